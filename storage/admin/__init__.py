"""Administration: maintenance and orphan cleanup, over every kind of table icelog writes.

The top floor of ``storage``: orphan cleanup must know every writer that leaves files before
its commit (log appends, transactions' staged files), so it sits above them all.

May import: every other ``storage`` package.
"""

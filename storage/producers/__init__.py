"""Producers: idempotent producer ids and epochs (I4), and transactions across partitions
and tables with a coordinator journal (its state: ``journal_state``) and recovery (I5).

May import: ``storage.groups``, ``storage.log``, ``storage.core``, ``storage.errors``, ``storage.properties``.
"""

"""The commit core: one protocol for every write, to one table or several (docs/guarantees.md: I2, I3, I5, I7).

Owns the compare-and-swap commit loop and its commit-id registry, the catalog side of a
commit (swap, database clock), the table-state protocol requests decide on, system tables,
metadata-file cleanup and fault points. Knows tables, not logs: a request brings its own
state type and file writer.

May import: ``storage.errors``, ``storage.properties``.
"""

"""Log tables: partitions of contiguous offsets on Iceberg (docs/guarantees.md: I1, I2, I4's sequence check).

Owns the public ``LogTable`` API (create, append, read), a log table's state (watermarks,
producer sequences), data files and their offset ranges, key hashes, schemas, read planning,
producer-sequence admission, maintenance requests and repair.

May import: ``storage.core``, ``storage.errors``, ``storage.properties``.
"""

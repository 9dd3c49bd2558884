"""Log tables: partitions of contiguous offsets on Iceberg (DESIGN I1, I2, I4's sequence check).

Owns the public ``LogTable`` API (create, append, read), data files and their offset ranges,
key hashes, schemas, read planning, producer-sequence admission, maintenance and repair.

May import: ``storage.core``, ``storage.errors``, ``storage.properties``.
"""

"""Key-to-partition mapping: a stable hash every engine can reproduce.

CRC-32 of the key's UTF-8 bytes, modulo the partition count. Python's ``zlib.crc32`` and
Spark SQL's ``crc32`` agree, so drivers and executors route a key to the same partition.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def partition_for_key(key: str | None, partitions: int) -> int:
    return zlib.crc32((key or "").encode()) % partitions


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """Vectorised :func:`partition_for_key` (dictionary-encoded, so each distinct key hashes once)."""
    encoded = pc.dictionary_encode(pc.fill_null(keys, "")).combine_chunks() if isinstance(keys, pa.ChunkedArray) else pc.dictionary_encode(pc.fill_null(keys, ""))
    table = np.array([zlib.crc32(k.encode()) % partitions for k in encoded.dictionary.to_pylist()], dtype=np.int32)
    return table[encoded.indices.to_numpy(zero_copy_only=False)] if len(table) else np.zeros(len(keys), dtype=np.int32)

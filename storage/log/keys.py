"""Stable key hashes every engine can reproduce.

* **Partition of a key:** CRC-32 of the key's UTF-8 bytes, modulo the partition count.
  Python's ``zlib.crc32`` and Spark SQL's ``crc32`` agree, so drivers and executors route a
  key to the same partition.
* **Key hash** (``log_key_hash``, consumer groups' key ranges): the low 16 bits of the MD5 of
  the key's UTF-8 bytes, the last four hex digits of its digest, in ``0..65535`` (Pulsar
  Key_Shared's hash space); a null key hashes as the empty string. The same in every engine
  (``tests/storage/groups/test_consumer.py`` checks DuckDB and Spark against Python):

  * Python: ``int(hashlib.md5(key.encode()).hexdigest()[-4:], 16)``
  * Spark SQL: ``conv(substr(md5(coalesce(key, '')), 29, 4), 16, 10)``
  * DuckDB: ``('0x' || right(md5(coalesce(key, '')), 4))::INTEGER``

  (CRC-32 is not built into DuckDB.)
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icelog.storage.log.names import HASH_SPACE  # noqa: F401 (re-exported)

SPARK_SQL_KEY_HASH = "conv(substr(md5(coalesce({key}, '')), 29, 4), 16, 10)"
DUCKDB_KEY_HASH = "('0x' || right(md5(coalesce({key}, '')), 4))::INTEGER"
# Distinct keys hashed in Python; more go through DuckDB's multi-threaded md5. A fresh DuckDB
# costs ~20 ms, so below ~100k keys Python's md5 is faster (measured: 10k keys 7.7 ms in Python,
# 28.5 ms through DuckDB; 1M keys 869 ms against 324 ms). No connection is kept: a cached one
# deadlocks a forked child.
_PYTHON_HASH_LIMIT = 100_000


def partition_for_key(key: str | None, partitions: int) -> int:
    return zlib.crc32((key or "").encode()) % partitions


def partitions_for_keys(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """Vectorised :func:`partition_for_key` (dictionary-encoded, so each distinct key hashes once)."""
    encoded = (
        pc.dictionary_encode(pc.fill_null(keys, "")).combine_chunks()
        if isinstance(keys, pa.ChunkedArray)
        else pc.dictionary_encode(pc.fill_null(keys, ""))
    )
    table = np.array([zlib.crc32(k.encode()) % partitions for k in encoded.dictionary.to_pylist()], dtype=np.int32)
    return table[encoded.indices.to_numpy(zero_copy_only=False)] if len(table) else np.zeros(len(keys), dtype=np.int32)


def split_by_key(rows: pa.Table, key_column: str, partitions: int) -> dict[int, pa.Table]:
    """``rows`` by the partition of their key (:func:`partitions_for_keys` of the column as text;
    a null key, or no such column, is the empty key), input order kept within a partition.
    Partitions that get no row are left out."""
    if key_column not in rows.column_names:
        return {partition_for_key(None, partitions): rows} if rows.num_rows else {}
    where = partitions_for_keys(pc.cast(rows[key_column], pa.string()), partitions)
    return {int(p): rows.take(np.flatnonzero(where == p)) for p in np.unique(where)}


def key_hash(key: str | None) -> int:
    return int(hashlib.md5((key or "").encode()).hexdigest()[-4:], 16)


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Vectorised :func:`key_hash` (each distinct key hashes once)."""
    return encoded_key_hashes(keys)[0]


def encoded_key_hashes(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.DictionaryArray | None]:
    """:func:`key_hashes`, and the keys dictionary-encoded as they were hashed (None for no keys).

    Text keys without nulls are encoded as they are, so the encoding gives them back: a writer
    reorders the int32 indices and then takes from the small dictionary, cheaper than taking
    the strings (``storage.log.files``).
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int32), None
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        keys = keys.cast(pa.string())
    encoded = pc.dictionary_encode(pc.fill_null(keys, ""))
    distinct = encoded.dictionary
    if len(distinct) <= _PYTHON_HASH_LIMIT:
        md5 = hashlib.md5  # the last two digest bytes are the last four hex digits of key_hash
        utf8 = distinct.cast(pa.binary()).to_pylist()
        lookup = np.fromiter((int.from_bytes(md5(k).digest()[14:], "big") for k in utf8), dtype=np.int32, count=len(utf8))
    else:
        import duckdb  # only for very many distinct keys: an import and a connection cost more than they save below

        with duckdb.connect() as con:
            con.register("distinct_keys", pa.table({"k": distinct}))
            lookup = (
                con.execute(f"SELECT {DUCKDB_KEY_HASH.format(key='k')} AS h FROM distinct_keys")
                .fetchnumpy()["h"]
                .astype(np.int32)
            )
    return lookup[encoded.indices.to_numpy(zero_copy_only=False)], encoded

"""Key hashes: both vectorised paths agree with the one-key definition (I10: writers and
consumers must route a key to the same hash range)."""

from __future__ import annotations

import pyarrow as pa

from icelog.storage.log.keys import _PYTHON_HASH_LIMIT, key_hash, key_hashes


def test_i10_many_distinct_keys_hash_like_one_key_at_a_time():
    keys = [f"user-{i}" for i in range(_PYTHON_HASH_LIMIT + 1)] + [None, "", "ünïcode-ключ"]  # the DuckDB path
    assert key_hashes(pa.array(keys)).tolist() == [key_hash(k) for k in keys]


def test_i10_few_distinct_keys_hash_like_one_key_at_a_time():
    few = ["a", None, "", "ünïcode-ключ", "a", "b" * 1000, "c"]  # the Python path, repeats and chunks
    assert key_hashes(pa.chunked_array([pa.array(few[:3]), pa.array(few[3:])])).tolist() == [key_hash(k) for k in few]
    assert key_hashes(pa.array(few, pa.large_string())).tolist() == [key_hash(k) for k in few]

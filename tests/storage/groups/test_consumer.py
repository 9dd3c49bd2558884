"""The group consumer: key-hash-range reads, chunk sharing, back-pressure, rebalance (I10)."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from icelog.storage.errors import InvalidInput, StaleGeneration
from icelog.storage.groups.consumer import DUCKDB_KEY_HASH, SPARK_SQL_KEY_HASH, Consumer, key_hash, key_hashes, parse_key_range
from icelog.storage.groups.offsets import GROUPS_TABLE, commit_ranges, describe_group
from icelog.storage.log.table import LogTable


def _log(catalog, rows=120, keys=13):
    t = LogTable.create(catalog, "db.events", 1)
    t.append({0: [{"key": f"k{i % keys}", "value": str(i)} for i in range(rows)]})
    return t


def _offsets(batches):
    return [o for b in batches for o in b.column("log_offset").to_pylist()]


def _drain(consumer, step=17):
    seen = []
    while True:
        batches = consumer.poll(step)
        if not batches:
            return seen
        seen += [
            (o, k) for b in batches for o, k in zip(b.column("log_offset").to_pylist(), b.column("key").to_pylist(), strict=False)
        ]
        consumer.commit()


KEYS = ["user-42", "", "ü-ключ-🔑", "a" * 300, None, "k0"]


def test_key_hash_is_md5_low_16_bits():
    assert key_hash("user-42") == int(hashlib.md5(b"user-42").hexdigest()[-4:], 16)
    assert key_hash(None) == key_hash("")
    assert list(key_hashes(pa.array(["a", None, "a", "ü"]))) == [key_hash("a"), key_hash(""), key_hash("a"), key_hash("ü")]
    assert parse_key_range("0:16383") == (0, 16383)
    for bad in ("1", "5:4", "0:65536", "a:b"):
        with pytest.raises(InvalidInput):
            parse_key_range(bad)


def test_key_hash_same_in_duckdb():
    import duckdb

    rows = (
        duckdb.connect()
        .execute(f"SELECT {DUCKDB_KEY_HASH.format(key='k')} FROM unnest($keys) AS t(k)", {"keys": KEYS})
        .fetchall()
    )
    assert [r[0] for r in rows] == [key_hash(k) for k in KEYS]


@pytest.mark.integration
def test_key_hash_same_in_spark_sql(spark):
    frame = spark.createDataFrame([(k,) for k in KEYS], "k string")
    got = [int(r[0]) for r in frame.selectExpr(SPARK_SQL_KEY_HASH.format(key="k")).collect()]
    assert got == [key_hash(k) for k in KEYS]


def test_i10_key_range_reads_split_the_partition_in_offset_order(sqlite_catalog):
    _log(sqlite_catalog)
    halves = [(0, 32767), (32768, 65535)]
    seen = {}
    for i, hashes in enumerate(halves):
        c = Consumer(sqlite_catalog, f"g{i}")
        c.assign("db.events", [0], key_range=hashes)
        seen[hashes] = _drain(c)
    for (lo, hi), records in seen.items():
        assert [o for o, _ in records] == sorted(o for o, _ in records)
        assert all(lo <= key_hash(k) <= hi for _, k in records)
    assert sorted(o for rs in seen.values() for o, _ in rs) == list(range(120))


def _keyed_by(catalog, column, extra=(), rows=400):
    payload = [{"name": n, "type": "string"} for n in (*extra, column, "value")]
    t = LogTable.create(catalog, "db.keyed", 1, payload=payload, properties={"icelog.key-column": column})
    t.append({0: [{**{n: f"{n}-{i}" for n in extra}, column: f"u{i % 37}", "value": str(i)} for i in range(rows)]})
    return t


@pytest.mark.parametrize("extra", [("key",), ()], ids=["beside-a-key-column", "no-key-column"])
def test_i10_key_ranges_hash_the_tables_key_column(sqlite_catalog, extra):
    _keyed_by(sqlite_catalog, "user", extra)
    halves = [(0, 32767), (32768, 65535)]
    seen = {}
    for i, hashes in enumerate(halves):
        c = Consumer(sqlite_catalog, f"g{i}")
        c.assign("db.keyed", [0], key_range=hashes)
        seen[hashes] = [
            (o, u)
            for b in _polled(c)
            for o, u in zip(b.column("log_offset").to_pylist(), b.column("user").to_pylist(), strict=False)
        ]
    for (lo, hi), records in seen.items():
        assert all(lo <= key_hash(u) <= hi for _, u in records)  # the writers' placement: per-user order
    assert sorted(o for rs in seen.values() for o, _ in rs) == list(range(400))
    for i, records in enumerate(seen.values()):  # each group committed exactly what it delivered
        entry = describe_group(sqlite_catalog, f"g{i}")["partitions"][0]
        assert entry["committed_offset"] + sum(last - first + 1 for first, last in entry["ranges"]) == len(records)


def test_i8_a_key_range_over_a_table_without_its_key_column_is_refused(sqlite_catalog):
    _keyed_by(sqlite_catalog, "user", rows=3)
    with pytest.raises(InvalidInput, match="'tailnum'"):
        Consumer(sqlite_catalog, "g", key_column="tailnum").assign("db.keyed", [0], key_range=(0, 100))


def _polled(consumer, step=50):
    while batches := consumer.poll(step):
        yield from batches
        consumer.commit()


def test_i10_fetch_skips_committed_ranges_and_in_flight(sqlite_catalog):
    _log(sqlite_catalog, rows=30)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(3, 5), (10, 19)]})
    c = Consumer(sqlite_catalog, "g")
    c.assign("db.events", [0])
    first = _offsets(c.poll(5))
    assert first == [0, 1, 2, 6, 7]
    second = _offsets(c.poll(100))  # fetched but uncommitted offsets are not fetched again
    assert second == [8, 9, *range(20, 30)]
    c.commit()
    entry = describe_group(sqlite_catalog, "g")["partitions"][0]
    assert entry["stable_offset"] == 29 and entry["ranges"] == [] and entry["committed_offset"] == 30


def test_i10_back_pressure_only_fills_gaps_near_the_bound(sqlite_catalog):
    _log(sqlite_catalog, rows=40)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(2, 2), (4, 4), (6, 6)]})
    table = sqlite_catalog.load_table(GROUPS_TABLE)
    with table.transaction() as txn:
        txn.set_properties({"icelog.groups.max-ranges": "3"})
    c = Consumer(sqlite_catalog, "g")
    c.assign("db.events", [0])
    assert _offsets(c.poll(100)) == [0, 1, 3, 5]  # nothing above the last open range
    c.commit()
    assert _offsets(c.poll(100)) == list(range(7, 40))


def test_i10_unkeyed_chunks_shared_round_robin(sqlite_catalog):
    _log(sqlite_catalog, rows=100)
    a = Consumer(sqlite_catalog, "g", member_id="a", mode="chunks", chunk_size=10, session_timeout_ms=60_000)
    b = Consumer(sqlite_catalog, "g", member_id="b", mode="chunks", chunk_size=10, session_timeout_ms=60_000)
    a.subscribe("db.events")
    b.subscribe("db.events")
    # a learns the new generation: its draining half is released to b
    got_a = _offsets(a.poll(1000))
    got_b = _offsets(b.poll(1000))
    assert sorted(got_a + got_b) == list(range(100)) and not set(got_a) & set(got_b)
    assert {o // 10 % 2 for o in got_a} == {0} and {o // 10 % 2 for o in got_b} == {1}
    a.commit()
    b.commit()
    assert describe_group(sqlite_catalog, "g")["partitions"][0]["stable_offset"] == 99


def test_i10_rebalance_fences_old_generation_and_new_owner_waits_for_draining(sqlite_catalog):
    _log(sqlite_catalog, rows=60)
    a = Consumer(sqlite_catalog, "g", member_id="a", session_timeout_ms=60_000)
    a.subscribe("db.events")
    fetched = _offsets(a.poll(1000))
    assert fetched == list(range(60))
    b = Consumer(sqlite_catalog, "g", member_id="b", session_timeout_ms=60_000)
    b.subscribe("db.events")
    assert b.poll(1000) == []  # b's half is draining from a, which has not acted yet
    described = describe_group(sqlite_catalog, "g")
    assert described["partitions"][0]["draining"] and described["generation"] == 2
    with pytest.raises(StaleGeneration):
        a.commit()  # a fetched under generation 1
    again = _offsets(a.poll(1000))  # a syncs: its own half again, from the committed state
    got_b = _offsets(b.poll(1000))
    assert sorted(again + got_b) == list(range(60)) and not set(again) & set(got_b)
    a.commit()
    b.commit()
    a.close()
    b.close()
    assert describe_group(sqlite_catalog, "g")["members"] == []


@pytest.mark.parametrize(
    "kwargs", [{"mode": "hash"}, {"chunk_size": 0}, {"session_timeout_ms": 0}, {"member_id": ""}, {"member_id": 7}]
)
def test_i8_bad_consumer_settings_refused_before_anything_is_written(sqlite_catalog, kwargs, unchanged):
    with unchanged(catalog=sqlite_catalog):
        with pytest.raises(InvalidInput):
            Consumer(sqlite_catalog, "g", **kwargs)

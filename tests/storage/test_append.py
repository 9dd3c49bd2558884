"""I2 conditional append, I7 durability of acknowledged rows, I8 bad input, on SQLite and PostgreSQL."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from storage.errors import (
    EmptyBatch,
    IcelogError,
    InvalidIdentifier,
    InvalidInput,
    InvalidOffset,
    OffsetMismatch,
    SchemaMismatch,
    TableAlreadyExists,
    TerminalError,
    TransientError,
    CommitConflict,
    UnknownPartition,
    UnknownTable,
)
from storage.log import LogTable


def rows(*values: str) -> list[dict]:
    return [{"key": v, "value": v} for v in values]


def snapshot(log_table: LogTable):
    table = log_table.table()
    return table.metadata.current_snapshot_id, table.metadata.properties.get("icelog.version"), log_table.watermarks()


def test_i2_append_assigns_offsets_from_log_end(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    first = t.append({0: rows("a", "b")})
    second = t.append({0: rows("c"), 1: rows("x")})
    assert first.ranges == {0: (0, 2)}
    assert second.ranges == {0: (2, 3), 1: (0, 1)}
    assert t.read(0).column("log_offset").to_pylist() == [0, 1, 2]
    assert t.read(0).column("key").to_pylist() == ["a", "b", "c"]
    assert t.read(0, 1, 2).column("key").to_pylist() == ["b"]
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (0, 3), 1: (0, 1)}


def test_i2_expected_offset_commits_only_at_log_end(catalog):
    t = LogTable.create(catalog, "db.events", partitions=1)
    assert t.append({0: rows("a")}, {0: 0}).ranges == {0: (0, 1)}
    before = snapshot(t)
    with pytest.raises(OffsetMismatch) as e:
        t.append({0: rows("b")}, {0: 0})
    assert (e.value.expected, e.value.actual, e.value.partition) == (0, 1, 0)
    with pytest.raises(OffsetMismatch) as e:
        t.append({0: rows("b")}, {0: 5})
    assert e.value.actual == 1
    assert snapshot(t) == before
    assert t.append({0: rows("b")}, {0: 1}).ranges == {0: (1, 2)}


def test_i2_multi_partition_append_is_all_or_nothing(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({1: rows("x")})
    with pytest.raises(OffsetMismatch):
        t.append({0: rows("a"), 1: rows("y")}, {0: 0, 1: 0})
    assert t.read(0).num_rows == 0 and t.read(1).num_rows == 1


def test_i2_appends_to_other_partitions_in_between_are_not_a_conflict(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    end = t.watermarks()[0].end
    for i in range(3):
        t.append({1: rows(f"other{i}")})
    assert t.append({0: rows("mine")}, {0: end}).ranges == {0: (0, 1)}


def test_i7_rows_survive_later_commits_and_snapshot_expiry(catalog):
    t = LogTable.create(catalog, "db.events", partitions=1, properties={"icelog.snapshots.keep": "3"})
    acknowledged = []
    for i in range(12):
        acknowledged.append(t.append({0: rows(f"v{i}")}).ranges[0])
    table = t.table()
    assert len(table.metadata.snapshots) <= 3
    assert t.read(0).column("key").to_pylist() == [f"v{i}" for i in range(12)]
    assert acknowledged == [(i, i + 1) for i in range(12)]


def test_add_partitions_never_removes(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({1: rows("a")})
    t.add_partitions(4)
    assert t.append({3: rows("b")}).ranges == {3: (0, 1)}
    assert t.watermarks()[1].end == 1
    with pytest.raises(InvalidInput):
        t.add_partitions(2)
    assert len(t.watermarks()) == 4


def test_payload_schema_from_spec_and_typed_columns(catalog):
    payload = [{"name": "tailnum", "type": "string"}, {"name": "dep_delay", "type": "double"}, {"name": "flight", "type": "long", "required": True}]
    t = LogTable.create(catalog, "db.flights", partitions=1, payload=payload)
    t.append({0: [{"tailnum": "N1", "dep_delay": 2, "flight": 7}, {"flight": 8}]})
    got = t.read(0)
    assert got.column("dep_delay").to_pylist() == [2.0, None]
    assert got.column("flight").to_pylist() == [7, 8]


# --- I8: bad input changes nothing ----------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error",
    [
        ({5: rows("a")}, UnknownPartition),
        ({-1: rows("a")}, UnknownPartition),
        ({0: []}, EmptyBatch),
        ({0: pa.table({"key": pa.array([], pa.string())})}, EmptyBatch),
        ({0: [{"key": "a", "nope": 1}]}, SchemaMismatch),
        ({0: [{"key": 12}]}, SchemaMismatch),
        ({0: [{"key": "a"}, {"key": 3}]}, SchemaMismatch),
        ({}, InvalidInput),
    ],
)
def test_i8_bad_rows_raise_typed_errors_and_change_nothing(catalog, bad, error):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({0: rows("a")})
    before = snapshot(t)
    with pytest.raises(error):
        t.append(bad)
    assert snapshot(t) == before


def test_i8_negative_or_non_integer_expected_offset(catalog):
    t = LogTable.create(catalog, "db.events", partitions=1)
    before = snapshot(t)
    for k in (-1, "3", 1.5):
        with pytest.raises(InvalidOffset):
            t.append({0: rows("a")}, {0: k})
    assert snapshot(t) == before


def test_i8_required_column_missing(catalog):
    t = LogTable.create(catalog, "db.f", partitions=1, payload=[{"name": "n", "type": "long", "required": True}])
    with pytest.raises(SchemaMismatch):
        t.append({0: [{"n": None}]})
    with pytest.raises(SchemaMismatch):
        t.append({0: pa.table({"other": [1]})})
    assert t.watermarks()[0].end == 0


@pytest.mark.parametrize("name", ["db.ev'ents", "db.e;drop", "db/x.y", "../etc.passwd", "a.b.c", "", "db.", "db.1x", "db.e v"])
def test_i8_bad_identifiers_rejected_before_touching_the_catalog(catalog, name):
    with pytest.raises(InvalidIdentifier):
        LogTable.create(catalog, name, partitions=1)
    assert catalog.list_namespaces() == []


@pytest.mark.parametrize("payload", [[{"name": "log_offset", "type": "long"}], [{"name": "x", "type": "decimal"}], [{"name": "x;y", "type": "string"}], []])
def test_i8_bad_payload_schema(catalog, payload):
    with pytest.raises(InvalidInput):
        LogTable.create(catalog, "db.events", partitions=1, payload=payload)


def test_i8_bad_partition_count_and_duplicates(catalog):
    for n in (0, -3, True, "2"):
        with pytest.raises(InvalidInput):
            LogTable.create(catalog, "db.events", partitions=n)
    LogTable.create(catalog, "db.events", partitions=1)
    with pytest.raises(TableAlreadyExists):
        LogTable.create(catalog, "db.events", partitions=3)
    with pytest.raises(UnknownTable):
        LogTable.open(catalog, "db.missing")


def test_errors_are_typed_and_picklable():
    cases = [
        OffsetMismatch(table="db.t", partition=1, expected=3, actual=5),
        CommitConflict(table="db.t", attempts=4),
        UnknownPartition(table="db.t", partition=9, partitions=2),
        InvalidIdentifier(identifier="a;b", reason="bad"),
    ]
    for error in cases:
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and clone.fields == error.fields and str(clone) == str(error)
        assert isinstance(clone, IcelogError)
    assert isinstance(cases[0], TerminalError) and not isinstance(cases[0], TransientError)
    assert isinstance(cases[1], TransientError)
    assert isinstance(cases[3], ValueError)
    assert cases[0].to_dict()["actual"] == 5 and "expected offset 3" in str(cases[0])

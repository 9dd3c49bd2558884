"""I8 at the Python API: bad input gets a typed error, and the table is unchanged."""

from __future__ import annotations

import pytest

from storage.errors import InvalidInput, InvalidProperty, UnknownSnapshot
from storage.log import LogTable
from storage.maintenance import maintain
from storage.schema import load_payload_spec, payload_fields


def fingerprint(t: LogTable) -> tuple:
    table = t.table()
    return table.metadata_location, {p: (w.start, w.end) for p, w in t.watermarks().items()}, t.read(0).num_rows


@pytest.fixture
def table(sqlite_catalog) -> LogTable:
    t = LogTable.create(sqlite_catalog, "db.bad", 2)
    for i in range(3):
        t.append({0: [{"key": str(i)}]})
    return t


@pytest.mark.parametrize("kwargs", [{"retention_ms": -1}, {"retention_ms": 0}, {"retention_bytes": -5}, {"keep_snapshots": 0}, {"orphan_age_s": -1.0}, {"orphan_age_s": float("nan")}])
def test_i8_maintain_refuses_bad_arguments_and_changes_nothing(sqlite_catalog, table, kwargs):
    before = fingerprint(table)
    with pytest.raises(InvalidInput):
        maintain(sqlite_catalog, table.identifier, **kwargs)
    assert fingerprint(table) == before


@pytest.mark.parametrize("value", ["-1", "0", "soon"])
def test_i8_maintain_refuses_a_bad_retention_property(sqlite_catalog, table, value):
    with sqlite_catalog.load_table(table.identifier).transaction() as txn:
        txn.set_properties({"icelog.retention.ms": value})
    before = fingerprint(table)
    with pytest.raises(InvalidInput, match="icelog.retention.ms"):
        maintain(sqlite_catalog, table.identifier)
    assert fingerprint(table) == before


def test_i8_partition_growth_is_bounded(table):
    before = fingerprint(table)
    with pytest.raises(InvalidInput, match="at most 100000"):
        table.add_partitions(1_000_000_000)
    with pytest.raises(InvalidInput, match="never removed"):
        table.add_partitions(1)
    assert fingerprint(table) == before


def test_i8_reading_an_unknown_snapshot_is_a_typed_error(table):
    with pytest.raises(UnknownSnapshot) as caught:
        table.read(0, snapshot_id=12345)
    assert caught.value.retained and "12345" in str(caught.value)


def test_i8_bad_schema_files_are_typed_errors(tmp_path):
    bad_utf8 = tmp_path / "latin1.json"
    bad_utf8.write_bytes(b'[{"name": "caf\xe9", "type": "string"}]')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path in (bad_utf8, deep):
        with pytest.raises(InvalidInput):
            load_payload_spec(path)
    with pytest.raises(InvalidInput):
        payload_fields([{"name": "n", "type": ["long"]}])


MALFORMED_PROPERTIES = [
    ("icelog.metadata.delete-grace-ms", "60s"),
    ("icelog.metadata.delete-grace-ms", "-1"),
    ("icelog.commit-ids.keep", "-5"),
    ("icelog.commit-ids.keep", "0"),
    ("icelog.commit-ids.min-retention-ms", "7d"),
    ("icelog.snapshots.keep", "0"),
]


@pytest.mark.parametrize("key, value", MALFORMED_PROPERTIES)
def test_i8_a_malformed_icelog_property_is_refused_when_set(sqlite_catalog, key, value):
    with pytest.raises(InvalidProperty) as caught:
        LogTable.create(sqlite_catalog, "db.misconfigured", 1, properties={key: value})
    assert (caught.value.key, caught.value.value) == (key, value)
    assert not sqlite_catalog.table_exists("db.misconfigured")


@pytest.mark.parametrize("key, value", MALFORMED_PROPERTIES)
def test_i8_a_malformed_icelog_property_set_by_another_tool_refuses_the_commit_before_it_lands(sqlite_catalog, table, key, value):
    with sqlite_catalog.load_table(table.identifier).transaction() as txn:
        txn.set_properties({key: value})
    before = fingerprint(table)
    # An append that landed and then failed would be re-sent by its caller: a duplicate.
    with pytest.raises(InvalidProperty, match=key):
        table.append({0: [{"key": "x"}]}, commit_id="once")
    assert fingerprint(table) == before

"""I8 at the Python API: bad input gets a typed error, and the table is unchanged."""

from __future__ import annotations

import pytest

from icelog.storage.admin.maintenance import maintain
from icelog.storage.errors import InvalidInput, InvalidProperty, UnknownSnapshot
from icelog.storage.log.schema import load_payload_spec, payload_fields
from icelog.storage.log.table import LogTable


def fingerprint(t: LogTable) -> tuple:
    table = t.table()
    return table.metadata_location, {p: (w.start, w.end) for p, w in t.watermarks().items()}, t.read(0).num_rows


@pytest.fixture
def table(sqlite_catalog) -> LogTable:
    t = LogTable.create(sqlite_catalog, "db.bad", 2)
    for i in range(3):
        t.append({0: [{"key": str(i)}]})
    return t


@pytest.mark.parametrize(
    "kwargs",
    [
        {"retention_ms": -1},
        {"retention_ms": 0},
        {"retention_bytes": -5},
        {"keep_snapshots": 0},
        {"orphan_age_s": -1.0},
        {"orphan_age_s": float("nan")},
    ],
)
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


# --- pre-written files (commit_files, send_files): the rows are read, not only their statistics ---


def _prewritten(catalog, target: LogTable, offsets: list[int]) -> list[str]:
    """Data files in ``target``'s location holding rows whose offsets are ``offsets``."""
    import uuid

    import pyarrow as pa

    from icelog.storage.log.files import write_log_files

    source = LogTable.create(catalog, f"db.source_{uuid.uuid4().hex[:8]}", 1)
    source.append({0: [{"key": str(i)} for i in range(len(offsets))]})
    rows = source.table().scan().to_arrow().sort_by("log_offset")
    rows = rows.set_column(rows.column_names.index("log_offset"), "log_offset", pa.array(offsets, pa.int64()))
    return [f.file_path for f in write_log_files(target.table(), {0: rows})]


def test_i1_prewritten_files_with_a_duplicate_and_a_gap_are_refused(sqlite_catalog, unchanged):
    from icelog.storage.errors import CorruptBatch
    from icelog.storage.producers.transactional import TransactionalProducer

    target = LogTable.create(sqlite_catalog, "db.target", 1)
    paths = _prewritten(sqlite_catalog, target, [0, 0, 2])  # min 0, max 2, count 3: the statistics agree
    with unchanged(target):
        with pytest.raises(CorruptBatch, match="offset 1 is missing"):
            target.commit_files({0: paths}, {0: 0})
        producer = TransactionalProducer(sqlite_catalog, "prewritten")
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(CorruptBatch, match="offset 1 is missing"):
            producer.send_files(target.identifier, {0: paths}, {0: 0})
        producer.abort_transaction()
    good = _prewritten(sqlite_catalog, target, [0, 1, 2])
    assert target.commit_files({0: good}, {0: 0}).ranges == {0: (0, 3)}


def test_i8_prewritten_files_outside_the_table_location_are_refused(sqlite_catalog, unchanged, tmp_path):
    import pyarrow.parquet as pq

    target = LogTable.create(sqlite_catalog, "db.target", 1)
    inside = _prewritten(sqlite_catalog, target, [0, 1, 2])[0]
    location = target.table().metadata.location.removeprefix("file://")
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(pq.read_table(inside.removeprefix("file://")), outside)
    sibling = f"{location}-evil/data/x.parquet"  # a prefix of the location is not inside it
    escaping = f"{location}/data/../../{outside.name}"
    with unchanged(target):
        for path in (str(outside), f"file://{outside}", sibling, escaping):
            with pytest.raises(InvalidInput, match="outside the location"):
                target.commit_files({0: [path]}, {0: 0})


@pytest.mark.parametrize("at_us", [10**33, -(10**30), 2**63 * 10**3, 1.5, "2024-01-01", True, None])
def test_i8_offsets_for_a_time_that_is_no_date_is_refused(table, at_us):
    with pytest.raises(InvalidInput, match="epoch microseconds"):
        table.offsets_for_time(at_us)

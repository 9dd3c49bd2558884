"""The validators catch gaps, duplicates and watermark drift planted around icelog with pyiceberg."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from storage.log import LogTable
from validations.contiguity import check_contiguity


def plant(log_table: LogTable, partition: int, offsets: list[int]) -> None:
    """Append rows with chosen offsets straight through pyiceberg, bypassing icelog."""
    table = log_table.table()
    schema = table.schema().as_arrow()
    n = len(offsets)
    columns = {
        "log_partition": [partition] * n, "log_offset": offsets, "log_timestamp": [0] * n,
        "producer_id": [None] * n, "producer_epoch": [None] * n, "producer_seq": [None] * n,
        "key": ["planted"] * n, "value": ["planted"] * n,
    }
    table.append(pa.table({f.name: pa.array(columns[f.name]).cast(f.type) for f in schema}, schema=schema))


@pytest.fixture
def log_table(sqlite_catalog) -> LogTable:
    t = LogTable.create(sqlite_catalog, "db.v", partitions=2)
    t.append({0: [{"key": "a"}] * 4, 1: [{"key": "b"}] * 2})
    t.append({0: [{"key": "c"}] * 2})
    return t


@pytest.mark.parametrize("deep", [False, True])
def test_i1_clean_table_passes(log_table, deep):
    report = check_contiguity(log_table.table(), deep=deep)
    assert report.ok, report.violations
    assert report.rows == 8


@pytest.mark.parametrize("deep", [False, True])
def test_i1_planted_gap_is_found_with_its_offsets(log_table, deep):
    plant(log_table, 0, [8, 9])  # 6 and 7 are missing
    violations = check_contiguity(log_table.table(), deep=deep).violations
    gaps = [v for v in violations if v.kind == "gap" and v.check == "contiguity"]
    assert [(g.partition, g.first, g.last) for g in gaps] == [(0, 6, 7)]
    assert any(v.kind == "watermark" and v.partition == 0 for v in violations)  # stored end 6 != data end 10


@pytest.mark.parametrize("deep", [False, True])
def test_i1_planted_duplicate_is_found_with_its_offsets(log_table, deep):
    plant(log_table, 1, [1, 2])  # offset 1 again
    violations = check_contiguity(log_table.table(), deep=deep).violations
    dups = [v for v in violations if v.kind == "duplicate"]
    assert [(d.partition, d.first, d.last) for d in dups] == [(1, 1, 1)]


def test_i1_gap_plus_duplicate_inside_one_file_is_caught_by_the_deep_check(log_table):
    plant(log_table, 0, [6, 6, 8])  # count 3 == 8 - 6 + 1: bounds and counts cannot tell
    assert check_contiguity(log_table.table(), deep=False).ok is False  # watermark 6 != data end 9 still shows
    deep = check_contiguity(log_table.table(), deep=True).violations
    kinds = {(v.kind, v.first, v.last) for v in deep if v.check == "contiguity"}
    assert ("duplicate", 6, 6) in kinds and ("gap", 7, 7) in kinds


def test_watermark_off_by_one_is_found(log_table):
    table = log_table.table()
    marks = json.loads(table.metadata.properties["icelog.watermarks"])
    marks["1"][1] += 1
    with table.transaction() as txn:
        txn.set_properties({"icelog.watermarks": json.dumps(marks)})
    for deep in (False, True):
        violations = check_contiguity(log_table.table(), deep=deep).violations
        assert [(v.kind, v.partition, v.extra) for v in violations] == [("watermark", 1, {"stored_end": 3, "data_end": 2})]


def test_old_snapshot_checked_for_contiguity(log_table):
    first = log_table.table().metadata.snapshots[0].snapshot_id
    report = check_contiguity(log_table.table(), deep=True, snapshot_id=first)
    assert report.ok and report.rows == 6 and report.checks == ["contiguity"]

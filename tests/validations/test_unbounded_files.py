"""Data files without offset bounds in their manifest entries, and the metadata-only check.

Another tool may set ``write.metadata.metrics.default=none`` (or ``none`` for the offset column)
on a log table, and a foreign writer may keep no statistics. icelog's own writes keep the offset
and partition bounds whatever those properties say; a file without them is read by the
metadata-only check (as the deep check reads it), never a ``KeyError``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from icelog.storage.log import schema as cols
from icelog.storage.log.files import data_files_from_parquet
from icelog.storage.log.manifests import live_files
from icelog.storage.log.table import LogTable
from icelog.validations import contiguity
from icelog.validations.contiguity import check_contiguity
from tests.support.cli import Cli
from tests.support.planting import plant, rows_at

NO_METRICS = [
    {"write.metadata.metrics.default": "none"},
    {"write.metadata.metrics.column.log_offset": "none", "write.metadata.metrics.column.log_partition": "counts"},
]


def set_properties(log_table: LogTable, properties: dict[str, str]) -> None:
    """What another tool does to the table: a property change, no snapshot."""
    table = log_table.table()
    with table.transaction() as txn:
        txn.set_properties(properties)


def bounded(table, field: str) -> dict[str, bool]:
    """Per data file: whether its manifest entry has both bounds of ``field``."""
    field_id = table.schema().find_field(field).field_id
    return {f.path: field_id in f.lower and field_id in f.upper for f in live_files(table, [field_id])}


@pytest.fixture
def no_file_reads(monkeypatch):
    """The metadata-only check must prove icelog's files from their manifests alone."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("the metadata-only check read a data file")

    monkeypatch.setattr(contiguity, "scan_files", refuse)


@pytest.mark.parametrize("properties", NO_METRICS, ids=["default none", "offset column none"])
def test_icelog_appends_keep_offset_bounds_whatever_the_metrics_properties(sqlite_catalog, properties, no_file_reads):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=2)
    set_properties(t, properties)
    t.append({0: [{"key": str(i)} for i in range(5)], 1: [{"key": "b"}]})
    t.append({0: [{"key": "c"}] * 3})
    table = t.table()
    assert table.metadata.properties.items() >= properties.items()
    for field in (cols.OFFSET, cols.PARTITION):
        assert set(bounded(table, field).values()) == {True}, field
    report = check_contiguity(table)
    assert report.ok and report.rows == 9, report.violations


@pytest.mark.parametrize("properties", NO_METRICS, ids=["default none", "offset column none"])
def test_files_described_from_parquet_keep_offset_bounds(sqlite_catalog, properties):
    """Files written elsewhere (Spark executors) and described by icelog: the same bounds."""
    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    set_properties(t, properties)
    table = t.table()
    path = f"{table.metadata.location}/data/spark-written.parquet"
    local = Path(path.removeprefix("file://"))
    local.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows_at(table, 0, [0, 1, 2]), local)
    (described,) = data_files_from_parquet(table, [path])
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    assert described.lower_bounds[offset_id] == (0).to_bytes(8, "little")
    assert described.upper_bounds[offset_id] == (2).to_bytes(8, "little")


@pytest.fixture
def unbounded(sqlite_catalog) -> LogTable:
    """Offsets 0..4 by icelog, then the table's metrics turned off by another tool, as foreign
    writers then write (pyiceberg's own writer keeps no bounds)."""
    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    t.append({0: [{"key": str(i)} for i in range(5)]})
    set_properties(t, {"write.metadata.metrics.default": "none"})
    return t


def diagnosis(report) -> list[tuple]:
    return sorted((v.check, v.kind, v.partition, v.first, v.last) for v in report.violations)


def test_a_foreign_file_without_bounds_that_extends_the_log_is_proven_by_reading_it(unbounded):
    plant(unbounded, 0, [7, 5, 6])
    table = unbounded.table()
    assert sorted(bounded(table, cols.OFFSET).values()) == [False, True]
    report = check_contiguity(table)
    # the stored watermark is icelog's (5); the foreign rows extend the data to 8, nothing else
    assert diagnosis(report) == [("watermark", "watermark", 0, 5, 7)]
    assert report.rows == 8
    assert diagnosis(report) == diagnosis(check_contiguity(table, deep=True))


@pytest.mark.parametrize(
    ("offsets", "expected"),
    [
        ([4, 5], [("contiguity", "duplicate", 0, 4, 4), ("watermark", "watermark", 0, 5, 5)]),
        ([6], [("contiguity", "gap", 0, 5, 5), ("watermark", "watermark", 0, 5, 6)]),
        ([5, 5, 7], [("contiguity", "duplicate", 0, 5, 5), ("contiguity", "gap", 0, 6, 6), ("watermark", "watermark", 0, 5, 7)]),
    ],
)
def test_a_foreign_file_without_bounds_that_breaks_the_log_is_diagnosed(unbounded, offsets, expected):
    plant(unbounded, 0, offsets)
    report = check_contiguity(unbounded.table())
    assert diagnosis(report) == expected == diagnosis(check_contiguity(unbounded.table(), deep=True))
    planted = next(path for path, has in bounded(unbounded.table(), cols.OFFSET).items() if not has)
    assert any(planted.removeprefix("file://") in v.detail for v in report.violations if v.check == "contiguity") == (
        offsets != [6]  # a duplicate names its files, a gap none
    )


def test_a_damaged_file_without_bounds_is_a_bad_file(unbounded):
    plant(unbounded, 0, [5, 6])
    planted = next(path for path, has in bounded(unbounded.table(), cols.OFFSET).items() if not has)
    with open(planted.removeprefix("file://"), "wb") as out:
        out.write(b"not parquet" * 10)
    report = check_contiguity(unbounded.table())
    bad = [v for v in report.violations if v.kind == "bad_file"]
    assert [(v.partition, v.extra["path"]) for v in bad] == [(0, planted.removeprefix("file://"))]


def test_a_file_without_bounds_on_s3_is_read_by_the_metadata_check(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", partitions=1)
    t.append({0: [{"key": str(i)} for i in range(5)]})
    set_properties(t, {"write.metadata.metrics.default": "none"})
    plant(t, 0, [5, 5])
    table = t.table()
    assert any(path.startswith("s3://") and not has for path, has in bounded(table, cols.OFFSET).items())
    assert diagnosis(check_contiguity(table)) == [("contiguity", "duplicate", 0, 5, 5), ("watermark", "watermark", 0, 5, 5)]


def test_validate_without_deep_reports_a_file_without_bounds_exit_1(unbounded, sqlite_spec):
    plant(unbounded, 0, [5, 5])
    report = Cli(sqlite_spec)("validate", "db.events", code=1)
    assert [(v["check"], v["kind"], v["first"], v["last"]) for v in report["violations"]] == [
        ("contiguity", "duplicate", 5, 5),
        ("watermark", "watermark", 5, 5),
    ]

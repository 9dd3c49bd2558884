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

from storage.log import schema as cols
from storage.log.files import data_files_from_parquet
from storage.log.manifests import live_files
from storage.log.table import LogTable
from tests.support.planting import rows_at
from validations import contiguity
from validations.contiguity import check_contiguity

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

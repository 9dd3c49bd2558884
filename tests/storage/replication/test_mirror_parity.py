"""I6: the mirror-parity check finds the first differing offset, and passes on true mirrors."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from icelog.storage.log.maintenance import live_files
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from icelog.validations.mirror import check_mirror_parity
from tests.support.mirror import rows, run_mirror


def mirrored(source, target, batches: int = 3) -> LogTable:
    src = LogTable.create(source, "orders", 2)
    for i in range(batches):
        src.append({0: rows(3, f"a{i}"), 1: rows(1, f"b{i}")})
    run_mirror(source, target)
    return src


def test_i6_parity_passes_on_a_mirror_and_on_a_lagging_one(source, target):
    src = mirrored(source, target)
    dst = LogTable.open(target, "orders").table()
    report = check_mirror_parity(dst, source=src.table())
    assert report.ok and report.rows == 12, report.to_dict()
    src.append({0: rows(2)})
    assert check_mirror_parity(dst, source=src.table()).ok  # behind, but what it holds is right


def test_i6_parity_reports_the_first_differing_offset(source, target):
    src = mirrored(source, target)
    dst = LogTable.open(target, "orders").table()
    victim = next(f for f in live_files(dst) if f.partition[0] == 0 and f.record_count == 3 and _first(f, dst) == 3)
    path = Path(victim.file_path.removeprefix("file://"))
    table = pq.read_table(path)
    changed = table.set_column(
        table.column_names.index("value"), "value", pc.if_else(pc.equal(table["log_offset"], 4), "tampered", table["value"])
    )
    pq.write_table(changed, path)
    report = check_mirror_parity(dst, source=src.table())
    assert not report.ok
    (violation,) = report.violations
    assert (violation.kind, violation.partition, violation.first) == ("content", 0, 4)


def test_i6_parity_reports_a_source_never_holding_the_mirrored_range(source, target):
    mirrored(source, target)
    dst = LogTable.open(target, "orders").table()
    other = LogTable.create(source, "shorter", 2)
    other.append({0: rows(2)})
    report = check_mirror_parity(dst, source=other.table())
    kinds = {v.kind for v in report.violations}
    assert {"source_changed", "range"} <= kinds


def test_i6_parity_finds_the_source_from_the_record(source_spec, target, monkeypatch):
    source = source_spec.open()
    mirrored(source, target)
    for key, value in source_spec.env().items():
        if key.startswith("PYICEBERG_CATALOG__"):
            monkeypatch.setenv(key, value)
    report = run_checks(LogTable.open(target, "orders").table(), ["mirror-parity"])
    assert report.ok, report.to_dict()


def test_i6_parity_on_a_table_that_is_no_mirror(target):
    table = LogTable.create(target, "plain", 1)
    assert [v.kind for v in check_mirror_parity(table.table()).violations] == ["not_a_mirror"]


def _first(data_file, table) -> int:
    from icelog.storage.log.files import file_offset_range

    return file_offset_range(data_file, table.schema().find_field("log_offset").field_id)[0]

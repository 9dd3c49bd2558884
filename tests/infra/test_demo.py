"""``make demo``'s own steps on a temporary catalog (the full run, Airflow and Spark included, is ``make demo``)."""

from __future__ import annotations

import io

import pyarrow.compute as pc
import pytest
from rich.console import Console

from infra import demo
from pipelines.flights import PARTITIONS, create_table, load_flights, monthly_batches


@pytest.fixture(scope="module")
def months():
    return monthly_batches(load_flights(), PARTITIONS)


def first_days(batch: dict, days: int) -> dict:
    return {p: rows.filter(pc.less_equal(rows["day"], days)) for p, rows in batch.items()}


def test_the_demo_passes_with_days_the_user_loaded_after_january(sqlite_catalog, months):
    # `make demo`, a backfill of 2013-02-01..02 from the UI, then `make demo` again.
    log_table, _ = create_table(sqlite_catalog)
    log_table.append({p: rows for p, rows in months[0].items() if rows.num_rows})
    log_table.append({p: rows for p, rows in first_days(months[1], 2).items() if rows.num_rows})
    out = io.StringIO()
    assert demo.check_january(Console(file=out, width=200), log_table)
    assert demo.january_flights(log_table) == (27_004, 27_004)
    assert "27,004 rows dated January 2013 = the January 2013 flights (27,004): yes (28,612 rows in all" in out.getvalue()


def test_the_demo_fails_when_a_january_day_is_missing(sqlite_catalog, months):
    log_table, _ = create_table(sqlite_catalog)
    log_table.append({p: rows for p, rows in first_days(months[0], 30).items() if rows.num_rows})
    log_table.append({p: rows for p, rows in first_days(months[1], 5).items() if rows.num_rows})
    out = io.StringIO()
    assert not demo.check_january(Console(file=out, width=200), log_table)
    assert ": no" in out.getvalue()


def metadata_files(log_table) -> set[str]:
    from pathlib import Path

    from storage.log.files import local_path

    return {p.name for p in Path(local_path(log_table.table().metadata_location)).parent.glob("*.metadata.json")}


def test_a_rerun_opens_the_table_and_writes_no_metadata_file(sqlite_catalog):
    log_table, created = create_table(sqlite_catalog)
    before = metadata_files(log_table)
    again, created_again = create_table(sqlite_catalog)
    assert (created, created_again) == (True, False)
    assert metadata_files(again) == before  # no orphan 00000-*.metadata.json from a refused create


def test_the_late_file_lands_once(tmp_path):
    from pipelines.flights import LATE_DAY, land_late_file

    late = land_late_file(tmp_path)
    assert late is not None and late.parent.name == f"date={LATE_DAY}" and late.exists()
    assert land_late_file(tmp_path) is None  # the demo's re-run says nothing landed

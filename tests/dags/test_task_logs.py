"""What pipelines.tasks logs (the Airflow task log's lines), without Airflow: the DAG runs that
show them in a real task log are in test_dags.py."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from icelog.pipelines import tasks
from icelog.storage.errors import UnknownTable
from icelog.storage.log.table import LogTable


def test_validate_logs_the_checks_and_each_violation(sqlite_spec, monkeypatch, caplog):
    for key, value in sqlite_spec.env().items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="icelog.tasks")
    table = LogTable.create(sqlite_spec.open(), "db.events", 2)
    table.append({0: [{"key": "a", "value": "1"}] * 3, 1: [{"key": "b", "value": "2"}]})
    assert tasks.validate("db.events", report=False)["ok"]
    (passed,) = [r for r in caplog.records if r.getMessage().startswith("checks passed")]
    assert passed.levelno == logging.INFO and "table=db.events" in passed.getMessage() and "violations=0" in passed.getMessage()
    assert "contiguity-deep" in passed.getMessage() and "transactions" in passed.getMessage()

    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    row = {f.name: None for f in schema} | {"log_partition": 0, "log_offset": 7, "log_timestamp": 0}
    iceberg.append(pa.Table.from_pylist([row]).cast(schema))  # a gap (offsets 3..6), planted around icelog
    caplog.clear()
    with pytest.raises(tasks.ValidationFailed):
        tasks.validate("db.events", report=False)
    messages = caplog.messages
    assert any(m.startswith("checks failed") and "violations=" in m for m in messages), messages
    (gap,) = [r for r in caplog.records if r.getMessage().startswith("violation") and "kind=gap" in r.getMessage()]
    assert gap.levelno == logging.WARNING and "partition=0" in gap.getMessage() and "offsets 3..6 missing" in gap.getMessage()


def test_a_day_with_no_landing_files_starts_nothing(tmp_path, monkeypatch, caplog):
    # A fresh home (make airflow before make demo): the unpaused icelog_ingest runs today at once.
    # Nothing landed, so it must not need the table, the catalog or Spark (the DAG then skips the
    # task: no Asset event, no validate run on a table that does not exist).
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "home"))

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started for a day with no landing files")

    monkeypatch.setattr(tasks, "spark_session", no_spark)
    caplog.set_level(logging.INFO, logger="icelog.tasks")
    (tmp_path / "landing" / "demo.flights" / "date=2026-11-24").mkdir(parents=True)  # a folder, empty
    for day in ("2026-11-24", "2026-11-25"):  # an empty folder, and none at all
        result = tasks.ingest_day("demo.flights", day, landing=str(tmp_path / "landing"))
        assert (result["rows"], result["loaded"], result["skipped"]) == (0, [], [])
        assert any(m.startswith("nothing to do: no landing files") and f"day={day}" in m for m in caplog.messages)
        assert any(m.startswith("no such log table yet") and "ICELOG_HOME=" in m for m in caplog.messages), caplog.messages
    assert not (tmp_path / "home").exists()
    # A backfill names the table it cannot find, even when no day has landing files.
    with pytest.raises(UnknownTable):
        tasks.backfill("demo.flights", "2026-11-24", "2026-11-25", landing=str(tmp_path / "landing"))

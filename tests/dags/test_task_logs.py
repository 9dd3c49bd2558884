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


def test_one_verdict_in_the_task_the_report_and_the_demo(sqlite_spec, monkeypatch, caplog, tmp_path):
    """A data-quality warning passes everywhere and says so; a data-quality error (no check
    violation) fails the task, the report's badge, its Validation section and the demo alike."""
    import json

    from infra import demo

    for key, value in sqlite_spec.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ICELOG_EXPECTATIONS", str(tmp_path / "expectations"))
    suite = tmp_path / "expectations" / "db.events.json"
    suite.parent.mkdir()
    caplog.set_level(logging.INFO, logger="icelog.tasks")
    table = LogTable.create(sqlite_spec.open(), "db.events", 1)
    table.append({0: [{"key": "a", "value": "1"}] * 3 + [{"key": "z", "value": "2"}]})
    report_dir = tmp_path / "home" / "reports" / "db.events"

    def surfaces() -> tuple[str, str, str, bool]:
        doc = json.loads((report_dir / "report.json").read_text())
        page = (report_dir / "index.html").read_text()
        badge = page.split('id="status"')[1].split(">")[1].split("<")[0]
        lines, ok = demo.validation_findings(doc, table.table().metadata.current_snapshot_id)
        return doc["verdict"], badge, "\n".join(lines), ok

    expectation = {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "key", "value_set": ["a"]}}
    suite.write_text(json.dumps({"expectations": [{**expectation, "severity": "warn"}]}))
    summary = tasks.validate("db.events")  # the task succeeds ...
    assert summary["status"] == "WARNINGS"
    (said,) = [r for r in caplog.records if r.getMessage().startswith("validation ")]
    assert said.levelno == logging.WARNING and said.getMessage().startswith("validation WARNINGS: 1 warning")  # ... and warns
    verdict, badge, lines, ok = surfaces()
    assert (verdict, badge, ok) == ("WARNINGS: 1 warning", "WARNINGS", True)
    assert "verdict: WARNINGS: 1 warning" in lines and "  warning: expect_column_values_to_be_in_set" in lines

    suite.write_text(json.dumps({"expectations": [expectation]}))  # the same expectation as a gate
    caplog.clear()
    with pytest.raises(tasks.ValidationFailed, match="db.events: 1 failed expectation, first: expect_column_values_to_be_in_set"):
        tasks.validate("db.events", full=True)
    (said,) = [r for r in caplog.records if r.getMessage().startswith("validation ")]
    assert said.levelno == logging.ERROR and said.getMessage().startswith("validation VIOLATIONS: 1 failed expectation")
    verdict, badge, lines, ok = surfaces()
    assert (verdict, badge, ok) == ("VIOLATIONS: 1 failed expectation", "VIOLATIONS", False)
    page = (report_dir / "index.html").read_text()
    assert "no check violations" in page and "VIOLATIONS: 1 failed expectation</b>" in page  # the section agrees with the badge

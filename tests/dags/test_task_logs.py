"""What pipelines.tasks logs (the Airflow task log's lines), without Airflow: the DAG runs that
show them in a real task log are in test_dags.py."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from pipelines import tasks
from storage.log.table import LogTable


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

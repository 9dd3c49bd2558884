"""The DAGs' ingest tasks with the landing root on S3: the lakehouse profile's bucket.

The tasks (``pipelines.tasks``: what icelog_ingest and icelog_backfill run) take the landing root
as a URI or a path; Spark's executors read the objects through pyarrow (no Hadoop connector).
Local landing roots: tests/pipelines/test_ingest_ledger.py.
"""

from __future__ import annotations

import logging
import os

import pytest

from icelog.pipelines import tasks
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.lakehouse import land


def test_landing_root_is_a_path_or_a_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path))
    monkeypatch.delenv("ICELOG_LANDING", raising=False)
    assert tasks.landing_root() == tmp_path / "landing"  # local folders stay Paths, as before
    assert tasks.day_folder(None, "demo.flights", "2013-01-02") == tmp_path / "landing" / "demo.flights" / "date=2013-01-02"
    assert tasks.landing_root(f"file://{tmp_path}/in") == tmp_path / "in"
    assert (
        tasks.day_folder("s3://bucket/landing/", "demo.flights", "2013-01-02")
        == "s3://bucket/landing/demo.flights/date=2013-01-02"
    )
    monkeypatch.setenv("ICELOG_LANDING", "s3://bucket/in")
    assert tasks.landing_root() == "s3://bucket/in"
    monkeypatch.setenv("ICELOG_LANDING", "")  # set but empty: the default, not the working directory
    assert tasks.landing_root() == tmp_path / "landing"


@pytest.mark.integration
def test_ingest_and_backfill_tasks_read_an_s3_landing_root_exactly_once(spark, lakehouse, s3_landing, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="icelog.tasks")
    table = LogTable.create(lakehouse.open(), "db.events", partitions=3)
    first = land(lakehouse, f"{s3_landing}/db.events/date=2024-01-01", files=2, rows=50)
    land(lakehouse, f"{s3_landing}/db.events/date=2024-01-03", files=1, rows=30)

    day = tasks.ingest_day("db.events", "2024-01-01", landing=f"{s3_landing}/", catalog=lakehouse.name)
    assert day["rows"] == len(first) == 100
    assert sorted(f["path"] for f in day["loaded"]) == [
        f"{s3_landing}/db.events/date=2024-01-01/part-{i}.parquet" for i in (0, 1)
    ]
    assert any("loaded file" in m and f"{s3_landing}/db.events/date=2024-01-01/part-0.parquet" in m for m in caplog.messages)

    # The backfill takes the root from $ICELOG_LANDING, as the DAGs do: a day loaded before, a
    # day without a landing folder, and a new day.
    monkeypatch.setenv("ICELOG_LANDING", s3_landing)
    caplog.clear()
    filled = tasks.backfill("db.events", "2024-01-01", "2024-01-03", catalog=lakehouse.name)
    assert [(d["day"], d["rows"], d["files_loaded"], d["files_skipped"]) for d in filled["days"]] == [
        ("2024-01-01", 0, 0, 2),
        ("2024-01-02", 0, 0, 0),
        ("2024-01-03", 30, 1, 0),
    ]
    assert any("nothing to do: no landing files" in m and "day=2024-01-02" in m for m in caplog.messages)
    assert sum(w.end for w in table.watermarks().values()) == 130
    assert check_contiguity(table.table(), deep=True).ok
    again = tasks.backfill("db.events", "2024-01-01", "2024-01-03", catalog=lakehouse.name)
    assert again["rows_written"] == 0 and again["files_skipped"] == 3


@pytest.mark.integration
@pytest.mark.slow  # a whole Airflow DAG run beside SeaweedFS and PostgreSQL: minutes on 2 cores
def test_backfill_dag_run_reads_its_source_param_from_s3(lakehouse, s3_landing, tmp_path, monkeypatch):
    from infra.airflow import airflow_env, dags_test, migrate

    for key in [k for k in os.environ if k.startswith("AIRFLOW")]:  # an Airflow of its own
        monkeypatch.delenv(key)

    table = LogTable.create(lakehouse.open(), "db.events", partitions=2)
    land(lakehouse, f"{s3_landing}/db.events/date=2024-01-01", files=2, rows=20)
    # The lakehouse catalog reaches the task through the environment (ICELOG_CATALOG, PYICEBERG_CATALOG__*).
    env = airflow_env(tmp_path / "airflow", {"ICELOG_HOME": str(tmp_path), "ICELOG_SPARK_MASTER": "local[2]"})
    migrate(env)
    conf = {"table": "db.events", "source": s3_landing, "start": "2024-01-01", "end": "2024-01-01"}
    done = dags_test(env, "icelog_backfill", conf=conf)
    assert sum(w.end for w in table.watermarks().values()) == 40
    assert f"{s3_landing}/db.events/date=2024-01-01/part-1.parquet" in done.stdout  # the task log's "loaded file"
    dags_test(env, "icelog_backfill", conf=conf)
    assert sum(w.end for w in table.watermarks().values()) == 40

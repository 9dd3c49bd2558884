"""DAG runs of icelog's operators through ``dag.test()``, in one process with Airflow's
environment already set (``python -m tests.support.provider_runs``, from the repository).

``$PROVIDER_TEST_CASES`` names a JSON file of cases, each ``{"dag_id": ..., "tasks":
[[operator class name, kwargs], ...]}`` (tasks in a chain), optionally ``"meanwhile": {"after_s",
"action": "append" | "drop", "catalog", "table"}`` (done in a thread ``after_s`` seconds after
the run's task is deferred: while its trigger waits) and ``"catalog"`` (print its tables' snapshots after); a catalog
is ``{"name", "uri", "warehouse"}``, opened directly (not through Airflow). ``dag.test()`` runs a DAG of the DAG
folder, so the folder holds a file that builds the same DAGs (:data:`DAG_FILE`). The run's task
states and XComs are written as one JSON line per case to the file ``$PROVIDER_TEST_RESULTS``
names (not to stdout, where Airflow's and OpenLineage's log lines from other threads interleave).
"""

from __future__ import annotations

import json
import os
import threading

import pendulum

CASES_ENV = "PROVIDER_TEST_CASES"
RESULTS_ENV = "PROVIDER_TEST_RESULTS"
# Airflow parses a file only if it says "airflow" and "dag" (safe mode): the comment does.
DAG_FILE = "# airflow dag: icelog operator runs\nfrom tests.support.provider_runs import dags\n\nglobals().update(dags())\n"


def cases() -> list[dict]:
    with open(os.environ[CASES_ENV]) as f:
        return json.load(f)


def dags() -> dict:
    return {case["dag_id"]: build(case) for case in cases()}


def build(case: dict):
    from airflow.sdk import DAG, chain

    from icelog.provider import operators, sensors

    with DAG(case["dag_id"], schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
        tasks = []
        for name, kwargs in case["tasks"]:
            cls = getattr(operators, name, None) or getattr(sensors, name)
            tasks.append(cls(**{"retries": 0, **kwargs}))
        chain(*tasks)
    return dag


def run(case: dict) -> dict:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.sdk.serde import deserialize
    from airflow.utils.session import create_session

    dag = build(case)
    meanwhile = case.get("meanwhile")
    if meanwhile:
        threading.Thread(target=act, args=(case["dag_id"], meanwhile), daemon=True).start()
    dagrun = dag.test(logical_date=pendulum.parse(case.get("logical_date", "2026-01-02")))
    out = {"dag_id": case["dag_id"], "state": str(dagrun.state), "tasks": {}}
    with create_session() as session:
        for ti in session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dagrun.run_id):
            xcom = (
                session.query(XComModel)
                .filter_by(dag_id=dag.dag_id, run_id=dagrun.run_id, task_id=ti.task_id, key="return_value")
                .one_or_none()
            )
            value = None if xcom is None else xcom.value
            value = json.loads(value) if isinstance(value, str) else value
            out["tasks"][ti.task_id] = {"state": str(ti.state), "xcom": deserialize(value)}  # serde's tuples and the like
    if case.get("catalog"):
        out["catalog"] = snapshots(case["catalog"])
    return out


def open_catalog(spec: dict):
    from icelog.storage.core.catalog import LogSqlCatalog

    return LogSqlCatalog(spec["name"], uri=spec["uri"], warehouse=spec["warehouse"])


def act(dag_id: str, meanwhile: dict) -> None:
    import sqlite3
    import time

    from icelog.storage.log.table import LogTable

    database = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")
    while True:  # until the task deferred (dag.test() then queues it while the trigger runs)
        with sqlite3.connect(database, timeout=30) as con:
            if con.execute("SELECT 1 FROM task_instance WHERE dag_id = ? AND next_method IS NOT NULL", (dag_id,)).fetchone():
                break
        time.sleep(0.5)
    time.sleep(meanwhile["after_s"])
    table = LogTable.open(open_catalog(meanwhile["catalog"]), meanwhile["table"])
    if meanwhile["action"] == "append":
        table.append({0: [{"key": "late", "value": "1"}] * 3})
    else:
        table.drop(purge=True)


def snapshots(spec: dict) -> dict[str, int | None]:
    """Every table of the catalog (log tables and icelog's own) and its current snapshot."""
    catalog = open_catalog(spec)
    return {
        ".".join(ident): catalog.load_table(ident).metadata.current_snapshot_id
        for namespace in catalog.list_namespaces()
        for ident in catalog.list_tables(namespace)
    }


if __name__ == "__main__":
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a run that hangs waits: kill -USR1
    for case in cases():
        result = json.dumps(run(case), default=str)
        with open(os.environ[RESULTS_ENV], "a") as out:
            out.write(result + "\n")

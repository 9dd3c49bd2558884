"""The watcher trigger under a real Airflow (scheduler, DAG processor, API server, triggerer;
LocalExecutor on SQLite): one Asset event per committed range, and after the triggerer is
killed with SIGKILL and started again, the ranges committed meanwhile once, the old ones never.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import time

import pytest

from infra.airflow import airflow_bin, airflow_env, api_env, free_port, migrate, services

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # about 90 s on 2 busy cores

DAG = """# an airflow dag: runs for each committed range of demo.events
import pendulum
from airflow.sdk import AssetWatcher, dag, task

from icelog.provider.assets import icelog_asset
from icelog.provider.triggers import IcelogLogTrigger

events = icelog_asset(
    "demo.events",
    "lake",
    watchers=[AssetWatcher(name="events_commits", trigger=IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", poll_interval=1))],
)


@dag(schedule=[events], start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, is_paused_upon_creation=False)
def on_events():
    @task
    def consume():
        pass

    consume()


on_events()
"""


def until(what: str, check, procs: dict, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            assert proc.poll() is None, f"airflow {name} exited ({proc.returncode}) while waiting for {what}"
        found = check()
        if found:
            return found
        time.sleep(1)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


@pytest.mark.timeout(900)
def test_a_watcher_fires_once_per_range_across_a_triggerer_killed_with_sigkill(lake, tmp_path, monkeypatch):
    from icelog.storage.log.table import LogTable

    catalog, spec = lake
    table = LogTable.create(catalog, "demo.events", 1)
    for key in [k for k in os.environ if k.startswith(("AIRFLOW", "ICELOG_", "PYICEBERG_"))]:
        monkeypatch.delenv(key)
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "on_events.py").write_text(DAG)
    port = free_port()
    extra = {"uri": spec["uri"], "warehouse": spec["warehouse"], "catalog_name": "lake"}
    env = airflow_env(
        tmp_path / "airflow",
        {
            "ICELOG_HOME": str(tmp_path / "home"),
            **api_env(port),
            "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__PARALLELISM": "2",
            # A killed triggerer's triggers go to the next one once its heartbeat is this old.
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW_CONN_LAKE": json.dumps({"conn_type": "icelog", "extra": extra}),
        },
    )
    migrate(env)
    database = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")

    def query(sql: str) -> list:
        with contextlib.closing(sqlite3.connect(database, timeout=30)) as con:
            return con.execute(sql).fetchall()

    def fired() -> list:
        rows = query("SELECT extra FROM asset_event ORDER BY id")
        return [json.loads(extra)["payload"]["ranges"] for (extra,) in rows if json.loads(extra).get("from_trigger")]

    def stored():
        rows = query("SELECT value FROM asset_state_store WHERE key = 'icelog.position'")
        return json.loads(rows[0][0]) if rows else None

    logs = tmp_path / "services"
    with services(env, logs) as procs:
        try:
            # The trigger writes its starting position (the log end, 0) when it first runs.
            assert until("the watcher's start", stored, procs, 420) == {"table": "demo.events", "ends": {"0": 0}}
            table.append({0: [{"key": "k", "value": "v"}] * 2})
            assert until("the first event", fired, procs, 120) == [{"0": [0, 2]}]
            until("its position", lambda: stored()["ends"] == {"0": 2}, procs, 60)

            os.killpg(procs["triggerer"].pid, signal.SIGKILL)
            procs["triggerer"].wait()
            table.append({0: [{"key": "k", "value": "v"}] * 3})  # while no triggerer runs
            with open(logs / "triggerer.log", "ab") as out:
                procs["triggerer"] = subprocess.Popen(
                    [airflow_bin(), "triggerer"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            assert until("the event after the restart", lambda: len(fired()) >= 2 and fired(), procs, 300) == [
                {"0": [0, 2]},
                {"0": [2, 5]},
            ]
            table.append({0: [{"key": "k", "value": "v"}]})
            assert until("the next event", lambda: len(fired()) >= 3 and fired(), procs, 120) == [
                {"0": [0, 2]},
                {"0": [2, 5]},
                {"0": [5, 6]},
            ]
            time.sleep(5)
            assert len(fired()) == 3  # nothing fired twice
            assert until(
                "a run of on_events", lambda: query("SELECT count(*) FROM dag_run WHERE dag_id = 'on_events'")[0][0], procs, 300
            )
        except BaseException as failure:
            failure.add_note("\n".join(f"--- {f}\n{f.read_text(errors='replace')[-4000:]}" for f in sorted(logs.glob("*.log"))))
            raise

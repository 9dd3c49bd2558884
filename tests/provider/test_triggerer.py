"""A team's DAG folder under a real Airflow (scheduler, DAG processor, API server, triggerer;
LocalExecutor on SQLite): the folder has its own ``pipelines`` and ``storage`` packages, and one
DAG built from the provider's public trigger and operator. One Asset event and one DAG run per
committed range; after the triggerer is killed with SIGKILL and started again, the ranges
committed meanwhile once, the old ones never; the team's packages and icelog's both import in
every run. The catalog is an Airflow connection: no icelog catalog setting.
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

# The provider's acceptance test, so it runs in make test: about 2 to 3 minutes on 2 busy cores.
pytestmark = [pytest.mark.integration]

DAG = """# an airflow dag: runs for each committed range of demo.events
import pendulum
from airflow.sdk import AssetWatcher, dag, task

import pipelines  # the team's own packages, named like icelog's folders
import storage
from icelog.provider.assets import icelog_asset
from icelog.provider.operators import IcelogMaintainOperator
from icelog.provider.triggers import IcelogLogTrigger

assert (pipelines.OWNER, storage.OWNER) == ("team", "team")

events = icelog_asset(
    "demo.events",
    "lake",
    watchers=[AssetWatcher(name="events_commits", trigger=IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", poll_interval=1))],
)


@dag(schedule=[events], start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, is_paused_upon_creation=False)
def on_events():
    @task
    def imports():
        import pipelines
        import storage

        import icelog.pipelines
        import icelog.storage

        assert (pipelines.OWNER, storage.OWNER) == ("team", "team"), (pipelines.__file__, storage.__file__)
        assert "/dags/" not in icelog.pipelines.__file__ and "/dags/" not in icelog.storage.__file__

    imports() >> IcelogMaintainOperator(task_id="maintain", table="demo.events", icelog_conn_id="lake")


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
    for package in ("pipelines", "storage"):  # a team's packages: Airflow puts the DAG folder on sys.path
        (tmp_path / "dags" / package).mkdir()
        (tmp_path / "dags" / package / "__init__.py").write_text('OWNER = "team"\n')
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

    def runs_by_event() -> list:
        """Per DAG run of on_events, the ranges of the events it consumed."""
        rows = query(
            "SELECT r.id, e.extra FROM dag_run r JOIN dagrun_asset_event l ON l.dag_run_id = r.id "
            "JOIN asset_event e ON e.id = l.event_id WHERE r.dag_id = 'on_events' ORDER BY r.id, e.id"
        )
        runs: dict[int, list] = {}
        for run_id, extra in rows:
            runs.setdefault(run_id, []).append(json.loads(extra)["payload"]["ranges"])
        return list(runs.values())

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
            assert until("the first run", runs_by_event, procs, 300) == [[{"0": [0, 2]}]]

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
            until("the second run", lambda: len(runs_by_event()) >= 2, procs, 300)
            table.append({0: [{"key": "k", "value": "v"}]})
            assert until("the next event", lambda: len(fired()) >= 3 and fired(), procs, 120) == [
                {"0": [0, 2]},
                {"0": [2, 5]},
                {"0": [5, 6]},
            ]
            time.sleep(5)
            assert len(fired()) == 3  # nothing fired twice

            def runs() -> list:
                done = query("SELECT state FROM dag_run WHERE dag_id = 'on_events' ORDER BY id")
                return done if len(done) >= 3 and all(state in ("success", "failed") for (state,) in done) else None

            assert until("three finished runs of on_events", runs, procs, 420) == [("success",)] * 3
            # Each committed range ran the DAG once: one event per run, none twice.
            assert runs_by_event() == [[{"0": [0, 2]}], [{"0": [2, 5]}], [{"0": [5, 6]}]]
        except BaseException as failure:
            failure.add_note("\n".join(f"--- {f}\n{f.read_text(errors='replace')[-4000:]}" for f in sorted(logs.glob("*.log"))))
            raise

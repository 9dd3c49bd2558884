"""icelog_maintenance: daily retention, compaction that keeps offsets, snapshot expiry, orphan cleanup."""

from __future__ import annotations

from airflow.sdk import dag, task

from icelog.dags.icelog_common import DAG_DEFAULTS, TABLES, task_id


@dag(
    dag_id="icelog_maintenance",
    schedule="@daily",
    max_active_runs=1,
    doc_md=__doc__,
    **DAG_DEFAULTS,
)
def icelog_maintenance():
    for table in TABLES:

        @task(task_id=task_id("maintain", table))
        def maintain(table: str = table) -> dict:
            from icelog.pipelines.tasks import maintain as run

            return run(table)

        maintain()


icelog_maintenance()

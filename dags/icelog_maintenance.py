"""icelog_maintenance: daily retention, compaction that keeps offsets, snapshot expiry, orphan cleanup."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from dags.icelog_common import DEFAULT_ARGS, TABLES


@dag(
    dag_id="icelog_maintenance",
    schedule="@daily",
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["icelog"],
    doc_md=__doc__,
)
def icelog_maintenance():
    for table in TABLES:

        @task(task_id=f"maintain__{table.replace('.', '__')}")
        def maintain(table: str = table) -> dict:
            from pipelines.tasks import maintain as run

            return run(table)

        maintain()


icelog_maintenance()

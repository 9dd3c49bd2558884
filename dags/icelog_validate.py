"""icelog_validate: after every write to a log table (its Asset), run every check; fail on violations."""

from __future__ import annotations

import pendulum
from airflow.sdk import AssetAny, dag, task

from dags.icelog_common import DEFAULT_ARGS, TABLES, table_asset


@dag(
    dag_id="icelog_validate",
    schedule=AssetAny(*[table_asset(t) for t in TABLES]),
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    default_args={**DEFAULT_ARGS, "retries": 0},
    tags=["icelog"],
    doc_md=__doc__,
)
def icelog_validate():
    for table in TABLES:

        @task(task_id=f"validate__{table.replace('.', '__')}")
        def validate(table: str = table) -> dict:
            from pipelines.tasks import validate as run

            return run(table, deep=True)

        validate()


icelog_validate()

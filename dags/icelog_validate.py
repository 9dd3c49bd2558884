"""icelog_validate: after every write to a log table (its Asset), run every check; fail on violations."""

from __future__ import annotations

from airflow.sdk import AssetAny, dag, task

from icelog.dags.icelog_common import DAG_DEFAULTS, TABLES, table_asset, task_id


@dag(
    dag_id="icelog_validate",
    schedule=AssetAny(*[table_asset(t) for t in TABLES]),
    doc_md=__doc__,
    is_paused_upon_creation=False,  # the demo's DAGs: unpaused in the UI from the start
    **DAG_DEFAULTS,  # retries for what is not icelog's (an API server not up yet); violations fail at once
)
def icelog_validate():
    for table in TABLES:

        @task(task_id=task_id("validate", table))
        def validate(table: str = table) -> dict:
            from icelog.pipelines.tasks import validate as run

            return run(table, deep=True)

        validate()


icelog_validate()

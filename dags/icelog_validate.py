"""icelog_validate: after every write to a log table (its Asset), run every check; fail on violations."""

from __future__ import annotations

from airflow.sdk import AssetAny, dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, TABLES, table_asset, task_id
from icelog.provider.operators import IcelogValidateOperator


@dag(
    dag_id="icelog_validate",
    schedule=AssetAny(*[table_asset(t) for t in TABLES]),
    doc_md=__doc__,
    is_paused_upon_creation=False,  # the demo's DAGs: unpaused in the UI from the start
    **DAG_DEFAULTS,  # retries for what is not icelog's (an API server not up yet); violations fail at once
)
def icelog_validate():
    for table in TABLES:
        IcelogValidateOperator(task_id=task_id("validate", table), table=table, icelog_conn_id=CONN_ID, deep=True)


icelog_validate()

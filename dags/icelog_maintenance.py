"""icelog_maintenance: daily retention, compaction that keeps offsets, snapshot expiry, orphan cleanup."""

from __future__ import annotations

from airflow.sdk import dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, TABLES, task_id
from icelog.provider.operators import IcelogMaintainOperator


@dag(
    dag_id="icelog_maintenance",
    schedule="@daily",
    max_active_runs=1,
    doc_md=__doc__,
    **DAG_DEFAULTS,
)
def icelog_maintenance():
    for table in TABLES:
        IcelogMaintainOperator(task_id=task_id("maintain", table), table=table, icelog_conn_id=CONN_ID)


icelog_maintenance()

"""icelog_ingest: each day, ingest that day's landing files into every configured log table."""

from __future__ import annotations

from airflow.sdk import dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, LANDING, TABLES, task_id
from icelog.provider.operators import IcelogIngestOperator


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
        # No landing files that day: skipped, so the table's Asset is not updated and
        # icelog_validate does not run for a day that changed nothing.
        IcelogIngestOperator(
            task_id=task_id("ingest", table), table=table, icelog_conn_id=CONN_ID, landing=LANDING or None, skip_when_empty=True
        )


icelog_ingest()

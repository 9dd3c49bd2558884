"""icelog_mirror: every 5 minutes, mirror each table to the disaster-recovery catalog with the same offsets.

The target catalog is ``$ICELOG_MIRROR_CATALOG`` (or the run's ``target_catalog`` param); the
principal (``$ICELOG_PRINCIPAL``) needs ``replicator-write`` there (``icelog acls add``). Each
step copies only what the source committed since the last one, and resumes after a crash.
A gap (the source's retention ran first) or a re-created source fails the task: it never
skips offsets.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, SETTINGS, TABLES, task_id
from icelog.provider.operators import IcelogMirrorOperator


@dag(
    dag_id="icelog_mirror",
    schedule=timedelta(minutes=5),
    max_active_runs=1,
    doc_md=__doc__,
    **DAG_DEFAULTS,
    params={
        "target_catalog": Param(
            SETTINGS.mirror_catalog,
            type=["null", "string"],
            description="pyiceberg catalog name of the copies (empty: $ICELOG_MIRROR_CATALOG)",
        ),
    },
)
def icelog_mirror():
    for table in TABLES:
        IcelogMirrorOperator(
            task_id=task_id("mirror", table),
            table=table,
            icelog_conn_id=CONN_ID,
            target_catalog="{{ params.target_catalog or '' }}",  # empty: $ICELOG_MIRROR_CATALOG
        )


icelog_mirror()

"""icelog_backfill: manual trigger; ingest a date range of landing files, each file exactly once.

Files already loaded (by the scheduled DAG, an earlier backfill, or Airflow's own backfill of
``icelog_ingest``), however long ago, are found in the ingest ledger and skipped; files that
landed late in a day already ingested are loaded. A file whose content changed since it was
loaded fails the run (``SourceFileChanged``) unless ``reload_changed`` is set.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, LANDING, NAME_PATTERN, TABLES, table_asset
from icelog.provider.operators import IcelogBackfillOperator


@dag(
    dag_id="icelog_backfill",
    schedule=None,
    doc_md=__doc__,
    is_paused_upon_creation=False,  # the demo's DAGs: unpaused in the UI from the start
    # The params reach the operator as they are: partitions a list, reload_changed a bool, None as None.
    render_template_as_native_obj=True,
    **DAG_DEFAULTS,
    params={
        "table": Param(TABLES[0], type="string", pattern=NAME_PATTERN, description="Log table, namespace.table"),
        # Nullable: the UI's form sends an empty field as null, so a required "" would keep Trigger disabled.
        "source": Param(
            LANDING or None,
            type=["null", "string"],
            description="Landing root, a folder or s3://bucket/prefix (empty: $ICELOG_LANDING, else $ICELOG_HOME/landing)",
        ),
        "start": Param("2013-01-01", type="string", format="date", description="First day (inclusive)"),
        "end": Param("2013-01-31", type="string", format="date", description="Last day (inclusive)"),
        "partitions": Param(
            None,
            type=["null", "array"],
            items={"type": "integer", "minimum": 0},
            description="Only these log partitions (default: all)",
        ),
        "format": Param("parquet", type="string", enum=["parquet", "csv", "jsonl"]),
        "key_column": Param(
            None,
            type=["null", "string"],
            description="Column whose hash picks the log partition (default: the table's icelog.key-column)",
        ),
        "reload_changed": Param(
            False, type="boolean", description="Load files whose content changed since they were loaded again, as new rows"
        ),
    },
)
def icelog_backfill():
    IcelogBackfillOperator(
        task_id="backfill",
        outlets=[table_asset(t) for t in TABLES],
        icelog_conn_id=CONN_ID,
        table="{{ params.table }}",
        start="{{ params.start }}",
        end="{{ params.end }}",
        landing="{{ params.source or None }}",
        fmt="{{ params.format }}",
        key_column="{{ params.key_column }}",
        partitions="{{ params.partitions }}",
        reload_changed="{{ params.reload_changed | default(false) }}",
    )


icelog_backfill()

"""icelog_fanout: manual trigger; copy a log table's new records to routed tables, exactly once.

One transaction per run commits every target table's rows and the consumer group's new
position on the source (consume–transform–produce). A run that crashed is finished or
aborted by the next run (``init_transactions``), so a re-run writes each record once.
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from icelog.dags.icelog_common import CONN_ID, DAG_DEFAULTS, NAME_PATTERN
from icelog.provider.operators import IcelogFanOutOperator

COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


@dag(
    dag_id="icelog_fanout",
    schedule=None,
    max_active_runs=1,
    doc_md=__doc__,
    # The params reach the operator as they are: routes a mapping, not its text.
    render_template_as_native_obj=True,
    **DAG_DEFAULTS,
    params={
        "source": Param("demo.flights", type="string", pattern=NAME_PATTERN, description="Source log table, namespace.table"),
        "group": Param("fanout", type="string", pattern=COLUMN_PATTERN, description="Consumer group holding the source position"),
        "routes": Param(
            {},
            type="object",
            additionalProperties={"type": "string", "pattern": NAME_PATTERN},
            description="{route value: target table}",
        ),
        "route_column": Param("key", type="string", pattern=COLUMN_PATTERN),
        "key_column": Param(
            "key", type="string", pattern=COLUMN_PATTERN, description="Column whose hash picks the target partition"
        ),
    },
)
def icelog_fanout():
    IcelogFanOutOperator(
        task_id="fanout",
        icelog_conn_id=CONN_ID,
        table="{{ params.source }}",
        group="{{ params.group }}",
        routes="{{ params.routes }}",
        route_column="{{ params.route_column }}",
        key_column="{{ params.key_column }}",
    )


icelog_fanout()

"""icelog_fanout: manual trigger; copy a log table's new records to routed tables, exactly once.

One transaction per run commits every target table's rows and the consumer group's new
position on the source (consume–transform–produce). A run that crashed is finished or
aborted by the next run (``init_transactions``), so a re-run writes each record once.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from icelog.dags.icelog_common import DAG_DEFAULTS, NAME_PATTERN

COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


@dag(
    dag_id="icelog_fanout",
    schedule=None,
    max_active_runs=1,
    doc_md=__doc__,
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
    @task
    def fanout(params: dict | None = None) -> dict:
        from icelog.pipelines.tasks import fanout as run

        return run(
            params["source"],
            params["group"],
            params["routes"],
            route_column=params["route_column"],
            key_column=params["key_column"],
        )

    fanout()


icelog_fanout()

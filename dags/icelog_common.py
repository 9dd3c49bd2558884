"""Shared wiring for the icelog DAGs: which tables, their Assets, the retry policy.

Only the standard library, ``airflow.sdk`` and icelog's settings (stdlib-only) are imported
here: DAG parsing stays light.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, ExceptionRetryPolicy, RetryAction, RetryRule

from icelog.provider.assets import icelog_asset
from icelog.storage.settings import Settings

SETTINGS = Settings.load()  # the DAG files' one read of the environment, at parse time
# Log tables the scheduled DAGs serve: ICELOG_TABLES="demo.flights,db.events".
TABLES = list(SETTINGS.tables)
LANDING = SETTINGS.landing or ""
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$"
# The catalog's Airflow connection (type icelog); unset: icelog's own default catalog
# ($ICELOG_CATALOG, .pyiceberg.yaml, or the embedded one under $ICELOG_HOME).
CONN_ID = SETTINGS.conn_id


def task_id(action: str, table: str) -> str:
    return f"{action}__{table.replace('.', '__')}"


def table_asset(table: str) -> Asset:
    """icelog://<catalog>/<namespace>/<table>: what the ingest tasks write, what icelog_validate runs on."""
    return icelog_asset(table, CONN_ID)


# Retry semantics live in icelog's exception types (storage.errors), not in messages:
# * TransientError (a lost commit race, an unreachable catalog): the same request may succeed;
# * AbortableError (an offset mismatch: another writer moved the log): the task re-runs from
#   the start, so it re-reads the watermarks and decides again;
# * every other icelog error (bad input, a fenced producer, violations) fails at once.
# Errors that are not icelog's (Spark, the OS) get the task's ordinary retries.
RETRY_POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(
            exception="icelog.storage.errors.TransientError",
            action=RetryAction.RETRY,
            retry_delay=timedelta(seconds=10),
            reason="transient: retry the same work",
        ),
        RetryRule(
            exception="icelog.storage.errors.AbortableError",
            action=RetryAction.RETRY,
            retry_delay=timedelta(seconds=5),
            reason="abortable: redo from the start on the current log",
        ),
        RetryRule(
            exception="icelog.storage.errors.IcelogError",
            action=RetryAction.FAIL,
            reason="terminal: bad input, fenced, or violations",
        ),
    ],
)

DEFAULT_ARGS = {"owner": "icelog", "retries": 3, "retry_delay": timedelta(seconds=30), "retry_policy": RETRY_POLICY}

# What every icelog DAG shares (each DAG adds its id, schedule and doc).
DAG_DEFAULTS = {
    "start_date": pendulum.datetime(2013, 1, 1, tz="UTC"),
    "catchup": False,
    "default_args": DEFAULT_ARGS,
    "tags": ["icelog"],
}

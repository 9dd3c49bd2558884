"""Airflow metadata-database settings for icelog's Airflow homes (Airflow imports them by name).

SQLite's default busy timeout (5 s) is short beside a busy scheduler, DAG processor and API
server: a CLI command such as ``airflow backfill create`` then fails half-way with "database
is locked", leaving a partial backfill. Waiting longer for the lock avoids that.

The API server keeps the default: it waits for the lock on its one event loop (the audit log
of a UI or REST write commits there), so no request is answered meanwhile, and the lock may be
held by one of its own request threads, whose transaction needs that loop to end. Only giving
up ends that wait (the write fails with HTTP 500); at 60 s it froze the server for a minute
while a task started.
"""

import sys

API_SERVER = sys.argv[1:2] == ["api-server"]  # also in its uvicorn workers: spawn passes argv on
SQLITE_CONNECT_ARGS = {"timeout": 5 if API_SERVER else 60}

"""Airflow metadata-database settings for icelog's Airflow homes (Airflow imports them by name).

SQLite's default busy timeout (5 s) is short beside a busy scheduler, DAG processor and API
server: a CLI command such as ``airflow backfill create`` then fails half-way with "database
is locked", leaving a partial backfill. Waiting longer for the lock avoids that.
"""

SQLITE_CONNECT_ARGS = {"timeout": 60}

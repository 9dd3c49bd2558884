"""DuckDB over log tables: every log table as a view under its own qualified name.

DuckDB reads the Parquet files that pyiceberg plans for a snapshot, so no DuckDB extension
(and no download) is needed.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from storage.log import list_log_tables
from storage.files import local_path


def planned_paths(table: Table, snapshot_id: int | None = None) -> list[str]:
    return [local_path(t.file.file_path) for t in table.scan(snapshot_id=snapshot_id).plan_files()]


def snapshot_as_of(table: Table, timestamp_ms: int) -> int | None:
    """The snapshot that was current at ``timestamp_ms`` (None: the table was empty then)."""
    chosen = None
    for entry in table.metadata.snapshot_log:
        if entry.timestamp_ms <= timestamp_ms:
            chosen = entry.snapshot_id
    return chosen


def register_table(
    con: duckdb.DuckDBPyConnection, name: str, table: Table, snapshot_id: int | None = None
) -> None:
    namespace, table_name = name.split(".")
    con.execute(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
    paths = planned_paths(table, snapshot_id) if snapshot_id is not None or table.metadata.current_snapshot_id else []
    target = f'"{namespace}"."{table_name}"'
    if paths:
        # Views cannot take prepared parameters: inline the paths as escaped literals.
        listing = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
        con.execute(f"CREATE OR REPLACE VIEW {target} AS SELECT * FROM read_parquet([{listing}])")
        return
    _register_empty(con, name, table)


def _register_empty(con: duckdb.DuckDBPyConnection, name: str, table: Table) -> None:
    """No data (yet, or at that time): an empty, typed view, so queries parse and return nothing."""
    namespace, table_name = name.split(".")
    con.execute(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
    empty = pa.Table.from_pylist([], schema=table.schema().as_arrow())
    con.register(f"__empty_{namespace}_{table_name}", empty)
    con.execute(f'CREATE OR REPLACE VIEW "{namespace}"."{table_name}" AS SELECT * FROM __empty_{namespace}_{table_name}')


def connect(
    catalog: Catalog,
    *,
    snapshot_id: int | None = None,
    as_of_ms: int | None = None,
    only: str | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with log tables as views.

    Args:
        catalog: The catalog whose log tables to expose.
        snapshot_id: Time travel for ``only`` (a snapshot id belongs to one table).
        as_of_ms: Time travel for every table: the snapshot current at this time.
        only: Expose just this table.
    """
    con = con or duckdb.connect()
    names = [only] if only else list_log_tables(catalog)
    for name in names:
        table = catalog.load_table(name)
        sid = snapshot_id
        if as_of_ms is not None:
            sid = snapshot_as_of(table, as_of_ms)
            if sid is None:
                _register_empty(con, name, table)
                continue
        register_table(con, name, table, sid)
    return con

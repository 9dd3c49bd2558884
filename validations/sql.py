"""DuckDB over log tables: every log table as a view under its own qualified name.

DuckDB reads the Parquet files that pyiceberg plans for a snapshot, so no DuckDB extension
(and no download) is needed: local files through ``read_parquet``, files on an object store
(``s3://…``) as a pyarrow dataset over the table's FileIO, into which DuckDB pushes its
projections and filters.

Time travel never answers from history that is gone. A snapshot id that is not retained
raises :class:`UnknownSnapshot` (or :class:`HistoryExpired` when the table shows that it
existed), and a time older than the retained history raises :class:`HistoryExpired`: an
empty answer there would be a false one. A time before the table's first snapshot answers
the empty table, which is what the table held then.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icelog.storage.core.commit import load
from icelog.storage.core.swap import load_tables
from icelog.storage.core.system import NAMESPACE as SYSTEM_NAMESPACE
from icelog.storage.errors import HistoryExpired, InvalidInput, UnknownSnapshot
from icelog.storage.ingest.ledger import LEDGER_TABLE
from icelog.storage.log import scan
from icelog.storage.log.table import LogTable, list_log_tables
from icelog.storage.producers.cut import consistent_cut


def planned_paths(table: Table, snapshot_id: int | None = None) -> list[str]:
    """Data files of a snapshot (default: the current one); an unknown snapshot raises."""
    if snapshot_id is not None:
        resolve_snapshot(table, snapshot_id)
    return scan.planned_paths(table, snapshot_id)


def _name(table: Table) -> str:
    return ".".join(table.name()[-2:])


def _iso(timestamp_ms: int) -> str:
    try:
        return datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # beyond datetime's years 1..9999
        return f"{timestamp_ms} ms after the epoch"


def _oldest_retained(table: Table) -> str | None:
    snapshots = table.metadata.snapshots
    return _iso(min(s.timestamp_ms for s in snapshots)) if snapshots else None


def resolve_snapshot(table: Table, snapshot_id: int) -> int:
    """``snapshot_id`` if the table still has it.

    Raises:
        HistoryExpired: the snapshot existed but has been expired (the table's snapshot log,
            a retained snapshot's parent or a previous metadata file still names it).
        UnknownSnapshot: no such snapshot is retained (never existed, or expired long ago).
    """
    retained = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    if any(s.snapshot_id == snapshot_id for s in retained):
        return snapshot_id
    if _once_existed(table, snapshot_id):
        raise HistoryExpired(table=_name(table), requested=f"snapshot {snapshot_id}", oldest=_oldest_retained(table))
    raise UnknownSnapshot(table=_name(table), snapshot_id=snapshot_id, retained=[s.snapshot_id for s in retained])


def _once_existed(table: Table, snapshot_id: int) -> bool:
    """Evidence that ``snapshot_id`` was a snapshot of this table (only read on the error path)."""
    meta = table.metadata
    if any(e.snapshot_id == snapshot_id for e in meta.snapshot_log):
        return True  # writers that keep the log of expired snapshots (Java's expiry does, partly)
    if any(s.parent_snapshot_id == snapshot_id for s in meta.snapshots):
        return True
    for entry in reversed(meta.metadata_log):  # previous metadata files, newest first
        try:
            with table.io.new_input(entry.metadata_file).open() as f:
                previous = json.load(f)
        except Exception:  # noqa: BLE001 - a deleted or unreadable old file is just no evidence
            continue
        if any(s.get("snapshot-id") == snapshot_id for s in previous.get("snapshots", [])):
            return True
    return False


def _expired_gaps(table: Table) -> list[tuple[int | None, int | None]]:
    """Time windows in which snapshots that are no longer retained were created.

    Sequence numbers (format v2+) count every snapshot ever added: 1, 2, 3, ... A number
    missing from the retained snapshots is an expired snapshot, created after the retained
    snapshot numbered just below it and before the one numbered just above it. Each window is
    ``(low_ms, high_ms)``; ``None`` is unbounded (e.g. expired snapshots older than all).
    pyiceberg's expiry drops the expired snapshots' snapshot-log entries too, so the log
    alone cannot show this.
    """
    meta = table.metadata
    if meta.format_version < 2:
        return []
    ordered = sorted(meta.snapshots, key=lambda s: s.sequence_number)
    gaps: list[tuple[int | None, int | None]] = []
    previous: Snapshot | None = None
    for snapshot in ordered:
        below = previous.sequence_number if previous else 0
        if snapshot.sequence_number > below + 1:
            gaps.append((previous.timestamp_ms if previous else None, snapshot.timestamp_ms))
        previous = snapshot
    if meta.last_sequence_number > (previous.sequence_number if previous else 0):
        gaps.append((previous.timestamp_ms if previous else None, None))
    return gaps


def snapshot_as_of(table: Table, timestamp_ms: int) -> int | None:
    """The snapshot that was current at ``timestamp_ms``; None: the table was empty then.

    Raises:
        HistoryExpired: the snapshot current at that time has been expired, or may have been
            (snapshots created in that stretch are gone), so no answer would be right.
    """
    chosen = None
    for entry in table.metadata.snapshot_log:
        if entry.timestamp_ms <= timestamp_ms:
            chosen = entry
    retained = {s.snapshot_id for s in table.metadata.snapshots}
    if chosen is not None and chosen.snapshot_id not in retained:
        raise HistoryExpired(table=_name(table), requested=_iso(timestamp_ms), oldest=_oldest_retained(table))
    since = chosen.timestamp_ms if chosen is not None else None
    for low, high in _expired_gaps(table):
        # An expired snapshot created in (low, high] could have become current in (since, as_of].
        # (Two commits in one millisecond are ordered by the log: low < as_of, not <=.)
        if (low is None or low < timestamp_ms) and (since is None or high is None or high > since):
            oldest = _iso(high) if high is not None else _oldest_retained(table)
            raise HistoryExpired(table=_name(table), requested=_iso(timestamp_ms), oldest=oldest)
    return chosen.snapshot_id if chosen is not None else None


def register_table(con: duckdb.DuckDBPyConnection, name: str, table: Table, snapshot_id: int | None = None) -> None:
    namespace, table_name = name.split(".")
    con.execute(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
    paths = planned_paths(table, snapshot_id) if snapshot_id is not None or table.metadata.current_snapshot_id else []
    target = f'"{namespace}"."{table_name}"'
    if paths:
        # No Hive partitioning: folder names of data files (Spark's ``…/p=N/`` staging) are not
        # columns of the table; DuckDB would otherwise infer them. Files on S3 are a pyarrow
        # dataset (no extension needed), into which DuckDB pushes projections and filters.
        source = scan.parquet_from(con, paths, table.io, "hive_partitioning = false")
        con.execute(f"CREATE OR REPLACE VIEW {target} AS SELECT * FROM {source}")
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
    consistent: bool = True,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with log tables (and the ingest ledger) as views.

    A new connection uses the time zone UTC, so ``timestamptz`` values (``log_timestamp``)
    print the same on every machine.

    Args:
        catalog: The catalog whose log tables to expose.
        snapshot_id: Time travel for ``only`` (a snapshot id belongs to one table).
        as_of_ms: Time travel for every table: the snapshot current at this time. System
            tables (``icelog_system.*``, the ingest ledger included) are left out of a
            catalog-wide cut: they hold state whose history is compacted (the transaction
            journal keeps 10 snapshots), so they would only ever answer ``HistoryExpired``.
            Name one with ``only`` to travel in it alone.
        only: Expose just this table (``namespace.table``; a bare name is in ``logs``).
        consistent: Read every table as one moment, so a transaction is seen whole or not at
            all: the pointers at one catalog instant (one database read on a SQL catalog), and
            on a catalog where tables roll forward one by one, a transaction not yet in all of
            its tables held back in each (:func:`consistent_cut`). False loads the tables one by
            one, as a plain Iceberg reader does.

    Raises:
        InvalidInput: ``snapshot_id`` without ``only``, or both ``snapshot_id`` and ``as_of_ms``.
        UnknownTable, NotALogTable, InvalidIdentifier: ``only`` is not a log table.
        UnknownSnapshot, HistoryExpired: the time travel asks for history that is not retained.
    """
    if snapshot_id is not None and only is None:
        raise InvalidInput(reason="a snapshot id names one table's snapshot: pass only=TABLE")
    if snapshot_id is not None and as_of_ms is not None:
        raise InvalidInput(reason="time travel takes a snapshot id or a time, not both")
    tables: list[tuple[str, Table]]
    if only:
        log_table = LogTable.open(catalog, only)
        tables = [(log_table.identifier, log_table.table())]
    else:
        names = list_log_tables(catalog)
        if catalog.table_exists(LEDGER_TABLE):  # which source files were loaded where, queryable too
            names.append(LEDGER_TABLE)
        if as_of_ms is not None:  # system tables keep current state, their history bounded: no cut
            names = [n for n in names if n.split(".")[0] != SYSTEM_NAMESPACE]
        if consistent:  # one catalog instant: never half of a multi-table commit (I5)
            tables = list(load_tables(catalog, names).items()) if names else []
        else:
            tables = [(name, load(catalog, name)) for name in names]
    # Resolve every time travel before building anything: bad history raises, nothing half-made.
    chosen: dict[str, int | None] = {}
    for name, table in tables:
        if as_of_ms is not None:
            chosen[name] = snapshot_as_of(table, as_of_ms)
        elif snapshot_id is not None:
            chosen[name] = resolve_snapshot(table, snapshot_id)
        else:
            chosen[name] = table.metadata.current_snapshot_id
    if consistent and len(tables) > 1:  # a transaction not whole at that moment is held back everywhere
        cut = consistent_cut(catalog, list(chosen), dict(tables), at=chosen if as_of_ms is not None else None)
        chosen = dict(cut.snapshots)
    if con is None:
        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
    for name, table in tables:
        if chosen[name] is None:
            _register_empty(con, name, table)
        else:
            register_table(con, name, table, chosen[name])
    return con

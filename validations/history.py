"""What a table's history looks like, from sources that outlive snapshot expiry.

Only the newest ``icelog.snapshots.keep`` snapshots (20) are retained, so their summaries
cannot draw a table's history. Two durable sources can:

* the commit registry (``storage.core.registry``: table properties and registry files, the last ``icelog.commit-ids.keep``
  commits, 1,000 by default): each commit's id and, for appends, the offset ranges it added;
* the rows themselves: every row carries its append time (``log_timestamp``). The time of a
  commit is the append time of the first row of its first range, found by a hash join of the
  commits' first offsets against the planned files (DuckDB, at scan speed). Rows per day count
  the rows by their event time where the table has one (:func:`event_time_column`): a backfill
  of last year loaded today is last year's rows, not today's.

Rows removed by retention take their commits' times with them: those commits keep their place
and size, without a time, until the registry forgets them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from pyiceberg.table import Table
from pyiceberg.types import TimestamptzType

from icelog.storage.core.registry import all_commits
from icelog.storage.ingest.ledger import RECEIPT_KEY
from icelog.storage.log import schema as cols
from icelog.storage.log.scan import parquet_from, planned_paths


@dataclass(frozen=True)
class CommitEntry:
    """One commit in the registry, oldest first."""

    seq: int
    commit_id: str
    rows: int
    ranges: dict[int, tuple[int, int]]
    snapshot_id: int | None
    timestamp_ms: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"time": iso(self.timestamp_ms)}


def iso(timestamp_ms: int | None) -> str | None:
    if timestamp_ms is None:
        return None
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).isoformat(timespec="seconds")


def _appended_ranges(receipt: Any) -> dict[int, tuple[int, int]]:
    """An append's receipt is ``{"partition": [start, end]}`` (an ingest's may carry its ledger
    rows beside); other commits added no rows."""
    if not isinstance(receipt, dict):
        return {}
    ranges = {}
    for p, r in receipt.items():
        if p == RECEIPT_KEY:
            continue
        if not (str(p).isdigit() and isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r)):
            return {}
        ranges[int(p)] = (r[0], r[1])
    return ranges


def commit_log(table: Table, paths: list[str] | None = None) -> list[CommitEntry]:
    """Every commit the registry remembers, with rows added and commit time (see module doc)."""
    snapshot_ms = {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}
    raw = [(cid, _appended_ranges(receipt), head) for cid, receipt, head, *_ in all_commits(table)]
    firsts = {(p, r[0]): i for i, (_, ranges, _) in enumerate(raw) for p, r in ranges.items() if r[1] > r[0]}
    appended_ms = _first_row_times(table, list(firsts), paths)
    times: dict[int, int] = {}
    for key, i in firsts.items():
        if key in appended_ms:
            times[i] = min(times.get(i, appended_ms[key]), appended_ms[key])
    entries = []
    for i, (cid, ranges, head) in enumerate(raw):
        # A commit that added no rows (producer init, compaction) is timed by its snapshot if kept.
        when = times.get(i, snapshot_ms.get(head) if not ranges else None)
        entries.append(CommitEntry(i, cid, sum(e - s for s, e in ranges.values()), ranges, head, when))
    return entries


def _first_row_times(table: Table, keys: list[tuple[int, int]], paths: list[str] | None) -> dict[tuple[int, int], int]:
    import duckdb
    import pyarrow as pa

    paths = planned_paths(table) if paths is None else paths
    if not keys or not paths:
        return {}
    wanted = pa.table({"p": [k[0] for k in keys], "o": [k[1] for k in keys]})
    with duckdb.connect() as con:
        con.register("wanted", wanted)
        rows = con.execute(
            f"SELECT r.{cols.PARTITION}, r.{cols.OFFSET}, epoch_ms(r.{cols.TIMESTAMP}) FROM {parquet_from(con, paths, table.io)} r "
            f"JOIN wanted w ON r.{cols.PARTITION} = w.p AND r.{cols.OFFSET} = w.o"
        ).fetchall()
    return {(int(p), int(o)): int(ms) for p, o, ms in rows}


def event_time_column(table: Table) -> str | None:
    """The table's event-time column (:func:`icelog.storage.log.schema.event_time_column`)."""
    return cols.event_time_column(table.schema())


def rows_per_day(table: Table, paths: list[str] | None = None, event_time: str | None = None) -> list[dict[str, Any]]:
    """Rows per UTC day, for the rows the table still holds: by ``event_time``, a payload
    column of a timestamp type, when given (rows without one are counted under day None,
    last); else by append time (``log_timestamp``)."""
    import duckdb

    paths = planned_paths(table) if paths is None else paths
    if not paths:
        return []
    if event_time is None:
        moment = f"{cols.TIMESTAMP} AT TIME ZONE 'UTC'"
    else:
        field = table.schema().find_field(event_time)
        quoted = '"' + event_time.replace('"', '""') + '"'
        # A timestamp without a zone is taken as written (UTC by Iceberg's convention).
        moment = f"{quoted} AT TIME ZONE 'UTC'" if isinstance(field.field_type, TimestamptzType) else quoted
    with duckdb.connect() as con:
        rows = con.execute(
            # Aliased apart from the payload: a payload column may be called "day" (the flights have one).
            f"SELECT strftime(date_trunc('day', {moment}), '%Y-%m-%d') AS per_day, count(*) "
            f"FROM {parquet_from(con, paths, table.io)} GROUP BY 1 ORDER BY 1 NULLS LAST"
        ).fetchall()
    return [{"day": day, "rows": int(n)} for day, n in rows]


def freshness_ms(table: Table, now_ms: int) -> int:
    """Milliseconds since the table's last commit (property-only commits included)."""
    return max(0, now_ms - table.metadata.last_updated_ms)


def human_age(ms: int) -> str:
    seconds = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds} s"

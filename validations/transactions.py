"""I5 check: the coordinator journal and a table agree about every transaction.

* Each COMMITTED transaction that touched this table holds exactly the ranges the journal
  recorded (offsets that retention already removed excepted), and is recorded once.
* ABORTED and in-flight transactions are nowhere: no retained snapshot of the table and no
  entry of its commit-id registry carries their id. A transaction the journal decided (a
  catalog without atomic multi-table commits) counts as committed while its tables roll forward.
"""

from __future__ import annotations

import json
import time

import duckdb
from pyiceberg.table import Table

from icelog.storage.core.registry import all_commits
from icelog.storage.errors import JournalUnreadable, UnknownTable
from icelog.storage.log.scan import parquet_from, planned_paths
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.producers.journal import ABORTED, COMMITTED
from icelog.storage.producers.journal_state import JOURNAL, JournalState
from icelog.storage.properties import TXN_ID
from icelog.validations.violations import CheckReport, Violation

CHECK = "transactions"


def _journal(table: Table) -> tuple[list[tuple[str, str, str]], dict]:
    """``(txn_id, state, detail)`` rows of the journal, and its coordinator state.

    Raises:
        JournalUnreadable: the coordinator state does not parse.
    """
    try:
        journal = LogTable.open(table.catalog, JOURNAL).table()
    except UnknownTable:
        return [], {}
    paths = planned_paths(journal)
    con = duckdb.connect()
    rows = (
        con.execute(
            f"SELECT txn_id, txn_state, detail FROM {parquet_from(con, paths, journal.io)} ORDER BY log_offset"
        ).fetchall()
        if paths
        else []
    )
    return rows, dict(JournalState.from_metadata(journal.metadata).transactions)


def _ranges(detail: str) -> dict | None:
    """A COMMITTED record's ``{table: {partition: [first, next]}}``; None if it does not parse."""
    try:
        ranges = json.loads(detail).get("ranges", {})
    except (ValueError, TypeError, AttributeError):
        return None
    valid = isinstance(ranges, dict) and all(
        isinstance(r, dict)
        and all(str(p).isdigit() for p in r)
        and all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v) for v in r.values())
        for r in ranges.values()
    )
    return ranges if valid else None


def check_transactions(table: Table, snapshot_id: int | None = None) -> CheckReport:
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    violations: list[Violation] = []
    try:
        records, coordinator = _journal(table)
    except JournalUnreadable as e:  # the journal cannot vouch for any transaction: say so, never crash
        violations.append(Violation(CHECK, name, "journal_unreadable", e.describe()))
        records, coordinator = [], {}
    committed: dict[str, dict] = {}
    ended: set[str] = set()
    for txn_id, state, detail in records:
        if state == COMMITTED:
            if txn_id in committed:
                violations.append(Violation(CHECK, name, "journal", f"transaction {txn_id} is COMMITTED twice in the journal"))
            committed[txn_id] = _ranges(detail)
            if committed[txn_id] is None:
                reason = f"transaction {txn_id}: its COMMITTED record's detail does not parse: {str(detail)[:80]!r}"
                violations.append(Violation(CHECK, name, "journal_unreadable", reason, extra={"txn_id": txn_id}))
                committed[txn_id] = {}
        if state in (COMMITTED, ABORTED):
            if state == ABORTED and txn_id in committed:
                violations.append(Violation(CHECK, name, "journal", f"transaction {txn_id} is both COMMITTED and ABORTED"))
            ended.add(txn_id)
    open_ids = {e.txn.id for e in coordinator.values() if e.txn is not None}
    # Decided by the journal and rolling forward table by table: committed, not yet recorded so.
    decided = {e.txn.id for e in coordinator.values() if e.txn is not None and e.txn.prepared and e.txn.prepared.decided}
    not_committed = (({r[0] for r in records} - set(committed)) | open_ids) - decided
    marks = LogState.from_metadata(table.metadata).watermarks
    paths = planned_paths(table, snapshot_id)
    con = duckdb.connect()
    source = parquet_from(con, paths, table.io) if paths else None
    for txn_id, ranges in committed.items():
        for p, (first, nxt) in ranges.get(name, {}).items():
            start = max(first, marks[int(p)].start) if int(p) in marks else first
            if start >= nxt:
                continue  # removed by retention
            present = (
                con.execute(
                    f"SELECT count(*), count(DISTINCT log_offset) FROM {source} WHERE log_partition = $part AND log_offset >= $a AND log_offset < $b",
                    {"part": int(p), "a": start, "b": nxt},
                ).fetchone()
                if paths
                else (0, 0)
            )
            if present != (nxt - start, nxt - start):
                violations.append(
                    Violation(
                        CHECK,
                        name,
                        "missing_transaction_rows",
                        f"transaction {txn_id}: partition {p} offsets {start}..{nxt - 1} hold {present[0]} rows, expected {nxt - start}",
                        partition=int(p),
                        first=start,
                        last=nxt - 1,
                        extra={"txn_id": txn_id},
                    )
                )
    if name == JOURNAL:  # the journal's own commits carry every transaction id it records
        carried: set = set()
    else:
        carried = {s.summary.additional_properties.get(TXN_ID) for s in table.metadata.snapshots if s.summary} | {
            c[0] for c in all_commits(table)
        }
    for txn_id in sorted(not_committed & carried):
        violations.append(
            Violation(
                CHECK,
                name,
                "uncommitted_transaction_visible",
                f"transaction {txn_id} is not COMMITTED in the journal but the table carries it",
                extra={"txn_id": txn_id},
            )
        )
    return CheckReport(
        table=name,
        snapshot_id=snapshot_id or table.metadata.current_snapshot_id,
        checks=[CHECK],
        violations=violations,
        rows=0,
        seconds=time.perf_counter() - started,
    )

"""A consistent cut across log tables: every transaction whole, or not at all.

On a SQL catalog a transaction's tables move in one database transaction, and reading every
table's pointer in one read (:func:`load_tables`) is already a cut. Elsewhere (a REST catalog)
the journal decides a transaction and each table then rolls forward in its own commit, whose
commit id is the transaction's id. Between the first and the last of those commits, one table
holds the transaction and another does not yet.

A reader that wants the tables as one moment reads them here. The tables are read first,
then the journal: any transaction a table already holds was decided before the journal read,
so the journal tells whether it is still rolling forward (PREPARE_COMMIT, decided) or done.
A transaction still rolling forward that some of the read tables hold and others do not is
held back: each table that holds it is read at the snapshot just before its part, like a
Kafka ``read_committed`` reader that stops at the last stable offset. Holding one back in a
table also hides what that table committed after it, so a later transaction it shares with
another read table is held back there too, until nothing changes.

The cut writes nothing: a reader needs no write permission, and the transaction appears
whole once its last table has it (the producer, ``recover`` or a new instance finish it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from icelog.storage.core.registry import all_commits
from icelog.storage.core.swap import is_atomic, load_tables
from icelog.storage.errors import TransactionRollingForward
from icelog.storage.producers.journal import PREPARE_COMMIT
from icelog.storage.producers.journal_state import JOURNAL, JournalState
from icelog.storage.properties import COMMIT_ID


@dataclass(frozen=True)
class Cut:
    """Tables as one moment: ``snapshots[name]`` is the snapshot to read (None: before the
    table's first commit), ``held_back[name]`` the transactions read as not yet there."""

    tables: Mapping[str, Table]
    snapshots: Mapping[str, int | None]
    held_back: Mapping[str, tuple[str, ...]]

    def is_current(self, name: str) -> bool:
        return self.snapshots[name] == self.tables[name].metadata.current_snapshot_id


def rolling_forward(catalog: Catalog) -> dict[str, frozenset[str]]:
    """Transactions the journal decided whose tables may still be rolling forward: ``{txn id:
    its tables}``. Empty on a catalog whose multi-table commits are atomic, or without a journal.

    Raises:
        JournalUnreadable: the coordinator state does not parse.
    """
    if is_atomic(catalog) or not catalog.table_exists(JOURNAL):
        return {}
    state = JournalState.from_metadata(catalog.load_table(JOURNAL).metadata)
    return {
        entry.txn.id: frozenset(entry.txn.prepared.sends)
        for entry in state.transactions.values()
        if entry.txn is not None
        and entry.txn.state == PREPARE_COMMIT
        and entry.txn.prepared is not None
        and entry.txn.prepared.decided
    }


def _chain(table: Table, snapshot_id: int | None) -> list[tuple[int, str | None]]:
    """The ancestry of the current snapshot (or of ``snapshot_id`` if it is not among it),
    oldest first: ``(snapshot id, icelog commit id)``."""

    def ancestry(snapshot):
        return [
            (s.snapshot_id, (s.summary.additional_properties if s.summary else {}).get(COMMIT_ID))
            for s in ancestors_of(snapshot, table.metadata)
        ][::-1]

    chain = ancestry(table.current_snapshot())
    if snapshot_id is not None and all(sid != snapshot_id for sid, _ in chain):
        chain = ancestry(table.metadata.snapshot_by_id(snapshot_id))
    return chain


def _registered(table: Table) -> dict[str, int | None]:
    """The commit-id registry as ``{commit id: snapshot id}`` (None: the commit added no
    snapshot, such as a group offsets or properties commit)."""
    return {cid: snapshot_id for cid, _, snapshot_id, *_ in all_commits(table)}


def consistent_cut(
    catalog: Catalog,
    names: Sequence[str],
    tables: Mapping[str, Table] | None = None,
    at: Mapping[str, int | None] | None = None,
) -> Cut:
    """Read ``names`` (or take ``tables``, loaded by :func:`load_tables` just now) as one moment.

    ``at``: time travel, the snapshot each table had at a time (None: before its first). Tables
    do not commit at one instant even when their pointers move in one database transaction (each
    snapshot carries its own time), nor when they roll forward one by one: a transaction one
    table holds at that time and another only after it is held back too.

    Raises:
        UnknownTable: a table does not exist.
        JournalUnreadable: the coordinator state does not parse (what is decided is unknown).
        TransactionRollingForward: a table would have to be read before a transaction's part
            whose snapshot has been expired; retriable once the transaction has rolled forward.
    """
    loaded = dict(tables) if tables is not None else load_tables(catalog, list(names))
    chosen = dict(at) if at is not None else {name: t.metadata.current_snapshot_id for name, t in loaded.items()}
    pending = rolling_forward(catalog)  # read after the tables: see the module's docstring
    if not pending and at is None:
        return Cut(loaded, chosen, dict.fromkeys(loaded, ()))
    chains = {name: _chain(t, chosen[name]) for name, t in loaded.items()}
    where = {name: {cid: i for i, (_, cid) in enumerate(chain) if cid} for name, chain in chains.items()}
    # Each table is read up to chain[:end]: its chosen snapshot and what came before it.
    ends = {name: next((i + 1 for i, (sid, _) in enumerate(chain) if sid == chosen[name]), 0) for name, chain in chains.items()}
    first_ends = dict(ends)
    registry = {name: _registered(t) for name, t in loaded.items()}

    def holds(name: str, txn_id: str) -> bool:
        """Whether the table as read holds ``txn_id`` (a part older than its retained
        snapshots counts: it is in the table)."""
        index = where[name].get(txn_id)
        return index < ends[name] if index is not None else registry[name].get(txn_id) is not None

    def hold(txn_id: str) -> bool:
        """Read every table that holds ``txn_id`` before it; whether any cut moved."""
        moved = False
        for name in loaded:
            index = where[name].get(txn_id)
            if index is None and registry[name].get(txn_id) is not None:  # its part's snapshot expired
                raise TransactionRollingForward(table=name, txn_id=txn_id)
            if index is not None and index < ends[name]:
                ends[name], moved = index, True
        return moved

    for txn_id, its_tables in pending.items():
        holding = [holds(n, txn_id) for n in its_tables & loaded.keys()]
        if any(holding) and not all(holding):
            hold(txn_id)
    moved = True
    while moved:  # what one table hides after a held-back part, every other table hides too
        hidden = {cid for name, chain in chains.items() for _, cid in chain[ends[name] :] if cid}
        moved = any(hold(cid) for cid in hidden)
    snapshots = {name: chains[name][ends[name] - 1][0] if ends[name] else None for name in loaded}
    held = {name: tuple(sorted(cid for _, cid in chains[name][ends[name] :] if cid in pending)) for name in loaded}
    for name, end in ends.items():
        oldest = chains[name][0] if chains[name] else None
        moved = end < first_ends[name]
        if (
            moved
            and end == 0
            and oldest is not None
            and loaded[name].metadata.snapshot_by_id(oldest[0]).parent_snapshot_id is not None
        ):
            raise TransactionRollingForward(table=name, txn_id=held[name][0] if held[name] else str(oldest[1]))
    return Cut(loaded, snapshots, held)

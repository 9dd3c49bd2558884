"""The transaction coordinator's journal: its state, and one commit request per coordinator step (I5).

The journal is a log table, ``icelog_system.transactions`` (Kafka's transaction-state topic):
one row per record (BEGIN, ADD_PARTITIONS, ADD_OFFSETS, PREPARE_COMMIT, COMMITTED, ABORTED). Its properties
hold the coordinator state (:class:`storage.producers.journal_state.JournalState`): per transactional id
a :class:`storage.producers.journal_state.TransactionalIdState` (the producer id, the epoch, and the open
transaction). Each step reads these values and puts new ones in their place.

Each step is a request decided on the journal's exact base, so epochs fence zombies. Every
step first aborts other transactions idle past their timeout (prepared ones are rolled
forward by recovery, never aborted).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Mapping

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icelog.storage import properties as props
from icelog.storage.core.commit import Decision, Request
from icelog.storage.errors import AbortableError, ProducerFenced, TableAlreadyExists, TerminalError, UnknownTable
from icelog.storage.log import schema as cols
from icelog.storage.log.files import write_log_files
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.journal_state import (
    JOURNAL,
    EndedTxn,
    GroupRegistration,
    JournalState,
    OpenTxn,
    Prepared,
    TransactionalIdState,
)
from icelog.storage.properties import TXN_ID

ONGOING, PREPARE_COMMIT, COMMITTED, ABORTED = "ONGOING", "PREPARE_COMMIT", "COMMITTED", "ABORTED"
JOURNAL_PAYLOAD = [
    {"name": "txn_id", "type": "string"},
    {"name": "transactional_id", "type": "string"},
    {"name": "txn_producer_id", "type": "long"},
    {"name": "txn_epoch", "type": "int"},
    {"name": "txn_state", "type": "string"},
    {"name": "detail", "type": "string"},
]


def now_ms() -> int:
    return int(time.time() * 1000)


class InvalidTxnState(TerminalError):
    """The call does not fit the transaction's state (e.g. commit without begin)."""

    transactional_id: str
    reason: str
    message = "transactional id {transactional_id!r}: {reason}"


class TransactionAborted(AbortableError):
    """The transaction was aborted (timed out, or aborted by a newer instance or recovery)."""

    transactional_id: str
    txn_id: str
    reason: str
    message = "transaction {txn_id} of {transactional_id!r} was aborted: {reason}"


def ensure_journal(catalog: Catalog) -> LogTable:
    """The coordinator journal, created on first use (opened first: it nearly always exists)."""
    try:
        return LogTable.open(catalog, JOURNAL)
    except UnknownTable:
        pass
    try:
        return LogTable.create(
            catalog, JOURNAL, 1, payload=JOURNAL_PAYLOAD, properties={"icelog.snapshots.keep": "10"}, system=True
        )
    except TableAlreadyExists:  # created meanwhile by another process
        return LogTable.open(catalog, JOURNAL)


def _record(tid: str, entry: TransactionalIdState, txn_id: str, state: str, detail: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "txn_id": txn_id,
        "transactional_id": tid,
        "txn_producer_id": entry.producer_id,
        "txn_epoch": entry.epoch,
        "txn_state": state,
        "detail": json.dumps(detail, sort_keys=True),
    }


def _end_aborted(entry: TransactionalIdState, txn: OpenTxn) -> TransactionalIdState:
    """The entry with its transaction ended as aborted, remembering where it staged files:
    whoever aborts it deletes them after the commit, and if that process dies first, the next
    ``init_transactions`` or ``recover`` does (as ``last_committed`` for a commit)."""
    return replace(entry, txn=None, last_aborted=EndedTxn(txn.id, txn.partitions))


@dataclass(frozen=True)
class Applied:
    """A decided transaction whose tables all rolled forward (a catalog without atomic multi-table
    commits): its COMMITTED record is still to be written, by its producer's next journal step."""

    txn_id: str
    ranges: Mapping[str, Mapping[str, list[int]]]
    lost: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Step:
    """What one step sees and leaves: the coordinator state (new values put in place of the
    ones read), journal records to append."""

    txns: dict[str, TransactionalIdState]
    records: list[dict[str, Any]]
    aborted: list[dict[str, Any]]
    now: int
    default_timeout: int
    result: dict[str, Any]

    def abort(self, tid: str, entry: TransactionalIdState, txn: OpenTxn, reason: str) -> TransactionalIdState:
        """Abort ``txn``, the open transaction of ``entry``; returns the entry it leaves."""
        self.records.append(_record(tid, entry, txn.id, ABORTED, {"reason": reason}))
        self.aborted.append({"transactional_id": tid, "txn": txn})
        ended = self.txns[tid] = _end_aborted(entry, txn)
        return ended

    def commit(
        self, tid: str, entry: TransactionalIdState, txn: OpenTxn, ranges: Mapping[str, Any], lost: Mapping[str, str]
    ) -> TransactionalIdState:
        """Record ``txn``, the prepared transaction of ``entry``, COMMITTED; returns the entry it leaves.

        Its staged payload files are deleted after the commit; if the process dies first, the
        next init_transactions or recover deletes them (idempotent)."""
        ranges = {t: dict(r) for t, r in ranges.items()}
        ended = self.txns[tid] = replace(entry, txn=None, last_committed=EndedTxn(txn.id, txn.partitions))
        detail = {"ranges": ranges, **({"lost": dict(lost)} if lost else {})}
        self.records.append(_record(tid, entry, txn.id, COMMITTED, detail))
        self.result["ranges"] = ranges
        return ended

    def timed_out(self, entry: TransactionalIdState, txn: OpenTxn | None) -> bool:
        timeout = self.default_timeout if entry.timeout_ms is None else entry.timeout_ms
        return txn is not None and txn.state == ONGOING and txn.last_ms < self.now - timeout


@dataclass
class JournalStep(Request):
    """One coordinator step on the journal; subclasses say what it does in :meth:`apply`."""

    transactional_id: str = ""
    producer_id: int | None = None
    epoch: int | None = None
    txn_id: str = ""
    clock: Callable[[], int] = now_ms
    commit_id: str = ""
    state_type = JournalState
    writes_system = True

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        return write_log_files(table, rows)  # the journal records, rows of the journal log

    def decide(self, state: JournalState, table: Table) -> Decision:
        if self.transactional_id:
            state.check_readable(self.transactional_id)
        step = _Step(
            txns=dict(state.transactions),  # the steps put new values in place of those they change
            records=[],
            aborted=[],
            now=self.clock(),
            default_timeout=props.read(table.metadata.properties, props.TRANSACTION_TIMEOUT_MS, JOURNAL),  # type: ignore[arg-type]
            result={},
        )
        step.result["aborted"] = step.aborted
        for tid, entry in list(step.txns.items()):
            if tid != self.transactional_id and entry.txn is not None and step.timed_out(entry, entry.txn):
                step.abort(tid, entry, entry.txn, "timeout")
        if not self.apply(step) or not step.records and step.txns == state.transactions:
            return Decision(state=state, result=step.result, write=False)  # e.g. a late abort, a re-sent prepare
        new_state = replace(state, transactions=step.txns)
        if not step.records:
            return Decision(state=new_state, result=step.result)
        payload = pa.Table.from_pylist(step.records, schema=cols.payload_arrow_schema(table.schema()))
        decision = AppendRequest(JOURNAL, {0: payload}, {}, self.commit_id).decide(new_state, table)
        decision.result = step.result
        decision.lineage = {**decision.lineage, **({TXN_ID: self.txn_id} if self.txn_id else {})}
        return decision

    def apply(self, step: _Step) -> bool:
        """Edit ``step``; False: write nothing."""
        raise NotImplementedError

    def receipt(self, result: Any) -> Any:
        return {k: v for k, v in result.items() if k in ("producer_id", "epoch", "ranges")}


@dataclass
class InitTransactions(JournalStep):
    """Fence older instances (epoch + 1) and abort their open transaction; a prepared one is
    rolled forward first (``roll_forward`` in the result: nothing written)."""

    fresh_producer_id: int | None = None  # for a new id, or one whose epoch is exhausted
    timeout_ms: int | None = None

    def apply(self, step: _Step) -> bool:
        tid = self.transactional_id
        entry = step.txns.get(tid) or TransactionalIdState(producer_id=self.fresh_producer_id, epoch=-1)
        txn = entry.txn
        if txn is not None and txn.state == PREPARE_COMMIT:  # finish it before fencing its producer
            step.result["roll_forward"] = {"transactional_id": tid, "entry": entry}
            return False
        # The caller deleted its last transactions' files before this step (and deletes them
        # again after it, from the entry as read: ``leftovers``).
        leftovers, entry = entry, replace(entry, last_committed=None, last_aborted=None)
        if txn is not None:
            entry = step.abort(tid, entry, txn, "a new instance initialised")
        if entry.epoch >= 2**31 - 2:  # the epoch's upper bound: a new producer id, as Kafka does
            entry = replace(entry, producer_id=self.fresh_producer_id, epoch=-1)
        timeout_ms = entry.timeout_ms if self.timeout_ms is None else self.timeout_ms
        entry = step.txns[tid] = replace(entry, epoch=entry.epoch + 1, txn=None, timeout_ms=timeout_ms)
        step.result.update(producer_id=entry.producer_id, epoch=entry.epoch, leftovers=leftovers)
        return True


@dataclass
class ExpireTransactions(JournalStep):
    """Only the common part: abort every transaction idle past its timeout."""

    def apply(self, step: _Step) -> bool:
        return bool(step.records)


@dataclass
class _ProducerStep(JournalStep):
    """A step of the producer that holds the epoch: fenced if another instance took it since."""

    ends_itself: ClassVar[bool] = False  # an abort of its own transaction that timed out is no error
    commits_data: ClassVar[bool] = False  # in the atomic swap of the data tables: a timeout raises
    applied: Applied | None = None  # the producer's last transaction, rolled forward: recorded first

    def apply(self, step: _Step) -> bool:
        entry = self._check_epoch(step.txns.get(self.transactional_id))
        txn = entry.txn
        done = self.applied
        if done is not None and txn is not None and txn.id == done.txn_id and txn.state == PREPARE_COMMIT:
            entry, txn = step.commit(self.transactional_id, entry, txn, done.ranges, done.lost), None
            step.result.pop("ranges")  # this step's own result
        if txn is not None and step.timed_out(entry, txn):
            if self.commits_data:  # nothing of an aborted transaction goes into a swap with its data
                raise TransactionAborted(transactional_id=self.transactional_id, txn_id=txn.id, reason="timed out")
            entry = step.abort(self.transactional_id, entry, txn, "timeout")
            if not self.ends_itself:  # record the abort; the caller raises TransactionAborted
                step.result["timed_out"] = self.txn_id
                return True
            txn = None
        self.apply_own(step, entry, txn)
        return True

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        """Put this step's new entry in ``step.txns``, append its records."""
        raise NotImplementedError

    def _check_epoch(self, entry: TransactionalIdState | None) -> TransactionalIdState:
        if entry is None:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason="not initialised: call init_transactions()")
        # Another producer id means a newer instance reached the epoch's upper bound and was
        # given a fresh id: this instance is as fenced as one with an older epoch (KAFKA-19367).
        if entry.producer_id != self.producer_id or self.epoch != entry.epoch:
            raise ProducerFenced(table=JOURNAL, producer_id=self.producer_id, epoch=self.epoch, current_epoch=entry.epoch)
        return entry

    def _ongoing(self, txn: OpenTxn | None, step: _Step) -> OpenTxn:
        if txn is None or txn.id != self.txn_id:
            reason = "timed out" if self.txn_id in {a["txn"].id for a in step.aborted} else "aborted"
            raise TransactionAborted(transactional_id=self.transactional_id, txn_id=self.txn_id, reason=reason)
        return txn


@dataclass
class _HeldStep(_ProducerStep):
    """A step that may decide a transaction the journal does not hold yet, or holds ONGOING with
    fewer partitions than it sent to (``unprepared``: the transaction as its producer holds it;
    ``recorded``: the journal holds it ONGOING). The producer registered nothing at its sends: this
    step is the journal's first word on them. Its epoch check fences zombies (``_check_epoch``),
    and the timeout is judged here, by the journal's clock, on the producer's last activity (read
    from the same clock)."""

    unprepared: OpenTxn | None = None
    recorded: bool = False  # the producer registered the transaction in the journal (ONGOING)

    def _unprepared(
        self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None, held: OpenTxn
    ) -> tuple[TransactionalIdState, OpenTxn | None]:
        """The journal's entry and the transaction this step decides (not yet in the journal, or ONGOING there)."""
        tid = self.transactional_id
        if self.recorded:  # the journal's entry speaks (its timeout was judged in apply); add what it lacks
            if txn is None or txn.id != held.id:
                return entry, txn  # aborted meanwhile: _ongoing raises
            partitions = {
                t: tuple(sorted({*txn.partitions.get(t, ()), *held.partitions.get(t, ())}))
                for t in {*txn.partitions, *held.partitions}
            }
            return entry, replace(txn, partitions=partitions)
        if txn is not None and txn.id == held.id:
            return entry, txn  # an earlier attempt of this very step landed (its outcome was unknown)
        if txn is not None:
            # An ONGOING leftover of this producer's own (same epoch) earlier transaction that never
            # reached the journal's end: it can no longer commit. A prepared one is never aborted here.
            if txn.state != ONGOING:
                raise InvalidTxnState(transactional_id=tid, reason=f"transaction {txn.id} is {txn.state}")
            entry = step.abort(tid, entry, txn, "superseded by a later transaction of its producer")
        if entry.last_committed is not None and entry.last_committed.id == held.id:
            raise InvalidTxnState(transactional_id=tid, reason=f"transaction {held.id} is already committed")
        timeout = step.default_timeout if entry.timeout_ms is None else entry.timeout_ms
        if held.last_ms < step.now - timeout:
            raise TransactionAborted(transactional_id=tid, txn_id=held.id, reason="timed out")
        return entry, held


@dataclass
class RegisterPartitions(_ProducerStep):
    """BEGIN or ADD_PARTITIONS (Kafka's AddPartitionsToTxn: an atomic catalog's transaction of
    pre-written files), or ADD_OFFSETS (Kafka's AddOffsetsToTxn: ``group`` registered before the
    decision checks its generation; the first record of a transaction that registered nothing before)."""

    partitions: Mapping[str, list[int]] = field(default_factory=dict)
    begins: bool = True  # the producer has registered nothing in this transaction yet
    group: GroupRegistration | None = None  # ADD_OFFSETS: the consumer group whose offsets it will commit

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        if txn is None:
            if self.txn_id in {a["txn"].id for a in step.aborted}:
                raise TransactionAborted(transactional_id=self.transactional_id, txn_id=self.txn_id, reason="timed out")
            if not self.begins:  # it had registered partitions: it ended (timed out, aborted) meanwhile
                raise TransactionAborted(transactional_id=self.transactional_id, txn_id=self.txn_id, reason="aborted")
            txn = OpenTxn(id=self.txn_id, state=ONGOING, started_ms=step.now, last_ms=step.now, partitions={})
            kind = "ADD_OFFSETS" if self.group is not None else "BEGIN"  # the group's registration begins it
        elif txn.id != self.txn_id or txn.state != ONGOING:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason=f"transaction {txn.id} is {txn.state}")
        else:
            kind = "ADD_OFFSETS" if self.group is not None else "ADD_PARTITIONS"
        partitions = dict(txn.partitions)
        for t, ps in self.partitions.items():
            partitions[t] = tuple(sorted(set(partitions.get(t, ())) | set(ps)))
        group = txn.group
        if self.group is not None:
            if group is not None and group.group != self.group.group:
                raise InvalidTxnState(
                    transactional_id=self.transactional_id, reason=f"one group per transaction: {group.group!r} registered"
                )
            group = self.group
        step.txns[self.transactional_id] = replace(entry, txn=replace(txn, partitions=partitions, last_ms=step.now, group=group))
        detail: dict[str, Any] = {"partitions": self.partitions}
        if self.group is not None:
            detail["group"] = {"group": self.group.group, "member": self.group.member, "generation": self.group.generation}
        step.records.append(_record(self.transactional_id, entry, self.txn_id, kind, detail))


@dataclass
class PrepareCommit(_HeldStep):
    """PREPARE_COMMIT: records the staged files; from here on recovery rolls it forward.

    ``unprepared``: (a catalog without atomic multi-table commits) the transaction as its producer
    holds it, every table and partition it sent to: its sends registered nothing, and this record
    registers them all, judged and fenced as :class:`_HeldStep` says."""

    prepared: Prepared = field(default_factory=lambda: Prepared(sends={}))

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        if self.unprepared is not None:
            entry, txn = self._unprepared(step, entry, txn, self.unprepared)
        txn = self._ongoing(txn, step)
        if txn.state == PREPARE_COMMIT and txn.prepared == self.prepared:
            return  # an earlier attempt whose outcome was unknown landed
        if txn.state != ONGOING:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason=f"transaction {txn.id} is {txn.state}")
        unregistered = [
            (t, s.partition)
            for t, sends in self.prepared.sends.items()
            for s in sends
            if s.partition not in txn.partitions.get(t, ())
        ]
        if unregistered:  # a late append to a partition the journal never registered (KAFKA-17754-like)
            raise InvalidTxnState(
                transactional_id=self.transactional_id, reason=f"partitions {unregistered} were never registered"
            )
        step.txns[self.transactional_id] = replace(
            entry, txn=replace(txn, state=PREPARE_COMMIT, last_ms=step.now, prepared=self.prepared)
        )
        step.records.append(
            _record(self.transactional_id, entry, self.txn_id, PREPARE_COMMIT, {"tables": sorted(self.prepared.sends)})
        )


@dataclass
class CommitTransaction(_HeldStep):
    """COMMITTED, in the same atomic commit as the data tables and group offsets.

    Decided after the data tables' appends (``reads_decisions``): the record names the offsets
    their decisions gave, ``{table: {partition: [first, next]}}``.

    ``unprepared``: the transaction as its producer holds it, committed without a PREPARE_COMMIT
    record (the fast path of atomic catalogs). The journal then holds nothing of it, or (``recorded``)
    an ONGOING entry; either way this swap is its first and only decision: the epoch check here
    fences zombies, and the timeout is judged here, by the journal's clock, on the producer's
    last activity (read from the same clock). Without it, the journal must hold the transaction
    prepared (a transaction recovery rolls forward).
    """

    tables: tuple[str, ...] = ()  # the data tables of the commit
    ranges: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)  # their decided offsets
    lost: Mapping[str, str] = field(default_factory=dict)  # tables that could not take their part, and why
    reads_decisions = True
    commits_data = True

    def decide_after(self, state: JournalState, table: Table, decided: Mapping[str, Decision]) -> Decision:
        ranges = {t: {str(p): list(r) for p, r in decided[t].ranges.items()} for t in self.tables}
        return replace(self, ranges=ranges).decide(state, table)

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        if self.unprepared is not None:
            entry, txn = self._unprepared(step, entry, txn, self.unprepared)
        txn = self._ongoing(txn, step)
        if txn.state != (ONGOING if self.unprepared is not None else PREPARE_COMMIT):
            raise InvalidTxnState(
                transactional_id=self.transactional_id, reason=f"transaction {txn.id} is {txn.state}, not prepared"
            )
        step.commit(self.transactional_id, entry, txn, self.ranges, self.lost)


@dataclass
class RecordCommitted(CommitTransaction):
    """COMMITTED after every table rolled forward on its own (a catalog without atomic
    multi-table commits): ``ranges`` are what each table's commit gave."""

    reads_decisions = False


@dataclass
class AbortTransaction(_ProducerStep):
    """ABORTED by the producer; a prepared transaction is refused (it will commit)."""

    ends_itself: ClassVar[bool] = True

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        if txn is None or txn.id != self.txn_id:
            return  # already aborted (by timeout, a new instance, or an earlier attempt)
        if txn.state == PREPARE_COMMIT:
            raise InvalidTxnState(
                transactional_id=self.transactional_id, reason=f"transaction {txn.id} is prepared: it will commit"
            )
        step.abort(self.transactional_id, entry, txn, "aborted by the producer")


@dataclass
class ForceAbort(AbortTransaction):
    """Abort a prepared transaction whose commit can never succeed (e.g. an offset mismatch,
    or its staged files gone at an operator's word)."""

    reason: str = "its commit can never succeed"

    def apply_own(self, step: _Step, entry: TransactionalIdState, txn: OpenTxn | None) -> None:
        if txn is None or txn.id != self.txn_id:
            return
        step.abort(self.transactional_id, entry, txn, self.reason)


def transactional_ids(catalog: Catalog) -> dict[str, TransactionalIdState]:
    """The coordinator state: every transactional id, its producer, epoch and open transaction.

    A read creates nothing: a catalog without a journal has no transactional ids.
    """
    if not catalog.table_exists(JOURNAL):
        return {}
    return dict(JournalState.from_metadata(LogTable.open(catalog, JOURNAL).table().metadata).transactions)

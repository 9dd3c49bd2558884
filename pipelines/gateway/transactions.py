"""Kafka's transactional producer over icelog transactions: one ``TransactionalProducer`` per transactional id.

InitProducerId with a transactional id runs ``init_transactions`` (a new epoch in the catalog's
transaction journal, every older instance fenced, on any gateway); AddPartitionsToTxn and
AddOffsetsToTxn begin the transaction; a transactional Produce stages its batch as one of the
transaction's sends (written, invisible to every reader); TxnOffsetCommit adds the group's
positions; EndTxn commits or aborts it. Tables hold decided data only, so a consumer never meets
an undecided or aborted record and no control batch is ever written.

The open transaction lives in this process (its sends are the staged files a
``TransactionalProducer`` remembers). A producer whose id and epoch the journal holds but this
process does not (the gateway restarted, or the client moved to another gateway) lost its open
transaction: it is answered with the errors librdkafka treats as abortable with an epoch bump
(UNKNOWN_PRODUCER_ID to a Produce, INVALID_PRODUCER_ID_MAPPING to AddPartitionsToTxn and an
EndTxn commit), so the client aborts, re-initializes and runs the transaction again; an EndTxn
abort is answered NONE. An older epoch is answered PRODUCER_FENCED (INVALID_PRODUCER_EPOCH to a
Produce): fatal, as Kafka's zombie fencing is.

At start-up the gateway recovers the journal in the background (``Transactions.recover``): decided
transactions roll forward and timed-out ones are aborted with no client asking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from pyiceberg.catalog import Catalog

from icelog.pipelines.gateway.groups import check_positions, valid_group
from icelog.pipelines.gateway.produce import Acked, error_code
from icelog.pipelines.gateway.records import Batch
from icelog.pipelines.gateway.topics import SYSTEM_NAMESPACE, batch_rows, table_name
from icelog.storage import errors
from icelog.storage.groups.offsets import check_member, group_state
from icelog.storage.log.table import LogTable
from icelog.storage.producers.journal import PREPARE_COMMIT, TransactionAborted
from icelog.storage.producers.journal_state import JOURNAL, JournalState, TransactionalIdState
from icelog.storage.producers.transactional import TransactionalProducer, abort, recover, roll_forward

log = logging.getLogger(__name__)

MAX_EPOCH = 2**15 - 1  # a Kafka producer epoch is an int16


@dataclass(eq=False)
class Session:
    """One transactional id's producer in this process, and what Kafka's coordinator tracks of it."""

    producer: TransactionalProducer
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one call at a time: the producer is not thread-safe
    added: set[tuple[str, int]] = field(default_factory=set)  # (table, partition) added to the open transaction
    groups: set[str] = field(default_factory=set)  # groups added to it (AddOffsetsToTxn)
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)  # the next base sequence per partition
    # The transaction ended without the client's EndTxn (its commit failed and it was aborted,
    # or it timed out): the client's abort is answered NONE.
    ended: bool = False

    @property
    def identity(self) -> tuple[int | None, int | None]:
        return self.producer.producer_id, self.producer.epoch

    @property
    def open(self) -> bool:
        return self.producer.txn_id is not None

    def reset(self) -> None:
        self.added.clear()
        self.groups.clear()


class Refused(Exception):
    """A request refused with a Kafka error code, before anything was written."""

    def __init__(self, code: ErrorCode, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.lost = lost  # the journal's current identity, whose open transaction this process does not hold


class Transactions:
    """Every transactional id this gateway serves (the open transactions are in memory)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.sessions: dict[str, Session] = {}
        self.by_producer: dict[int, str] = {}  # producer id -> transactional id

    async def recover(self) -> dict[str, Any] | None:
        """At start-up, what Kafka's coordinator does when it loads its log: roll forward every
        transaction the journal decided and abort every one idle past its timeout (the recovery
        of ``icelog transactions recover``). The gateway runs it in the background: a request
        that meets such a transaction meanwhile settles it itself, and both finish it by its id,
        once. Without a journal there is nothing to recover, and none is created.

        Returns:
            The recovery's report (``{"rolled_forward", "aborted"}``), or ``None`` without a
            journal or when it failed (logged: the gateway serves on, the next request or
            ``icelog transactions recover`` finishes what is left).
        """
        try:
            report = await asyncio.to_thread(self._recover)
        except Exception as e:  # noqa: BLE001 - logged, and the gateway serves on: what is left waits for the next try
            if isinstance(e, errors.IcelogError):
                log.warning("recovery at start-up: %s", e)
            else:
                log.exception("recovery at start-up failed")
            return None
        if report is not None and (report["rolled_forward"] or report["aborted"]):
            log.warning(
                "recovery at start-up: rolled forward %s, aborted %s",
                report["rolled_forward"] or "none",
                report["aborted"] or "none",
            )
        return report

    def _recover(self) -> dict[str, Any] | None:
        if not self.catalog.table_exists(JOURNAL):
            return None
        # Cheap when nothing is open: the ended transactions' leftover files are not looked for.
        return recover(self.catalog, leftovers=False)

    async def close(self) -> None:
        """What each session still owes the journal, written when the gateway stops.

        Without atomic multi-table commits a transaction's COMMITTED record is written with its
        producer's next journal step: the last one of each session is written here. A transaction
        still open is aborted (its staged batches live in this process, which a restart loses):
        its staged files are deleted and the client's next request meets the lost-transaction
        answers. One decided but not yet rolled forward is left to recovery, which finishes it.
        """
        for tid, session in list(self.sessions.items()):
            async with session.lock:
                try:
                    await asyncio.to_thread(self._close, session)
                except errors.IcelogError as e:  # the journal is behind, never wrong: recovery catches up
                    log.warning("closing transactional id %r: %s", tid, e)

    @staticmethod
    def _close(session: Session) -> None:
        producer = session.producer
        if session.open and not producer.prepared:
            producer.abort_transaction()
        producer.close()

    # --- InitProducerId ----------------------------------------------------------------------

    async def init(self, request: Any) -> dict[str, Any]:
        tid = request.transactional_id
        timeout_ms = _ms(request.transaction_timeout)
        fail: dict[str, Any] = {"producer_id": -1, "producer_epoch": -1}
        if timeout_ms < 1:
            return {**fail, "error_code": ErrorCode.invalid_transaction_timeout}
        asked = (getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1))
        old = self.sessions.get(tid)
        lock = old.lock if old is not None else asyncio.Lock()
        async with lock:
            try:
                if asked[0] != -1:  # a client bumping its epoch (KIP-360): only the current instance may
                    entry = await asyncio.to_thread(self._entry, tid)
                    if entry is None or (entry.producer_id, entry.epoch) != asked:
                        return {**fail, "error_code": ErrorCode.producer_fenced}
                producer = TransactionalProducer(self.catalog, tid, timeout_ms=timeout_ms)
                await asyncio.to_thread(producer.init_transactions)
            except errors.InvalidInput as e:
                log.info("InitProducerId %r refused: %s", tid, e)
                return {**fail, "error_code": ErrorCode.invalid_request}
            except errors.TransientError as e:
                log.warning("InitProducerId %r: %s", tid, e)
                return {**fail, "error_code": ErrorCode.coordinator_load_in_progress}
            except errors.IcelogError as e:
                log.warning("InitProducerId %r failed: %s", tid, e)
                return {**fail, "error_code": ErrorCode.concurrent_transactions}
            if old is not None and old.open:  # the previous instance's open transaction: its staged files go
                with contextlib.suppress(errors.IcelogError):
                    await asyncio.to_thread(old.producer.abort_transaction)
        if producer.epoch is None or producer.epoch > MAX_EPOCH:
            return {**fail, "error_code": ErrorCode.unknown_server_error}
        self._adopt(tid, producer, lock)
        return {"error_code": ErrorCode.none, "producer_id": producer.producer_id, "producer_epoch": producer.epoch}

    def _adopt(self, tid: str, producer: TransactionalProducer, lock: asyncio.Lock | None = None) -> Session:
        session = Session(producer, lock or asyncio.Lock())
        self.sessions[tid] = session
        self.by_producer[producer.producer_id] = tid  # type: ignore[index]
        return session

    def _entry(self, tid: str) -> TransactionalIdState | None:
        """The journal's record of ``tid`` (in a thread)."""
        if not self.catalog.table_exists(JOURNAL):
            return None
        return JournalState.from_metadata(LogTable.open(self.catalog, JOURNAL).table().metadata).transactions.get(tid)

    # --- the producer behind a request ---------------------------------------------------------

    async def _session(self, tid: str | None, producer_id: int, epoch: int, lost: ErrorCode) -> Session:
        """The live session of ``(tid, producer_id, epoch)``, checked against the journal (another
        gateway may have fenced it).

        Raises:
            Refused: ``lost`` for an identity the journal holds but this process does not (its
                open transaction is gone); PRODUCER_FENCED for an older epoch;
                INVALID_PRODUCER_ID_MAPPING for an id the journal does not give ``tid``.
        """
        tid = tid if tid is not None else self.by_producer.get(producer_id)
        if tid is None:
            raise Refused(ErrorCode.invalid_producer_id_mapping, f"producer id {producer_id} has no transactional id here")
        try:
            entry = await asyncio.to_thread(self._entry, tid)
        except errors.IcelogError as e:
            raise Refused(ErrorCode.coordinator_load_in_progress, str(e)) from e
        if entry is None or entry.producer_id != producer_id:
            raise Refused(ErrorCode.invalid_producer_id_mapping, f"{tid!r} does not have producer id {producer_id}")
        if entry.epoch != epoch:
            raise Refused(ErrorCode.producer_fenced, f"{tid!r} epoch {epoch} is fenced by epoch {entry.epoch}")
        session = self.sessions.get(tid)
        if session is None or session.identity != (producer_id, epoch):
            raise Refused(lost, f"{tid!r}: this gateway does not hold its open transaction (restarted?): abort and retry", True)
        return session

    # --- AddPartitionsToTxn, AddOffsetsToTxn ------------------------------------------------------

    async def add_partitions(self, request: Any) -> dict[str, Any]:
        topics = [(t.name, list(t.partitions)) for t in request.v3_and_below_topics]
        try:
            session = await self._session(
                request.v3_and_below_transactional_id,
                request.v3_and_below_producer_id,
                request.v3_and_below_producer_epoch,
                lost=ErrorCode.invalid_producer_id_mapping,
            )
            async with session.lock:
                codes = await asyncio.to_thread(self._partition_codes, topics)
                if all(c == ErrorCode.none for c in codes.values()):
                    self._begin(session)
                    session.added |= {(table_name(t), p) for t, ps in topics for p in ps}  # type: ignore[misc]
        except Refused as e:
            log.info("AddPartitionsToTxn refused: %s", e)
            codes = {(t, p): e.code for t, ps in topics for p in ps}
        return {
            "results_by_topic_v3_and_below": [
                {"name": t, "results_by_partition": [{"partition_index": p, "partition_error_code": codes[(t, p)]} for p in ps]}
                for t, ps in topics
            ]
        }

    def _partition_codes(self, topics: list[tuple[str, list[int]]]) -> dict[tuple[str, int], ErrorCode]:
        """Each partition's answer (in a thread); once one is refused, the rest are not attempted."""
        codes: dict[tuple[str, int], ErrorCode] = {}
        for topic, partitions in topics:
            name = table_name(topic)
            count = 0
            if name is not None:
                with contextlib.suppress(errors.IcelogError):
                    count = LogTable(self.catalog, name).state().partitions
            for p in partitions:
                if topic.split(".")[0] == SYSTEM_NAMESPACE:
                    codes[(topic, p)] = ErrorCode.topic_authorization_failed
                elif not 0 <= p < count:
                    codes[(topic, p)] = ErrorCode.unknown_topic_or_partition
                else:
                    codes[(topic, p)] = ErrorCode.none
        if any(c != ErrorCode.none for c in codes.values()):
            codes = {k: ErrorCode.operation_not_attempted if c == ErrorCode.none else c for k, c in codes.items()}
        return codes

    def _begin(self, session: Session) -> None:
        if not session.open:
            session.producer.begin_transaction()
            session.reset()
            session.ended = False

    async def add_offsets(self, request: Any) -> dict[str, Any]:
        try:
            session = await self._session(
                request.transactional_id, request.producer_id, request.producer_epoch, lost=ErrorCode.invalid_producer_id_mapping
            )
        except Refused as e:
            log.info("AddOffsetsToTxn refused: %s", e)
            return {"error_code": e.code}
        if not valid_group(request.group_id):
            return {"error_code": ErrorCode.invalid_group_id}
        async with session.lock:
            self._begin(session)
            session.groups.add(request.group_id)
        return {"error_code": ErrorCode.none}

    # --- TxnOffsetCommit ---------------------------------------------------------------------

    async def commit_offsets(self, request: Any) -> dict[str, Any]:
        """The group's positions (Kafka offset N: everything below N done) join the transaction."""
        wanted = [(t.name, p.partition_index, p.committed_offset) for t in request.topics for p in t.partitions]
        member = getattr(request, "member_id", "") or None
        generation = getattr(request, "generation_id", -1)
        try:
            # UNKNOWN_PRODUCER_ID: abortable here (librdkafka treats INVALID_PRODUCER_ID_MAPPING as fatal).
            session = await self._session(
                request.transactional_id, request.producer_id, request.producer_epoch, lost=ErrorCode.unknown_producer_id
            )
            async with session.lock:
                if not session.open or request.group_id not in session.groups:
                    raise Refused(ErrorCode.invalid_txn_state, f"group {request.group_id!r} was not added to the transaction")
                codes = await asyncio.to_thread(self._add_offsets, session, request.group_id, wanted, member, generation)
        except Refused as e:
            log.info("TxnOffsetCommit refused: %s", e)
            codes = {(t, p): e.code for t, p, _ in wanted}
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, p, _ in wanted:
            topics.setdefault(topic, []).append({"partition_index": p, "error_code": codes[(topic, p)]})
        return {"topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    def _add_offsets(
        self, session: Session, group: str, wanted: list[tuple[str, int, int]], member: str | None, generation: int
    ) -> dict[tuple[str, int], ErrorCode]:
        """Check the member and each position; add them all or none (in a thread)."""
        if member is not None:
            try:
                check_member(group_state(self.catalog), group, member, generation)
            except errors.UnknownGroup as e:
                raise Refused(ErrorCode.unknown_member_id, str(e)) from e
            except errors.StaleGeneration as e:
                raise Refused(ErrorCode.illegal_generation, str(e)) from e
        codes, offsets = check_positions(self.catalog, wanted)
        if any(c != ErrorCode.none for c in codes.values()):
            return codes
        try:
            fence = {"member": member, "generation": generation} if member is not None else {}
            session.producer.send_offsets_to_transaction(offsets, group, **fence)
        except errors.IcelogError as e:
            raise Refused(ErrorCode.invalid_request, str(e)) from e
        return codes

    # --- Produce -----------------------------------------------------------------------------

    async def stage(self, tid: str | None, table: str, partition: int, batches: list[Batch]) -> Acked:
        """A transactional Produce's batches for one partition, staged as the transaction's sends.

        Answered with base offset -1: the offsets are decided at commit.
        """
        first = batches[0]
        if any(
            not b.transactional or (b.producer_id, b.producer_epoch) != (first.producer_id, first.producer_epoch) for b in batches
        ):
            return Acked(ErrorCode.invalid_record, message="a transactional produce sends only its own transactional batches")
        try:
            session = await self._session(tid, first.producer_id, first.producer_epoch, lost=ErrorCode.unknown_producer_id)
        except Refused as e:
            code = ErrorCode.invalid_producer_epoch if e.code == ErrorCode.producer_fenced else e.code
            if code == ErrorCode.invalid_producer_id_mapping:
                code = ErrorCode.unknown_producer_id
            return Acked(code, message=str(e))
        async with session.lock:
            if not session.open or (table, partition) not in session.added:
                return Acked(
                    ErrorCode.invalid_txn_state, message=f"{table} partition {partition} was not added to the transaction"
                )
            for batch in batches:
                key = (table, partition)
                expected = session.sequences.get(key)
                if expected is not None and batch.base_sequence < expected:
                    continue  # sent again after a lost answer: staged already
                if expected is not None and batch.base_sequence != expected:
                    return Acked(
                        ErrorCode.out_of_order_sequence_number, message=f"sequence {batch.base_sequence}, expected {expected}"
                    )
                try:
                    await asyncio.to_thread(session.producer.send, table, partition, batch_rows(batch))
                except TransactionAborted as e:
                    session.ended = True
                    return Acked(ErrorCode.unknown_producer_id, message=str(e))
                except errors.ProducerFenced as e:
                    return Acked(ErrorCode.invalid_producer_epoch, message=str(e))
                except errors.IcelogError as e:
                    return Acked(error_code(e), message=str(e))
                session.sequences[key] = batch.base_sequence + len(batch)
        return Acked(ErrorCode.none, -1)

    # --- EndTxn ------------------------------------------------------------------------------

    async def end(self, request: Any) -> dict[str, Any]:
        tid, commit = request.transactional_id, request.committed
        try:
            session = await self._session(
                tid, request.producer_id, request.producer_epoch, lost=ErrorCode.invalid_producer_id_mapping
            )
        except Refused as e:
            if not e.lost or commit:
                log.info("EndTxn refused: %s", e)
                return {"error_code": e.code}
            # An abort of a transaction this process lost. The identity is the journal's current
            # one (checked), so once it is ended there the client goes on with it here; until
            # then a retried abort comes this way again.
            producer = TransactionalProducer(self.catalog, tid)
            producer.producer_id, producer.epoch = request.producer_id, request.producer_epoch
            lock = asyncio.Lock()
            async with lock:
                try:
                    await asyncio.to_thread(self._end_lost, tid)
                except errors.IcelogError as e:
                    log.warning("EndTxn abort of %r: %s", tid, e)
                    return {"error_code": ErrorCode.concurrent_transactions}
                self._adopt(tid, producer, lock)
            return {"error_code": ErrorCode.none}
        async with session.lock:
            if not session.open:
                if session.ended and not commit:
                    session.ended = False
                    return {"error_code": ErrorCode.none}
                return {"error_code": ErrorCode.invalid_txn_state}
            code = await asyncio.to_thread(self._end, session, commit)
            if not session.open:
                session.reset()
                if not commit:
                    session.sequences.clear()  # the client numbers its next batches afresh after an abort
            return {"error_code": code}

    def _end_lost(self, tid: str) -> None:
        """End in the journal the transaction of ``tid`` this process lost (in a thread).

        Without atomic commits the journal holds an open transaction: it is aborted there (nothing
        of it is visible). One it holds decided (PREPARE_COMMIT: a commit whose answer was lost)
        is never aborted, since some tables may hold it already: it is rolled forward, as the
        journal's decision says, and the client's abort is answered as for any commit that
        landed unanswered (its rewind to the group's committed offsets skips what it wrote).
        """
        entry = self._entry(tid)
        txn = entry.txn if entry is not None else None
        if entry is not None and txn is not None and txn.state == PREPARE_COMMIT:
            roll_forward(self.catalog, tid, entry)
        else:
            abort(self.catalog, tid)

    def _end(self, session: Session, commit: bool) -> ErrorCode:
        """Commit or abort the open transaction (in a thread); the Kafka answer."""
        producer = session.producer
        try:
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            return ErrorCode.none
        except errors.ProducerFenced:
            return ErrorCode.producer_fenced
        except errors.TransientError as e:  # the outcome is unknown: a retried EndTxn looks it up by the id
            log.warning("EndTxn %s: %s", producer.transactional_id, e)
            return ErrorCode.concurrent_transactions
        except errors.IcelogError as e:
            log.info("EndTxn %s failed: %s", producer.transactional_id, e)
            if producer.txn_id is not None:
                with contextlib.suppress(errors.IcelogError):
                    producer.abort_transaction()
            session.ended = True
            if isinstance(e, TransactionAborted):
                return ErrorCode.invalid_producer_id_mapping  # abortable, with a new epoch
            if isinstance(e, errors.StaleGeneration):
                return ErrorCode.illegal_generation
            return ErrorCode.transaction_abortable


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)

"""A consumer shaped like the Kafka clients: ``subscribe``/``assign``, ``poll``, ``commit``, ``close``.

Several consumers of one group can share one partition:

* by **key-hash range** (``mode="key"``): each member reads only the records whose key hash
  (:func:`key_hashes`) falls in its ranges of ``0..65535``, in offset order, so per-key order
  holds;
* by **offset chunks** (``mode="chunks"``, for unkeyed records): chunks of ``chunk_size``
  offsets are dealt round-robin (``storage.groups.membership.chunk_slot``).

Each member commits exactly the offsets it processed, out of order, as ranges
(``storage.groups.offsets.CommitRanges``); ``poll`` never returns an offset that is committed or that
this consumer fetched and has not committed yet. Near ``icelog.groups.max-ranges`` open
ranges, ``poll`` only fetches offsets inside the gaps (back-pressure), so the gap closes and
no state is ever dropped.

The key hash is ``storage.log.keys.key_hash`` (low 16 bits of the key's MD5) of the table's key
column (``icelog.key-column``, default ``key``), the column writers hash into ``log_key_hash``
so a key-range read skips row groups of other hashes. A consumer hashing any other column
would read ranges the writers' pruning does not match, and miss records.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog

from icelog.storage.core.commit import CommitRequest, commit_tables
from icelog.storage.core.swap import is_atomic
from icelog.storage.errors import InvalidInput, StaleGeneration, TransactionPartUnsupported, UnknownPartition
from icelog.storage.groups import membership
from icelog.storage.groups.membership import HashRange
from icelog.storage.groups.offsets import (
    GROUPS_TABLE,
    CommitRanges,
    GroupAction,
    group_action,
    group_state,
    ranges_request,
    validate_group_id,
)
from icelog.storage.groups.ranges import RangeState, pending, to_ranges
from icelog.storage.log import schema as cols
from icelog.storage.log.keys import DUCKDB_KEY_HASH, SPARK_SQL_KEY_HASH, key_hash, key_hashes  # noqa: F401 (re-exported)
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.journal import TransactionAborted
from icelog.storage.producers.transactional import TransactionalProducer, settle_group

BACK_PRESSURE = 0.9  # of icelog.groups.max-ranges
SCAN_WINDOW = 5_000  # offsets read by the first step while looking for this member's records


def parse_key_range(text: str) -> HashRange:
    """``LO:HI`` (inclusive, within 0..65535)."""
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise InvalidInput(reason=f"a key range is LO:HI with 0 <= LO <= HI <= 65535, not {text!r}") from None
    if not 0 <= lo <= hi < membership.HASH_SPACE:
        raise InvalidInput(reason=f"a key range is LO:HI with 0 <= LO <= HI <= 65535, not {text!r}")
    return lo, hi


def _transaction_part(catalog: Catalog, table: str, part: CommitRequest) -> None:
    """Refuse an ``also`` part a transaction cannot carry where each table rolls forward on its own
    (a REST catalog): it takes its rows at its log end of that moment, so offsets named now
    (expected offsets of payload rows) or sequence numbers checked against the log end now (an
    idempotent producer's batch) could not be kept. Pre-written files name offsets too, but only
    as their numbering: the roll-forward rewrites them where the table moved."""
    if not isinstance(part, AppendRequest):
        what, why = f"a {type(part).__name__}", "only log appends (payload rows or pre-written files) roll forward"
    elif part.producer is not None:
        what = "an idempotent producer's batch"
        why = "its sequence numbers are checked against the log end at the commit, and the part reaches the log end only when it rolls forward"
    elif part.expected_offsets and not part.files:
        what = f"expected offsets {dict(part.expected_offsets)}"
        why = "the offsets are chosen when the table rolls forward, at its log end then"
    else:
        return
    raise TransactionPartUnsupported(catalog=catalog.name, kind=type(catalog).__name__, table=table, part=what, why=why)


def _known(log_table: LogTable, partitions: Sequence[int], marks: Mapping[int, Any]) -> list[int]:
    """``partitions``, sorted, once each is one of the table's (I8: a typed error, not a KeyError at poll)."""
    for p in partitions:
        if isinstance(p, bool) or p not in marks:
            raise UnknownPartition(table=log_table.identifier, partition=p, partitions=len(marks))
    return sorted(set(partitions))


@dataclass
class _Assignment:
    table: str
    partition: int
    hashes: list[HashRange] | None  # None: as the group assigns


@dataclass
class Consumer:
    """A group consumer. Not thread-safe; one per thread or process.

    Args:
        catalog: The catalog of the tables and the group.
        group: The group id.
        member_id: This member's id (default: random).
        session_timeout_ms: Removed from the group when no heartbeat came for this long.
        mode: ``"key"`` (key-hash ranges) or ``"chunks"`` (offset chunks, unkeyed records).
        key_column: The payload column holding the key (default: each table's
            ``icelog.key-column``, else ``key``: the column its writers hash).
        clock: Milliseconds since the epoch (injectable for tests).
        transaction_timeout_ms: Where ``commit(also=...)`` is a transaction (a REST catalog): abort
            one idle this long (default: the session timeout, at least 30 s). A member taking over
            the group's partitions waits at most this long for a dead member's undecided one.
    """

    catalog: Catalog
    group: str
    member_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    session_timeout_ms: int = 10_000
    mode: str = "key"
    chunk_size: int = 100
    key_column: str | None = None
    clock: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    generation: int | None = None
    transaction_timeout_ms: int | None = None
    _subscription: dict[str, list[int]] = field(default_factory=dict)
    _manual: list[_Assignment] | None = None
    _assigned: list[_Assignment] = field(default_factory=list)
    _in_flight: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    _key_columns: dict[str, str] = field(default_factory=dict)
    _last_heartbeat: int = 0
    _closed: bool = False
    _producer: TransactionalProducer | None = None  # commit(also=...) without atomic multi-table commits

    def __post_init__(self) -> None:
        validate_group_id(self.group)  # now, not at the first commit after records were handed out
        if self.mode not in ("key", "chunks"):
            raise InvalidInput(reason=f"mode is 'key' or 'chunks', not {self.mode!r}")
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise InvalidInput(reason="chunk_size is an integer >= 1")
        if not isinstance(self.session_timeout_ms, int) or not 1 <= self.session_timeout_ms <= 86_400_000:
            raise InvalidInput(reason="session_timeout_ms is an integer in 1..86400000")
        if self.transaction_timeout_ms is not None and (
            not isinstance(self.transaction_timeout_ms, int)
            or isinstance(self.transaction_timeout_ms, bool)
            or self.transaction_timeout_ms < 1
        ):
            raise InvalidInput(reason="transaction_timeout_ms is an integer >= 1")
        if not isinstance(self.member_id, str) or not self.member_id.strip() or len(self.member_id) > 256:
            raise InvalidInput(reason="a member id is a non-empty string of at most 256 characters")

    # --- membership -------------------------------------------------------------------------

    def subscribe(self, table: str, partitions: list[int] | None = None) -> None:
        """Join the group for ``table`` (default: every partition); the group assigns hash ranges."""
        source = cols.qualified(table)
        log_table = LogTable.open(self.catalog, source)
        marks = log_table.watermarks()
        self._remember_key_column(log_table, hashed=self.mode == "key")
        self._subscription[source] = sorted(marks) if partitions is None else _known(log_table, partitions, marks)
        self._join()

    def assign(self, table: str, partitions: list[int], key_range: HashRange | None = None) -> None:
        """Read these partitions (optionally one key-hash range) without group membership.

        Commits are then manual ones (allowed while the group has no live member).
        """
        source = cols.qualified(table)
        log_table = LogTable.open(self.catalog, source)
        self._remember_key_column(log_table, hashed=self.mode == "key" and key_range is not None)
        hashes = [(0, membership.HASH_SPACE - 1)] if key_range is None else [tuple(key_range)]
        self._manual = [_Assignment(source, p, hashes) for p in _known(log_table, partitions, log_table.watermarks())]  # type: ignore[arg-type]
        self._assigned = list(self._manual)
        settle_group(self.catalog, self.group)  # before reading the group's offsets (see _adopt)

    def _remember_key_column(self, log_table: LogTable, hashed: bool) -> None:
        """The column whose hash places ``log_table``'s records: the one its writers hash."""
        table = log_table.table()
        name = self.key_column or cols.declared_key_column(table.metadata.properties)
        if hashed and name not in log_table.payload_schema(table).names:
            raise InvalidInput(reason=f"{log_table.identifier} has no payload column {name!r} to hash for key ranges")
        self._key_columns[log_table.identifier] = name

    def _join(self) -> None:
        record = group_action(
            self.catalog,
            GroupAction(self.group, self.member_id, "join", dict(self._subscription), self.session_timeout_ms, self.clock()),
        )
        self._adopt(record)

    def _heartbeat(self) -> None:
        try:
            record = group_action(self.catalog, GroupAction(self.group, self.member_id, "heartbeat", now_ms=self.clock()))
        except StaleGeneration:  # removed (session lapsed): join again, start from what is committed
            self._join()
            return
        self._adopt(record)

    def _adopt(self, record: Mapping[str, Any]) -> None:
        self._last_heartbeat = self.clock()
        if record["generation"] != self.generation:
            self._in_flight.clear()  # fetched under the old generation: those commits are fenced
            # Where output and offsets commit table by table, a transaction decided before this
            # generation may not have written its offsets yet: finish (or wait for) every one
            # registered with the group before reading offsets (a no-op on an atomic catalog).
            settle_group(self.catalog, self.group)
        self.generation = record["generation"]
        self._assigned = [_Assignment(t, p, None) for t, ps in sorted(self._subscription.items()) for p in ps]

    def _hashes(self, record: Mapping[str, Any], a: _Assignment) -> list[HashRange]:
        return membership.fetchable_hashes(record, self.member_id, a.table, a.partition)

    # --- fetch ------------------------------------------------------------------------------

    def poll(self, max_records: int = 500) -> list[pa.RecordBatch]:
        """Fetch up to ``max_records`` records not committed and not already fetched, per
        partition in offset order, as Arrow record batches (schema metadata names the table).
        """
        if self._closed:
            raise InvalidInput(reason="the consumer is closed")
        if not self._assigned and not self._subscription:
            raise InvalidInput(reason="subscribe() or assign() first")
        if self._manual is None and self.clock() - self._last_heartbeat >= self.session_timeout_ms // 3:
            self._heartbeat()
        state = group_state(self.catalog)
        record = state.members.get(self.group) or membership.empty_group()
        if self._manual is None and record["generation"] != self.generation:
            self._heartbeat()
            state = group_state(self.catalog)
            record = state.members.get(self.group) or membership.empty_group()
        out: list[pa.RecordBatch] = []
        budget = max_records
        for a in self._assigned:
            if budget <= 0:
                break
            hashes = a.hashes if self._manual is not None else self._hashes(record, a)
            if not hashes:
                continue
            batch = self._fetch(state, a, hashes, budget)
            if batch is not None and batch.num_rows:
                out.append(batch)
                budget -= batch.num_rows
        return out

    def _fetch(self, state: Any, a: _Assignment, hashes: list[HashRange], budget: int) -> pa.RecordBatch | None:
        log_table = LogTable(self.catalog, a.table)
        mark = log_table.watermarks()[a.partition]
        rs: RangeState = state.range_state(self.group, a.table, a.partition, mark.start)
        end = mark.end
        if rs.ranges and len(rs.ranges) >= int(state.max_ranges * BACK_PRESSURE):
            end = rs.ranges[-1][1] + 1  # back-pressure: only fill the gaps below the last range
        in_flight = self._in_flight.setdefault((a.table, a.partition), set())
        start = rs.committed
        taken: list[pa.Table] = []
        window = max(SCAN_WINDOW, 4 * budget)
        while start < end and budget > 0:
            stop = min(end, start + window)
            window *= 2  # sparse matches (a narrow key range): fewer, larger reads
            gaps = pending(rs, start, stop - 1)
            if gaps:
                pruned = hashes if self.mode == "key" and hashes != [(0, membership.HASH_SPACE - 1)] else None
                rows = log_table.read(a.partition, gaps[0][0], gaps[-1][1] + 1, key_ranges=pruned)
                rows = self._select(rows, rs, in_flight, hashes, self._key_columns[a.table])
                if rows.num_rows:
                    rows = rows.slice(0, budget)
                    taken.append(rows)
                    budget -= rows.num_rows
            start = stop
        if not taken:
            return None
        fetched = pa.concat_tables(taken).combine_chunks()
        in_flight.update(fetched.column(cols.OFFSET).to_pylist())
        batch = fetched.to_batches()[0] if fetched.num_rows else None
        if batch is None:
            return None
        return batch.replace_schema_metadata({b"icelog.table": a.table.encode()})

    def _select(self, rows: pa.Table, rs: RangeState, in_flight: set[int], hashes: list[HashRange], key_column: str) -> pa.Table:
        offsets = rows.column(cols.OFFSET).to_numpy()
        keep = np.ones(len(offsets), dtype=bool)
        for first, last in rs.ranges:
            keep &= ~((offsets >= first) & (offsets <= last))
        if in_flight:
            keep &= ~np.isin(offsets, np.fromiter(in_flight, dtype=np.int64))
        if hashes != [(0, membership.HASH_SPACE - 1)]:
            if self.mode == "key":
                h = key_hashes(rows.column(key_column))
            else:
                h = np.array([membership.chunk_slot(int(o) // self.chunk_size) for o in offsets], dtype=np.int32)
            inside = np.zeros(len(offsets), dtype=bool)
            for lo, hi in hashes:
                inside |= (h >= lo) & (h <= hi)
            keep &= inside
        return rows.filter(pa.array(keep))

    # --- commit -----------------------------------------------------------------------------

    def commit_request(
        self, offsets: Mapping[tuple[str, int], list[int]] | None = None
    ) -> tuple[CommitRanges, Callable[[], None]]:
        """A range commit of what was fetched (or of ``offsets``), to run inside a multi-table
        commit (``storage.core.commit.commit_tables``) with the output it produced: exactly once.

        Returns:
            The request, and a callback to call once that commit succeeded.
        """
        chosen = {k: sorted(v) for k, v in (offsets or self._in_flight).items() if v}
        if not chosen:
            raise InvalidInput(reason="nothing fetched to commit")
        member, generation = (None, None) if self._manual is not None else (self.member_id, self.generation)
        request = ranges_request(
            self.catalog, self.group, {k: to_ranges(v) for k, v in chosen.items()}, member=member, generation=generation
        )
        request.now_ms = self.clock()

        def done() -> None:
            for key, offs in chosen.items():
                self._in_flight.get(key, set()).difference_update(offs)
            self._last_heartbeat = self.clock()

        return request, done

    def commit(
        self,
        offsets: Mapping[tuple[str, int], list[int]] | None = None,
        *,
        also: Sequence[tuple[str, CommitRequest]] = (),
    ) -> dict[str, Any]:
        """Commit what ``poll`` returned (default) or the given offsets, individually, as ranges.

        Args:
            offsets: ``{(table, partition): [offset, ...]}``; default: everything fetched.
            also: Further ``(table, request)`` parts, e.g. the appends of the output this
                consumer produced: all land in one atomic multi-table commit with the
                offsets, or none does (exactly-once consume-transform-produce).

        Returns:
            The range commit's result (stable offset and ranges per partition).

        Raises:
            StaleGeneration: a rebalance happened; nothing was committed (the ``also`` parts
                neither). The next ``poll`` syncs, and what was fetched is fetched again by
                whoever owns it now.
            TransactionAborted: (a catalog without atomic multi-table commits) the commit's
                transaction timed out or was aborted: nothing committed, handled as above.
            TransactionPartUnsupported: (idem) an ``also`` part that is no log append, a payload
                append at expected offsets, or an idempotent producer's batch (offsets are
                chosen when each table rolls forward); nothing written. Payload appends and
                pre-written files (``LogTable.files_request``) fit.
            InvalidRange, RangeLimitExceeded: see ``storage.groups.offsets.commit_ranges``.
        """
        request, done = self.commit_request(offsets)
        in_transaction = bool(also) and not is_atomic(self.catalog)
        beat = self._last_heartbeat
        try:
            if in_transaction:
                result = self._commit_in_transaction(request, also)
            else:
                result = commit_tables(self.catalog, [*also, (GROUPS_TABLE, request)])[-1].result
        except (StaleGeneration, TransactionAborted):
            self._in_flight.clear()
            self.generation = -1  # forces a sync on the next poll
            raise
        done()
        if in_transaction:  # its range commit rolled forward unfenced: it was no heartbeat
            self._last_heartbeat = beat
        return result

    def _commit_in_transaction(self, request: CommitRanges, also: Sequence[tuple[str, CommitRequest]]) -> dict[str, Any]:
        """``commit(also=...)`` on a catalog without atomic multi-table commits (REST): one
        transaction of this member's transactional producer (``storage.producers.transactional``)
        sends the output appends (payload rows with ``send``, pre-written files with ``send_files``),
        registers the group with the member's generation, checks that generation, and decides in
        the coordinator journal; each table then rolls forward in its own commit carrying the
        transaction id, the range commit too. Offsets are chosen at the roll-forward (a pre-written
        file numbered elsewhere is rewritten at its new offsets), so a part that names offsets or
        sequence numbers is refused before anything is written (:func:`_transaction_part`).
        """
        for table, part in also:
            _transaction_part(self.catalog, table, part)
        producer = self.transactional_producer()
        producer.begin_transaction()
        try:
            for table, part in also:
                append: AppendRequest = part  # type: ignore[assignment]  # checked above
                if append.files:
                    paths = {p: [f.file_path for f in files] for p, files in append.files.items()}
                    producer.send_files(table, paths, append.expected_offsets)
                for partition, rows in sorted(append.payload.items()):
                    producer.send(table, partition, rows)
            producer.send_ranges_to_transaction(
                dict(request.ranges), self.group, member=request.member, generation=request.generation, now_ms=request.now_ms
            )
            producer.commit_transaction()
        except BaseException:
            with contextlib.suppress(Exception):  # a prepared one is refused: it will commit
                producer.abort_transaction()
            raise
        state = group_state(self.catalog)
        return {
            "group": self.group,
            "generation": request.generation,
            "partitions": {
                f"{t}/{p}": {"stable": rs.stable, "committed": rs.committed, "ranges": rs.to_json()}
                for t, p in sorted(request.ranges)
                for rs in [state.range_state(self.group, t, p, request.log_bounds[(t, p)][0])]
            },
        }

    def transactional_producer(self) -> TransactionalProducer:
        """This member's transactional producer, one per group and member id: a restarted member
        fences its predecessor's (epoch) and finishes what it left."""
        if self._producer is None:
            tid = f"icelog-consumer/{self.group}/{self.member_id}"
            if len(tid) > 256:
                tid = f"icelog-consumer/{hashlib.sha256(tid.encode()).hexdigest()}"
            timeout_ms = self.transaction_timeout_ms or max(self.session_timeout_ms, 30_000)
            producer = TransactionalProducer(self.catalog, tid, timeout_ms=timeout_ms)
            producer.init_transactions()
            self._producer = producer
        return self._producer

    def close(self) -> None:
        """Leave the group (its hash ranges go to the other members at once)."""
        if self._closed:
            return
        self._closed = True
        if self._producer is not None:
            self._producer.close()  # its last transaction's COMMITTED record
        if self._manual is None and self._subscription:
            group_action(self.catalog, GroupAction(self.group, self.member_id, "leave", now_ms=self.clock()))

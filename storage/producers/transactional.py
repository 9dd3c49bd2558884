"""Transactions across partitions and tables, with a coordinator journal and recovery (I5).

Shaped like Kafka's transactional producer::

    producer = TransactionalProducer(catalog, "orders-copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.orders", 0, rows)
        producer.send("db.audit", 3, other_rows, expected_offset=41)
        producer.send_offsets_to_transaction({("db.source", 0): 1200}, "copier")

Design (docs/transactions.md):

* **The coordinator journal** is itself a log table, ``icelog_system.transactions`` (like
  Kafka's transaction-state topic): one row per record (BEGIN, ADD_PARTITIONS,
  PREPARE_COMMIT, COMMITTED, ABORTED). Its table properties hold the coordinator state:
  per transactional id the producer id, the epoch, and the open transaction.
* **Sends stage Parquet files** of payload rows under ``<table>/data/staging/<txn id>/``:
  invisible to readers, and never held in memory.
* **With atomic multi-table commits (SQL: SQLite, PostgreSQL) the commit is one swap and the
  journal's only record of the transaction** (``storage.core.commit.commit_tables``): every data
  table's append (offsets decided at commit time, so sends without an expected offset are
  renumbered after other writers), the group offsets, and the journal's COMMITTED record with the
  epoch check that fences zombies and the timeout judged by the journal's clock. Journal and data
  therefore never disagree, and nothing needs recording before: a crash before the swap leaves
  only staged files no reader sees (orphan cleanup deletes them), a crash after it a committed
  transaction. Only a transaction with pre-written files (:meth:`TransactionalProducer.send_files`,
  committed as they are) registers in the journal first (BEGIN), so that orphan cleanup keeps them.
* **Without atomic multi-table commits** (a REST catalog) sends write nothing to the journal
  either, and PREPARE_COMMIT is the decision itself (``Prepared.decided``), recorded only after
  every table's part was decided on the table as it is and its files were found: it registers
  every partition (Kafka's AddPartitionsToTxn, folded into it), checks the epoch and judges the
  timeout by the journal's clock, as the SQL swap does. A crash before it leaves only data files
  in ``data/txn-<id>/`` that no reader sees and orphan cleanup removes. (A group whose offsets
  the transaction commits is registered before, ADD_OFFSETS: see :meth:`_add_group`.) Each table
  then rolls forward in its own commit whose commit id is the transaction id (a
  second run finds it done), the group offsets likewise, and COMMITTED is recorded last. Sends
  there take no expected offset: each table places them at its log end when it rolls forward
  (pre-written files too: one numbered elsewhere is rewritten at its new offsets then).
* **Recovery** (``init_transactions`` for its own id, :func:`recover` for all) rolls forward
  what reached PREPARE_COMMIT (a REST catalog's decided transactions, and an SQL journal's
  prepared ones from versions before the one-swap commit), aborts the rest the journal holds, and
  deletes aborted staged files. A transaction idle past its timeout (default 60 s) is aborted by
  the next coordinator action, or refused by its own commit. Timeouts are judged by one clock, the
  catalog database's (``storage.core.catalog.database_clock``): judged by each client's own, a
  fast host would abort everyone's transactions, a slow one its own.

On an SQL catalog a transaction therefore commits to the journal table once (its swap); without
atomic commits, once for its decision (which writes the previous transaction's COMMITTED too),
plus ADD_OFFSETS for a group.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icelog.storage.core import faults
from icelog.storage.core.bases import LastSeen
from icelog.storage.core.catalog import database_clock
from icelog.storage.core.commit import (
    Decision,
    Request,
    commit,
    commit_tables,
    new_commit_id,
    refuse_read_only,
    refuse_system_table,
)
from icelog.storage.core.swap import is_atomic, still_current
from icelog.storage.errors import (
    AbortableError,
    ExpectedOffsetNeedsAtomicCatalog,
    ExpectedOffsetRequired,
    IcelogError,
    InvalidInput,
    InvalidOffset,
    InvalidRange,
    JournalUnreadable,
    OffsetMismatch,
    PreparedFilesMissing,
    ProducerFenced,
    RangeLimitExceeded,
    RecoveryIncomplete,
    SentFilesMissing,
    StorageUnavailable,
    TerminalError,
    TransactionTableChanged,
    TransientError,
    UnknownPartition,
    UnknownTable,
)
from icelog.storage.groups.offsets import (
    GROUPS_TABLE,
    CommitRanges,
    check_member,
    commit_request,
    group_state,
    ranges_request,
    validate_offsets,
    validate_ranges,
)
from icelog.storage.log import schema as cols
from icelog.storage.log.files import (
    arrow_location,
    data_files_from_parquet,
    prewritten_files,
    renumbered_file,
    write_log_files,
)
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable, checked_on, with_system_columns
from icelog.storage.producers.idempotent import lease_producer_ids
from icelog.storage.producers.journal import (
    ONGOING,
    PREPARE_COMMIT,
    AbortTransaction,
    Applied,
    CommitTransaction,
    ExpireTransactions,
    ForceAbort,
    InitTransactions,
    InvalidTxnState,
    JournalStep,
    PrepareCommit,
    RecordCommitted,
    RegisterPartitions,
    TransactionAborted,
    ensure_journal,
)
from icelog.storage.producers.journal_state import (
    JOURNAL,
    EndedTxn,
    GroupRegistration,
    JournalState,
    OpenTxn,
    Prepared,
    StagedSend,
    TransactionalIdState,
    TxnOffsets,
    prewritten_dir,
    staging_dir,
)
from icelog.storage.properties import CHECK_EXPECTED_OFFSETS, TXN_ID

# --- the data side of a transaction ---------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A staged send and the first offset a commit's decision gave it."""

    index: int  # the send's place in the transaction: files are written in send order
    send: StagedSend
    first: int


@dataclass
class TxnAppend(Request):
    """A transaction's appends to one table, decided at commit time.

    Offsets are assigned against the base of the atomic commit, so sends without an
    expected offset follow whatever other writers appended meanwhile; a send with an
    expected offset that no longer holds aborts the transaction (``OffsetMismatch``).
    The decision places each send at its offsets; the commit's write step rewrites the
    staged payload files as data files there (:meth:`write_rows`), once per set of offsets.

    ``renumber``: the roll-forward of a transaction the journal decided (a catalog without
    atomic multi-table commits), where every send goes to the log end as it is then: a
    pre-written file's offsets are where it was numbered, not a condition, and it is rewritten
    at its new offsets if the table moved meanwhile (``storage.log.files.renumbered_file``).
    """

    state_type = LogState
    reads_inputs = True  # the staged files: a coordinator that finished the transaction deletes them

    table: str
    txn_id: str
    sends: list[StagedSend]
    commit_id: str = ""
    renumber: bool = False

    def decide(self, state: LogState, table: Table) -> Decision:
        self._check_table(table)
        cols.check_log_spec(self.table, table.metadata)
        ranges: dict[int, tuple[int, int]] = {}
        placed: dict[int, list[Placed]] = {}
        strict = table.metadata.properties.get(CHECK_EXPECTED_OFFSETS, "false").lower() == "true"
        for index, send in enumerate(self.sends):
            if send.partition >= state.partitions:
                raise UnknownPartition(table=self.table, partition=send.partition, partitions=state.partitions)
            base = ranges.get(send.partition, (state.end(send.partition),) * 2)[1]
            expected = None if self.renumber else send.expected_offset
            if expected is not None and expected != base:
                raise OffsetMismatch(table=self.table, partition=send.partition, expected=expected, actual=base)
            if expected is None and strict:
                raise ExpectedOffsetRequired(table=self.table, partitions=[send.partition])
            first = ranges.get(send.partition, (base, base))[0]
            ranges[send.partition] = (first, base + send.rows)
            placed.setdefault(send.partition, []).append(Placed(index, send, base))
        return Decision(
            state=state.with_ends({p: r[1] for p, r in ranges.items()}),
            result={str(p): list(r) for p, r in ranges.items()},
            rows=placed,
            ranges=ranges,
            lineage={TXN_ID: self.txn_id},
        )

    def _check_table(self, table: Table) -> None:
        """Every send was checked for this very table: not one dropped and re-created under the
        name since (its rows would land in a table they were never checked for), nor an older
        schema. Checked before anything is written, so the transaction aborts with nothing left."""
        now = checked_on(table)
        for send in self.sends:
            made_for = send.made_for()
            if made_for is not None and made_for != now:
                reason = "re-created under its name" if made_for[0] != now[0] else f"schema {made_for[1]} -> {now[1]}"
                raise TransactionTableChanged(table=self.table, txn_id=self.txn_id, reason=reason)

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        """The commit's write step: each placed send's staged payload file -> a data file at its
        offsets, in send order, one staged file in memory at a time."""
        now_us = int(time.time() * 1_000_000)
        files: list[DataFile] = []
        for placed in sorted((p for sends in rows.values() for p in sends), key=lambda p: p.index):
            send = placed.send
            if send.prewritten and placed.first == send.expected_offset:  # numbered where it lands
                files += data_files_from_parquet(table, [send.path])
                continue
            if send.prewritten:  # a decided transaction's file, and the table moved since it was numbered
                assert send.expected_offset is not None  # where send_files found it numbered
                files.append(renumbered_file(table, send.path, placed.first - send.expected_offset, now_us))
                continue
            with table.io.new_input(send.path).open() as f:
                payload = pq.read_table(f)
            files += write_log_files(
                table, {send.partition: with_system_columns(payload, send.partition, placed.first, now_us, None, None)}
            )
        return files

    def keeps(self, data_file: DataFile) -> bool:
        """A prewritten send's file is the sender's, committed as it is: never deleted here."""
        return any(send.prewritten and send.path == data_file.file_path for send in self.sends)

    def renumbered(self, result: Mapping[str, list[int]]) -> list[str]:
        """The pre-written files a landed decision (``result``: ``{partition: [first, next)}``)
        placed elsewhere than they were numbered: rewritten, so no longer the table's."""
        cursor = {int(p): r[0] for p, r in result.items()}
        moved = []
        for send in self.sends:
            first = cursor.get(send.partition)
            if first is None:
                continue
            if send.prewritten and first != send.expected_offset:
                moved.append(send.path)
            cursor[send.partition] = first + send.rows
        return moved

    def receipt(self, result: Any) -> Any:
        return result


# --- the producer ----------------------------------------------------------------------------------


def _delete_staging(catalog: Catalog, txn: OpenTxn | EndedTxn, committed: bool = False) -> None:
    """Delete a transaction's staged files, and its pre-written ones if it aborted (a missing
    folder is fine)."""
    for table_name in txn.partitions:
        try:
            table = LogTable.open(catalog, table_name).table()
        except Exception:  # noqa: BLE001 - a dropped table has nothing left to clean
            continue
        _delete_dir(table, staging_dir(table.metadata.location, txn.id))
        if not committed:  # a committed transaction's pre-written files are its data
            _delete_dir(table, prewritten_dir(table.metadata.location, txn.id))


def _delete_leftovers(catalog: Catalog, entry: TransactionalIdState | None) -> None:
    """Staged files the last committed or aborted transaction may have left (its process died
    before deleting them)."""
    if entry is not None and entry.last_committed is not None:
        _delete_staging(catalog, entry.last_committed, committed=True)
    if entry is not None and entry.last_aborted is not None:
        _delete_staging(catalog, entry.last_aborted)


def _delete_dir(table: Table, uri: str) -> None:
    """Delete a folder through the table's own FileIO settings (an object store's endpoint and keys)."""
    with contextlib.suppress(FileNotFoundError, OSError, IcelogError):
        filesystem, path = arrow_location(table.io, uri)
        filesystem.delete_dir(path)


class TransactionalProducer:
    """A transactional producer over any partitions of any tables of one catalog (see module doc).

    Args:
        catalog: Any catalog. With atomic multi-table commits (SQL: SQLite, PostgreSQL) a
            transaction commits in one step; otherwise (REST) the journal decides and each table
            rolls forward in its own commit, and sends take no expected offset.
        transactional_id: Stable identity; a new instance fences every older one.
        timeout_ms: Abort a transaction idle this long (default: the journal's
            ``icelog.transaction.timeout-ms``, 60 s).
        clock: Milliseconds now, by which timeouts are judged. Default: the catalog database's
            clock, the one every client shares (tests inject one).
    """

    def __init__(
        self, catalog: Catalog, transactional_id: str, *, timeout_ms: int | None = None, clock: Callable[[], int] | None = None
    ) -> None:
        if not isinstance(transactional_id, str) or not transactional_id.strip() or len(transactional_id) > 256:
            raise InvalidInput(reason="a transactional id is a non-empty string of at most 256 characters")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 1):
            raise InvalidInput(reason=f"timeout_ms must be an integer >= 1, not {timeout_ms!r}")
        self.catalog, self.transactional_id, self.timeout_ms = catalog, transactional_id, timeout_ms
        self.clock = clock or database_clock(catalog)
        self.producer_id: int | None = None
        self.epoch: int | None = None
        self.txn_id: str | None = None
        self._sends: dict[str, list[StagedSend]] = {}
        self._written: set[str] = set()  # data files this instance's sends wrote (see _prewrite)
        self._registered: dict[str, set[int]] = {}  # the partitions sent to
        self._recorded = False  # the journal holds the open transaction (ONGOING)
        self._started_ms: int | None = None  # its first send, by ``clock``
        self._last_ms: int | None = None  # the last new partition's send, by ``clock``
        self._offsets: tuple[str, dict[tuple[str, int], int]] | None = None
        self._ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}  # a group member's range commits
        self._group: GroupRegistration | None = None  # the group of its offsets, member and generation
        self._group_now: int | None = None  # the member's clock when it sent them
        # The commit under way: recorded in the journal (PREPARE_COMMIT) without atomic multi-table
        # commits; with them, the commit once tried, whose outcome may be unknown.
        self._prepared: Prepared | None = None
        self._tables: dict[str, LogTable] = {}
        # The journal and each table as this producer last read or committed them: the first
        # bases of its commits (storage.core.bases), as a single append has.
        self._seen = LastSeen()
        self.last_commit: dict[str, dict[str, list[int]]] = {}  # offsets of the last committed transaction
        # A decided transaction rolled forward whose COMMITTED record the next journal step writes.
        self._applied: Applied | None = None

    @property
    def prepared(self) -> bool:
        """The open transaction's commit started and its outcome is unknown: it can only be
        committed (``commit_transaction`` again), never aborted."""
        return self._prepared is not None

    # --- lifecycle --------------------------------------------------------------------------

    def init_transactions(self) -> dict[str, int]:
        """Fence older instances (epoch + 1) and finish what the previous instance left:
        roll forward a prepared transaction, abort an ongoing one."""

        ensure_journal(self.catalog)
        for _ in range(10):  # each round finishes one prepared transaction; it never needs many
            entry = JournalState.from_metadata(LogTable.open(self.catalog, JOURNAL).table().metadata).transactions.get(
                self.transactional_id
            )
            _delete_leftovers(self.catalog, entry)  # before the init step forgets them
            fresh = lease_producer_ids(self.catalog, 1)[0] if entry is None or entry.epoch >= 2**31 - 2 else None
            step = InitTransactions(self.transactional_id, fresh_producer_id=fresh, timeout_ms=self.timeout_ms, clock=self.clock)
            result = commit(self.catalog, JOURNAL, step).result
            _clean_aborted(self.catalog, result)
            if result.get("roll_forward"):
                roll_forward(
                    self.catalog, result["roll_forward"]["transactional_id"], result["roll_forward"]["entry"], self.clock
                )
                continue
            _delete_leftovers(self.catalog, result.get("leftovers"))  # one may have ended since the read above
            self.producer_id, self.epoch = result["producer_id"], result["epoch"]
            self.txn_id, self._applied = None, None
            return {"producer_id": self.producer_id, "epoch": self.epoch}
        raise InvalidTxnState(
            transactional_id=self.transactional_id,
            reason="a prepared transaction stayed prepared after 10 roll-forwards; run `icelog transactions recover` and check its tables",
        )

    def begin_transaction(self) -> str:
        if self.epoch is None:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason="call init_transactions() first")
        if self.txn_id is not None:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason=f"transaction {self.txn_id} is still open")
        self.txn_id = new_commit_id()  # the commit id of its atomic commit
        self._sends, self._registered, self._offsets, self._prepared = {}, {}, None, None
        self._written = set()
        self._recorded, self._started_ms, self._last_ms = False, None, None
        self._ranges, self._group, self._group_now = {}, None, None
        return self.txn_id

    def send(self, table: str, partition: int, rows: pa.Table | list[dict], expected_offset: int | None = None) -> int:
        """Stage rows for ``(table, partition)``; invisible until the transaction commits.

        Returns:
            The number of rows staged.

        Raises:
            InvalidInput, SchemaMismatch, UnknownPartition: bad rows; nothing staged.
            ProducerFenced: a newer instance exists.
        """
        txn_id = self._require_open(sending=True)
        log_table = self._table(table)
        current = self._current(log_table)
        self._seen.put(log_table.identifier, current)
        payload = log_table.conform({partition: rows}, current)[partition]
        if expected_offset is not None and (
            not isinstance(expected_offset, int) or isinstance(expected_offset, bool) or expected_offset < 0
        ):
            raise InvalidInput(reason=f"an expected offset is an integer >= 0, not {expected_offset!r}")
        name = log_table.identifier
        if expected_offset is not None:
            self._refuse_fixed_offsets(name)
        if partition not in self._registered.get(name, set()):
            self._register(name, [partition])
            faults.checkpoint(faults.AFTER_TXN_BEGIN)
        sends = self._sends.setdefault(name, [])
        try:
            if is_atomic(self.catalog):
                path = f"{staging_dir(current.metadata.location, txn_id)}/{partition}-{len(sends)}.parquet"
                with current.io.new_output(path).create(overwrite=True) as out:
                    pq.write_table(payload, out)
                staged = [StagedSend(partition, expected_offset, path, payload.num_rows, False, *checked_on(current))]
            else:
                staged = self._prewrite(current, name, txn_id, partition, payload)
        except (FileNotFoundError, PermissionError):
            raise
        except OSError as e:  # a full disk, an S3 server restarting: nothing staged, the same send may be re-sent
            raise StorageUnavailable(table=name, reason=repr(e)) from e
        sends.extend(staged)
        faults.checkpoint(faults.AFTER_TXN_STAGE)
        return payload.num_rows

    def _prewrite(self, current: Table, name: str, txn_id: str, partition: int, payload: pa.Table) -> list[StagedSend]:
        """A send's data files, written now and numbered at the partition's log end as it is (after
        this transaction's earlier sends there), in the transaction's folder.

        Without atomic multi-table commits each table rolls forward at its log end of that moment,
        so the numbers are a guess: the roll-forward commits the files as they are if no other
        writer moved the partition meanwhile, and rewrites them at their new offsets if one did
        (as for ``send_files``). Writing them here spares the roll-forward reading a payload back
        and writing it out again, and deleting it after.
        """
        earlier = sum(s.rows for s in self._sends.get(name, []) if s.partition == partition)
        first = LogState.from_metadata(current.metadata).end(partition) + earlier
        rows = with_system_columns(payload, partition, first, int(time.time() * 1_000_000), None, None)
        staged = []
        for f in write_log_files(current, {partition: rows}, directory=prewritten_dir(current.metadata.location, txn_id)):
            staged.append(StagedSend(partition, first, f.file_path, f.record_count, True, *checked_on(current)))
            self._written.add(f.file_path)
            first += f.record_count
        return staged

    def data_dir(self, table: str) -> str:
        """Where executors write this transaction's data files for :meth:`send_files`."""
        return prewritten_dir(self._table(table).table().metadata.location, self._require_open())

    def send_files(self, table: str, files: Mapping[int, list[str]], expected_offsets: Mapping[int, int]) -> int:
        """Add data files written elsewhere (Spark executors) to the transaction.

        Each file holds one partition with consecutive offsets; per partition the files tile
        ``[expected, expected + rows)`` (checked from their statistics now, as
        :meth:`storage.log.table.LogTable.commit_files` does). They live under :meth:`data_dir`, are
        deleted if the transaction aborts, and commit as they are when they land where they were
        numbered. With atomic multi-table commits, a partition whose log end is no longer
        ``expected`` at commit aborts the transaction with ``OffsetMismatch``. Without them (the
        journal decides, each table rolls forward later) the files go to the log end as it is at
        the roll-forward, like every send there: a file numbered elsewhere is rewritten at its
        new offsets then (``storage.log.files.renumbered_file``).
        """

        self._require_open(sending=True)
        log_table = self._table(table)
        current = log_table.table()
        name = log_table.identifier
        self._seen.put(name, current)
        if not files and not expected_offsets:
            return 0
        partitions = LogState.from_metadata(current.metadata).partitions
        staged: list[StagedSend] = []
        for p, data_files in prewritten_files(current, name, partitions, files, expected_offsets).items():
            cursor = expected_offsets[p]
            for f in data_files:
                staged.append(StagedSend(p, cursor, f.file_path, f.record_count, True, *checked_on(current)))
                cursor += f.record_count
        new = sorted({s.partition for s in staged} - self._registered.get(name, set()))
        if new or not self._recorded:
            # Files committed as they are in an atomic catalog's one swap: the journal must know the
            # open transaction, or orphan cleanup (which keeps the files of open transactions at any
            # age) could delete one between the commit's read of it and the swap. (Without atomic
            # commits PREPARE_COMMIT registers them, as every send's.)
            self._register(name, new, record=True)
        self._sends.setdefault(name, []).extend(staged)
        return sum(s.rows for s in staged)

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: str,
        *,
        member: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Commit a consumer group's positions (next offset to read) with this transaction.

        ``member`` and ``generation`` (Kafka's ``ConsumerGroupMetadata``): the commit is fenced
        if the group rebalanced since (``StaleGeneration`` at commit, nothing visible).
        """

        self._require_open(sending=True)
        qualified = {(cols.qualified(t), p): o for (t, p), o in offsets.items()}
        validate_offsets(group, qualified)
        if self._ranges:
            raise InvalidInput(reason="a transaction commits a group's offsets or its ranges, not both")
        self._add_group(group, member, generation)
        merged = {**(self._offsets[1] if self._offsets else {}), **qualified}
        self._offsets = (group, merged)

    def send_ranges_to_transaction(
        self,
        ranges: Mapping[tuple[str, int], list[tuple[int, int]]],
        group: str,
        *,
        member: str | None,
        generation: int | None,
        now_ms: int | None = None,
    ) -> None:
        """Commit a group member's processed offset ranges (``{(table, partition): [(first, last)]}``,
        inclusive, as ``storage.groups.offsets.commit_ranges``) with this transaction, fenced by
        ``member`` and ``generation`` (None: a commit outside the group's membership).

        ``now_ms``: the member's clock, by which its session is judged at the check (default: now).
        """

        self._require_open(sending=True)
        qualified = {(cols.qualified(t), p): [tuple(r) for r in rs] for (t, p), rs in ranges.items()}
        validate_ranges(group, qualified)  # type: ignore[arg-type]
        if self._offsets is not None:
            raise InvalidInput(reason="a transaction commits a group's offsets or its ranges, not both")
        self._add_group(group, member, generation)
        for key, rs in qualified.items():
            self._ranges.setdefault(key, []).extend(rs)  # type: ignore[arg-type]
        self._group_now = now_ms

    def _add_group(self, group: str, member: str | None, generation: int | None) -> None:
        """One group per transaction. Without atomic multi-table commits the group is registered
        in the journal first (Kafka's AddOffsetsToTxn), so the generation checked at the decision
        is checked after a consumer adopting the group's partitions can see the transaction."""
        registration = GroupRegistration(group, member, generation)
        if self._group is not None:
            if self._group != registration:
                raise InvalidInput(reason=f"one group, member and generation per transaction: {self._group} already sent")
            return
        if not is_atomic(self.catalog):  # with the partitions sent so far: an abort then deletes their files
            every = {t: sorted(ps) for t, ps in self._registered.items()} if not self._recorded else {}
            self._journal(RegisterPartitions, partitions=every, group=registration)
            self._recorded = True
        self._group = registration

    def commit_transaction(self) -> dict[str, dict[str, list[int]]]:
        """Make every send and offset of the transaction visible in one atomic step.

        After a :class:`storage.errors.TransientError` (e.g. ``CommitOutcomeUnknown``: the
        commit may have landed), call it again: the retry looks the commit up by the
        transaction's id and returns its offsets, or commits it if it never landed.

        Returns:
            The offsets assigned: ``{table: {partition: [first, next]}}``.

        Raises:
            OffsetMismatch: an expected offset no longer holds; the transaction is aborted.
            ProducerFenced: a newer instance took over; nothing of this transaction is visible.
            TransactionAborted: it timed out or was aborted by recovery.
            SentFilesMissing: (a catalog without atomic multi-table commits) data files of its
                sends are gone before the decision (orphan cleanup's age limit shorter than the
                transaction); the transaction is aborted.
            TransientError: the outcome is unknown; the transaction stays open for a retry.
        """
        txn_id = self._require_open()
        if is_atomic(self.catalog):
            return self._commit_atomic(txn_id)
        if self._prepared is None:
            if not self._sends and self._group is None:
                self.txn_id = None  # nothing was sent: nothing to commit
                return {}
            offsets = self._txn_offsets()
            prepared = Prepared(
                sends={t: tuple(sends) for t, sends in self._sends.items()}, offsets=offsets, decided=not is_atomic(self.catalog)
            )
            if prepared.decided:  # the record below is the decision: refuse now what a table would refuse later
                try:
                    checked = _check_tables(self.catalog, txn_id, prepared, self._group_now)
                except IcelogError as e:
                    if not e.retriable:  # refused: the decision would be; a retry of a transient failure checks again
                        self.abort_transaction()
                    raise
                for name, table in checked.items():
                    self._seen.put(name, table)
            # The journal's first word on the sends: this record registers every partition, and its
            # step fences a zombie (the epoch) and judges the timeout by the journal's clock.
            self._journal(PrepareCommit, prepared=prepared, unprepared=self._held(txn_id), recorded=self._recorded)
            self._prepared, self._recorded = prepared, True
            faults.checkpoint(faults.AFTER_TXN_PREPARE)
        try:
            if self._prepared.decided:  # COMMITTED goes with the next journal step (or recover, or close)
                ranges, lost = _roll_forward_tables(self.catalog, self.transactional_id, txn_id, self._prepared, self._seen)
                self._applied = Applied(txn_id, ranges, lost)
            else:
                ranges = _commit_prepared(
                    self.catalog,
                    self.transactional_id,
                    self.producer_id,
                    self.epoch,
                    txn_id,
                    self._prepared,
                    self.clock,
                    self._seen,
                )
        except TransientError:
            raise  # it may have landed: a retry looks it up (the commit id is txn_id), never commits blind
        except (AbortableError, TerminalError) as e:
            if _can_never_commit(e):  # else fenced or already ended: the journal's owner decides
                self._journal(ForceAbort)
            elif isinstance(e, ProducerFenced):
                self._discard_staged()
            self.txn_id = self._prepared = None
            raise
        self.txn_id = self._prepared = None
        self.last_commit = ranges
        return ranges

    def _commit_atomic(self, txn_id: str) -> dict[str, dict[str, list[int]]]:
        """The fast path of an atomic catalog: one swap of the data tables, the group offsets and
        the journal's COMMITTED record, with no PREPARE_COMMIT before it (nothing to roll forward:
        the swap lands whole or not at all). The journal's part checks the epoch and the timeout."""
        if self._prepared is None:
            if not self._sends and self._group is None:
                self.txn_id = None  # nothing was sent: nothing to commit
                return {}
            self._prepared = Prepared(sends={t: tuple(sends) for t, sends in self._sends.items()}, offsets=self._txn_offsets())
            resent = False
        else:
            resent = True  # an earlier attempt's outcome was unknown: found by its id, or judged by the registry
        faults.checkpoint(faults.AFTER_TXN_PREPARE)  # nothing written yet: a crash here leaves nothing visible
        held = self._held(txn_id)
        try:
            ranges = _commit_prepared(
                self.catalog,
                self.transactional_id,
                self.producer_id,
                self.epoch,
                txn_id,
                self._prepared,
                self.clock,
                self._seen,
                unprepared=(held, self._recorded),
                resent=resent,
            )
        except TransientError:
            raise  # it may have landed: a retry looks it up (the commit id is txn_id), never commits blind
        except (AbortableError, TerminalError, FileNotFoundError) as e:
            self._prepared = None  # the swap did not land: the transaction ends here
            if self._recorded and not isinstance(e, ProducerFenced):
                with contextlib.suppress(TransactionAborted, InvalidTxnState):  # ended meanwhile
                    self._journal(ForceAbort, reason=f"its commit failed: {e}")
            self._discard_staged()
            self.txn_id = None
            raise
        self.txn_id = self._prepared = None
        self.last_commit = ranges
        return ranges

    def abort_transaction(self) -> None:
        """Discard the open transaction: nothing of it ever becomes visible."""
        if self.txn_id is None:
            return
        if self._prepared is not None:  # its commit failed with an unknown outcome
            raise InvalidTxnState(
                transactional_id=self.transactional_id,
                reason=f"transaction {self.txn_id} is prepared: it will commit; call commit_transaction() again",
            )
        if not self._recorded:  # the journal never heard of it: nothing to record
            self._discard_staged()
            if not is_atomic(self.catalog):  # only this producer knows its folders (executors' files too)
                _delete_staging(self.catalog, self._held(self.txn_id))
            self.txn_id = None
            return
        try:
            self._journal(AbortTransaction)
        except ProducerFenced:
            self._discard_staged()
            self.txn_id = None
            raise
        # Aborted now or earlier (timeout, recovery): a send that staged its file after the
        # coordinator cleaned the transaction up would otherwise be left behind.
        self._discard_staged()
        self.txn_id = None

    def close(self) -> None:
        """Record the last transaction COMMITTED now if its record is still to be written (on a
        catalog without atomic multi-table commits the next journal step writes it otherwise;
        ``recover`` and a new instance do too). Committed data is visible either way."""
        if self._applied is None:
            return
        done = self._applied
        step = RecordCommitted(
            self.transactional_id, self.producer_id, self.epoch, done.txn_id, ranges=done.ranges, lost=done.lost, clock=self.clock
        )
        with contextlib.suppress(TransactionAborted):  # recorded meanwhile (recover, a new instance)
            commit(self.catalog, JOURNAL, step, commit_id=done.txn_id, resent=True, loaded=self._seen.get(JOURNAL))
        self._applied = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """``with producer.transaction():`` begins, commits, and aborts on an exception."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self.txn_id is not None:
                with contextlib.suppress(Exception):
                    self.abort_transaction()
            raise
        self.commit_transaction()

    # --- internals --------------------------------------------------------------------------

    def _txn_offsets(self) -> TxnOffsets | None:
        group = self._group
        if group is None:
            return None
        offsets = tuple((t, p, o) for (t, p), o in (self._offsets[1] if self._offsets else {}).items())
        ranges = tuple((t, p, first, last) for (t, p), rs in sorted(self._ranges.items()) for first, last in sorted(rs))
        return TxnOffsets(group.group, offsets, ranges=ranges, member=group.member, generation=group.generation)

    def _discard_staged(self) -> None:
        """A fenced zombie deletes the payload files it staged, and the data files its sends
        wrote (a send after the new instance cleaned up would otherwise leave one behind).
        Files pre-written by others (``send_files``) are left alone: the new instance may have
        rolled the transaction forward with them."""
        for name, sends in self._sends.items():
            for send in sends:
                if not send.prewritten or send.path in self._written:
                    with contextlib.suppress(OSError, IcelogError):  # a dropped table took its files along
                        self._table(name).table().io.delete(send.path)

    def _current(self, log_table: LogTable) -> Table:
        """The table as it is now: as this producer last saw it if its metadata pointer has not
        moved since (one small query on SQL, no metadata read), else freshly loaded."""
        seen = self._seen.get(log_table.identifier)
        if seen is not None and still_current(self.catalog, seen):
            return seen
        return log_table.table()

    def _refuse_fixed_offsets(self, table: str) -> None:
        if not is_atomic(self.catalog):
            raise ExpectedOffsetNeedsAtomicCatalog(table=table, catalog=self.catalog.name)

    def _require_open(self, sending: bool = False) -> str:
        if self.txn_id is None:
            raise InvalidTxnState(transactional_id=self.transactional_id, reason="no open transaction: call begin_transaction()")
        if sending and self._prepared is not None:
            raise InvalidTxnState(
                transactional_id=self.transactional_id,
                reason=f"transaction {self.txn_id} is prepared: call commit_transaction() again",
            )
        return self.txn_id

    def _table(self, table: str) -> LogTable:
        if table not in self._tables:
            log_table = LogTable.open(self.catalog, table)
            refuse_system_table(log_table.identifier)  # fail at send, before staging
            refuse_read_only(log_table.identifier, log_table.table().metadata)
            self._tables[table] = log_table
        return self._tables[table]

    def _register(self, table: str, partitions: list[int], record: bool = False) -> None:
        """Note partitions the transaction sends to (Kafka's AddPartitionsToTxn).

        Nothing is written to the journal: the decision carries every partition (the one swap of an
        atomic catalog, or PREPARE_COMMIT without one), fences zombies by the epoch and judges the
        timeout on ``_last_ms`` (the journal clock's time of this send). A crash before it leaves
        only staged or pre-written files that no reader sees and orphan cleanup removes once past
        its age limit. ``record`` (an atomic catalog's pre-written files, committed as they are in
        the one swap): register the transaction anyway, so that orphan cleanup keeps its files at
        any age. Once the journal holds the transaction (that, or a group's registration), each new
        partition is registered too: the journal's record is then what every coordinator judges
        its timeout on.
        """
        if self._recorded or (record and is_atomic(self.catalog)):
            every = {t: sorted(ps) for t, ps in self._registered.items()} if not self._recorded else {}
            new = sorted({*every.get(table, ()), *partitions})
            self._journal(RegisterPartitions, partitions={**every, table: new})
            self._recorded = True
        else:
            self._last_ms = self.clock()
            self._started_ms = self._started_ms if self._started_ms is not None else self._last_ms
        self._registered.setdefault(table, set()).update(partitions)

    def _held(self, txn_id: str) -> OpenTxn:
        """The open transaction as this producer holds it: what its decision registers in the journal."""
        now = self._last_ms if self._last_ms is not None else self.clock()
        started = self._started_ms if self._started_ms is not None else now
        partitions = {t: tuple(sorted(ps)) for t, ps in self._registered.items()}
        return OpenTxn(id=txn_id, state=ONGOING, started_ms=started, last_ms=now, partitions=partitions)

    def _journal(self, step: type[JournalStep], **fields: Any) -> dict[str, Any]:
        if step is RegisterPartitions:
            fields["begins"] = not self._recorded
        request = step(
            self.transactional_id,
            self.producer_id,
            self.epoch,
            self.txn_id or "",
            clock=self.clock,
            applied=self._applied,
            **fields,
        )
        try:
            outcome = commit(self.catalog, JOURNAL, request, loaded=self._seen.get(JOURNAL))
        except TransactionAborted:
            self._discard_staged()  # it ended without us: what we staged since is ours to delete
            self.txn_id = None
            raise
        except ProducerFenced:
            self._discard_staged()  # the new instance cleaned up before our late sends
            raise
        self._seen.put(JOURNAL, outcome.table)
        self._applied = None  # recorded by this step, or by another coordinator before it
        result = outcome.result
        _clean_aborted(self.catalog, result)
        if result.get("timed_out"):
            self._discard_staged()
            self.txn_id = None
            raise TransactionAborted(transactional_id=self.transactional_id, txn_id=result["timed_out"], reason="timed out")
        return result


def _can_never_commit(error: BaseException) -> bool:
    """A prepared transaction that fails like this would fail forever: abort it, or recovery
    would wedge on it. A fenced producer or an ended transaction is not ours to abort; missing
    files are an operator's call (``abort(..., missing_files=True)``)."""
    return not isinstance(error, (ProducerFenced, InvalidTxnState, TransactionAborted, PreparedFilesMissing))


def _clean_aborted(catalog: Catalog, result: Mapping[str, Any]) -> None:
    for aborted in result.get("aborted", []):  # {"transactional_id", "txn": OpenTxn}
        _delete_staging(catalog, aborted["txn"])


def _commit_prepared(
    catalog: Catalog,
    tid: str,
    producer_id: int | None,
    epoch: int | None,
    txn_id: str,
    prepared: Prepared,
    clock: Callable[[], int],
    seen: LastSeen | None = None,
    *,
    unprepared: tuple[OpenTxn, bool] | None = None,
    resent: bool = False,
) -> dict[str, dict[str, list[int]]]:
    """The commit point: data tables, group offsets and the COMMITTED record, all or nothing.

    ``seen``: the producer's tables as it last saw them, the first bases if it has them all;
    updated with the tables the commit leaves. A transaction the journal decided
    (``prepared.decided``) rolls forward table by table instead (:func:`_roll_forward_tables`).
    ``unprepared``: ``(the transaction as its producer holds it, whether the journal holds it
    ONGOING)`` for a commit with no PREPARE_COMMIT before it (:class:`CommitTransaction`)."""

    if prepared.decided:
        ranges, lost = _roll_forward_tables(catalog, tid, txn_id, prepared, seen)
        step = RecordCommitted(tid, producer_id, epoch, txn_id, ranges=ranges, lost=lost, clock=clock)
        return (commit(catalog, JOURNAL, step, commit_id=txn_id, resent=True).result or {}).get("ranges", ranges)
    appends = {t: TxnAppend(t, txn_id, list(sends), txn_id) for t, sends in prepared.sends.items()}
    parts: list[tuple[str, Any]] = sorted(appends.items())
    if prepared.offsets is not None:
        parts.append((GROUPS_TABLE, _offsets_request(catalog, prepared.offsets)))
    # The COMMITTED record names the offsets the appends' decisions give (it decides after them).
    held, recorded = unprepared if unprepared is not None else (None, False)
    step = CommitTransaction(
        tid, producer_id, epoch, txn_id, tables=tuple(appends), clock=clock, unprepared=held, recorded=recorded
    )
    parts.append((JOURNAL, step))
    try:
        loaded = seen.all([ident for ident, _ in parts]) if seen is not None else None
        # A first attempt is not judged by the registry's window (the id was made at begin, maybe
        # long ago): the journal's state says whether the transaction can still commit. A retry
        # after an unknown outcome is (``resent``): it may have landed.
        outcomes = commit_tables(catalog, parts, commit_id=txn_id, loaded=loaded, resent=resent)
    except FileNotFoundError:
        _raise_if_missing(catalog, tid, txn_id, prepared)
        raise
    if seen is not None:
        for (ident, _), outcome in zip(parts, outcomes, strict=True):
            seen.put(ident, outcome.table)
    landed = dict(zip([ident for ident, _ in parts], outcomes, strict=True))
    journal_result = outcomes[-1].result or {}
    ranges = journal_result.get("ranges") or {t: landed[t].result or {} for t in appends}
    cleanups = []
    for name, append in appends.items():
        if not all(s.prewritten for s in append.sends):  # (found already committed: no table swapped, read it)
            table = landed[name].table or LogTable.open(catalog, name).table()
            cleanups.append(lambda t=table: _delete_dir(t, staging_dir(t.metadata.location, txn_id)))
    if cleanups:
        # Side by side: each delete mostly waits on the file system (one by one, 27 ms of a
        # 10-table commit's 226 ms on a loaded machine; side by side, 13 ms).
        list(_in_parallel(cleanups))
    return ranges


def _in_parallel(jobs: list[Callable[[], Any]]) -> Iterator[Any]:
    """Run independent single-table steps at once (a REST catalog answers each in a round trip);
    yields their results as they finish. An error is raised once every job has ended."""
    if len(jobs) == 1:
        yield jobs[0]()
        return
    with ThreadPoolExecutor(max_workers=min(len(jobs), 8), thread_name_prefix="icelog-txn") as pool:
        for future in as_completed([pool.submit(job) for job in jobs]):
            yield future.result()


def _check_tables(catalog: Catalog, txn_id: str, prepared: Prepared, now_ms: int | None = None) -> dict[str, Table]:
    """Decide every table's part on the table as it is, writing nothing: each refusal a roll-forward
    could meet from the transaction itself (a table dropped or re-created since the send, a partition
    it lacks, a foreign partition spec, a read-only mirror, a file of its sends gone) is raised
    before the decision.
    Returns the tables as read, the roll-forward's first bases."""

    def check(name: str, sends: tuple[StagedSend, ...]) -> tuple[str, Table]:
        table = LogTable.open(catalog, name).table()
        refuse_read_only(name, table.metadata)
        TxnAppend(name, txn_id, list(sends), txn_id, renumber=True).decide(LogState.from_metadata(table.metadata), table)
        # The sends registered nothing in the journal, so orphan cleanup keeps their files only by
        # its age limit: one gone now aborts the transaction, before a decision that could never land.
        missing = _missing(table, [s.path for s in sends])
        if missing:
            raise SentFilesMissing(table=name, txn_id=txn_id, missing=missing)
        return name, table

    if prepared.offsets is not None:
        _check_offsets(catalog, prepared.offsets, now_ms)
    jobs = [lambda n=name, s=sends: check(n, s) for name, sends in sorted(prepared.sends.items())]
    return dict(_in_parallel(jobs))


def _offsets_request(catalog: Catalog, spec: TxnOffsets, decided: bool = False) -> Request:
    """The group table's part of a transaction: its offsets, or its member's ranges, fenced by the
    member's generation when a member sent them, unless ``decided`` (a roll-forward of what the
    journal decided)."""
    if spec.ranges:
        ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for t, p, first, last in spec.ranges:
            ranges.setdefault((t, p), []).append((first, last))
        return ranges_request(catalog, spec.group, ranges, member=spec.member, generation=spec.generation, decided=decided)
    fence = {} if decided or spec.member is None else {"member": spec.member, "generation": spec.generation, "fenced": True}
    return commit_request(catalog, spec.group, {(t, p): o for t, p, o in spec.offsets}, **fence)


def _check_offsets(catalog: Catalog, spec: TxnOffsets, now_ms: int | None = None) -> None:
    """Before the decision (after the group's registration is durable): the member still holds
    its generation, and its ranges fit the group's state now. Writes nothing.

    Raises:
        UnknownGroup, StaleGeneration: see :func:`storage.groups.offsets.check_member`.
        InvalidRange, RangeLimitExceeded, InvalidInput: as a range commit would.
    """
    state = group_state(catalog)
    if spec.member is not None:
        check_member(state, spec.group, spec.member, spec.generation, now_ms)
    request = _offsets_request(catalog, spec)
    if isinstance(request, CommitRanges):
        request.now_ms = now_ms
    request.decide(state, None)  # type: ignore[arg-type]


def _roll_forward_tables(
    catalog: Catalog, tid: str, txn_id: str, prepared: Prepared, seen: LastSeen | None = None
) -> tuple[dict[str, dict[str, list[int]]], dict[str, str]]:
    """Apply a decided transaction to each table in its own commit, the tables at once; returns
    ``(ranges, lost)``. The caller records it COMMITTED.

    Each table's commit carries the transaction id as its commit id, so a second run (the
    producer's retry, ``recover``, a new instance) finds a table already done by that id and
    takes its recorded offsets: never twice, never by content. Sends have no expected offsets
    here: each table takes them at its log end when it rolls forward. A table dropped or
    re-created after the decision cannot take its part: it is returned in ``lost`` with the
    reason (the other tables keep theirs: the decision stands). The group offsets roll forward
    the same way.
    """

    def table_part(name: str, sends: tuple[StagedSend, ...]) -> tuple[str, Any]:
        append = TxnAppend(name, txn_id, list(sends), txn_id, renumber=True)
        loaded = seen.get(name) if seen is not None else None
        try:
            outcome = commit(catalog, name, append, commit_id=txn_id, resent=True, loaded=loaded)
        except (UnknownTable, TransactionTableChanged) as e:
            return name, e
        except FileNotFoundError:
            _raise_if_missing(catalog, tid, txn_id, prepared)
            raise
        if seen is not None and outcome.table is not None:
            seen.put(name, outcome.table)
        moved = append.renumbered(outcome.result or {})
        if moved or not all(s.prewritten for s in sends):
            table = outcome.table or LogTable.open(catalog, name).table()
            _delete_dir(table, staging_dir(table.metadata.location, txn_id))
            for path in moved:  # the table holds their renumbered copies now
                with contextlib.suppress(FileNotFoundError, OSError, IcelogError):
                    table.io.delete(path)
        return name, outcome.result or {}

    def offsets_part() -> tuple[str, Any]:
        spec = prepared.offsets
        assert spec is not None
        try:
            request = _offsets_request(catalog, spec, decided=True)
            commit(catalog, GROUPS_TABLE, request, commit_id=txn_id, resent=True)
        except (UnknownTable, InvalidOffset, InvalidRange, RangeLimitExceeded) as e:
            return GROUPS_TABLE, e  # a source dropped, or ranges done by another: the decision stands
        return GROUPS_TABLE, None

    jobs: list[Callable[[], tuple[str, Any]]] = [lambda n=n, s=s: table_part(n, s) for n, s in sorted(prepared.sends.items())]
    if prepared.offsets is not None:
        jobs.append(offsets_part)
    ranges: dict[str, dict[str, list[int]]] = {}
    lost: dict[str, str] = {}
    for index, (name, result) in enumerate(_in_parallel(jobs)):
        if index == 0 and len(jobs) > 1:
            faults.checkpoint(faults.BETWEEN_TABLE_SWAPS)  # one part done, the others under way
        if isinstance(result, IcelogError):
            lost[name] = str(result)
        elif name != GROUPS_TABLE:
            ranges[name] = result
    return dict(sorted(ranges.items())), lost


def roll_forward(
    catalog: Catalog, tid: str, entry: TransactionalIdState, clock: Callable[[], int] | None = None
) -> dict[str, Any]:
    """Finish a transaction that reached PREPARE_COMMIT (idempotent: its id is the commit id)."""
    txn = entry.txn  # found in PREPARE_COMMIT: it has what it prepared
    clock = clock or database_clock(catalog)
    try:
        ranges = _commit_prepared(catalog, tid, entry.producer_id, entry.epoch, txn.id, txn.prepared, clock)
    except (AbortableError, TerminalError, FileNotFoundError) as e:
        # Checked first: a coordinator that finished it first also deleted its staged files.
        if not _still_prepared(catalog, tid, txn.id):
            return {"txn_id": txn.id, "action": "finished_elsewhere"}
        if isinstance(e, FileNotFoundError) or not _can_never_commit(e) or txn.prepared.decided:
            raise
        step = ForceAbort(tid, entry.producer_id, entry.epoch, txn.id, clock=clock, reason=str(e))
        _clean_aborted(catalog, commit(catalog, JOURNAL, step).result)
        return {"txn_id": txn.id, "action": "aborted", "reason": str(e)}
    return {"txn_id": txn.id, "action": "rolled_forward", "ranges": ranges}


def _raise_if_missing(catalog: Catalog, tid: str, txn_id: str, prepared: Prepared) -> None:
    """After a file was not found: :class:`PreparedFilesMissing` if the transaction's own files are gone."""
    missing = missing_files(catalog, prepared)
    if missing:
        raise PreparedFilesMissing(transactional_id=tid, txn_id=txn_id, missing=missing) from None


def missing_files(catalog: Catalog, prepared: Prepared) -> list[str]:
    """The files a prepared transaction recorded that no longer exist (looked up through each
    table's FileIO; a dropped table's files count as missing)."""
    missing = []
    for name, sends in prepared.sends.items():
        try:
            table = LogTable.open(catalog, name).table()
        except UnknownTable:
            missing += [send.path for send in sends]
            continue
        missing += _missing(table, [send.path for send in sends])
    return missing


def _missing(table: Table, paths: list[str]) -> list[str]:
    """``paths`` (under ``table``'s location) that do not exist, looked up in one call through its FileIO."""
    if not paths:
        return []
    filesystem, _ = arrow_location(table.io, paths[0])
    infos = filesystem.get_file_info([arrow_location(table.io, p)[1] for p in paths])
    return [p for p, info in zip(paths, infos, strict=True) if info.type == pafs.FileType.NotFound]


def _still_prepared(catalog: Catalog, tid: str, txn_id: str) -> bool:
    entry = JournalState.from_metadata(LogTable.open(catalog, JOURNAL).table().metadata).transactions.get(tid)
    txn = entry.txn if entry is not None else None
    return txn is not None and txn.id == txn_id and txn.state == PREPARE_COMMIT


def recover(catalog: Catalog, *, clock: Callable[[], int] | None = None, leftovers: bool = True) -> dict[str, Any]:
    """Finish every prepared transaction and abort every one idle past its timeout.

    Idempotent; deletes the staged files of aborted transactions. One transaction that
    cannot be finished never holds up the others.

    Args:
        leftovers: Also delete the staged files that each transactional id's last ended
            transaction may have left (its process died first): a few storage calls per id,
            most of the cost when nothing is open. ``False`` (a gateway starting) leaves them to
            that id's next ``init_transactions()``, to this function, or to orphan cleanup.

    Raises:
        RecoveryIncomplete: after finishing every other transaction, naming each that failed
            with its typed error (e.g. ``PreparedFilesMissing``).
    """
    ensure_journal(catalog)
    clock = clock or database_clock(catalog)
    report: dict[str, Any] = {"rolled_forward": [], "aborted": []}
    failed: list[dict[str, Any]] = []
    state = JournalState.from_metadata(LogTable.open(catalog, JOURNAL).table().metadata)
    for tid, (_, reason) in sorted(state.unreadable.items()):  # stuck alone: the others go on
        failed.append(
            {
                "transactional_id": tid,
                "txn_id": None,
                **JournalUnreadable(table=JOURNAL, transactional_id=tid, reason=reason).to_dict(),
            }
        )
    for tid, entry in state.transactions.items():
        if leftovers:
            _delete_leftovers(catalog, entry)
        txn = entry.txn
        if txn is not None and txn.state == PREPARE_COMMIT:
            try:
                done = roll_forward(catalog, tid, entry, clock)
            except IcelogError as e:
                failed.append({"transactional_id": tid, "txn_id": txn.id, **e.to_dict()})
                continue
            if done["action"] != "finished_elsewhere":
                report["rolled_forward" if done["action"] == "rolled_forward" else "aborted"].append(done["txn_id"])
    result = commit(catalog, JOURNAL, ExpireTransactions(clock=clock)).result
    _clean_aborted(catalog, result)
    report["aborted"] += [a["txn"].id for a in result.get("aborted", [])]
    if failed:
        raise RecoveryIncomplete(rolled_forward=report["rolled_forward"], aborted=report["aborted"], failed=failed)
    return report


def settle_group(
    catalog: Catalog, group: str, *, clock: Callable[[], int] | None = None, poll_s: float = 0.1
) -> dict[str, list[str]]:
    """Before a consumer adopts ``group``'s partitions (join, rebalance) on a catalog without
    atomic multi-table commits: finish every transaction registered with the group.

    A decided one is rolled forward now (its offsets land, once, by its id); an undecided one is
    waited for until it is decided or ended, or aborted once idle past its timeout (as recovery
    does). So a new owner never reads offsets that a decided transaction is about to overwrite:
    a transaction registers its group before it checks the member's generation, and this reads
    the journal after the adopter's join bumped that generation (KIP-447's fence).

    Returns:
        ``{"rolled_forward": [txn ids], "aborted": [txn ids]}`` (empty on an atomic catalog).
    """
    report: dict[str, list[str]] = {"rolled_forward": [], "aborted": []}
    while True:
        done, undecided = settle_decided(catalog, group, clock=clock)
        for key in report:
            report[key] += done[key]
        if not undecided:
            return report
        time.sleep(poll_s)


def settle_decided(
    catalog: Catalog, group: str, *, clock: Callable[[], int] | None = None
) -> tuple[dict[str, list[str]], set[str]]:
    """One pass of :func:`settle_group` that waits for nothing: roll forward every decided
    transaction registered with ``group``, and abort those idle past their timeout (on a catalog
    without atomic multi-table commits).

    Returns:
        ``({"rolled_forward": [txn ids], "aborted": [txn ids]}, undecided)``: ``undecided`` are
        the ids of the transactions still registered with the group and not decided (their
        offsets may yet land). Both empty on an atomic catalog.
    """
    report: dict[str, list[str]] = {"rolled_forward": [], "aborted": []}
    if is_atomic(catalog) or not catalog.table_exists(JOURNAL):
        return report, set()  # one atomic commit: the offsets land with the decision, or never
    state = JournalState.from_metadata(LogTable.open(catalog, JOURNAL).table().metadata)
    registered = {
        tid: entry
        for tid, entry in state.transactions.items()
        if entry.txn is not None and entry.txn.group is not None and entry.txn.group.group == group
    }
    undecided: set[str] = set()
    for tid, entry in sorted(registered.items()):
        txn = entry.txn
        assert txn is not None
        if txn.state == PREPARE_COMMIT:
            done = roll_forward(catalog, tid, entry, clock)
            if done["action"] != "finished_elsewhere":
                report["rolled_forward" if done["action"] == "rolled_forward" else "aborted"].append(txn.id)
        else:
            undecided.add(txn.id)
    if undecided:
        result = commit(catalog, JOURNAL, ExpireTransactions(clock=clock or database_clock(catalog))).result
        _clean_aborted(catalog, result)
        expired = {a["txn"].id for a in result.get("aborted", [])} & undecided
        report["aborted"] += sorted(expired)
        undecided -= expired
    return report, undecided


def abort(catalog: Catalog, transactional_id: str, *, missing_files: bool = False) -> dict[str, Any]:
    """Abort a transactional id's open, unprepared transaction from outside (an operator's tool).

    Args:
        missing_files: Also abort a *prepared* transaction, provided some of its staged files
            are gone (it can never commit: see ``PreparedFilesMissing``).

    Raises:
        InvalidTxnState: the transaction is prepared and can still commit (recovery finishes it).
    """
    ensure_journal(catalog)
    state = JournalState.from_metadata(LogTable.open(catalog, JOURNAL).table().metadata)
    state.check_readable(transactional_id)
    entry = state.transactions.get(transactional_id)
    if entry is None or entry.txn is None:
        return {"transactional_id": transactional_id, "aborted": None}
    txn = entry.txn
    clock = database_clock(catalog)
    step: AbortTransaction = AbortTransaction(transactional_id, entry.producer_id, entry.epoch, txn.id, clock=clock)
    if missing_files and txn.state == PREPARE_COMMIT:
        step = _abort_prepared_without_files(catalog, transactional_id, entry, txn, clock)
    result = commit(catalog, JOURNAL, step).result
    _clean_aborted(catalog, result)
    # Only what this call aborted: the transaction it read may have ended meanwhile.
    aborted = txn.id if any(a["txn"].id == txn.id for a in result.get("aborted", [])) else None
    return {"transactional_id": transactional_id, "aborted": aborted}


def _abort_prepared_without_files(
    catalog: Catalog, transactional_id: str, entry: TransactionalIdState, txn: OpenTxn, clock: Callable[[], int]
) -> ForceAbort:
    if txn.prepared is not None and txn.prepared.decided:  # some tables may hold it already
        reason = f"transaction {txn.id} was decided: it rolls forward table by table and is never aborted"
        raise InvalidTxnState(transactional_id=transactional_id, reason=reason)
    missing = missing_files(catalog, txn.prepared) if txn.prepared is not None else []
    if not missing:  # every file is there: aborting would undo a commit recovery can still make
        reason = f"transaction {txn.id} is prepared and all its files exist: it will commit; run `icelog transactions recover`"
        raise InvalidTxnState(transactional_id=transactional_id, reason=reason)
    reason = f"aborted by an operator: {len(missing)} staged files missing"
    return ForceAbort(transactional_id, entry.producer_id, entry.epoch, txn.id, clock=clock, reason=reason)

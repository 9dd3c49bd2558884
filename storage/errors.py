"""The icelog exception taxonomy.

One root, :class:`IcelogError`. Retry semantics live in the type, not the message (as in
confluent-kafka's ``retriable()`` / ``fatal()`` / ``txn_requires_abort()``):

* :class:`TransientError`: a retry of the *same* request may succeed (a commit lost a race
  too many times, the catalog was unreachable, the outcome is unknown).
* :class:`AbortableError`: the request was decided on a state that is gone. Retrying it as
  it is cannot help, but redoing the work *from the start* (re-read the log, decide again)
  can: an offset mismatch.
* :class:`TerminalError`: neither helps (bad input, a fenced producer, a foreign commit).
  :class:`InvalidInput` is also a ``ValueError``.

Every class takes keyword-only, typed fields, exposes them as attributes and in
``fields``, builds its own message, and pickles (errors cross Spark-executor and
Airflow-worker process boundaries). This module imports only the standard library, so the
DAG files can name these types at parse time.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


def _rebuild(cls: type[IcelogError], fields: dict[str, Any]) -> IcelogError:
    return cls(**fields)


@lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


class IcelogError(Exception):
    """Root of every error icelog raises on purpose.

    Subclasses declare their fields as keyword-only ``__init__`` parameters, assign them,
    then call ``super().__init__()``.
    """

    retriable = False
    requires_abort = False

    def __init__(self) -> None:
        super().__init__(self.describe())

    @property
    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _field_names(type(self))}

    def describe(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.fields.items())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.fields))

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": str(self), **self.fields}


class TransientError(IcelogError):
    """A retry of the same request may succeed."""

    retriable = True


class AbortableError(IcelogError):
    """Abort and redo from the start: re-read the log, decide again, then send."""

    requires_abort = True


class TerminalError(IcelogError):
    """Retrying the same request cannot succeed."""


# --- bad input (I8): nothing was written -------------------------------------------------


class InvalidInput(TerminalError, ValueError):
    """The request itself is malformed; the table is unchanged."""

    def __init__(self, *, reason: str) -> None:
        self.reason = reason
        super().__init__()

    def describe(self) -> str:
        return self.reason


class InvalidIdentifier(InvalidInput):
    def __init__(self, *, identifier: str, reason: str) -> None:
        self.identifier = identifier
        super().__init__(reason=reason)

    def describe(self) -> str:
        return f"invalid identifier {self.identifier!r}: {self.reason}"


class SchemaMismatch(InvalidInput):
    def __init__(self, *, table: str, reason: str) -> None:
        self.table = table
        super().__init__(reason=reason)

    def describe(self) -> str:
        return f"rows do not match the payload schema of {self.table}: {self.reason}"


class EmptyBatch(InvalidInput):
    def __init__(self, *, table: str, partition: int) -> None:
        self.table, self.partition = table, partition
        super().__init__(reason="empty batch")

    def describe(self) -> str:
        return f"empty batch for {self.table} partition {self.partition}: nothing to append"


class MalformedInput(InvalidInput):
    def __init__(self, *, reason: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(reason=reason)

    def describe(self) -> str:
        where = f" at line {self.line}" if self.line else ""
        return f"malformed input{where}: {self.reason}"


class InvalidOffset(InvalidInput):
    def __init__(self, *, partition: int, offset: Any, reason: str) -> None:
        self.partition, self.offset = partition, offset
        super().__init__(reason=reason)

    def describe(self) -> str:
        return f"invalid offset {self.offset!r} for partition {self.partition}: {self.reason}"


class ExpectedOffsetRequired(InvalidInput):
    """The table sets ``icelog.check-expected-offsets``: every append must name its offsets."""

    def __init__(self, *, table: str, partitions: list[int]) -> None:
        self.table, self.partitions = table, partitions
        super().__init__(reason="expected offsets required")

    def describe(self) -> str:
        return (
            f"{self.table} requires an expected offset on every append (icelog.check-expected-offsets); "
            f"none given for partitions {self.partitions}"
        )


class InvalidProperty(InvalidInput):
    """An ``icelog.*`` table property has a malformed value (``storage.properties``).

    Refused when set, and when a commit reads it: that commit writes nothing.
    """

    def __init__(self, *, table: str | None, key: str, value: str, reason: str) -> None:
        self.table, self.key, self.value = table, key, value
        super().__init__(reason=reason)

    def describe(self) -> str:
        where = f"{self.table}: " if self.table else ""
        return f"{where}table property {self.key}={self.value!r} is malformed ({self.reason}); nothing was written"


class UnknownSnapshot(InvalidInput):
    def __init__(self, *, table: str, snapshot_id: int, retained: list[int]) -> None:
        self.table, self.snapshot_id, self.retained = table, snapshot_id, retained
        super().__init__(reason="unknown snapshot")

    def describe(self) -> str:
        oldest = f"; the oldest retained is {self.retained[0]}" if self.retained else ""
        return (
            f"{self.table} has no snapshot {self.snapshot_id} (never existed, or expired: "
            f"{len(self.retained)} snapshots are retained{oldest})"
        )


class HistoryExpired(InvalidInput):
    """Time travel to a moment older than the retained history: no answer is right."""

    def __init__(self, *, table: str, requested: str, oldest: str | None) -> None:
        self.table, self.requested, self.oldest = table, requested, oldest
        super().__init__(reason="history expired")

    def describe(self) -> str:
        return (
            f"{self.table}: history before {self.oldest} has expired, so the table as of {self.requested} "
            "cannot be answered (raise icelog.snapshots.keep to keep more)"
        )


# --- unknown things ------------------------------------------------------------------------


class UnknownTable(TerminalError):
    def __init__(self, *, table: str, catalog: str | None = None) -> None:
        self.table, self.catalog = table, catalog
        super().__init__()

    def describe(self) -> str:
        return f"no log table {self.table!r} in catalog {self.catalog!r}"


class TableAlreadyExists(TerminalError):
    def __init__(self, *, table: str) -> None:
        self.table = table
        super().__init__()

    def describe(self) -> str:
        return f"log table {self.table!r} already exists"


class NotALogTable(TerminalError):
    def __init__(self, *, table: str) -> None:
        self.table = table
        super().__init__()

    def describe(self) -> str:
        return f"{self.table!r} is an Iceberg table but not an icelog log table"


class UnsupportedFormat(TerminalError):
    """The table's state was written by a newer icelog, in an encoding this one cannot read."""

    def __init__(self, *, location: str, format: str, supported: str) -> None:
        self.location, self.format, self.supported = location, format, supported
        super().__init__()

    def describe(self) -> str:
        return (
            f"the log table at {self.location} has icelog state format {self.format}; this icelog reads "
            f"formats {self.supported}: upgrade icelog to write to it"
        )


class UnknownPartition(TerminalError):
    def __init__(self, *, table: str, partition: Any, partitions: int) -> None:
        self.table, self.partition, self.partitions = table, partition, partitions
        super().__init__()

    def describe(self) -> str:
        return f"{self.table} has no partition {self.partition!r} (partitions 0..{self.partitions - 1})"


# --- conflicts ------------------------------------------------------------------------------


class ConflictError(IcelogError):
    """The request lost against the table's current state (CLI exit code 3)."""


class OffsetMismatch(ConflictError, AbortableError):
    """A conditional append expected a log end offset that is no longer current (I2)."""

    def __init__(self, *, table: str, partition: int, expected: int, actual: int) -> None:
        self.table, self.partition, self.expected, self.actual = table, partition, expected, actual
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table} partition {self.partition}: expected offset {self.expected} "
            f"but the log end offset is {self.actual}"
        )


class CommitConflict(ConflictError, TransientError):
    """Every attempt lost the compare-and-swap to a concurrent commit."""

    def __init__(self, *, table: str, attempts: int) -> None:
        self.table, self.attempts = table, attempts
        super().__init__()

    def describe(self) -> str:
        return f"{self.table}: commit lost {self.attempts} compare-and-swap races in a row"


class ForeignCommit(ConflictError, TerminalError):
    """The table's current snapshot was not made by icelog: building on it could break I1.

    Repair with ``icelog repair TABLE``: it adopts the foreign rows when they extend the log
    exactly, or rolls back to the last icelog snapshot.
    """

    def __init__(self, *, table: str, snapshot_id: int | None, icelog_snapshot_id: int | None) -> None:
        self.table, self.snapshot_id, self.icelog_snapshot_id = table, snapshot_id, icelog_snapshot_id
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table}: the current snapshot {self.snapshot_id} was not written by icelog "
            f"(its last commit made snapshot {self.icelog_snapshot_id}); refusing to build on it. "
            f"Run `icelog repair {self.table}`"
        )


class CatalogUnavailable(TransientError):
    """The catalog could not be read (e.g. a busy SQLite database) for every attempt."""

    def __init__(self, *, table: str, reason: str) -> None:
        self.table, self.reason = table, reason
        super().__init__()

    def describe(self) -> str:
        return f"{self.table}: catalog unavailable ({self.reason})"


class CommitOutcomeUnknown(TransientError):
    """The catalog call failed and icelog could not tell whether the commit landed."""

    def __init__(self, *, table: str, commit_id: str, reason: str) -> None:
        self.table, self.commit_id, self.reason = table, commit_id, reason
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table}: outcome of commit {self.commit_id} is unknown ({self.reason}); "
            "re-send with the same commit id"
        )


class CommitIdForgotten(TerminalError):
    """A re-sent commit id may have landed before the commit-id registry's window: the
    registry cannot prove it did not, so icelog neither writes it again nor says it landed."""

    def __init__(self, *, table: str, commit_id: str, created_ms: int, forgotten_ms: int) -> None:
        self.table, self.commit_id, self.created_ms, self.forgotten_ms = table, commit_id, created_ms, forgotten_ms
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table}: commit id {self.commit_id} was made at {self.created_ms} ms, and the commit-id registry "
            f"has forgotten commits up to {self.forgotten_ms} ms (icelog.commit-ids.keep, "
            "icelog.commit-ids.min-retention-ms): whether it landed cannot be proven. Check the log (offsets, "
            "producer sequences) before sending the rows again under a new commit id"
        )


class StorageUnavailable(TransientError):
    """The warehouse could not be written (e.g. a full disk) before the pointer swap: nothing was
    committed, so the same request may be re-sent, with the same commit id, once it can be."""

    def __init__(self, *, table: str, reason: str) -> None:
        self.table, self.reason = table, reason
        super().__init__()

    def describe(self) -> str:
        return f"{self.table}: the warehouse could not be written ({self.reason}); nothing was committed"


class AtomicCommitUnsupported(TerminalError):
    """The catalog cannot swap several tables' metadata pointers in one step (I5)."""

    def __init__(self, *, catalog: str, kind: str) -> None:
        self.catalog, self.kind = catalog, kind
        super().__init__()

    def describe(self) -> str:
        return (
            f"catalog {self.catalog!r} ({self.kind}) cannot commit several tables atomically; "
            "icelog never commits them one by one. Use a SQL catalog (SQLite or PostgreSQL)"
        )


# --- idempotent producers (I4) ------------------------------------------------------------


class UnknownProducer(TerminalError):
    def __init__(self, *, table: str, producer_id: int) -> None:
        self.table, self.producer_id = table, producer_id
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table}: producer id {self.producer_id} is unknown "
            "(never initialised here, or expired after disuse): call `producers init` again"
        )


class ProducerFenced(ConflictError, TerminalError):
    """A newer instance of this producer exists; this (zombie) instance may never write again."""

    def __init__(self, *, table: str, producer_id: int, epoch: int, current_epoch: int) -> None:
        self.table, self.producer_id, self.epoch, self.current_epoch = table, producer_id, epoch, current_epoch
        super().__init__()

    def describe(self) -> str:
        return f"{self.table}: producer {self.producer_id} epoch {self.epoch} is fenced by epoch {self.current_epoch}"


class InvalidProducerEpoch(TerminalError):
    def __init__(self, *, table: str, producer_id: int, epoch: int, current_epoch: int) -> None:
        self.table, self.producer_id, self.epoch, self.current_epoch = table, producer_id, epoch, current_epoch
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table}: producer {self.producer_id} sent epoch {self.epoch}, "
            f"ahead of the current epoch {self.current_epoch}"
        )


class OutOfOrderSequence(TerminalError):
    def __init__(self, *, table: str, partition: int, producer_id: int, sequence: int, expected: int) -> None:
        self.table, self.partition, self.producer_id = table, partition, producer_id
        self.sequence, self.expected = sequence, expected
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table} partition {self.partition}: producer {self.producer_id} "
            f"sent sequence {self.sequence}, expected {self.expected}"
        )


class DuplicateSequence(TerminalError):
    """The batch was written, but too long ago for its offsets to be remembered."""

    def __init__(self, *, table: str, partition: int, producer_id: int, sequence: int) -> None:
        self.table, self.partition, self.producer_id, self.sequence = table, partition, producer_id, sequence
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table} partition {self.partition}: sequence {self.sequence} of producer "
            f"{self.producer_id} was already written (older than the last batches kept)"
        )


# --- transactions (I5) ---------------------------------------------------------------------


class PreparedFilesMissing(TerminalError):
    """A prepared transaction's staged files are gone (deleted by hand, or by an older orphan
    cleanup): it can never commit. Left prepared until an operator aborts it, since files
    on an unmounted store may come back."""

    def __init__(self, *, transactional_id: str, txn_id: str, missing: list[str]) -> None:
        self.transactional_id, self.txn_id, self.missing = transactional_id, txn_id, missing
        super().__init__()

    def describe(self) -> str:
        return (
            f"transaction {self.txn_id} of {self.transactional_id!r} is prepared but {len(self.missing)} of its "
            f"staged files are gone (e.g. {self.missing[0] if self.missing else '?'}), so it can never commit; "
            f"abort it with `icelog transactions abort {self.transactional_id} --missing-files`"
        )


class RecoveryIncomplete(TerminalError):
    """Recovery finished every transaction it could; these ones failed (each with its typed error)."""

    def __init__(self, *, rolled_forward: list[str], aborted: list[str], failed: list[dict]) -> None:
        self.rolled_forward, self.aborted, self.failed = rolled_forward, aborted, failed
        super().__init__()

    def describe(self) -> str:
        stuck = "; ".join(f"{f['transactional_id']!r}: {f['error']}: {f['message']}" for f in self.failed)
        return (
            f"recovery rolled forward {len(self.rolled_forward)} and aborted {len(self.aborted)} transactions, "
            f"but could not finish {len(self.failed)}: {stuck}"
        )


# --- permissions (KIP-391's ReplicatorWrite ACL) -----------------------------------------


class AuthorizationFailed(TerminalError):
    """The calling principal lacks a permission (CLI exit code 5); nothing was written."""

    def __init__(self, *, principal: str, operation: str, table: str) -> None:
        self.principal, self.operation, self.table = principal, operation, table
        super().__init__()

    def describe(self) -> str:
        return f"principal {self.principal!r} may not {self.operation} on {self.table} (default deny; see `icelog acls`)"


# --- consumer groups (I10) ------------------------------------------------------------------


class InvalidRange(InvalidInput):
    """A range commit that is malformed, overlaps offsets already done, or leaves the log."""

    def __init__(self, *, table: str, partition: int, first: Any, last: Any, reason: str) -> None:
        self.table, self.partition, self.first, self.last = table, partition, first, last
        super().__init__(reason=reason)

    def describe(self) -> str:
        return f"{self.table} partition {self.partition}: range {self.first!r}-{self.last!r} refused: {self.reason}"


class RangeLimitExceeded(TransientError):
    """The commit would keep more open ranges than ``icelog.groups.max-ranges``: close a gap first."""

    def __init__(self, *, group: str, table: str, partition: int, ranges: int, limit: int) -> None:
        self.group, self.table, self.partition, self.ranges, self.limit = group, table, partition, ranges, limit
        super().__init__()

    def describe(self) -> str:
        return (
            f"group {self.group!r} {self.table} partition {self.partition}: {self.ranges} open ranges would pass "
            f"the limit {self.limit} (icelog.groups.max-ranges); commit the offsets of the lowest gap first"
        )


class StaleGeneration(ConflictError, AbortableError):
    """A group member acted with a generation that is no longer current (or was removed): fenced."""

    def __init__(self, *, group: str, member: str, generation: int, current_generation: int) -> None:
        self.group, self.member, self.generation, self.current_generation = group, member, generation, current_generation
        super().__init__()

    def describe(self) -> str:
        return (
            f"group {self.group!r}: member {self.member!r} acted at generation {self.generation}, "
            f"the group is at {self.current_generation} (rejoin, then redo from the committed offsets)"
        )


# --- writes with offsets and mirrors (KIP-391, I6) -----------------------------------------


class InvalidProduceOffset(ConflictError, AbortableError):
    """A batch with explicit offsets does not start at the partition's log end (KIP-391)."""

    def __init__(self, *, table: str, partition: int, offset: int, log_end: int) -> None:
        self.table, self.partition, self.offset, self.log_end = table, partition, offset, log_end
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.table} partition {self.partition}: a batch with offsets must start at the log end "
            f"{self.log_end}, not at {self.offset}"
        )


class PlanOutdated(ConflictError, AbortableError):
    """A concurrent commit changed the state a request was planned from (a mirror step's
    progress, group offsets or the target's promotion): landing it would move that state back
    or write over a promoted table. Plan again."""

    def __init__(self, *, table: str, what: str) -> None:
        self.table, self.what = table, what
        super().__init__()

    def describe(self) -> str:
        return f"{self.table}: {self.what} changed since this request was planned; plan it again"


class CorruptBatch(InvalidInput):
    """A batch's own offsets are not consecutive (or not of the partition it names)."""

    def __init__(self, *, table: str, partition: int, reason: str) -> None:
        self.table, self.partition = table, partition
        super().__init__(reason=reason)

    def describe(self) -> str:
        return f"corrupt batch for {self.table} partition {self.partition}: {self.reason}"


class ReadOnlyTable(TerminalError):
    """The table is a mirror target: only the mirror writes it until it is promoted."""

    def __init__(self, *, table: str, source: str) -> None:
        self.table, self.source = table, source
        super().__init__()

    def describe(self) -> str:
        return f"{self.table} is a read-only mirror of {self.source}; run `icelog mirror promote {self.table}` to write to it"


class MirrorGap(TerminalError):
    """The source no longer holds offsets the mirror never copied (retention ran first)."""

    def __init__(self, *, source: str, partition: int, missing_start: int, missing_end: int) -> None:
        self.source, self.partition = source, partition
        self.missing_start, self.missing_end = missing_start, missing_end
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.source} partition {self.partition}: offsets [{self.missing_start}, {self.missing_end}) "
            "were removed by the source's retention before they were mirrored; refusing to skip them"
        )


class MirrorSourceChanged(TerminalError):
    """The source table is not the one the mirror copies (dropped and re-created, or another table)."""

    def __init__(self, *, source: str, expected_uuid: str, actual_uuid: str) -> None:
        self.source, self.expected_uuid, self.actual_uuid = source, expected_uuid, actual_uuid
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.source} is not the table this mirror copies: its table UUID is {self.actual_uuid}, "
            f"the mirror's source was {self.expected_uuid} (dropped and re-created?); refusing to mix them"
        )


class MirrorPromoted(TerminalError):
    """The target was promoted: mirroring into it has stopped for good."""

    def __init__(self, *, table: str) -> None:
        self.table = table
        super().__init__()

    def describe(self) -> str:
        return f"{self.table} was promoted to a writable table; it is no longer a mirror target"


class MirrorSchemaChanged(TerminalError):
    """The source gained columns its mirror lacks: copying on would drop them."""

    def __init__(self, *, source: str, columns: list[str]) -> None:
        self.source, self.columns = source, columns
        super().__init__()

    def describe(self) -> str:
        return f"{self.source} has columns its mirror lacks: {self.columns}; mirror into a new target table"


# --- the ingest ledger ------------------------------------------------------------------


class SourceFileChanged(TerminalError):
    """A source file was loaded before and its content changed since; nothing was written."""

    def __init__(self, *, table: str, path: str, loaded_fingerprint: str, fingerprint: str, loaded_at: str) -> None:
        self.table, self.path, self.loaded_fingerprint = table, path, loaded_fingerprint
        self.fingerprint, self.loaded_at = fingerprint, loaded_at
        super().__init__()

    def describe(self) -> str:
        return (
            f"{self.path} was loaded into {self.table} at {self.loaded_at} and its content changed since "
            f"({self.loaded_fingerprint} -> {self.fingerprint}); nothing was loaded. "
            "Reload it as new rows with --reload-changed, or restore the file"
        )

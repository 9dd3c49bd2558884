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

Errors are declared, not written out (as dlt's ``exceptions.py`` reads): one annotated line
per field and a ``message`` template per class::

    class SchemaMismatch(InvalidInput):
        table: str
        message = "rows do not match the payload schema of {table}: {reason}"

The root builds each class's keyword-only ``__init__`` from those lines, exposes the fields
as attributes and in ``fields``, renders the message, and pickles by fields (errors cross
Spark-executor and Airflow-worker process boundaries). This module imports only the
standard library, so the DAG files can name these types at parse time.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, dataclass_transform


def _rebuild(cls: type[IcelogError], fields: dict[str, Any]) -> IcelogError:
    return cls(**fields)


def _is_class_var(annotation: Any) -> bool:
    return annotation is ClassVar or str(annotation).startswith(("ClassVar", "typing.ClassVar"))


def span(start: int, end: int) -> str:
    """The offsets ``start`` up to, not including, ``end``, as icelog writes them in messages,
    logs and text output:
    half-open ``[start, end)``, like Kafka's log start and end offsets (``[0, 164)`` is 164 rows)."""
    return f"[{start}, {end})"


class _Attributes:
    """What a template's ``{name}`` reads: the error's attribute ``name``."""

    def __init__(self, error: IcelogError) -> None:
        self.error = error

    def __getitem__(self, name: str) -> Any:
        return getattr(self.error, name)


def _declared_init(cls: type, names: tuple[str, ...], annotations: dict[str, Any]) -> Any:
    """A keyword-only ``__init__(self, *, name, ...)`` that sets each field, then renders the message."""
    defaults = {name: getattr(cls, name) for name in names if hasattr(cls, name)}
    params = ", ".join(f"{name}=_defaults[{name!r}]" if name in defaults else name for name in names)
    body = "".join(f"    self.{name} = {name}\n" for name in names)
    source = f"def __init__(self{', *, ' + params if names else ''}) -> None:\n{body}    _IcelogError.__init__(self)\n"
    scope: dict[str, Any] = {}
    exec(source, {"_defaults": defaults, "_IcelogError": IcelogError}, scope)  # as dataclasses builds its __init__
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = {name: annotations[name] for name in names if name in annotations} | {"return": "None"}
    return init


@dataclass_transform(kw_only_default=True)
class IcelogError(Exception):
    """Root of every error icelog raises on purpose.

    A subclass declares:

    * each field as an annotated line (``table: str``, ``line: int | None = None``). ``fields``
      lists the class's own first, then the inherited ones;
    * ``message``, a ``str.format`` template over its attributes (``"log table {table!r} already
      exists"``); a message with conditional parts is a short ``describe()`` instead;
    * optionally a value for an inherited field, without an annotation (``reason = "empty
      batch"``): that field is fixed, no longer a parameter and not in ``fields``.

    A subclass that writes its own ``__init__`` (sets its fields, then calls
    ``super().__init__()``) still works: its keyword-only parameters are its fields.
    """

    retriable: ClassVar[bool] = False
    requires_abort: ClassVar[bool] = False
    message: ClassVar[str | None] = None
    _field_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            params = inspect.signature(cls.__init__).parameters.values()
            cls._field_names = tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
            return
        own = {name: a for name, a in inspect.get_annotations(cls).items() if not _is_class_var(a)}
        inherited = tuple(name for name in cls._field_names if name not in own and name not in cls.__dict__)
        cls._field_names = (*own, *inherited)
        annotations = {}
        for klass in reversed(cls.__mro__):
            annotations.update(inspect.get_annotations(klass))
        cls.__init__ = _declared_init(cls, cls._field_names, annotations)  # type: ignore[method-assign]

    def __init__(self) -> None:
        super().__init__(self.describe())

    @property
    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._field_names}

    def describe(self) -> str:
        """The message: ``message`` rendered with the error's attributes (by default, its fields)."""
        if self.message is None:
            return ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return self.message.format_map(_Attributes(self))

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

    reason: str
    message = "{reason}"


class InvalidIdentifier(InvalidInput):
    identifier: str
    message = "invalid identifier {identifier!r}: {reason}"


class SchemaMismatch(InvalidInput):
    table: str
    message = "rows do not match the payload schema of {table}: {reason}"


class EmptyBatch(InvalidInput):
    table: str
    partition: int
    reason = "empty batch"
    message = "empty batch for {table} partition {partition}: nothing to append"


class MalformedInput(InvalidInput):
    reason: str
    line: int | None = None

    def describe(self) -> str:
        where = f" at line {self.line}" if self.line else ""
        return f"malformed input{where}: {self.reason}"


class InvalidOffset(InvalidInput):
    partition: int
    offset: Any
    message = "invalid offset {offset!r} for partition {partition}: {reason}"


class ExpectedOffsetRequired(InvalidInput):
    """The table sets ``icelog.check-expected-offsets``: every append must name its offsets."""

    table: str
    partitions: list[int]
    reason = "expected offsets required"
    message = (
        "{table} requires an expected offset on every append (icelog.check-expected-offsets); "
        "none given for partitions {partitions}"
    )


class ExpectedOffsetNeedsAtomicCatalog(InvalidInput):
    """A transaction's send names an expected offset on a catalog without atomic multi-table
    commits. There the journal decides the commit and each table then rolls forward at its log end
    of that moment, which another writer may have moved: an expected offset could not be kept.
    Refused at the send, nothing staged. (Pre-written files are accepted there: the roll-forward
    renumbers them if the table moved.)"""

    table: str
    catalog: str
    reason = "expected offsets in a transaction need atomic multi-table commits"
    message = (
        "a transaction cannot send to {table} at an expected offset on catalog {catalog!r}: "
        "it has no atomic multi-table commit, so each table takes the transaction at its log end when it "
        "rolls forward. Send without an expected offset, or use a SQL catalog (SQLite or PostgreSQL)"
    )


class UnknownGroup(InvalidInput):
    """No consumer group of that id has offsets, ranges or members in the catalog."""

    group: str
    reason = "no such consumer group"
    message = "no consumer group {group!r} in this catalog"


class InvalidProperty(InvalidInput):
    """An ``icelog.*`` table property has a malformed value (``storage.properties``).

    Refused when set, and when a commit reads it: that commit writes nothing.
    """

    table: str | None
    key: str
    value: str

    def describe(self) -> str:
        where = f"{self.table}: " if self.table else ""
        return f"{where}table property {self.key}={self.value!r} is malformed ({self.reason}); nothing was written"


class InvalidSetting(InvalidInput):
    """An ``ICELOG_*`` environment variable has a malformed value (``storage.settings``).

    Refused where icelog reads its settings (an entry point, or a library call that was given
    none), before anything is written.
    """

    variable: str
    value: str
    message = "environment variable {variable}={value!r} is malformed: {reason}"


class UnknownSnapshot(InvalidInput):
    table: str
    snapshot_id: int
    retained: list[int]
    reason = "unknown snapshot"

    def describe(self) -> str:
        oldest = f"; the oldest retained is {self.retained[0]}" if self.retained else ""
        return (
            f"{self.table} has no snapshot {self.snapshot_id} (never existed, or expired: "
            f"{len(self.retained)} snapshots are retained{oldest}); `icelog snapshots {self.table}` lists them"
        )


class UnknownProperty(InvalidProperty):
    """A table property icelog does not let a user set (``storage.properties.SETTABLE``)."""

    def describe(self) -> str:
        where = f"{self.table}: " if self.table else ""
        return f"{where}cannot set table property {self.key}: {self.reason}; nothing was written"


class ConfirmationRequired(InvalidInput):
    """A destructive command was not confirmed: no ``--yes``, and no terminal to ask on."""

    action: str
    message = "{action} needs confirmation: {reason}; nothing was changed"


class TableInUse(TerminalError):
    """A table that transactions or consumer groups still use; deleting it needs ``--force``."""

    table: str
    users: list[str]
    hint: str
    message = "{table} is in use ({users_text}); nothing was changed: {hint}"

    @property
    def users_text(self) -> str:
        return "; ".join(self.users)


class HistoryExpired(InvalidInput):
    """Time travel to a moment older than the retained history: no answer is right."""

    table: str
    requested: str
    oldest: str | None
    reason = "history expired"
    message = (
        "{table}: history before {oldest} has expired, so the table as of {requested} "
        "cannot be answered; `icelog snapshots {table}` lists what is retained "
        "(raise icelog.snapshots.keep with `icelog topics alter {table}` to keep more)"
    )


class InvalidConnection(InvalidInput):
    """An Airflow connection that cannot open an icelog catalog (missing, another type, or
    malformed); nothing was read or written."""

    conn_id: str
    message = "Airflow connection {conn_id!r}: {reason}"


# --- unknown things ------------------------------------------------------------------------


class UnknownTable(TerminalError):
    table: str
    catalog: str | None = None
    message = "no log table {table!r} in catalog {catalog!r}"


class TableAlreadyExists(TerminalError):
    table: str
    message = "log table {table!r} already exists"


class NotALogTable(TerminalError):
    table: str
    message = "{table!r} is an Iceberg table but not an icelog log table"


class UnsupportedFormat(TerminalError):
    """The table's state was written by a newer icelog, in an encoding this one cannot read."""

    location: str
    format: str
    supported: str
    message = (
        "the log table at {location} has icelog state format {format}; this icelog reads "
        "formats {supported}: upgrade icelog to write to it"
    )


class MissingExtra(TerminalError):
    """A feature needs an optional dependency that is not installed (``pyproject.toml``'s extras):
    the core is pyiceberg, pyarrow and DuckDB; Spark, Airflow, Great Expectations come with extras."""

    feature: str
    module: str
    extra: str
    message = "{module} is not installed; {feature} needs it: pip install 'icelog[{extra}]'"


class UnknownPartition(TerminalError):
    table: str
    partition: Any
    partitions: int

    def describe(self) -> str:
        return f"{self.table} has no partition {self.partition!r} (partitions 0..{self.partitions - 1})"


# --- conflicts ------------------------------------------------------------------------------


class ConflictError(IcelogError):
    """The request lost against the table's current state (CLI exit code 3)."""


class OffsetMismatch(ConflictError, AbortableError):
    """A conditional append expected a log end offset that is no longer current (I2)."""

    table: str
    partition: int
    expected: int
    actual: int
    message = "{table} partition {partition}: expected offset {expected} but the log end offset is {actual}"


class CommitConflict(ConflictError, TransientError):
    """Every attempt lost the compare-and-swap to a concurrent commit."""

    table: str
    attempts: int
    message = "{table}: commit lost {attempts} compare-and-swap races in a row"


class TableChanged(ConflictError, TransientError):
    """The table was re-created, or its schema changed, between the check of the rows and the
    commit: rows converted for one table must not land in another. Nothing was written;
    ``LogTable.append`` checks the rows again on the table as it is."""

    table: str
    reason: str
    message = "{table} changed after its rows were checked ({reason}); nothing was written"


class TransactionTableChanged(ConflictError, AbortableError):
    """A table a transaction sent to was dropped and re-created under its name (or its schema
    changed) before the transaction committed. Its rows were checked for the other table, so
    the transaction can never commit: it is aborted, the table as it is stays untouched, and
    the transactional id goes on with its next transaction."""

    table: str
    txn_id: str
    reason: str
    message = "{table} changed after transaction {txn_id} sent to it ({reason}); the transaction is aborted, nothing was written"


class ForeignCommit(ConflictError, TerminalError):
    """The table's current snapshot was not made by icelog: building on it could break I1.

    Repair with ``icelog repair TABLE``: it adopts the foreign rows when they extend the log
    exactly, or rolls back to the last icelog snapshot.
    """

    table: str
    snapshot_id: int | None
    icelog_snapshot_id: int | None
    message = (
        "{table}: the current snapshot {snapshot_id} was not written by icelog "
        "(its last commit made snapshot {icelog_snapshot_id}); refusing to build on it. "
        "Run `icelog repair {table}`"
    )


class ForeignPartitionSpec(ConflictError, TerminalError):
    """Another tool changed the log table's default partition spec (``update_spec()``): icelog
    writes each data file into exactly one log partition, under ``identity(log_partition)``
    alone, so it refuses to write under any other spec. Reads still work.

    ``icelog repair TABLE`` sets the default spec back to ``identity(log_partition)`` (the
    table keeps its older specs, and files written under them stay readable).
    """

    table: str
    spec_id: int
    spec: str
    message = (
        "{table}: the default partition spec {spec_id} ({spec}) was set by another writer; icelog writes "
        "only under identity(log_partition) and wrote nothing. Run `icelog repair {table}` to set it back"
    )


class CatalogUnavailable(TransientError):
    """The catalog could not be read (e.g. a busy SQLite database) for every attempt."""

    table: str
    reason: str
    message = "{table}: catalog unavailable ({reason})"


class CatalogBusy(CatalogUnavailable):
    """SQLite refused a commit's pointer swap for a lock another connection held ("database is
    locked"): a definite no, nothing was written. The commit core tries again until its deadline."""

    message = "{table}: catalog database busy, nothing written ({reason})"


class CommitOutcomeUnknown(TransientError):
    """The catalog call failed and icelog could not tell whether the commit landed."""

    table: str
    commit_id: str
    reason: str
    message = "{table}: outcome of commit {commit_id} is unknown ({reason}); re-send with the same commit id"


class CommitIdForgotten(TerminalError):
    """A re-sent commit id may have landed before the commit-id registry's window: the
    registry cannot prove it did not, so icelog neither writes it again nor says it landed."""

    table: str
    commit_id: str
    created_ms: int
    forgotten_ms: int
    message = (
        "{table}: commit id {commit_id} was made at {created_ms} ms, and the commit-id registry "
        "has forgotten commits up to {forgotten_ms} ms (icelog.commit-ids.keep, "
        "icelog.commit-ids.min-retention-ms): whether it landed cannot be proven. Check the log (offsets, "
        "producer sequences) before sending the rows again under a new commit id"
    )


class RegistryFileGone(CommitIdForgotten):
    """A commit-id registry file the table's current metadata lists is gone from the store
    (another engine's orphan cleanup deletes files no Iceberg metadata references, registry
    files included), and the re-sent id may be in it. As for an id older than the window: icelog
    neither writes it again nor says it landed. The table forgets the file's ids (its list drops
    it and ``icelog.commits.forgotten-ms`` moves past them), so later commits go on."""

    path: str
    created_ms: int | None  # type: ignore[assignment]  # None: the id carries no time
    message = (
        "{table}: commit id {commit_id} may be in the commit-id registry file {path}, which the table lists "
        "but the store no longer holds (deleted by an orphan cleanup that does not know icelog's registry "
        "files?): whether it landed cannot be proven, and the table now forgets that file's commits (up to "
        "{forgotten_ms} ms). Check the log (offsets, producer sequences) before sending the rows again under "
        "a new commit id; give foreign orphan cleanups an older_than of at least icelog.commit-ids.min-retention-ms"
    )


class StorageUnavailable(TransientError):
    """The warehouse could not be written (e.g. a full disk) before the pointer swap: nothing was
    committed, so the same request may be re-sent, with the same commit id, once it can be."""

    table: str
    reason: str
    message = "{table}: the warehouse could not be written ({reason}); nothing was committed"


class StorageUnreachable(TransientError):
    """The warehouse's store could not be reached outside a commit (e.g. an S3 server restarting
    while files are read, listed or copied): run the same call again once it can be."""

    table: str
    reason: str
    message = "{table}: the warehouse could not be reached ({reason}); run again"


class AtomicCommitUnsupported(TerminalError):
    """The catalog cannot swap several tables' metadata pointers in one step (I5)."""

    catalog: str
    kind: str
    message = (
        "catalog {catalog!r} ({kind}) cannot commit several tables atomically; "
        "icelog never commits them one by one. Use a SQL catalog (SQLite or PostgreSQL)"
    )


class TransactionPartUnsupported(AtomicCommitUnsupported):
    """A part of ``Consumer.commit(also=...)`` that a transaction cannot carry on a catalog without
    atomic multi-table commits (REST). There the output is a transaction: the journal decides,
    then each table rolls forward in its own commit and takes its part at its log end of that
    moment. Payload appends and pre-written files (rewritten at their new offsets if the table
    moved) fit; a payload append at expected offsets, or an idempotent producer's batch (whose
    sequence numbers are checked against the log end as it is at the commit), cannot. Refused
    before anything is written."""

    table: str
    part: str
    why: str
    message = (
        "catalog {catalog!r} ({kind}) commits `also` parts as a transaction that each table takes at its log end "
        "when it rolls forward; the part for {table} has {part}: {why}. Send it without, or use a SQL catalog "
        "(SQLite or PostgreSQL)"
    )


# --- idempotent producers (I4) ------------------------------------------------------------


class UnknownProducer(TerminalError):
    table: str
    producer_id: int
    message = (
        "{table}: producer id {producer_id} is unknown "
        "(never initialised here, or expired after disuse): call `producers init` again"
    )


class ProducerFenced(ConflictError, TerminalError):
    """A newer instance of this producer exists; this (zombie) instance may never write again."""

    table: str
    producer_id: int
    epoch: int
    current_epoch: int
    message = "{table}: producer {producer_id} epoch {epoch} is fenced by epoch {current_epoch}"


class InvalidProducerEpoch(TerminalError):
    table: str
    producer_id: int
    epoch: int
    current_epoch: int
    message = "{table}: producer {producer_id} sent epoch {epoch}, ahead of the current epoch {current_epoch}"


class OutOfOrderSequence(TerminalError):
    table: str
    partition: int
    producer_id: int
    sequence: int
    expected: int
    message = "{table} partition {partition}: producer {producer_id} sent sequence {sequence}, expected {expected}"


class PartlyDuplicate(OutOfOrderSequence):
    """One append's batch was already written on some of its partitions and not on others.

    Commits are atomic, so a multi-partition batch is all new or all a re-send; for the Python API
    this is a protocol error. The gateway, whose batches per partition are independent, commits
    each part alone instead."""

    written: list[int]
    message = (
        "{table}: producer {producer_id}'s batch was already written on partitions {written} "
        "but not on partition {partition} (sequence {sequence})"
    )


class DuplicateSequence(TerminalError):
    """The batch was written, but too long ago for its offsets to be remembered."""

    table: str
    partition: int
    producer_id: int
    sequence: int
    message = (
        "{table} partition {partition}: sequence {sequence} of producer "
        "{producer_id} was already written (older than the last batches kept)"
    )


# --- transactions (I5) ---------------------------------------------------------------------


class TransactionRollingForward(TransientError):
    """A consistent read would have to read a table as it was before a transaction's part, and
    that snapshot has been expired while the transaction's other tables still roll forward.
    Retry once it has rolled forward (``icelog transactions recover`` finishes it)."""

    table: str
    txn_id: str
    message = (
        "{table}: transaction {txn_id} is still rolling forward into its other tables, and the snapshot "
        "before its part here has expired, so no consistent read exists yet; retry, or finish it with "
        "`icelog transactions recover`"
    )


class SentFilesMissing(AbortableError):
    """Data files a transaction's sends wrote are gone before its decision (a catalog without atomic
    multi-table commits), deleted by hand or by an orphan cleanup whose age limit is shorter than
    the transaction: it is aborted before it decides, and nothing of it is visible. Send it again."""

    table: str
    txn_id: str
    missing: list[str]

    def describe(self) -> str:
        return (
            f"transaction {self.txn_id}: {len(self.missing)} data files its sends wrote to {self.table} are gone "
            f"(e.g. {self.missing[0] if self.missing else '?'}), so it was aborted before its decision and nothing "
            "of it is visible; send it again (and give orphan cleanup an age limit longer than any transaction)"
        )


class PreparedFilesMissing(TerminalError):
    """A prepared transaction's staged files are gone (deleted by hand, or by an older orphan
    cleanup): it can never commit. Left prepared until an operator aborts it, since files
    on an unmounted store may come back."""

    transactional_id: str
    txn_id: str
    missing: list[str]

    def describe(self) -> str:
        return (
            f"transaction {self.txn_id} of {self.transactional_id!r} is prepared but {len(self.missing)} of its "
            f"staged files are gone (e.g. {self.missing[0] if self.missing else '?'}), so it can never commit; "
            f"abort it with `icelog transactions abort {self.transactional_id} --missing-files`"
        )


class JournalUnreadable(TerminalError):
    """The coordinator's state in the transaction journal (its ``icelog.transactions`` property)
    cannot be read: as a whole (``transactional_id`` None: no coordinator action can run) or one
    transactional id's entry (that id alone is stuck; every other goes on, and the entry is kept
    byte for byte). Raised before anything is written."""

    table: str
    transactional_id: str | None
    reason: str

    def describe(self) -> str:
        which = "the coordinator state" if self.transactional_id is None else f"the entry of {self.transactional_id!r}"
        return (
            f"{self.table}: {which} cannot be read ({self.reason}); nothing was written. "
            "Restore the table property icelog.transactions from an earlier metadata file of the journal"
        )


class RecoveryIncomplete(TerminalError):
    """Recovery finished every transaction it could; these ones failed (each with its typed error)."""

    rolled_forward: list[str]
    aborted: list[str]
    failed: list[dict]

    def describe(self) -> str:
        stuck = "; ".join(f"{f['transactional_id']!r}: {f['error']}: {f['message']}" for f in self.failed)
        return (
            f"recovery rolled forward {len(self.rolled_forward)} and aborted {len(self.aborted)} transactions, "
            f"but could not finish {len(self.failed)}: {stuck}"
        )


# --- permissions (KIP-391's ReplicatorWrite ACL) -----------------------------------------


class AuthorizationFailed(TerminalError):
    """The calling principal lacks a permission (CLI exit code 5); nothing was written."""

    principal: str
    operation: str
    table: str
    message = "principal {principal!r} may not {operation} on {table} (default deny; see `icelog acls`)"


class UnsafeListener(InvalidInput):
    """A server asked to listen beyond the loopback interface without authentication: refused,
    since any client reaching it could write every log table of the catalog."""

    host: str
    reason = "icelog serve listens beyond loopback addresses only with SASL users (--sasl-users)"
    message = "refusing to listen on {host}: {reason}"


class SaslUsersFile(InvalidInput):
    """A SASL users file that cannot be used (unreadable, open to other users, a malformed line):
    nothing is served."""

    path: str
    message = "SASL users file {path}: {reason}"


# --- consumer groups (I10) ------------------------------------------------------------------


class InvalidRange(InvalidInput):
    """A range commit that is malformed, overlaps offsets already done, or leaves the log."""

    table: str
    partition: int
    first: Any
    last: Any
    message = "{table} partition {partition}: range {first!r}-{last!r} refused: {reason}"


class RangeLimitExceeded(TransientError):
    """The commit would keep more open ranges than ``icelog.groups.max-ranges``: close a gap first."""

    group: str
    table: str
    partition: int
    ranges: int
    limit: int
    message = (
        "group {group!r} {table} partition {partition}: {ranges} open ranges would pass "
        "the limit {limit} (icelog.groups.max-ranges); commit the offsets of the lowest gap first"
    )


class StaleGeneration(ConflictError, AbortableError):
    """A group member acted with a generation that is no longer current (or was removed): fenced."""

    group: str
    member: str
    generation: int
    current_generation: int
    message = (
        "group {group!r}: member {member!r} acted at generation {generation}, "
        "the group is at {current_generation} (rejoin, then redo from the committed offsets)"
    )


# --- writes with offsets and mirrors (KIP-391, I6) -----------------------------------------


class InvalidProduceOffset(ConflictError, AbortableError):
    """A batch with explicit offsets does not start at the partition's log end (KIP-391)."""

    table: str
    partition: int
    offset: int
    log_end: int
    message = "{table} partition {partition}: a batch with offsets must start at the log end {log_end}, not at {offset}"


class PlanOutdated(ConflictError, AbortableError):
    """A concurrent commit changed the state a request was planned from (a mirror step's
    progress, group offsets or the target's promotion): landing it would move that state back
    or write over a promoted table. Plan again."""

    table: str
    what: str
    message = "{table}: {what} changed since this request was planned; plan it again"


class CorruptBatch(InvalidInput):
    """A batch's own offsets are not consecutive (or not of the partition it names)."""

    table: str
    partition: int
    message = "corrupt batch for {table} partition {partition}: {reason}"


class ReadOnlyTable(TerminalError):
    """The table is a mirror target: only the mirror writes it until it is promoted."""

    table: str
    source: str
    message = "{table} is a read-only mirror of {source}; run `icelog mirror promote {table}` to write to it"


class MirrorGap(TerminalError):
    """The source no longer holds offsets the mirror never copied (retention ran first)."""

    source: str
    partition: int
    missing_start: int
    missing_end: int
    message = (
        "{source} partition {partition}: offsets [{missing_start}, {missing_end}) "
        "were removed by the source's retention before they were mirrored; refusing to skip them"
    )


class MirrorSourceChanged(TerminalError):
    """The source table is not the one the mirror copies (dropped and re-created, or another table)."""

    source: str
    expected_uuid: str
    actual_uuid: str
    message = (
        "{source} is not the table this mirror copies: its table UUID is {actual_uuid}, "
        "the mirror's source was {expected_uuid} (dropped and re-created?); refusing to mix them"
    )


class MirrorPromoted(TerminalError):
    """The target was promoted: mirroring into it has stopped for good."""

    table: str
    message = "{table} was promoted to a writable table; it is no longer a mirror target"


class MirrorSchemaChanged(TerminalError):
    """The source gained columns its mirror lacks: copying on would drop them."""

    source: str
    columns: list[str]
    message = "{source} has columns its mirror lacks: {columns}; mirror into a new target table"


# --- the ingest ledger ------------------------------------------------------------------


class SourceFileChanged(TerminalError):
    """A source file was loaded before and its content changed since; nothing was written."""

    table: str
    path: str
    loaded_fingerprint: str
    fingerprint: str
    loaded_at: str
    message = (
        "{path} was loaded into {table} at {loaded_at} and its content changed since "
        "({loaded_fingerprint} -> {fingerprint}); nothing was loaded. "
        "Reload it as new rows with --reload-changed, or restore the file"
    )

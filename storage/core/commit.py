"""The commit core: every icelog write path goes through :func:`commit_tables`.

One protocol for one table or several (docs/guarantees.md: I2, I3, I5, I7); :func:`commit`
is its one-table case.

1. Load the tables (one catalog instant). If this commit id already landed (an earlier
   attempt whose outcome was unknown), return its recorded result: never write twice.
   Every commit records its id in the table's commit-id registry (``storage.core.registry``:
   its newest entries in ``icelog.commits``, older ones in registry files the same swap
   lists), so commits that add no snapshot are findable too, for the last
   ``icelog.commit-ids.keep`` commits of the table (default 1,000), however many snapshots
   are retained.
2. Refuse to build on a foreign commit: ``icelog.head`` names the snapshot icelog's last
   commit left current; a different current snapshot was made by another writer
   (:class:`ForeignCommit`, repaired by ``storage.log.repair``). Refuse, as well, what a request
   may not write: a read-only mirror target (:class:`ReadOnlyTable`; only the mirror's own
   writes and its promotion may), and a system table ``icelog_system.*`` (only icelog's own
   state requests may: a forged journal record or producer-id lease would be believed).
3. Decide, purely, from the base state: ``request.decide(state, table)`` -> :class:`Decision`.
   Each request names its state type (log table or system table). A request that records what
   the others decided (a transaction's COMMITTED record names each table's offsets) decides
   after them, on their decisions: ``request.decide_after(state, table, decided)``.
4. Write data files: each decision's ``rows``, through its request's ``write_rows`` (reused
   across attempts while the offsets they depend on stay the same).
5. Swap every table's metadata pointer from the exact base the decision read, all or nothing
   (``storage.core.swap``). pyiceberg's own commit retry, which rebases an append onto a
   different base, is never involved.
6. On a lost race, reload and decide again. On an unknown outcome, reload and look for the
   commit id before deciding again.
7. Liveness for slow commits: an ``exclusive`` request (compaction, retention: their swap
   stages more than an append's) that loses ``EXCLUSIVE_AFTER`` races in a row takes the
   table's lease (``icelog.lease``, a property-only compare-and-swap naming its commit id and
   an expiry ``LEASE_TTL_S`` ahead). Every other commit that sees a live lease waits, reading
   again, until the holder's commit clears it or it expires: so the holder's next attempt
   meets no competitor. A dead holder stalls writers for at most the TTL.

A commit never deletes the metadata file it replaced: a reader may hold that pointer.
Every commit sweeps metadata files superseded more than ``icelog.metadata.delete-grace-ms``
ago (default 60 s; ``storage.core.metadata_files``), so files still inside the grace at one
commit go at a later one. The table properties the core reads (``storage.properties``) are
read before anything is written: a malformed one refuses the commit, and nothing after the
swap may fail a commit that landed.
"""

from __future__ import annotations

import enum
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Literal, Mapping, Protocol, Sequence

from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchTableError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import CommitTableResponse, Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemovePropertiesUpdate,
    RemoveSnapshotsUpdate,
    SetDefaultSpecUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    ValidatableTableRequirement,
)
from sqlalchemy.exc import SQLAlchemyError

from icelog.storage import properties as props
from icelog.storage.core import avro_writers, faults, metadata_files, registry
from icelog.storage.core.catalog_config import SYSTEM_NAMESPACE
from icelog.storage.core.manifest_merge import merge_in_caller
from icelog.storage.core.registry import CLOCK_SKEW_MS, NOT_FOUND, commit_id_created_ms
from icelog.storage.core.registry import find_commit as find_commit  # re-exported: the registry's lookup
from icelog.storage.core.registry import new_commit_id as new_commit_id
from icelog.storage.core.registry import was_committed as was_committed
from icelog.storage.core.state import TableState
from icelog.storage.core.swap import TableSwap, apply_updates, check_atomic, load_tables, swap
from icelog.storage.errors import (
    CatalogBusy,
    CatalogUnavailable,
    CommitConflict,
    CommitIdForgotten,
    CommitOutcomeUnknown,
    ForeignCommit,
    IcelogError,
    InvalidIdentifier,
    InvalidInput,
    ReadOnlyTable,
    RegistryFileGone,
    StorageUnavailable,
    UnknownTable,
)
from icelog.storage.properties import COMMIT_FILES, COMMIT_ID, FORGOTTEN, HEAD, LEASE, RANGES, READ_ONLY, VERSION
from icelog.storage.telemetry import get_logger

log = get_logger("commit")
avro_writers.install()  # every commit writes a manifest and a manifest list per table

KEEP_SNAPSHOTS = props.SNAPSHOTS_KEEP.key
KEEP_COMMIT_IDS = props.COMMIT_IDS_KEEP.key
METADATA_GRACE_MS = props.METADATA_DELETE_GRACE_MS.key
LEASE_TTL_S = 10.0
# Set on a mirror target (to its source) until promoted: only the mirror writes it (I6).
EXCLUSIVE_AFTER = 3


class AssertStateVersion(ValidatableTableRequirement):
    """Requirement: the table's ``icelog.version`` property equals the one the decision read.

    The SQL catalog path also swaps the pointer from the exact base; this requirement keeps
    property-only commits compare-and-swap on catalogs that validate against their own
    current metadata.
    """

    type: Literal["assert-icelog-version"] = Field(default="assert-icelog-version")
    version: int

    def validate(self, base_metadata: TableMetadata | None) -> None:
        actual = _version(base_metadata) if base_metadata else None
        if actual != self.version:
            raise CommitFailedException(f"Requirement failed: icelog version is {actual}, expected {self.version}")


@dataclass
class Decision:
    """What one commit does to one table, decided purely from its base state.

    Attributes:
        state: The table state after the commit (written as table properties).
        result: Returned to the caller, with the snapshot id filled in.
        rows: What the request's ``write_rows`` writes, per partition (rows with their system
            columns filled; a transaction's staged sends and their first offsets); empty for none.
        ranges: Offsets added per partition (lineage, and the key for reusing written files).
        drop_files: Data files to remove (retention, compaction).
        add_files: Data files already written (e.g. by Spark executors or compaction).
        lineage: Extra snapshot-summary entries.
        expire: Snapshot ids to expire in the same commit.
        properties: Further table properties to set in the same commit.
        remove_properties: Table properties to remove in the same commit.
        set_main: Point ``main`` at this snapshot (a rollback), instead of adding one.
        default_spec_id: Make this existing partition spec the table's default (a repair).
        write: False when nothing needs committing (e.g. a re-sent batch already landed).
    """

    state: Any
    result: Any
    rows: Mapping[int, Any] = field(default_factory=dict)
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    drop_files: tuple[DataFile, ...] = ()
    add_files: tuple[DataFile, ...] = ()
    lineage: Mapping[str, str] = field(default_factory=dict)
    expire: tuple[int, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    remove_properties: tuple[str, ...] = ()
    set_main: int | None = None
    default_spec_id: int | None = None
    write: bool = True


class CommitRequest(Protocol):
    """What the core asks of a request; :class:`Request` has the defaults."""

    state_type: ClassVar[type[TableState]]
    allow_foreign: ClassVar[bool]
    exclusive: ClassVar[bool]
    writes_read_only: ClassVar[bool]
    writes_system: ClassVar[bool]
    reads_decisions: ClassVar[bool]
    reads_inputs: ClassVar[bool]

    def decide(self, state: Any, table: Table) -> Decision: ...

    def decide_after(self, state: Any, table: Table, decided: Mapping[str, Decision]) -> Decision: ...

    def keeps(self, data_file: DataFile) -> bool: ...

    def properties_after(self, properties: Mapping[str, str]) -> Mapping[str, str]: ...

    def receipt(self, result: Any) -> Any: ...

    def from_receipt(self, receipt: Any) -> Any: ...

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]: ...


class Request:
    """Defaults for commit requests: no receipt worth keeping, no special permission.

    A request names its own ``state_type`` (a log table's ``LogState``, a system table's
    :class:`SystemState`, ...): the core knows tables, not logs.

    ``receipt(result)`` is what the commit-id registry remembers (small JSON); after an
    unknown outcome, ``from_receipt`` turns it back into the caller's result.
    ``allow_foreign`` is for repair alone; ``exclusive`` may take the table's lease (step 7).
    ``writes_read_only`` is for the mirror's own writes and its promotion; ``writes_system``
    for the requests that keep icelog's own state in ``icelog_system.*`` (step 2).
    ``reads_decisions``: decided after the commit's other requests, on their decisions
    (:meth:`decide_after`); its files then depend on every table's offsets. ``reads_inputs``:
    its ``write_rows`` reads files another process may delete (a transaction's staged sends):
    one that is gone counts as a decision's input gone (the commit looks once more).
    """

    allow_foreign: ClassVar[bool] = False
    exclusive: ClassVar[bool] = False
    writes_read_only: ClassVar[bool] = False
    writes_system: ClassVar[bool] = False
    reads_decisions: ClassVar[bool] = False
    reads_inputs: ClassVar[bool] = False

    def decide_after(self, state: Any, table: Table, decided: Mapping[str, Decision]) -> Decision:
        """Decide on the base and on ``decided``, the decisions of the commit's other tables
        (a request that ``reads_decisions``; by default, :meth:`decide` alone)."""
        return self.decide(state, table)  # type: ignore[attr-defined]

    def keeps(self, data_file: DataFile) -> bool:
        """Whether a file ``write_rows`` gave must stay when the commit does not land (a file
        the caller wrote and commits as it is). By default none: the core deletes them."""
        return False

    def receipt(self, result: Any) -> Any:
        return None

    def from_receipt(self, receipt: Any) -> Any:
        return receipt

    def properties_after(self, properties: Mapping[str, str]) -> Mapping[str, str]:
        """The table properties this commit leaves, as far as the core's own knobs go: unchanged."""
        return properties

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        """Write a decision's ``rows`` as data files: the core knows tables, the request knows its format."""
        raise NotImplementedError(f"{type(self).__name__} decided rows but has no file writer")


@dataclass
class CommitOutcome:
    result: Any
    snapshot_id: int | None
    attempts: int
    already_committed: bool = False
    table: Table | None = None  # the table as this commit's swap left it (None: nothing swapped)


def _version(metadata: TableMetadata) -> int:
    return int(metadata.properties.get(VERSION, "0"))


def check_not_forgotten(identifier: str, metadata: TableMetadata, commit_id: str) -> None:
    """Raise :class:`CommitIdForgotten` unless the registry proves ``commit_id`` never landed.

    Called once the lookup did not find it. Every commit since the newest one the registry
    dropped is in it; an id made after that (by its UUIDv7 time, less the clock skew) can
    only have landed after it, so its absence is proven. Ids that carry no time cannot be
    judged: only the registry's window protects them.
    """
    created_ms = commit_id_created_ms(commit_id)
    forgotten_ms = int(metadata.properties.get(FORGOTTEN, "0") or 0)
    if created_ms is not None and forgotten_ms and created_ms - CLOCK_SKEW_MS <= forgotten_ms:
        raise CommitIdForgotten(table=identifier, commit_id=commit_id, created_ms=created_ms, forgotten_ms=forgotten_ms)


def icelog_head(metadata: TableMetadata) -> int | None | Literal["unknown"]:
    """The snapshot icelog's last commit left current (``"unknown"``: never recorded)."""
    head = metadata.properties.get(HEAD)
    if head is None:
        return "unknown"
    return int(head) if head else None


def check_head(identifier: str, metadata: TableMetadata) -> None:
    """Raise :class:`ForeignCommit` if another writer moved ``main`` since icelog's last commit."""
    head, current = icelog_head(metadata), metadata.current_snapshot_id
    if head == "unknown":  # made before heads were recorded: the summary tells
        snapshot = metadata.current_snapshot()
        if snapshot is None or COMMIT_ID in (snapshot.summary.additional_properties if snapshot.summary else {}):
            return
        raise ForeignCommit(table=identifier, snapshot_id=current, icelog_snapshot_id=None)
    if head != current:
        raise ForeignCommit(table=identifier, snapshot_id=current, icelog_snapshot_id=head)


def refuse_read_only(identifier: str, metadata: TableMetadata) -> None:
    """Raise :class:`ReadOnlyTable` on a mirror target that was not promoted."""
    if metadata.properties.get(READ_ONLY):
        raise ReadOnlyTable(table=identifier, source=metadata.properties[READ_ONLY])


def is_system_table(identifier: str) -> bool:
    return identifier.split(".")[0].lower() == SYSTEM_NAMESPACE


def system_tables(catalog: Catalog) -> list[str]:
    """Every table in ``icelog_system`` (the commit registry, the ingest ledger, ...), sorted."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        return sorted(".".join(ident) for ident in catalog.list_tables(SYSTEM_NAMESPACE))
    except NoSuchNamespaceError:
        return []


def refuse_system_table(identifier: str) -> None:
    """Raise :class:`InvalidIdentifier` for ``icelog_system.*``: icelog alone writes its state there."""
    if is_system_table(identifier):
        raise InvalidIdentifier(
            identifier=identifier, reason=f"{SYSTEM_NAMESPACE}.* holds icelog's own state and is written only by icelog"
        )


def check_writable(identifier: str, metadata: TableMetadata, request: CommitRequest) -> None:
    """Step 2: refuse a request on a table it may not write (a system table, a read-only mirror)."""
    if not request.writes_system:
        refuse_system_table(identifier)
    if not request.writes_read_only:
        refuse_read_only(identifier, metadata)


def load(catalog: Catalog, identifier: str, attempts: int = 8) -> Table:
    """Load a table, retrying while its pointer moves on under us.

    A metadata file can vanish between reading the pointer and reading the file only when
    a writer that is not icelog deletes it (icelog defers deletion); reading the pointer
    again finds the new one.

    Raises:
        UnknownTable: no such table.
        CatalogUnavailable: the metadata file of the current pointer stayed unreadable.
    """
    for attempt in range(1, attempts + 1):
        try:
            return catalog.load_table(identifier)
        except NoSuchTableError as e:
            raise UnknownTable(table=identifier, catalog=catalog.name) from e
        except FileNotFoundError as e:
            if attempt == attempts:
                raise CatalogUnavailable(table=identifier, reason=f"metadata file missing: {e}") from e
            time.sleep(0.005 * attempt)
    raise AssertionError("unreachable")


def _load_all(catalog: Catalog, identifiers: Sequence[str]) -> dict[str, Table]:
    if len(identifiers) == 1:
        return {identifiers[0]: load(catalog, identifiers[0])}
    for attempt in range(1, 9):
        try:
            return load_tables(catalog, identifiers)
        except NoSuchTableError as e:
            missing = next(i for i in identifiers if i in str(e))
            raise UnknownTable(table=missing, catalog=catalog.name) from e
        except FileNotFoundError as e:
            if attempt == 8:
                raise CatalogUnavailable(table=",".join(identifiers), reason=f"metadata file missing: {e}") from e
            time.sleep(0.005 * attempt)
    raise AssertionError("unreachable")


def commit(
    catalog: Catalog,
    identifier: str,
    request: CommitRequest,
    *,
    commit_id: str | None = None,
    max_attempts: int = 200,
    deadline_s: float = 120.0,
    write_rows: Callable[[Table, Mapping[int, Any]], list[DataFile]] | None = None,
    loaded: Table | None = None,
    resent: bool | None = None,
) -> CommitOutcome:
    """Run one table's ``request`` through the commit protocol (the one-table case).

    ``loaded``: the table as the caller last saw it, the first attempt's base (saves reading the
    metadata again). It may be older than the table: a base that moved on loses the
    compare-and-swap, and an error decided on it is raised only if the table as it is now
    gives it too.
    """
    return commit_tables(
        catalog,
        [(identifier, request)],
        commit_id=commit_id,
        max_attempts=max_attempts,
        deadline_s=deadline_s,
        write_rows=write_rows,
        loaded={identifier: loaded} if loaded is not None else None,
        resent=resent,
    )[0]


def commit_tables(
    catalog: Catalog,
    parts: Sequence[tuple[str, CommitRequest]],
    *,
    commit_id: str | None = None,
    max_attempts: int = 200,
    deadline_s: float = 120.0,
    write_rows: Callable[[Table, Mapping[int, Any]], list[DataFile]] | None = None,
    loaded: Mapping[str, Table] | None = None,
    resent: bool | None = None,
) -> list[CommitOutcome]:
    """Run one request per table through the commit protocol, all tables in one atomic commit.

    Args:
        catalog: The catalog of every table.
        parts: ``(identifier, request)`` per table, each table at most once.
        commit_id: Idempotency key, recorded in every table written.
        loaded: Every table as the caller last saw it, the first attempt's bases (see :func:`commit`).
        resent: Whether ``commit_id`` may have been sent before (default: whenever the caller gives
            one). A re-sent id the registry may have forgotten raises :class:`CommitIdForgotten`; a
            caller that made the id just now says False.

    Returns:
        One outcome per part, in order.

    Raises:
        CommitConflict: every attempt lost the compare-and-swap.
        CommitOutcomeUnknown: the catalog kept failing in ways that leave the outcome unknown.
        CatalogUnavailable: the catalog could not be read.
        AtomicCommitUnsupported: several tables on a catalog without atomic multi-table swaps.
        ForeignCommit: a table's current snapshot was not made by icelog.
        TerminalError, AbortableError: whatever a request's ``decide`` raises.
    """
    identifiers = [ident for ident, _ in parts]
    if len(set(identifiers)) != len(identifiers):
        raise InvalidInput(reason=f"each table at most once per commit: {identifiers}")
    check_atomic(catalog, len(identifiers))
    run = _Run(
        catalog,
        list(parts),
        commit_id or new_commit_id(),
        resent=bool(commit_id) if resent is None else resent,  # a caller's id may have been sent before
        loaded=dict(loaded) if loaded and set(loaded) == set(identifiers) else None,
        write_rows=write_rows,
        max_attempts=max_attempts,
        deadline_s=deadline_s,
    )
    return run.commit()


class _Turn(enum.Enum):
    """What a step tells the loop of :meth:`_Run.commit` when the commit is not over yet."""

    FRESH = "read again at once; not an attempt (a cached base to prove, another commit's lease)"
    NOW = "a new attempt at once"
    LATER = "a new attempt after a backoff, unless past the deadline"
    GIVE_UP = "past the deadline"


@dataclass
class _Run:
    """One :func:`commit_tables` call: its requests, and what it learnt from its attempts so far.

    :meth:`commit` is the protocol as a loop of named steps (read, look up, guard, decide,
    write, stage, swap); each step either lets the attempt go on or ends it with a
    :class:`_Turn` or the outcomes.
    """

    catalog: Catalog
    parts: list[tuple[str, CommitRequest]]
    commit_id: str
    resent: bool
    loaded: dict[str, Table] | None  # the caller's bases, for the first round only
    write_rows: Callable[[Table, Mapping[int, Any]], list[DataFile]] | None
    max_attempts: int
    deadline_s: float
    started: float = field(default_factory=time.monotonic)
    tables: dict[str, Table] = field(default_factory=dict)  # as the latest read found them
    written: dict[str, tuple[str, list[DataFile]]] = field(default_factory=dict)  # per table: (ranges key, files)
    attempt: int = 0
    rounds: int = 0  # attempts and fresh reads: only the first round may use the caller's base
    lost: int = 0  # races lost in a row
    unknown: BaseException | None = None  # the last swap's, if its outcome was unknown
    read_error: BaseException | None = None  # the last read's, if it failed
    input_gone: bool = False  # a decision found its input deleted on a fresh read
    swapped: bool = False
    landed: bool = False  # found in the registry: an earlier attempt landed
    # True from a swap call until it lost the race; for good once a swap's outcome was unknown
    # (a server may still apply it). While in doubt, no file this commit wrote is deleted.
    in_doubt: bool = False
    ever_unknown: bool = False

    def __post_init__(self) -> None:
        self.identifiers = [ident for ident, _ in self.parts]
        self.exclusive = any(request.exclusive for _, request in self.parts)
        self.bound = log.bind(tables=self.identifiers, commit_id=self.commit_id)

    def commit(self) -> list[CommitOutcome]:
        try:
            while self.attempt < self.max_attempts:
                self.attempt += 1
                self.rounds += 1
                turn = self._attempt(callers_base=self.rounds == 1 and self.loaded is not None)
                if isinstance(turn, list):
                    return turn
                if turn is _Turn.FRESH:
                    self.attempt -= 1
                elif turn is _Turn.GIVE_UP or (turn is _Turn.LATER and self._past_deadline()):
                    break
                elif turn is _Turn.LATER:
                    _backoff(self.attempt)
            raise self._failure()
        finally:
            self._clean_up()

    def _attempt(self, callers_base: bool) -> _Turn | list[CommitOutcome]:
        turn = self._read(callers_base)
        if turn is None:
            turn = self._look_up(callers_base) or self._guard(callers_base)
        if turn is not None:
            return turn
        planned = self._decide_write_stage(callers_base)
        if not isinstance(planned, tuple):
            return planned
        return self._swap(*planned)

    def _past_deadline(self) -> bool:
        return time.monotonic() - self.started > self.deadline_s

    # --- the steps ---------------------------------------------------------------------------

    def _read(self, callers_base: bool) -> _Turn | None:
        """Step 1: the tables, as the caller last saw them (first round) or as the catalog has them."""
        try:
            self.tables = dict(self.loaded or {}) if callers_base else _load_all(self.catalog, self.identifiers)
        except (SQLAlchemyError, CatalogUnavailable) as e:  # e.g. SQLite busy, a server restarting: read again
            self.bound.warning("catalog read failed", attempt=self.attempt, error=repr(e))
            self.read_error = e
            return _Turn.LATER
        self.read_error = None
        return None

    def _look_up(self, callers_base: bool) -> _Turn | list[CommitOutcome] | None:
        """Step 1: an earlier attempt (or send) of this commit id that landed is the answer.

        A registry file that cannot be read (a stale base whose file a later commit dropped and
        orphan cleanup deleted, a store restarting) is a failed read: read again. One that is gone
        while the table still lists it (:class:`RegistryFileGone`) cannot prove a re-sent id new:
        refused as a forgotten one, after the table drops the file. A first send's id was never
        sent: the gone file cannot hold it, and this commit drops the file.
        """
        try:
            receipts = {ident: self._find(ident) for ident in self.identifiers}
        except OSError as e:
            self.bound.warning("commit-id registry file unreadable", attempt=self.attempt, error=repr(e))
            self.read_error = e
            return _Turn.LATER
        if all(r is NOT_FOUND for r in receipts.values()):
            return None
        if callers_base:
            # A hit on the caller's base speaks for that table only: the name may since hold a
            # re-created table, which this commit never reached. Acknowledge on a fresh read.
            return _Turn.FRESH
        self.landed = True  # the swap is atomic: every table has it
        return [_landed(request, receipts[ident], self.attempt) for ident, request in self.parts]

    def _find(self, ident: str) -> Any:
        try:
            return find_commit(self.tables[ident], self.commit_id)
        except RegistryFileGone as e:
            if not self.resent:
                return NOT_FOUND
            _forget_gone(self.catalog, ident, self.bound)  # so that later commits on the table go on
            raise RegistryFileGone(**{**e.fields, "table": ident}) from None

    def _guard(self, callers_base: bool) -> _Turn | None:
        """Before deciding: a re-sent id the registry may have forgotten, and the lease (step 7)."""
        if self.resent:
            try:
                for ident in self.identifiers:
                    check_not_forgotten(ident, self.tables[ident].metadata, self.commit_id)
            except IcelogError:
                if not callers_base:
                    raise
                return _Turn.FRESH  # the caller's base may be stale: judge on the table as it is now
        wait = max((_lease_wait(t.metadata, self.commit_id) for t in self.tables.values()), default=0.0)
        if wait > 0:  # another commit's turn: not an attempt of ours
            if self._past_deadline():
                return _Turn.GIVE_UP
            time.sleep(min(wait, random.uniform(0.02, 0.1)))
            return _Turn.FRESH
        if self.exclusive and self.lost >= EXCLUSIVE_AFTER:
            if not all(_holds_lease(t.metadata, self.commit_id) for t in self.tables.values()):
                if self._past_deadline():
                    return _Turn.GIVE_UP
                if not _take_lease(self.catalog, list(self.tables.values()), self.commit_id, self.bound):
                    _backoff(self.lost)
                return _Turn.FRESH
        return None

    def _decide_write_stage(
        self, callers_base: bool
    ) -> tuple[list[_Plan], list[_Plan], list[TableSwap]] | _Turn | list[CommitOutcome]:
        """Steps 2 to 4: decide on the exact bases, write the rows, stage the catalog updates."""
        deciding = True
        try:
            plans = _decide(self.parts, self.tables)
            deciding = False
            if not any(plan.decision.write for plan in plans):
                if callers_base:  # no swap proves this base (a duplicate judged on it may be fenced since)
                    return _Turn.FRESH
                return [CommitOutcome(plan.decision.result, plan.state.snapshot_id, self.attempt, True) for plan in plans]
            _write_files(plans, self.written, self.write_rows)
            faults.checkpoint(faults.AFTER_DATA_FILES)
            staged = [plan for plan in plans if plan.decision.write]
            swaps = [
                _stage(p.table, p.state, p.decision, self.written[p.ident][1], self.commit_id, p.request, p.settings)
                for p in staged
            ]
        except IcelogError:
            if not (deciding and callers_base):
                raise
            return _Turn.FRESH  # decided on the caller's base, which may be stale: decide again on a fresh read
        except _InputGone as gone:  # a write step's input, as a decision's below
            if callers_base:
                return _Turn.FRESH
            if not self.input_gone:
                self.input_gone = True
                return _Turn.NOW
            raise gone.error from None
        except OSError as e:
            if callers_base:
                # The caller's base may be stale: a coordinator finished the transaction and deleted its
                # staged files, or maintenance deleted a manifest list the base names. Judge on a fresh read.
                return _Turn.FRESH
            if deciding and isinstance(e, FileNotFoundError):
                if not self.input_gone:  # whoever deleted the input may have landed this commit: look once more
                    self.input_gone = True
                    return _Turn.NOW
                raise  # a decision's input is gone (a finished transaction's staged files): its caller judges
            # E.g. a full disk, while a decision or this core writes data files or manifests. This
            # attempt's lookup did not find commit_id, and nothing is swapped yet: nothing is committed
            # (the files written so far are deleted on the way out).
            raise StorageUnavailable(table=",".join(self.identifiers), reason=repr(e)) from e
        return plans, staged, swaps

    def _swap(self, plans: list[_Plan], staged: list[_Plan], swaps: list[TableSwap]) -> _Turn | list[CommitOutcome]:
        """Step 5: every table's pointer from the exact base its decision read, all or nothing."""
        try:
            self.in_doubt = True
            responses = swap(self.catalog, _one_instant(swaps))
        except CommitFailedException as e:
            self.bound.debug("commit lost the race", attempt=self.attempt, reason=str(e))
            self.in_doubt, self.unknown = self.ever_unknown, None
            self.lost += 1
            _discard_snapshot_files(swaps)  # nothing references a lost attempt's manifests
            return _Turn.LATER
        except CatalogBusy as e:
            # A definite no (SQLite's "database is locked"): not a lost race, and nothing to look
            # for. Its files are nobody's, as a lost race's; the swap deleted its metadata files.
            self.bound.info("catalog busy, swap refused", attempt=self.attempt, error=str(e))
            self.in_doubt, self.unknown, self.read_error = self.ever_unknown, None, e
            _discard_snapshot_files(swaps)
            return _Turn.LATER
        except (CommitStateUnknownException, SQLAlchemyError, OSError) as e:
            # The swap may or may not have happened: the next attempt looks for commit_id.
            self.bound.warning("commit outcome unknown", attempt=self.attempt, error=repr(e))
            self.unknown, self.ever_unknown = e, True
            return _Turn.LATER
        self.swapped = True  # (it ended any lease of ours)
        faults.checkpoint(faults.AFTER_CATALOG_SWAP)
        return _landed_now(plans, staged, responses, self.attempt, self.bound)

    # --- the end -----------------------------------------------------------------------------

    def _failure(self) -> IcelogError:
        where = ",".join(self.identifiers)
        if self.unknown is not None:
            return CommitOutcomeUnknown(table=where, commit_id=self.commit_id, reason=repr(self.unknown))
        if isinstance(self.read_error, CatalogBusy):
            return CatalogBusy(table=where, reason=self.read_error.reason)
        if self.read_error is not None:
            return CatalogUnavailable(table=where, reason=repr(self.read_error))
        return CommitConflict(table=where, attempts=self.attempt)

    def _clean_up(self) -> None:
        if not (self.swapped or self.landed or self.in_doubt):
            # The commit ends without landing, and no attempt may have: what it wrote is nobody's
            # (a stale writer's OffsetMismatch, a lost race, a duplicate found on a fresh read).
            requests = dict(self.parts)
            for ident, (_, files) in self.written.items():
                _discard(self.tables[ident], [f for f in files if not requests[ident].keeps(f)])
        if self.exclusive and self.lost >= EXCLUSIVE_AFTER and not self.swapped:
            # It may hold the lease (it gave up, or found nothing to do): no need to wait out the TTL.
            _release_lease(self.catalog, self.identifiers, self.commit_id, self.bound)


@dataclass
class _Plan:
    """One table's part of an attempt: the request, the base it read, and what it decided."""

    ident: str
    request: CommitRequest
    table: Table
    state: TableState
    settings: props.CommitSettings
    decision: Decision


def _decide(parts: Sequence[tuple[str, CommitRequest]], tables: Mapping[str, Table]) -> list[_Plan]:
    """Steps 2 and 3: refuse what may not be built on or written, then decide on the exact base:
    first the requests that decide on their base alone, then those that read their decisions."""
    plans: dict[str, _Plan] = {}
    for after_others in (False, True):
        decided = {ident: plan.decision for ident, plan in plans.items()}
        for ident, request in parts:
            if request.reads_decisions is after_others:
                plans[ident] = _decide_one(ident, request, tables[ident], decided if after_others else None)
    return [plans[ident] for ident, _ in parts]


def _decide_one(ident: str, request: CommitRequest, table: Table, decided: Mapping[str, Decision] | None) -> _Plan:
    if not request.allow_foreign:
        check_head(ident, table.metadata)
    check_writable(ident, table.metadata, request)
    state = request.state_type.from_metadata(table.metadata)
    # Read before anything is written; a request that changes these knobs runs under its new
    # values, so that a malformed one (set by another tool) can be fixed by a commit.
    settings = props.CommitSettings.of(request.properties_after(table.metadata.properties), ident)
    # A decision may write files itself (compaction's merged files): the caller handles OSError.
    if decided is None:
        decision = request.decide(state, table)
    else:
        decision = request.decide_after(state, table, decided)
    return _Plan(ident, request, table, state, settings, decision)


class _InputGone(Exception):
    """A write step found an input of its request deleted (``reads_inputs``): ``error`` says which."""

    def __init__(self, error: FileNotFoundError) -> None:
        super().__init__(str(error))
        self.error = error


def _write_files(
    plans: list[_Plan],
    written: dict[str, tuple[str, list[DataFile]]],
    write_rows: Callable[[Table, Mapping[int, Any]], list[DataFile]] | None,
) -> None:
    """Step 4: write each decision's rows, reusing the last attempt's files while the offsets hold.

    A file is reused only for the same table (uuid: a table re-created under the name may be at
    the same offsets) and the same offsets of that table; for a request that ``reads_decisions``,
    the same offsets in *every* table of the commit: its rows record what the others got (the
    journal's COMMITTED record names each table's offsets).
    """
    offsets = {plan.ident: sorted((int(p), list(r)) for p, r in plan.decision.ranges.items()) for plan in plans}
    due: list[tuple[_Plan, str]] = []
    for plan in plans:
        if not plan.decision.write:
            continue
        depends = sorted(offsets.items()) if plan.request.reads_decisions else []
        key = json.dumps([str(plan.table.metadata.table_uuid), offsets[plan.ident], depends])
        if plan.ident in written and written[plan.ident][0] == key:
            continue
        if plan.ident in written:
            # The commit id is not in the table, so the last attempt's files never landed.
            _discard(plan.table, [f for f in written.pop(plan.ident)[1] if not plan.request.keeps(f)])
        due.append((plan, key))

    def write(plan: _Plan) -> list[DataFile]:
        return (write_rows or plan.request.write_rows)(plan.table, plan.decision.rows) if plan.decision.rows else []

    # Tables side by side (a transaction's): reading and writing Parquet mostly waits on the file
    # system and on Arrow, which releases the GIL. Every table's files are recorded, even when
    # another table's write failed, so that a commit that ends without landing deletes them.
    failed: BaseException | None = None
    for (plan, key), outcome in zip(due, _side_by_side(write, [plan for plan, _ in due]), strict=True):
        if isinstance(outcome, BaseException):
            if isinstance(outcome, FileNotFoundError) and plan.request.reads_inputs:
                gone = _InputGone(outcome)
                gone.__cause__ = outcome  # as ``raise ... from``: the missing input stays in the traceback
                outcome = gone
            failed = failed or outcome
        else:
            written[plan.ident] = (key, outcome)
    if failed is not None:
        raise failed


def _side_by_side(job: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``job`` on every item, at once when there are several; each result, or the exception it raised."""

    def run(item: Any) -> Any:
        try:
            return job(item)
        except Exception as e:  # noqa: BLE001 - handed to the caller, which raises it
            return e

    if len(items) < 2:
        return [run(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(8, len(items)), thread_name_prefix="icelog-write") as pool:
        return list(pool.map(run, items))


def _landed_now(
    plans: list[_Plan], staged: list[_Plan], responses: Sequence[CommitTableResponse], attempt: int, bound: Any
) -> list[CommitOutcome]:
    """After the swap: sweep superseded metadata and give every result its snapshot."""
    snapshots: dict[str, int | None] = {}
    for plan, response in zip(staged, responses, strict=True):
        _delete_superseded_metadata(plan.table, response, plan.settings.metadata_grace_ms)
        snapshots[plan.ident] = response.metadata.current_snapshot_id
        _attach_snapshot(plan.decision.result, snapshots[plan.ident])
    bound.debug("committed", attempt=attempt, snapshots=snapshots)
    after = {
        plan.ident: Table(plan.table.name(), response.metadata, response.metadata_location, plan.table.io, plan.table.catalog)
        for plan, response in zip(staged, responses, strict=True)
    }
    return [
        CommitOutcome(
            p.decision.result, snapshots.get(p.ident, p.state.snapshot_id), attempt, not p.decision.write, after.get(p.ident)
        )
        for p in plans
    ]


def _lease(metadata: TableMetadata) -> tuple[str, float]:
    """(holder, expiry in epoch seconds); a malformed value (set by hand) is no lease."""
    holder, _, expiry = metadata.properties.get(LEASE, "").partition(" ")
    try:
        return holder, float(expiry) / 1000
    except ValueError:
        return "", 0.0


def _holds_lease(metadata: TableMetadata, commit_id: str) -> bool:
    holder, expiry = _lease(metadata)
    return holder == commit_id and expiry > time.time()


def _lease_wait(metadata: TableMetadata, commit_id: str) -> float:
    """Seconds left on another commit's lease; 0 for none, ours, or an expired one. An expiry
    further ahead than the TTL (a clock far off on the holder's host) counts as expired."""
    holder, expiry = _lease(metadata)
    left = expiry - time.time()
    return left if holder and holder != commit_id and 0 < left <= LEASE_TTL_S else 0.0


def _take_lease(catalog: Catalog, tables: list[Table], commit_id: str, bound: Any) -> bool:
    """A property-only compare-and-swap (``icelog.version`` moves, so two takers serialise).
    Losing it, or an unknown outcome, is one more round: the caller reads again."""
    expiry = int((time.time() + LEASE_TTL_S) * 1000)
    swaps = [
        TableSwap(
            table,
            (AssertTableUUID(uuid=table.metadata.table_uuid), AssertStateVersion(version=_version(table.metadata))),
            (SetPropertiesUpdate(updates={LEASE: f"{commit_id} {expiry}", VERSION: str(_version(table.metadata) + 1)}),),
        )
        for table in tables
    ]
    try:
        swap(catalog, swaps)
    except (CommitFailedException, CatalogBusy, CommitStateUnknownException, SQLAlchemyError, OSError) as e:
        bound.debug("lease not taken", reason=repr(e))
        return False
    bound.info("took the lease", ttl_s=LEASE_TTL_S)
    return True


def _forget_gone(catalog: Catalog, identifier: str, bound: Any) -> None:
    """Best effort: a property-only swap that drops the registry files this process found gone
    from the table's list and moves ``icelog.commits.forgotten-ms`` past them. Failing, the
    table's next commit that finds them drops them."""
    try:
        table = load(catalog, identifier)
        healed = registry.without_gone(table.metadata)
        if healed is None:
            return
        files, newest_ms = healed
        forgotten_ms = max(newest_ms, int(table.metadata.properties.get(FORGOTTEN, "0") or 0))
        version = _version(table.metadata)
        updates = {COMMIT_FILES: files, FORGOTTEN: str(forgotten_ms), VERSION: str(version + 1)}
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), AssertStateVersion(version=version))
        swap(catalog, [TableSwap(table, requirements, (SetPropertiesUpdate(updates=updates),))])
    except Exception as e:  # noqa: BLE001 - the table's next commit drops them
        bound.warning("gone registry files not dropped yet", error=repr(e))
        return
    bound.warning("dropped gone registry files; their ids are forgotten", forgotten_ms=forgotten_ms)


def _release_lease(catalog: Catalog, identifiers: list[str], commit_id: str, bound: Any) -> None:
    """Best effort, for a holder that gives up: clear its lease; failing, it expires."""
    try:
        tables = _load_all(catalog, identifiers)
        held = [t for t in tables.values() if _lease(t.metadata)[0] == commit_id]
        if held:
            swap(
                catalog,
                [
                    TableSwap(
                        t,
                        (AssertStateVersion(version=_version(t.metadata)),),
                        (SetPropertiesUpdate(updates={LEASE: "", VERSION: str(_version(t.metadata) + 1)}),),
                    )
                    for t in held
                ],
            )
    except Exception as e:  # noqa: BLE001 - the lease's expiry is the fallback
        bound.warning("lease not released; it expires", error=repr(e))


def _landed(request: CommitRequest, found: Any, attempt: int) -> CommitOutcome:
    """The outcome of a commit found in the registry (a table it did not write gets None)."""
    if found is NOT_FOUND:
        return CommitOutcome(None, None, attempt, True)
    receipt, snapshot_id = found
    result = request.from_receipt(receipt)
    _attach_snapshot(result, snapshot_id)
    return CommitOutcome(result, snapshot_id, attempt, True)


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(0.5, 0.002 * 2 ** min(attempt, 8))))


def _delete_superseded_metadata(base: Table, response: CommitTableResponse, grace_ms: int) -> None:
    """After a commit landed: sweep superseded metadata files (``storage.core.metadata_files``).

    Nothing here may fail the commit: its caller must hear that it landed.
    """
    try:
        metadata_files.delete_superseded(base.io, response.metadata, response.metadata_location, grace_ms, base.metadata)
    except Exception as e:  # noqa: BLE001 - a later commit or `maintain` sweeps again
        log.warning("could not sweep superseded metadata files", location=response.metadata_location, error=repr(e))


def _discard_snapshot_files(swaps: Sequence[TableSwap]) -> None:
    """After a lost race: delete the manifest lists, the new manifests and the commit-id registry
    files the attempt staged.

    A manifest is new when the parent snapshot's list does not name it (merged manifests
    included); a registry file, when the base's list does not. Best effort: what stays is an
    orphan for maintenance, never a loss.
    """
    for s in swaps:
        io = s.base.io
        for update in s.updates:
            if isinstance(update, SetPropertiesUpdate):
                for path in registry.files_written(s.base.metadata, update.updates):
                    try:
                        io.delete(path)
                    except OSError:
                        pass
            if not isinstance(update, AddSnapshotUpdate):
                continue
            snapshot = update.snapshot
            try:
                parent = s.base.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
                kept = {m.manifest_path for m in parent.manifests(io)} if parent is not None else set()
                new = [m.manifest_path for m in snapshot.manifests(io) if m.manifest_path not in kept]
            except Exception as e:  # noqa: BLE001 - orphan cleanup gets them later
                log.debug("lost attempt's manifests not listed", error=repr(e))
                continue
            for path in [*new, snapshot.manifest_list]:
                try:
                    io.delete(path)
                except OSError:
                    pass


def _discard(table: Table, files: list[DataFile]) -> None:
    for data_file in files:
        try:
            table.io.delete(data_file.file_path)
        except OSError:
            pass  # orphan cleanup (storage.admin.orphans) gets it later


def _attach_snapshot(result: Any, snapshot_id: int | None) -> None:
    if hasattr(result, "snapshot_id"):
        result.snapshot_id = snapshot_id


class _StagingTransaction(Transaction):
    """pyiceberg's ``Transaction``, with its metadata view computed once per set of staged updates.

    pyiceberg 0.12 re-applies every staged update and deep-copies the whole table metadata on
    each ``table_metadata`` access: 14 times while one append stages, about a third of the
    commit. The models are frozen and ``_updates`` is a tuple replaced on every
    change, so one view per tuple is exact (contract: tests/storage/core/test_pyiceberg_contract.py).
    """

    _view: tuple[tuple[Any, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if self._view is None or self._view[0] is not self._updates:
            self._view = (self._updates, apply_updates(self._table.metadata, self._updates))
        return self._view[1]


def _stage(
    table: Table,
    state: Any,
    decision: Decision,
    new_files: list[DataFile],
    commit_id: str,
    request: Any,
    settings: props.CommitSettings,
) -> TableSwap:
    """Turn a decision into catalog updates plus the requirements that pin its base."""
    metadata = table.metadata
    lineage = {
        COMMIT_ID: commit_id,
        RANGES: json.dumps({str(p): list(r) for p, r in sorted(decision.ranges.items())}),
        **decision.lineage,
    }
    txn = _StagingTransaction(table)
    files = [*new_files, *decision.add_files]
    if files or decision.drop_files:
        snapshot = txn.update_snapshot(snapshot_properties=lineage)
        producer = snapshot.overwrite() if decision.drop_files else snapshot.merge_append()
        if decision.drop_files:
            _evaluator_per_manifest(producer)
        else:
            merge_in_caller(producer)
        with producer as p:
            for data_file in decision.drop_files:
                p.delete_data_file(data_file)
            for data_file in files:
                p.append_data_file(data_file)
    updates: list[Any] = list(txn._updates)
    if decision.default_spec_id is not None:
        updates.append(SetDefaultSpecUpdate(spec_id=decision.default_spec_id))
    head = next((u.snapshot.snapshot_id for u in updates if isinstance(u, AddSnapshotUpdate)), metadata.current_snapshot_id)
    if decision.set_main is not None:
        updates.append(SetSnapshotRefUpdate(ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=decision.set_main))
        head = decision.set_main
    if head in decision.expire:  # a rollback to the empty table expires main's snapshot: no head
        head = None
    now_ms = int(time.time() * 1000)
    version = _version(metadata) + 1
    entry = [commit_id, request.receipt(decision.result), head, now_ms]
    registered = registry.register(table, entry, version, settings, now_ms)  # may write a registry file
    forgotten_ms = registered.forgotten_ms
    properties = {
        **({LEASE: ""} if metadata.properties.get(LEASE) else {}),  # a lease ends with its holder's commit, or any later one
        **decision.properties,
        **decision.state.to_properties(),
        VERSION: str(version),
        HEAD: "" if head is None else str(head),
        **registered.properties,
    }
    if forgotten_ms is not None or FORGOTTEN in decision.properties:  # it only ever moves forward
        known = (forgotten_ms, decision.properties.get(FORGOTTEN), metadata.properties.get(FORGOTTEN))
        properties[FORGOTTEN] = str(max(int(v or 0) for v in known))
    updates.append(SetPropertiesUpdate(updates=properties))
    if decision.remove_properties:
        updates.append(RemovePropertiesUpdate(removals=[k for k in decision.remove_properties if k not in properties]))
    adding = 1 if files or decision.drop_files else 0
    expired = set(decision.expire) | set(
        _snapshots_to_expire(metadata, adding, settings.snapshots_keep, protect=decision.set_main)
    )
    if expired:
        updates.append(RemoveSnapshotsUpdate(snapshot_ids=sorted(expired)))
    requirements = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertRefSnapshotId(ref="main", snapshot_id=state.snapshot_id),
        AssertStateVersion(version=_version(metadata)),
    )
    return TableSwap(table, requirements, tuple(updates))


def _one_instant(swaps: list[TableSwap]) -> list[TableSwap]:
    """Give every snapshot of one atomic commit the same timestamp, the latest of them.

    pyiceberg stamps each snapshot as it is staged, table after table, milliseconds apart; a
    time-travel read (``as of T``) resolves each table by its own snapshot log, so a T between
    two stamps would show one table's part of the commit and not the other's (I5). The
    latest stamp is no earlier than any table's own, so each table's log stays in order.
    """
    added = [u.snapshot.timestamp_ms for s in swaps for u in s.updates if isinstance(u, AddSnapshotUpdate)]
    if len(added) < 2:
        return swaps
    instant = max(added)

    def stamped(update: Any) -> Any:
        if not isinstance(update, AddSnapshotUpdate):
            return update
        return update.model_copy(update={"snapshot": update.snapshot.model_copy(update={"timestamp_ms": instant})})

    return [replace(s, updates=tuple(stamped(u) for u in s.updates)) for s in swaps]


def _evaluator_per_manifest(overwrite: Any) -> None:
    """pyiceberg 0.12's overwrite matches the files to delete against the parent's manifests in
    worker threads, sharing one manifest evaluator per spec, and that evaluator keeps the
    manifest being judged on itself: a manifest can be judged on another one's partition
    summary and skipped, and a live file to delete is then "missing" (ValidationException).
    A fresh evaluator per manifest shares nothing (``tests/storage/admin/test_maintenance.py``)."""
    build = overwrite._build_manifest_evaluator
    overwrite._build_manifest_evaluator = lambda spec_id: lambda manifest: build(spec_id)(manifest)


def _snapshots_to_expire(metadata: TableMetadata, adding: int, keep: int, protect: int | None = None) -> list[int]:
    """Inline expiry keeps commit cost flat: only the newest ``icelog.snapshots.keep`` stay."""
    protected = {ref.snapshot_id for ref in metadata.refs.values()} | {protect}
    candidates = sorted((s for s in metadata.snapshots if s.snapshot_id not in protected), key=lambda s: s.timestamp_ms)
    excess = len(metadata.snapshots) + adding - keep
    return [s.snapshot_id for s in candidates[: max(0, excess)]]

"""The commit core: every icelog write path goes through :func:`commit`.

Protocol (DESIGN I2, I3, I7):

1. Load the table. If this commit id already landed (an earlier attempt whose outcome was
   unknown), return its recorded result: never write twice.
2. Decide, purely, from the base state: ``request.decide(state)`` -> :class:`Decision`
   (the new state, the data files to write and drop, the lineage, the result).
3. Write data files (reused across attempts while the decision's offsets stay the same).
4. Commit updates with explicit requirements: the exact ``main`` snapshot the decision
   read, and the icelog state version (so property-only changes are compare-and-swap too).
   The catalog is called directly: pyiceberg's own commit retry, which rebases an append
   onto a different base, is never involved.
5. On a lost race, reload and decide again. On an unknown outcome, reload and look for the
   commit id before deciding again.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol

import structlog
from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, NoSuchTableError
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    ValidatableTableRequirement,
)
from sqlalchemy.exc import SQLAlchemyError

from storage import faults
from storage.errors import CatalogUnavailable, CommitConflict, CommitOutcomeUnknown, UnknownTable
from storage.state import VERSION, LogState

log = structlog.get_logger("icelog.commit")

COMMIT_ID = "icelog.commit-id"
RANGES = "icelog.ranges"
KEEP_SNAPSHOTS = "icelog.snapshots.keep"
KEEP_SNAPSHOTS_DEFAULT = 20


class AssertStateVersion(ValidatableTableRequirement):
    """Requirement: the table's ``icelog.version`` property equals the one the decision read.

    The SQL catalog validates requirements against the metadata it then swaps by
    compare-and-swap, so this closes the lost-update race of property-only commits.
    """

    type: Literal["assert-icelog-version"] = Field(default="assert-icelog-version")
    version: int

    def validate(self, base_metadata: TableMetadata | None) -> None:
        actual = int(base_metadata.properties.get(VERSION, "0")) if base_metadata else None
        if actual != self.version:
            raise CommitFailedException(f"Requirement failed: icelog version is {actual}, expected {self.version}")


@dataclass
class Decision:
    """What one commit does, decided purely from a base :class:`LogState`.

    Attributes:
        state: The log state after the commit (written as table properties).
        rows: Rows to append per partition, system columns filled; empty for none.
        drop_files: Data files to remove (retention, compaction).
        add_files: Data files already written (e.g. by Spark executors or compaction).
        expire: Snapshot ids to expire in the same commit.
        properties: Further table properties to set in the same commit.
        lineage: Extra snapshot-summary entries.
        result: Returned to the caller, with the snapshot id filled in.
        write: False when nothing needs committing (e.g. a re-sent batch already landed).
    """

    state: LogState
    result: Any
    rows: Mapping[int, Any] = field(default_factory=dict)
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    drop_files: tuple[DataFile, ...] = ()
    add_files: tuple[DataFile, ...] = ()
    lineage: Mapping[str, str] = field(default_factory=dict)
    expire: tuple[int, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    write: bool = True


class CommitRequest(Protocol):
    def decide(self, state: LogState, table: Table) -> Decision: ...

    def result_from_snapshot(self, snapshot: Snapshot) -> Any: ...


@dataclass
class CommitOutcome:
    result: Any
    snapshot_id: int | None
    attempts: int
    already_committed: bool = False


def find_commit(metadata: TableMetadata, commit_id: str) -> Snapshot | None:
    for snapshot in reversed(metadata.snapshots):
        if snapshot.summary is not None and snapshot.summary.additional_properties.get(COMMIT_ID) == commit_id:
            return snapshot
    return None


def load(catalog: Catalog, identifier: str) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError as e:
        raise UnknownTable(table=identifier, catalog=catalog.name) from e


def commit(
    catalog: Catalog,
    identifier: str,
    request: CommitRequest,
    *,
    commit_id: str | None = None,
    max_attempts: int = 200,
    deadline_s: float = 120.0,
    write_rows: Callable[[Table, Mapping[int, Any]], list[DataFile]] | None = None,
) -> CommitOutcome:
    """Run ``request`` through the commit protocol. See the module docstring.

    Raises:
        CommitConflict: every attempt lost the compare-and-swap.
        CommitOutcomeUnknown: the catalog kept failing in ways that leave the outcome unknown.
        TerminalError: whatever ``request.decide`` raises (mismatch, fencing, bad input).
    """
    from storage.files import write_log_files

    write_rows = write_rows or write_log_files
    commit_id = commit_id or uuid.uuid4().hex
    bound = log.bind(table=identifier, commit_id=commit_id)
    started = time.monotonic()
    written: tuple[Any, list[DataFile]] | None = None  # (ranges, files) of the last attempt
    unknown: BaseException | None = None
    read_error: BaseException | None = None
    for attempt in range(1, max_attempts + 1):
        try:
            table = load(catalog, identifier)
        except SQLAlchemyError as e:  # e.g. SQLite busy: nothing decided yet, just read again
            bound.warning("catalog read failed", attempt=attempt, error=repr(e))
            read_error = e
            time.sleep(random.uniform(0, min(0.5, 0.002 * 2 ** min(attempt, 8))))
            continue
        read_error = None
        landed = find_commit(table.metadata, commit_id)
        if landed is not None:
            return CommitOutcome(request.result_from_snapshot(landed), landed.snapshot_id, attempt, True)
        state = LogState.from_metadata(table.metadata)
        decision = request.decide(state, table)
        if not decision.write:
            return CommitOutcome(decision.result, state.snapshot_id, attempt, True)

        key = json.dumps(sorted((int(p), list(r)) for p, r in decision.ranges.items()))
        if written is None or written[0] != key:
            if written is not None:
                # The commit id is not in the table, so the last attempt's files never landed.
                _discard(table, written[1])
            written = (key, write_rows(table, decision.rows) if decision.rows else [])
        faults.checkpoint(faults.AFTER_DATA_FILES)

        updates, requirements = _stage(table, state, decision, written[1], commit_id)
        try:
            response = catalog.commit_table(table, requirements, updates)
        except CommitFailedException as e:
            bound.debug("commit lost the race", attempt=attempt, reason=str(e))
            unknown = None
        except (CommitStateUnknownException, SQLAlchemyError, OSError) as e:
            # The swap may or may not have happened: the next attempt looks for commit_id.
            bound.warning("commit outcome unknown", attempt=attempt, error=repr(e))
            unknown = e
        else:
            faults.checkpoint(faults.AFTER_CATALOG_SWAP)
            _delete_old_metadata(catalog, table, response.metadata)
            snapshot_id = response.metadata.current_snapshot_id
            _attach_snapshot(decision.result, snapshot_id)
            bound.debug("committed", attempt=attempt, snapshot_id=snapshot_id)
            return CommitOutcome(decision.result, snapshot_id, attempt)
        if time.monotonic() - started > deadline_s:
            break
        time.sleep(random.uniform(0, min(0.5, 0.002 * 2 ** min(attempt, 8))))
    if unknown is not None:
        raise CommitOutcomeUnknown(table=identifier, commit_id=commit_id, reason=repr(unknown))
    if read_error is not None:
        raise CatalogUnavailable(table=identifier, reason=repr(read_error))
    raise CommitConflict(table=identifier, attempts=attempt)


def _delete_old_metadata(catalog: Catalog, table: Table, new: TableMetadata) -> None:
    """What pyiceberg's Table._do_commit does after a commit (we call the catalog directly):
    drop metadata files that fell out of the metadata log
    (``write.metadata.delete-after-commit.enabled``), so they do not pile up."""
    try:
        catalog._delete_old_metadata(table.io, table.metadata, new)
    except Exception as e:  # a leftover file is harmless; orphan cleanup removes it later
        log.warning("could not delete old metadata files", table=table.name(), error=repr(e))


def _discard(table: Table, files: list[DataFile]) -> None:
    for data_file in files:
        try:
            table.io.delete(data_file.file_path)
        except OSError:
            pass  # orphan cleanup (storage.maintenance) gets it later


def _attach_snapshot(result: Any, snapshot_id: int | None) -> None:
    if hasattr(result, "snapshot_id"):
        result.snapshot_id = snapshot_id


def _stage(
    table: Table, state: LogState, decision: Decision, new_files: list[DataFile], commit_id: str
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Turn a decision into catalog updates plus the requirements that pin its base."""
    lineage = {
        COMMIT_ID: commit_id,
        RANGES: json.dumps({str(p): list(r) for p, r in sorted(decision.ranges.items())}),
        **decision.lineage,
    }
    txn = table.transaction()
    files = [*new_files, *decision.add_files]
    if files or decision.drop_files:
        snapshot = txn.update_snapshot(snapshot_properties=lineage)
        producer = snapshot.overwrite() if decision.drop_files else snapshot.merge_append()
        with producer as p:
            for data_file in decision.drop_files:
                p.delete_data_file(data_file)
            for data_file in files:
                p.append_data_file(data_file)
    updates = (*txn._updates, SetPropertiesUpdate(updates={**decision.properties, **decision.state.to_properties()}))
    expired = set(decision.expire) | set(_snapshots_to_expire(table.metadata, adding=1 if files or decision.drop_files else 0))
    if expired:
        updates = (*updates, RemoveSnapshotsUpdate(snapshot_ids=sorted(expired)))
    requirements = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertRefSnapshotId(ref="main", snapshot_id=state.snapshot_id),
        AssertStateVersion(version=state.version),
    )
    return updates, requirements


def _snapshots_to_expire(metadata: TableMetadata, adding: int) -> list[int]:
    """Inline expiry keeps commit cost flat: only the newest ``icelog.snapshots.keep`` stay."""
    keep = int(metadata.properties.get(KEEP_SNAPSHOTS, KEEP_SNAPSHOTS_DEFAULT))
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    candidates = sorted(
        (s for s in metadata.snapshots if s.snapshot_id not in protected), key=lambda s: s.timestamp_ms
    )
    excess = len(metadata.snapshots) + adding - keep
    return [s.snapshot_id for s in candidates[: max(0, excess)]]

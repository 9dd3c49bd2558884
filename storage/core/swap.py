"""The catalog side of a commit: swap the metadata pointers of one or several tables at once.

pyiceberg 0.12 commits one table per call. Its SQL catalog keeps every table's metadata
pointer in one database table (``iceberg_tables``), so icelog swaps several pointers in one
database transaction: each ``UPDATE … WHERE metadata_location = <the base the decision
read>`` must match exactly one row, or the whole transaction rolls back and the commit lost
a race (docs/guarantees.md: I3, I5). Updates run in a fixed table order, so two PostgreSQL
transactions cannot deadlock; nothing reads ``iceberg_tables`` inside the transaction, so
SQLite never has to upgrade a read lock ("database is locked").

Reads use the same table: :func:`load_tables` resolves several tables' pointers in one
query, a consistent cut across tables. Metadata files are never deleted by a commit (see
``storage.core.commit``), so a pointer read here stays loadable.

This module relies on private pyiceberg names; ``tests/storage/core/test_pyiceberg_contract.py``
pins each one, so an upgrade fails loudly.
"""

from __future__ import annotations

import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import CommitTableResponse, StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import and_, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from icelog.storage.core import faults
from icelog.storage.errors import AtomicCommitUnsupported, CatalogBusy
from icelog.storage.properties import HEAD

SPEC_REQUIREMENTS = frozenset(  # the REST spec's table requirements
    {
        "assert-create",
        "assert-table-uuid",
        "assert-ref-snapshot-id",
        "assert-last-assigned-field-id",
        "assert-current-schema-id",
        "assert-last-assigned-partition-id",
        "assert-default-spec-id",
        "assert-default-sort-order-id",
    }
)
BASE_TAG = "icelog-base-"  # + a number that grows by one with every icelog commit (prove_base)


@dataclass(frozen=True)
class TableSwap:
    """One table's part of a commit: its base (as loaded) and what to apply to it."""

    base: Table
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


def _key(table: Table) -> tuple[str, str]:
    *namespace, name = table.name()
    return ".".join(namespace), name


def apply_updates(base: TableMetadata, updates: Sequence[TableUpdate], metadata_location: str | None = None) -> TableMetadata:
    """pyiceberg's ``update_table_metadata``, without the deep copy it ends with.

    Each update builds new models from the old (``model_copy(update=...)``, new lists and
    dicts); nothing in icelog or pyiceberg edits a metadata model in place, so the result may
    share the base's unchanged parts. The deep copy was about a fifth of a commit, paid twice
    per table. Contract: ``tests/storage/core/test_pyiceberg_contract.py``.
    """
    context = _TableMetadataUpdateContext()
    metadata = base
    for change in updates:
        metadata = _apply_table_update(change, metadata, context)
    if context.has_changes():
        if metadata_location:
            metadata = _update_table_metadata_log(metadata, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            metadata = metadata.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


def _staged(catalog: SqlCatalog, s: TableSwap) -> StagedTable:
    """pyiceberg's ``_update_and_stage_table`` for an existing table, through :func:`apply_updates`
    and the base's file IO (pyiceberg builds a new one per commit)."""
    for requirement in s.requirements:
        requirement.validate(s.base.metadata)
    metadata = apply_updates(s.base.metadata, s.updates, s.base.metadata_location)
    version = catalog._parse_metadata_version(s.base.metadata_location) + 1
    location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(version)
    return StagedTable(identifier=s.base.name(), metadata=metadata, metadata_location=location, io=s.base.io, catalog=catalog)


def is_atomic(catalog: Catalog) -> bool:
    """Whether the catalog swaps several tables' pointers in one step (pyiceberg's SQL catalog)."""
    return isinstance(catalog, SqlCatalog)


def check_atomic(catalog: Catalog, tables: int) -> None:
    """Raise :class:`AtomicCommitUnsupported` before anything is written, never commit table by table."""
    if tables > 1 and not is_atomic(catalog):
        raise AtomicCommitUnsupported(catalog=catalog.name, kind=type(catalog).__name__)


def swap(catalog: Catalog, swaps: Sequence[TableSwap]) -> list[CommitTableResponse]:
    """Apply every table's updates on its base, all or nothing.

    Raises:
        CommitFailedException: a base is no longer current (a lost race); nothing changed.
        CatalogBusy: SQLite refused a statement or the COMMIT for a lock another connection
            holds; nothing changed.
        AtomicCommitUnsupported: several tables on a catalog that cannot swap them at once.
        sqlalchemy.exc.SQLAlchemyError, OSError: the outcome may be unknown.
    """
    check_atomic(catalog, len(swaps))
    if not isinstance(catalog, SqlCatalog):
        only = swaps[0]
        requirements, updates = prove_base(catalog, only)
        return [catalog.commit_table(only.base, requirements, updates)]
    ordered = sorted(swaps, key=lambda s: _key(s.base))
    # Requirements are checked against the exact base the decision read (I3); the pointer
    # compare-and-swap below then proves that base is still current.
    staged = [_staged(catalog, s) for s in ordered]

    def write(table) -> None:
        catalog._write_metadata(metadata=table.metadata, io=table.io, metadata_path=table.metadata_location)

    if len(staged) == 1:
        write(staged[0])
    else:  # one file per table: write them side by side, not one after another
        with ThreadPoolExecutor(max_workers=min(8, len(staged))) as pool:
            list(pool.map(write, staged))
    with Session(catalog.engine) as session:
        connection = session.connection()
        try:
            _swap_pointers(catalog, session, ordered, staged)
        except SQLAlchemyError as e:
            # A COMMIT that failed (SQLite's "database is locked" while a reader holds its lock)
            # can leave the driver's transaction open on this connection; back in the pool, a
            # later read on it would see this swap's uncommitted pointers, and the commit-id
            # lookup would acknowledge a commit that never became durable. Closing it rolls back.
            with contextlib.suppress(Exception):
                connection.invalidate()
            if _locked_out(e):
                _delete_metadata_files(staged)  # as after a lost race: no pointer names them
                raise CatalogBusy(table=",".join(".".join(_key(s.base)) for s in swaps), reason=repr(e.orig)) from e
            raise
    by_name = {
        _key(s.base): CommitTableResponse(metadata=t.metadata, metadata_location=t.metadata_location)
        for s, t in zip(ordered, staged, strict=True)
    }
    return [by_name[_key(s.base)] for s in swaps]


def _locked_out(error: SQLAlchemyError) -> bool:
    """Whether SQLite refused for another connection's lock (SQLITE_BUSY, SQLITE_LOCKED, and their
    extended codes). Such a statement or COMMIT wrote nothing: the transaction stays open and
    closing the connection rolls it back. A PostgreSQL error is never this: a connection lost
    during its COMMIT leaves the outcome unknown."""
    orig = getattr(error, "orig", None)
    code = getattr(orig, "sqlite_errorcode", None) if isinstance(orig, sqlite3.Error) else None
    return isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _swap_pointers(catalog: SqlCatalog, session: Session, ordered: Sequence[TableSwap], staged: Sequence[StagedTable]) -> None:
    """Every pointer from its exact base, in one database transaction (committed here)."""
    for i, (s, new) in enumerate(zip(ordered, staged, strict=True)):
        namespace, name = _key(s.base)
        result = session.execute(
            update(IcebergTables)
            .where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == name,
                IcebergTables.metadata_location == s.base.metadata_location,
            )
            .values(metadata_location=new.metadata_location, previous_metadata_location=s.base.metadata_location)
        )
        if result.rowcount != 1:
            session.rollback()
            _delete_metadata_files(staged)  # no pointer names them: a lost race leaves nothing behind
            raise CommitFailedException(f"{namespace}.{name} has been updated by another process")
        if i < len(staged) - 1:
            faults.checkpoint(faults.BETWEEN_TABLE_SWAPS)
    session.commit()


def _delete_metadata_files(staged: Sequence[StagedTable]) -> None:
    for table in staged:
        try:
            table.io.delete(table.metadata_location)
        except OSError:
            pass  # an orphan for maintenance


def base_tags(metadata: TableMetadata) -> dict[str, int]:
    """The icelog base tags of a table: name -> the number in it."""
    found = {}
    for name, ref in metadata.refs.items():
        number = name.removeprefix(BASE_TAG)
        if name.startswith(BASE_TAG) and ref.snapshot_ref_type == SnapshotRefType.TAG and number.isdigit():
            found[name] = int(number)
    return found


def prove_base(catalog: Catalog, s: TableSwap) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]:
    """A single-table commit's requirements and updates on a catalog that checks requirements
    but cannot swap the pointer from an exact base (REST): the base's tag moves with it.

    The Iceberg REST spec has no requirement on properties or on the metadata location, and
    icelog keeps its state in properties: two property-only commits on one base would both
    pass. So every icelog commit asserts the base's tag ``icelog-base-N`` (its snapshot id)
    and, in the same commit, removes it and sets ``icelog-base-N+1``: a second commit on the
    same base finds its tag gone (409, nothing changed). The tag points at the commit's new
    snapshot or the current one, so snapshot expiry never takes it.

    A table without a tag (just created, or written only by other tools) is adopted first by
    a commit that carries no state (:func:`adopt`); the caller's commit then fails as a lost
    race and is decided again on the adopted base. Other tools' commits that touch only
    properties move no tag and are not seen: only icelog writes icelog's properties (I8).

    Raises:
        CommitFailedException: the table was adopted now, or another commit adopted it.
    """
    base = s.base.metadata
    tags = base_tags(base)
    if not tags:
        adopt(catalog, s.base)
        raise CommitFailedException(f"{'.'.join(s.base.name())} had no icelog base tag: adopted, decide again")
    newest = max(tags, key=tags.__getitem__)
    added = [u.snapshot.snapshot_id for u in s.updates if isinstance(u, AddSnapshotUpdate)]
    target = added[-1] if added else base.current_snapshot_id
    # icelog's own requirements (the state version) are not in the spec: the tag proves more.
    spec = tuple(r for r in s.requirements if r.type in SPEC_REQUIREMENTS)
    requirements = (*spec, AssertRefSnapshotId(ref=newest, snapshot_id=base.refs[newest].snapshot_id))
    updates = (
        *s.updates,
        *(RemoveSnapshotRefUpdate(ref_name=name) for name in sorted(tags)),
        SetSnapshotRefUpdate(ref_name=f"{BASE_TAG}{tags[newest] + 1}", type=SnapshotRefType.TAG, snapshot_id=target),
    )
    return requirements, updates


def adopt(catalog: Catalog, table: Table) -> None:
    """Give a table its first base tag (:func:`prove_base`): one commit of an empty snapshot
    and the tag on it, asserting the current snapshot. It carries no state; moving ``main``
    fails every adopter that read the table before, so none re-creates a tag a stale base
    could still match. Losing the race is fine: the caller reloads and looks again.
    """
    metadata = table.metadata
    tx = table.transaction()
    tx.append(table.schema().as_arrow().empty_table())  # a snapshot of no files; asserts main is current
    snapshot_id = apply_updates(metadata, tx._updates).current_snapshot_id
    updates: tuple[TableUpdate, ...] = (
        *tx._updates,
        SetSnapshotRefUpdate(ref_name=f"{BASE_TAG}0", type=SnapshotRefType.TAG, snapshot_id=snapshot_id),
    )
    current = metadata.current_snapshot_id
    if metadata.properties.get(HEAD) == ("" if current is None else str(current)):
        # icelog made the current snapshot (storage.core.commit.check_head): the empty one
        # follows it as icelog's; otherwise another writer's snapshot stays one to repair.
        updates += (SetPropertiesUpdate(updates={HEAD: str(snapshot_id)}),)
    try:
        catalog.commit_table(table, tx._requirements, updates)
    except CommitFailedException:
        pass


def still_current(catalog: Catalog, table: Table) -> bool:
    """Whether ``table`` (as read before) is still the catalog's table: its metadata pointer
    unchanged, read in one small query, without loading metadata. Metadata files are never
    rewritten, so the same pointer is the same table. Other catalogs: False (load it)."""
    if not isinstance(catalog, SqlCatalog):
        return False
    namespace, name = _key(table)
    with Session(catalog.engine) as session:
        location = session.scalar(
            select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == name,
            )
        )
    return location is not None and location == table.metadata_location


def load_tables(catalog: Catalog, identifiers: Sequence[str]) -> dict[str, Table]:
    """Load several tables as of one catalog instant (one database read on a SQL catalog).

    A reader that uses this never sees half of a multi-table commit. Other catalogs load
    the tables one by one (each table is still atomic on its own).

    Raises:
        NoSuchTableError: a table does not exist.
    """
    if not isinstance(catalog, SqlCatalog):
        return {ident: catalog.load_table(ident) for ident in identifiers}
    wanted = {ident: tuple(ident.rsplit(".", 1)) for ident in identifiers}
    with Session(catalog.engine) as session:
        rows = session.scalars(
            select(IcebergTables).where(
                IcebergTables.catalog_name == catalog.name,
                or_(*(and_(IcebergTables.table_namespace == ns, IcebergTables.table_name == n) for ns, n in wanted.values())),
            )
        ).all()
    found = {(r.table_namespace, r.table_name): r for r in rows}
    tables = {}
    for ident, key in wanted.items():
        if key not in found:
            raise NoSuchTableError(f"Table does not exist: {ident}")
        tables[ident] = catalog._convert_orm_to_iceberg(found[key])
    return tables

"""The catalog side of a commit: swap the metadata pointers of one or several tables at once.

pyiceberg 0.12 commits one table per call. Its SQL catalog keeps every table's metadata
pointer in one database table (``iceberg_tables``), so icelog swaps several pointers in one
database transaction: each ``UPDATE … WHERE metadata_location = <the base the decision
read>`` must match exactly one row, or the whole transaction rolls back and the commit lost
a race (DESIGN §3, I3, I5). Updates run in a fixed table order, so two PostgreSQL
transactions cannot deadlock; nothing reads ``iceberg_tables`` inside the transaction, so
SQLite never has to upgrade a read lock ("database is locked").

Reads use the same table: :func:`load_tables` resolves several tables' pointers in one
query, a consistent cut across tables. Metadata files are never deleted by a commit (see
``storage.core.commit``), so a pointer read here stays loadable.

This module relies on private pyiceberg names; ``tests/storage/test_pyiceberg_contract.py``
pins each one, so an upgrade fails loudly.
"""

from __future__ import annotations

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
from pyiceberg.table.update import (
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from storage.core import faults
from storage.errors import AtomicCommitUnsupported


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
    per table (issue 20). Contract: ``tests/storage/test_pyiceberg_contract.py``.
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


def check_atomic(catalog: Catalog, tables: int) -> None:
    """Raise :class:`AtomicCommitUnsupported` before anything is written, never commit table by table."""
    if tables > 1 and not isinstance(catalog, SqlCatalog):
        raise AtomicCommitUnsupported(catalog=catalog.name, kind=type(catalog).__name__)


def swap(catalog: Catalog, swaps: Sequence[TableSwap]) -> list[CommitTableResponse]:
    """Apply every table's updates on its base, all or nothing.

    Raises:
        CommitFailedException: a base is no longer current (a lost race); nothing changed.
        AtomicCommitUnsupported: several tables on a catalog that cannot swap them at once.
        sqlalchemy.exc.SQLAlchemyError, OSError: the outcome may be unknown.
    """
    check_atomic(catalog, len(swaps))
    if not isinstance(catalog, SqlCatalog):
        only = swaps[0]
        return [catalog.commit_table(only.base, only.requirements, only.updates)]
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
                raise CommitFailedException(f"{namespace}.{name} has been updated by another process")
            if i < len(staged) - 1:
                faults.checkpoint(faults.BETWEEN_TABLE_SWAPS)
        session.commit()
    by_name = {
        _key(s.base): CommitTableResponse(metadata=t.metadata, metadata_location=t.metadata_location)
        for s, t in zip(ordered, staged, strict=True)
    }
    return [by_name[_key(s.base)] for s in swaps]


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

"""Planning reads of a snapshot: which data files hold its rows (from manifests, no data read)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyarrow.fs import FileSystem
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from icelog.storage.errors import UnknownSnapshot
from icelog.storage.log.files import arrow_location, is_local, local_path

if TYPE_CHECKING:
    import duckdb
    import pyarrow.dataset as ds


def check_snapshot(table: Table, snapshot_id: int | None) -> None:
    """Raise :class:`UnknownSnapshot` unless ``snapshot_id`` is None or a retained snapshot."""
    if snapshot_id is not None and table.metadata.snapshot_by_id(snapshot_id) is None:
        retained = [s.snapshot_id for s in sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)]
        raise UnknownSnapshot(table=".".join(table.name()), snapshot_id=snapshot_id, retained=retained)


def planned_paths(table: Table, snapshot_id: int | None = None) -> list[str]:
    """Data files of ``snapshot_id`` (default: the current snapshot): local files as local paths,
    others (``s3://…``) as their URIs."""
    check_snapshot(table, snapshot_id)
    if snapshot_id is None and table.metadata.current_snapshot_id is None:
        return []
    return [local_path(t.file.file_path) for t in table.scan(snapshot_id=snapshot_id).plan_files()]


@dataclass(frozen=True)
class PlannedFiles:
    """Data files of a snapshot, as the readers that need no DuckDB extension take them.

    Local files are for DuckDB's ``read_parquet`` (its fastest path); files on an object store
    are read through pyarrow with the table's FileIO settings, where DuckDB pushes projections
    and filters into the scan (``dataset``).
    """

    paths: list[str]  # local paths and object-store URIs
    io: FileIO

    @property
    def local(self) -> bool:
        """Every file is local: ``read_parquet`` reads them all."""
        return all(is_local(p) for p in self.paths)

    def dataset(self) -> ds.Dataset:
        """All files as one pyarrow dataset (its schema is the first file's, as ``read_parquet``'s)."""
        import pyarrow.dataset as ds  # lazy: it loads pandas, which reading offsets never needs

        groups: dict[int, tuple[FileSystem, list[str]]] = {}
        for uri in self.paths:
            fs, path = arrow_location(self.io, uri)
            groups.setdefault(id(fs), (fs, []))[1].append(path)
        parts = [ds.dataset(paths, filesystem=fs, format="parquet") for fs, paths in groups.values()]
        return parts[0] if len(parts) == 1 else ds.dataset(parts)


def planned_files(table: Table, snapshot_id: int | None = None) -> PlannedFiles:
    """The data files of ``snapshot_id`` (default: the current snapshot) with the FileIO that reads them."""
    return PlannedFiles(planned_paths(table, snapshot_id), table.io)


_sources = itertools.count()


def parquet_from(con: duckdb.DuckDBPyConnection, paths: list[str], io: FileIO, options: str = "") -> str:
    """A DuckDB FROM item that reads the Parquet files ``paths`` (at least one), with no extension.

    Local files: ``read_parquet`` (with ``options``, e.g. ``union_by_name = true``). Files on an
    object store (``s3://…``), which DuckDB reads only through its httpfs extension: a pyarrow
    dataset over ``io``'s filesystem, registered on ``con``, into which DuckDB pushes
    projections and filters (its schema is the first file's; ``options`` do not apply).
    """
    files = PlannedFiles(paths, io)
    if files.local:
        listing = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
        return f"read_parquet([{listing}]{', ' + options if options else ''})"
    source = f"__files_{next(_sources)}"
    con.register(source, files.dataset())
    return f'"{source}"'

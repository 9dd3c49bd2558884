"""Orphan cleanup: files under a table that no snapshot, metadata file, commit-id registry or open
transaction needs.

It sits above every writer that leaves files before its commit (appends, Spark executors,
transactions), because it must know what each still needs.
"""

from __future__ import annotations

import time

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icelog.storage.core import metadata_files, registry
from icelog.storage.core.commit import load
from icelog.storage.errors import InvalidInput
from icelog.storage.producers.journal_state import pending_files


def referenced_files(table: Table) -> set[str]:
    """Every file a live snapshot, the metadata log or the commit-id registry still needs, by its
    path in the table's file system (a local path; ``bucket/key`` on S3), as orphan cleanup lists them.

    Registry files count while the current metadata lists them: one a later commit dropped from
    the list (its ids left the window) is dead, as is one written by a commit that never landed.
    """
    meta = table.metadata
    listed = registry.file_list(meta)
    locations = [table.metadata_location, *(entry.metadata_file for entry in meta.metadata_log)]
    locations.extend(listed.paths() if listed else [])
    for snapshot in meta.snapshots:
        locations.append(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            locations.append(manifest.manifest_path)
            locations.extend(entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return {_store_path(location) for location in locations}


def _store_path(location: str) -> str:
    """A location as its file system names it (``file:///a/b`` -> ``/a/b``, ``s3://bucket/k`` -> ``bucket/k``)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    path = PyArrowFileIO.parse_location(location)[2]
    return path + "/" if location.endswith("/") and not path.endswith("/") else path


def remove_orphan_files(catalog: Catalog, identifier: str, older_than_s: float = 3600.0) -> list[str]:
    """Delete files under the table location that no snapshot and no open transaction references.

    Only files older than ``older_than_s`` go, so a writer's files that are written but not
    yet committed survive. The files of open and prepared transactions stay at any age:
    recovery rolls a prepared one forward from them. Listing and deleting go through the
    table's FileIO, so a local warehouse and an object store (S3) are cleaned alike.

    Returns:
        The paths deleted, as the table's file system names them (``bucket/key`` on S3).

    Raises:
        InvalidInput: the table's FileIO is not pyarrow's (nothing to list with).
    """
    table = load(catalog, identifier)
    location = table.metadata.location
    found = metadata_files.file_system(table.io, location)
    if found is None:
        raise InvalidInput(reason=f"orphan cleanup lists through pyarrow's FileIO, not {type(table.io).__name__}")
    fs, root = found
    cutoff_ms = (time.time() - older_than_s) * 1000
    candidates = [f.path for f in metadata_files.list_files(fs, root, recursive=True) if f.mtime_ms < cutoff_ms]
    # Read after the listing, journal before table: a listed file's transaction is then either
    # still open in the journal read, or ended before it, so committed in the table read.
    pending, pending_dirs = pending_files(catalog, location)
    keep = referenced_files(load(catalog, identifier)) | {_store_path(p) for p in pending}
    pending_prefixes = tuple(_store_path(d) for d in pending_dirs)
    removed = []
    for path in candidates:
        if path in keep or path.startswith(pending_prefixes):
            continue
        try:
            fs.delete_file(path)
            removed.append(path)
        except FileNotFoundError:  # removed meanwhile (e.g. a superseded metadata file)
            continue
    return removed

"""Delete superseded table metadata files once no reader can still want them.

A reader that read a metadata pointer has ``icelog.metadata.delete-grace-ms`` to read the
file. Every commit (and ``maintain``) sweeps the metadata folder, so a file still inside
the grace at one commit is deleted by a later one: the folder holds the metadata log, the
current file and whatever was superseded within the grace, however busy the table.

When a file stopped being current is not recorded once it leaves the metadata log, so the
sweep bounds it from the files themselves. pyiceberg names a metadata file after its
version (``00042-<uuid>.metadata.json``), one more than the base it was built from; a REST
catalog server writes its own (``v42.metadata.json`` on SeaweedFS and Java's catalogs). A file
of version v that was ever current was replaced by the version v+1 one, and every file of
version v+2 or more was built (so written) after that replacement was current. The
earliest modification time among them is therefore a moment by which v was superseded.
Files never current (lost races) are safe to delete at any time, so the same rule serves.
Files of the current version or newer (a commit in flight), files named otherwise, and
files that the bound does not postdate (a dropped table's files at the same location) are
never touched.

Listing the folder costs in proportion to everything in it (manifests too, until orphan
cleanup), so a commit lists it only every ``SWEEP_EVERY`` versions (and ``maintain``
always). Every other commit deletes just the file that left the metadata log with it, when
the same rule proves it superseded more than the grace ago: the log names the files of the
next versions and their times, so nothing needs listing (a commit's cost stays flat with
history). What that misses (a file still inside the grace, a lost race's file) the next
listing sweeps.

Listing and deleting go through the table's FileIO (the pyarrow file system it opens for the
location's scheme), never ``os.*``: the same code sweeps a local warehouse and an object store. Stores that keep whole seconds (S3's ``LastModified``) get their times rounded up,
so a truncated time never makes a file look older than it is.
"""

from __future__ import annotations

import bisect
import posixpath
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem
    from pyiceberg.io import FileIO
    from pyiceberg.table.metadata import TableMetadata

_NAME = re.compile(r"(\d+)-[^/]*\.metadata\.json|v(\d+)(?:\.gz)?\.metadata\.json")
SWEEP_EVERY = 64  # versions between two listings of the metadata folder by commits


@dataclass(frozen=True)
class StoredFile:
    """A file as the table's file system lists it."""

    path: str  # as the file system names it: a local path, or ``bucket/key`` on S3
    mtime_ms: int  # the latest moment it can have been written


@dataclass(frozen=True)
class _MetadataFile:
    path: str  # as the file system names it
    version: int
    mtime_ms: int


def file_system(io: FileIO, location: str) -> tuple[FileSystem, str] | None:
    """The pyarrow file system the table's FileIO uses for ``location``, and the location's
    path in it (``bucket/key`` on S3); None for a FileIO that is not pyarrow's."""
    # lazy: pyiceberg.io.pyarrow loads pyarrow.dataset and pandas, which reading offsets never needs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if not isinstance(io, PyArrowFileIO):
        return None
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), path


def list_files(fs: FileSystem, folder: str, *, recursive: bool = False, suffix: str = "") -> list[StoredFile]:
    """The files in ``folder`` (none if it does not exist) whose names end with ``suffix``."""
    from pyarrow.fs import FileSelector, FileType

    found = []
    for info in fs.get_file_info(FileSelector(folder, allow_not_found=True, recursive=recursive)):
        if info.type == FileType.File and info.path.endswith(suffix) and info.mtime_ns is not None:
            found.append(StoredFile(info.path, _latest_ms(info.mtime_ns)))
    return found


def _latest_ms(mtime_ns: int) -> int:
    """A whole-second time (S3's ``LastModified``) may be up to a second early: round it up."""
    return mtime_ns // 1_000_000 + (999 if mtime_ns % 1_000_000_000 == 0 else 0)


def version_of(name: str) -> int | None:
    """The version in a metadata file name (pyiceberg's ``00042-<uuid>`` or a REST server's
    ``v42``), or None for another name."""
    match = _NAME.fullmatch(posixpath.basename(name))
    return int(match.group(1) or match.group(2)) if match else None


def delete_superseded(
    io: FileIO, metadata: TableMetadata, location: str, grace_ms: int, base: TableMetadata | None = None
) -> list[str]:
    """Delete the metadata files beside ``location`` superseded more than ``grace_ms`` ago.

    Args:
        io: The table's file IO (a pyarrow one, local or S3; others are left to orphan cleanup).
        metadata: The table's current metadata, read from ``location``.
        location: The current metadata file.
        grace_ms: ``icelog.metadata.delete-grace-ms``.
        base: The metadata the commit that wrote ``location`` was built on: only the file
            that left the log is considered, unless this version is due a listing.

    Returns:
        The paths deleted.
    """
    current = version_of(location)
    found = file_system(io, location) if current is not None else None
    if found is None:
        return []
    fs, path = found
    cutoff = int(time.time() * 1000) - grace_ms
    # The file that left the log is proven by the log's own times, which a store's whole-second
    # listing times cannot always prove yet: on a listing's version too, or it waits 64 more.
    deleted = _delete_left_log(io, metadata, location, base, cutoff) if base is not None else []
    if base is not None and current % SWEEP_EVERY:
        return deleted
    kept = {posixpath.basename(location)} | {posixpath.basename(e.metadata_file) for e in metadata.metadata_log}
    files = sorted(_list(fs, posixpath.dirname(path)), key=lambda f: f.version)
    versions = [f.version for f in files]
    # earliest[i]: the earliest modification among files[i:], all of version >= files[i].version
    earliest = [0] * len(files)
    for i in range(len(files) - 1, -1, -1):
        earliest[i] = min(files[i].mtime_ms, earliest[i + 1]) if i + 1 < len(files) else files[i].mtime_ms
    for f in files:
        if f.version >= current or posixpath.basename(f.path) in kept or f.path in deleted:
            continue
        later = bisect.bisect_left(versions, f.version + 2)
        if later == len(files):
            continue
        superseded_by = earliest[later]
        if f.mtime_ms <= superseded_by <= cutoff:
            try:
                fs.delete_file(f.path)
                deleted.append(f.path)
            except (FileNotFoundError, OSError):
                pass  # already gone (a concurrent sweep), or unreachable: a later sweep tries again
    return deleted


def _delete_left_log(io: FileIO, metadata: TableMetadata, location: str, base: TableMetadata, cutoff: int) -> list[str]:
    """The listing's rule applied to the files that left the metadata log with this commit:
    version v is proven superseded by the time the version v+2 file was written."""
    written = {version_of(e.metadata_file): e.timestamp_ms for e in metadata.metadata_log}
    written[version_of(location)] = metadata.last_updated_ms
    kept = {e.metadata_file for e in metadata.metadata_log} | {location}
    deleted = []
    for entry in base.metadata_log:
        version = version_of(entry.metadata_file)
        superseded_by = written.get(version + 2) if version is not None else None
        if entry.metadata_file in kept or superseded_by is None or superseded_by > cutoff:
            continue  # still in the log, or not yet proven old enough: a listing sweeps it
        fs, path = file_system(io, entry.metadata_file)
        try:
            fs.delete_file(path)
            deleted.append(path)
        except (FileNotFoundError, OSError):
            pass  # already gone, or unreachable: a listing tries again
    return deleted


def _list(fs: FileSystem, folder: str) -> list[_MetadataFile]:
    found = []
    for f in list_files(fs, folder, suffix=".metadata.json"):  # most of the folder: manifests and lists
        version = version_of(f.path)
        if version is not None:
            found.append(_MetadataFile(f.path, version, f.mtime_ms))
    return found

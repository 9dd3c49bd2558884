"""The commit-id registry: every commit's id and receipt, findable for a bounded window.

Every commit records ``[commit_id, receipt, snapshot_id, committed_ms]`` in the same swap as
its change (``storage.core.commit``). Rewriting every remembered id in every commit made the
metadata JSON grow with the window (4,000 ids, ~330 KB) and each commit parse and write it
all. So the registry has two parts:

* the **tail**, the newest entries, in the table property ``icelog.commits`` (JSON, oldest
  first), at most about ``TAIL_BYTES`` of text;
* **registry files**, immutable Avro files beside the metadata files
  (``icelog-commits-<version>-<random>.avro``), listed oldest first in the property
  ``icelog.commits.files`` with each file's entry count and newest commit time. When the tail
  outgrows ``TAIL_BYTES``, the commit writes its older entries to a new file before the swap
  and lists it in the same swap.

A file is only ever believed through the list of the metadata that names it, so one written
by an attempt that lost its race or died before the swap makes no id look committed or
forgotten: it is an orphan (deleted at once after a lost race, else by orphan cleanup).

The window is the same as one list's: the newest ``icelog.commit-ids.keep`` entries, and
older ones younger than ``icelog.commit-ids.min-retention-ms``, ``COMMIT_IDS_MAX`` in all.
Files leave it whole, so it may keep up to one file's entries more (keeping more ids is never
wrong); ``icelog.commits.forgotten-ms`` moves only when entries leave.

A lookup reads the tail first, then (only when it misses) the files that can hold the id:
an id that carries its creation time (UUIDv7) can only be in a file whose newest commit
came after it (less the clock skew). Files never change, so this process keeps the ones it
read (``_CACHE_FILES``). A file belongs to one table: it names the table's uuid,
and a file of another table (copied properties, a table re-created at the same location)
counts for nothing.

A listed file that is **gone** from the store (another engine's orphan cleanup deletes every
file no Iceberg metadata references: it does not know these) while the table's current
metadata still lists it cannot prove an id new. A lookup that could need it raises
:class:`storage.errors.RegistryFileGone` (a ``CommitIdForgotten``); one that cannot (a UUIDv7
id newer than the file) never reads it. The process remembers the file (``_gone``), and its
next commit on the table drops it from the list and moves ``icelog.commits.forgotten-ms`` past
its newest commit: the table heals, and the file's ids are forgotten, never "not landed".
Any other read error stays an ``OSError``: the commit reads again.

A table written by an older icelog holds the whole registry in ``icelog.commits``: its first
commit now moves it into one file (it is larger than ``TAIL_BYTES``).
"""

from __future__ import annotations

import io
import json
import posixpath
import random
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from icelog.storage import properties as props
from icelog.storage.core import faults
from icelog.storage.errors import RegistryFileGone
from icelog.storage.properties import COMMIT_FILES, COMMITS
from icelog.storage.telemetry import get_logger

log = get_logger("registry")

COMMIT_IDS_MAX = 4000  # the time floor keeps at most this many ids (or commit-ids.keep): bounded files
TAIL_BYTES = 6144  # a tail this large moves into a registry file: the metadata JSON stays small
CLOCK_SKEW_MS = 1000  # between the host that made a commit id and the one that recorded a commit
FILE_PREFIX = "icelog-commits-"
_CACHE_FILES = 256

NOT_FOUND: Any = object()

Entry = list[Any]  # [commit_id, receipt, snapshot_id, committed_ms]


@dataclass(frozen=True)
class RegistryFile:
    """One registry file as the list names it."""

    stem: str  # ``<version>-<random>``: the file is ``icelog-commits-<stem>.avro`` in the list's folder
    count: int  # entries in it
    newest_ms: int  # the latest commit time among them (an upper bound for an older icelog's entries)


@dataclass(frozen=True)
class FileList:
    """``icelog.commits.files``: the folder of the registry files and the files, oldest first."""

    folder: str
    files: tuple[RegistryFile, ...] = ()

    def path(self, f: RegistryFile) -> str:
        return f"{self.folder}/{FILE_PREFIX}{f.stem}.avro"

    def paths(self) -> list[str]:
        return [self.path(f) for f in self.files]

    def to_property(self) -> str:
        return json.dumps(
            {"dir": self.folder, "files": [[f.stem, f.count, f.newest_ms] for f in self.files]}, separators=(",", ":")
        )


@dataclass(frozen=True)
class Registered:
    """What one commit writes to the registry: the properties to set (in the swap), and the newest
    commit time it dropped, if any (the registry file it wrote, if any, is the one the list adds:
    :func:`files_written`)."""

    properties: dict[str, str]
    forgotten_ms: int | None


def file_list(metadata: TableMetadata) -> FileList | None:
    """The registry files ``metadata`` names (None: none yet)."""
    return _file_list(metadata.properties.get(COMMIT_FILES, ""))


@lru_cache(maxsize=64)
def _file_list(raw: str | None) -> FileList | None:
    """Parsed once per text: a commit reads its base's list more than once, and the list is
    longest (up to the window's files) on a long history. A ``FileList`` never changes."""
    if not raw:
        return None
    parsed = json.loads(raw)
    return FileList(parsed["dir"], tuple(RegistryFile(str(n), int(c), int(ms)) for n, c, ms in parsed["files"]))


def tail(metadata: TableMetadata) -> list[Entry]:
    """The newest entries, those in the metadata itself (``icelog.commits``), oldest first."""
    return json.loads(metadata.properties.get(COMMITS, "") or "[]")


def all_commits(table: Table, skip_gone: bool = False) -> list[Entry]:
    """Every entry the registry holds, registry files and tail, oldest first (reads the files).

    Args:
        skip_gone: Leave out the entries of a listed file that is gone (for a caller that has
            another record of them), instead of raising.

    Raises:
        RegistryFileGone: a listed file is gone while the current metadata lists it.
        OSError: a listed file could not be read (a stale table whose file a later commit dropped
            and orphan cleanup deleted: load the table again; a store restarting).
    """
    listed = file_list(table.metadata)
    entries: list[Entry] = []
    if listed is not None:
        for f in listed.files:
            try:
                entries.extend(_read(table, listed.path(f))[0])
            except FileNotFoundError:
                if not _confirmed_gone(table, listed.path(f)):
                    raise
                if not skip_gone:
                    raise _gone_error(table, "<any>", listed.path(f), f.newest_ms) from None
    return [*entries, *tail(table.metadata)]


def find_commit(table: Table, commit_id: str) -> Any:
    """``(receipt, snapshot_id)`` recorded for ``commit_id``, or :data:`NOT_FOUND`: the tail
    first, then the registry files that can hold it, newest first.

    Raises:
        RegistryFileGone: a file that can hold ``commit_id`` is gone (and no other holds it).
        OSError: a listed file could not be read (see :func:`all_commits`).
    """
    found = _in_tail(table.metadata.properties.get(COMMITS, ""), commit_id)
    if found is not NOT_FOUND:
        return found
    listed = file_list(table.metadata)
    if listed is None:
        return NOT_FOUND
    created_ms = commit_id_created_ms(commit_id)
    gone: RegistryFile | None = None
    for f in reversed(listed.files):
        if created_ms is not None and f.newest_ms < created_ms - CLOCK_SKEW_MS:
            continue  # only commits made before the id could land
        try:
            hit = _read(table, listed.path(f))[1].get(commit_id)
        except FileNotFoundError:
            if not _confirmed_gone(table, listed.path(f)):
                raise
            gone = gone or f  # the newest gone file: the error names it; the others are remembered too
            continue
        if hit is not None:
            return hit
    if gone is not None:
        raise _gone_error(
            table, commit_id, listed.path(gone), max(g.newest_ms for g in listed.files if g is gone or _is_gone(listed.path(g)))
        )
    return NOT_FOUND


def _gone_error(table: Table, commit_id: str, path: str, newest_ms: int) -> RegistryFileGone:
    return RegistryFileGone(
        table=".".join(table.name()),
        commit_id=commit_id,
        path=path,
        created_ms=commit_id_created_ms(commit_id),
        forgotten_ms=newest_ms,
    )


_gone: set[str] = set()  # listed registry files this process found gone: its next commit drops them


def _is_gone(path: str) -> bool:
    with _cache_lock:
        return path in _gone


def _lost(listed: FileList | None) -> list[RegistryFile]:
    """The files of ``listed`` this process found gone (one look at an empty ``_gone``, the
    usual case, rather than one per listed file)."""
    with _cache_lock:
        if not _gone or listed is None:
            return []
        return [f for f in listed.files if listed.path(f) in _gone]


def _confirmed_gone(table: Table, path: str) -> bool:
    """Whether ``path``, not found, is gone from a file list that is current: the table as the
    catalog has it now still lists it (a stale table's file may have been dropped by a later
    commit and deleted by icelog's own cleanup: that is no loss). Remembered for the next commit."""
    if _is_gone(path):
        return True
    try:
        current = table.catalog.load_table(table.name()).metadata
    except Exception as e:  # noqa: BLE001 - the catalog unreadable: not proven gone, the caller reads again
        log.warning("registry file not found; the table could not be reloaded", path=path, error=repr(e))
        return False
    listed = file_list(current)
    if current.table_uuid != table.metadata.table_uuid or listed is None or path not in listed.paths():
        return False
    log.warning("commit-id registry file listed but gone: its ids are forgotten from the next commit", path=path)
    with _cache_lock:
        _gone.add(path)
    return True


def _in_tail(raw: str, commit_id: str) -> Any:
    if commit_id not in raw:  # cheap test first
        return NOT_FOUND
    for cid, receipt, snapshot_id, *_ in reversed(json.loads(raw)):
        if cid == commit_id:
            return receipt, snapshot_id
    return NOT_FOUND


def was_committed(table: Table, commit_id: str) -> bool:
    return find_commit(table, commit_id) is not NOT_FOUND


def new_commit_id() -> str:
    """A fresh commit id that carries its creation time (a UUIDv7, RFC 9562).

    A re-send of such an id can be judged after the registry forgot older commits: see
    :class:`storage.errors.CommitIdForgotten`.
    """
    ms = time.time_ns() // 1_000_000
    value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | random.getrandbits(12) << 64 | 0b10 << 62 | random.getrandbits(62)
    return uuid.UUID(int=value).hex


def commit_id_created_ms(commit_id: str) -> int | None:
    """The creation time in a UUIDv7 commit id (any spelling ``uuid.UUID`` reads); None for other ids."""
    try:
        parsed = uuid.UUID(commit_id)
    except (ValueError, TypeError, AttributeError):
        return None
    return parsed.int >> 80 if parsed.version == 7 else None


# --- writing -------------------------------------------------------------------------------


def committed_times(entries: Sequence[Entry], now_ms: int) -> list[int]:
    """Each entry's commit time. An entry an older icelog wrote has none: it landed before the
    next entry that has one (the registry is in commit order), so that time bounds it (``now_ms``
    when none follows). "Now" for every such entry would mark each fresh id made before the
    commit that drops one as possibly forgotten: refused on its first send."""
    times, later = [now_ms] * len(entries), now_ms
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if len(entry) > 3 and isinstance(entry[3], int) and not isinstance(entry[3], bool):
            later = entry[3]
        times[i] = later
    return times


def _dropped(units: Sequence[tuple[int, int]], settings: props.CommitSettings, now_ms: int) -> int:
    """How many of ``units`` (``(entries, newest time)``, oldest first) leave the window: the
    oldest, while the rest still hold ``commit-ids.keep`` entries and it is older than the time
    floor, or the rest hold ``COMMIT_IDS_MAX`` (or ``commit-ids.keep``) entries anyway."""
    cap = max(settings.commit_ids_keep, COMMIT_IDS_MAX)
    floor_ms = now_ms - settings.commit_ids_min_retention_ms
    rest = sum(count for count, _ in units)
    dropped = 0
    for count, newest_ms in units:
        rest -= count
        if not (rest >= cap or (rest >= settings.commit_ids_keep and newest_ms <= floor_ms)):
            break
        dropped += 1
    return dropped


def register(table: Table, entry: Entry, version: int, settings: props.CommitSettings, now_ms: int) -> Registered:
    """Record ``entry`` (the commit's own) on ``table``'s registry as the next version leaves it.

    Entries (and whole files) that left the window are dropped; a tail outgrowing
    ``TAIL_BYTES`` moves into a new registry file, written here, before the swap.

    Raises:
        OSError: the registry file could not be written (nothing is committed).
    """
    metadata = table.metadata
    old = tail(metadata)
    listed = file_list(metadata)
    files = list(listed.files) if listed else []
    lost = _lost(listed)
    if lost:
        assert listed is not None
        log.warning("dropping gone registry files: their ids are forgotten", files=[listed.path(f) for f in lost])
        files = [f for f in files if f not in lost]
    times = committed_times([*old, entry], now_ms)
    units = [(f.count, f.newest_ms) for f in files] + [(1, t) for t in times]
    dropped = _dropped(units, settings, now_ms)
    gone_files, gone_entries = files[:dropped], max(0, dropped - len(files))
    forgotten = [f.newest_ms for f in [*lost, *gone_files]] + times[:gone_entries]
    files, kept, kept_times = files[len(gone_files) :], old[gone_entries:], times[gone_entries:-1]
    text = json.dumps(kept, separators=(",", ":"))
    if len(text) >= TAIL_BYTES:
        folder = listed.folder if listed else posixpath.dirname(table.metadata_location)
        # The version, and randomness against a racing commit on the same base: the list stays short.
        made = RegistryFile(f"{version:05d}-{uuid.uuid4().hex[:12]}", len(kept), max(kept_times))
        _write(table, FileList(folder).path(made), kept)
        files.append(made)
        listed, kept = FileList(folder), []
    properties = {COMMITS: json.dumps([*kept, entry], separators=(",", ":"))}
    if listed is not None:
        properties[COMMIT_FILES] = FileList(listed.folder, tuple(files)).to_property()
    return Registered(properties, max(forgotten, default=None))


def without_gone(metadata: TableMetadata) -> tuple[str, int] | None:
    """``icelog.commits.files`` without the listed files this process found gone, and the newest
    commit time among those (for ``icelog.commits.forgotten-ms``); None when none is gone."""
    listed = file_list(metadata)
    lost = _lost(listed)
    if not lost or listed is None:
        return None
    kept = tuple(f for f in listed.files if f not in lost)
    return FileList(listed.folder, kept).to_property(), max(f.newest_ms for f in lost)


def files_written(base: TableMetadata, properties: Mapping[str, str]) -> list[str]:
    """Registry files a staged commit lists that its base does not: written by that attempt."""
    after, before = _file_list(properties.get(COMMIT_FILES)), file_list(base)
    known = set(before.paths()) if before else set()
    return [p for p in after.paths() if p not in known] if after else []


_SCHEMA = {
    "type": "record",
    "name": "commit",
    "namespace": "icelog",
    "fields": [
        {"name": "commit_id", "type": "string"},
        {"name": "receipt", "type": "string"},  # JSON: whatever the request's receipt holds
        {"name": "snapshot_id", "type": ["null", "long"]},
        {"name": "committed_ms", "type": ["null", "long"]},  # none in an older icelog's entries
    ],
}
_OWNER = "icelog.table-uuid"


def _write(table: Table, path: str, entries: list[Entry]) -> None:
    """Avro, as Iceberg's own manifests: the one kind of file besides metadata JSON and data that
    every store holding Iceberg tables takes under ``metadata/`` (S3 table buckets refuse others)."""
    import fastavro

    records = [
        {
            "commit_id": e[0],
            "receipt": json.dumps(e[1], separators=(",", ":")),
            "snapshot_id": e[2],
            "committed_ms": e[3] if len(e) > 3 and isinstance(e[3], int) and not isinstance(e[3], bool) else None,
        }
        for e in entries
    ]
    buffer = io.BytesIO()
    fastavro.writer(buffer, fastavro.parse_schema(_SCHEMA), records, metadata={_OWNER: str(table.metadata.table_uuid)})
    with table.io.new_output(path).create(overwrite=True) as out:
        out.write(buffer.getvalue())
    _remember(path, str(table.metadata.table_uuid), entries)
    faults.checkpoint(faults.AFTER_REGISTRY_FILE)


def _parse(data: bytes) -> tuple[str, list[Entry]]:
    import fastavro

    reader = fastavro.reader(io.BytesIO(data))
    entries: list[Entry] = []
    for r in reader:
        entry = [r["commit_id"], json.loads(r["receipt"]), r["snapshot_id"]]
        entries.append(entry if r["committed_ms"] is None else [*entry, r["committed_ms"]])
    return str(reader.metadata.get(_OWNER)), entries


# --- reading registry files: immutable, so kept once read ---------------------------------------

_cache: OrderedDict[str, tuple[str, list[Entry], dict[str, tuple[Any, Any]]]] = OrderedDict()
_cache_lock = threading.Lock()


def _remember(path: str, table_uuid: str, entries: list[Entry]) -> tuple[str, list[Entry], dict[str, tuple[Any, Any]]]:
    by_id = {e[0]: (e[1], e[2]) for e in entries}
    value = (table_uuid, entries, by_id)
    with _cache_lock:
        _cache[path] = value
        _cache.move_to_end(path)
        while len(_cache) > _CACHE_FILES:
            _cache.popitem(last=False)
    return value


def _read(table: Table, path: str) -> tuple[list[Entry], dict[str, tuple[Any, Any]]]:
    """A registry file's entries and ``{commit id: (receipt, snapshot id)}``; nothing for a file
    that belongs to another table."""
    with _cache_lock:
        value = _cache.get(path)
        if value is not None:
            _cache.move_to_end(path)
    if value is None:
        with table.io.new_input(path).open() as f:
            value = _remember(path, *_parse(f.read()))
    owner, entries, by_id = value
    if owner != str(table.metadata.table_uuid):
        log.warning("registry file of another table ignored", path=path, owner=owner, table=str(table.metadata.table_uuid))
        return [], {}
    return entries, by_id


def clear_cache() -> None:
    """Forget the registry files this process read (tests: a file deleted behind its back)."""
    with _cache_lock:
        _cache.clear()
        _gone.clear()

"""Mirrors: offset-preserving copies of log tables in another catalog (KIP-391; docs/guarantees.md#i6-mirrors-keep-offsets).

A mirror target holds the same (partition, offset) with the same content as its source, so
consumers fail over with their committed offsets unchanged. :func:`mirror` is one
incremental, resumable step:

1. Read the target (its progress and group offsets), then the source's consumer-group
   offsets, *then* the source table. Source groups before the source table: a committed group
   offset never passes the log end (I10), so every offset read is covered by the data read.
   Target before source: every step that committed into the target read the source earlier,
   so the target never holds more than this step's view of the source.
2. Create the target on first use, with the source's schema, partition spec, sort order and
   table properties. It is read-only (``icelog.read-only``) until :func:`promote`.
3. Refuse to go on if the source is not the table mirrored so far (its table UUID changed:
   dropped and re-created), or if the source's retention removed offsets never mirrored
   (:class:`MirrorGap` names the range). Never skip silently.
4. Find what the source committed since the last mirrored source snapshot, from the
   manifests of the snapshots in between (work proportional to the delta). If that snapshot
   is no longer retained, fall back to the source's live files.
5. Copy those data files byte for byte into the target's warehouse, in parallel, each under
   a new name (so concurrent steps never write over each other's or a committed file). A
   step that fails deletes its copies; one killed leaves them to orphan cleanup. A file that
   straddles the target's log end (the source compacted across it) is sliced.
6. Commit one :class:`MirrorWrite` (plus the group offsets, in the same atomic
   multi-table commit; on a catalog without one, a REST catalog, in a commit of their own
   right after) through the commit core. The progress (source snapshot, UUID and
   state version) is a table property set in that same commit, so a crash at any point
   resumes from exactly what the target holds: no gap, no duplicate. The commit lands only if
   the target's progress, group offsets and promotion are still the ones read in step 1
   (:class:`PlanOutdated` otherwise, and the step plans again): a slow step never moves a
   concurrent step's progress, producer state or group offsets back, and never lands on a
   target promoted meanwhile. Before it, the producer ids that state holds are reserved in
   the target catalog, so no producer there ever gets a mirrored id (not even after promotion).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import random
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from icelog.storage.core.catalog import ensure_namespace
from icelog.storage.core.commit import Decision, Request, commit, commit_tables, load, refuse_system_table
from icelog.storage.core.commit import _discard as discard_files
from icelog.storage.core.swap import check_atomic
from icelog.storage.core.system import ensure_system_table
from icelog.storage.errors import (
    AtomicCommitUnsupported,
    CatalogUnavailable,
    CommitOutcomeUnknown,
    InvalidInput,
    InvalidProduceOffset,
    MirrorGap,
    MirrorPromoted,
    MirrorSchemaChanged,
    MirrorSourceChanged,
    NotALogTable,
    PlanOutdated,
)
from icelog.storage.groups.offsets import GROUPS_TABLE, GroupOffsetsState
from icelog.storage.log import schema as cols
from icelog.storage.log.files import (
    data_files_from_parquet,
    file_offset_range,
    file_partition,
    local_path,
    store_reachable,
)
from icelog.storage.log.maintenance import _read_file, live_files
from icelog.storage.log.state import LogState
from icelog.storage.producers.idempotent import producer_id_floor, reserve_producer_ids_below
from icelog.storage.properties import (
    COMMIT_FILES,
    COMMITS,
    FORGOTTEN,
    FORMAT,
    HEAD,
    MIRROR,
    PARTITIONS,
    PRODUCERS,
    PROMOTED,
    READ_ONLY,
    SOURCE_SNAPSHOT,
    VERSION,
    WATERMARKS,
)
from icelog.storage.replication.acls import REPLICATOR_WRITE, authorize
from icelog.storage.replication.replica import OffsetWriteRequest, batch_spans
from icelog.storage.settings import Settings
from icelog.storage.telemetry import get_logger

log = get_logger("mirror")

# Never copied from the source: the target's own state, bookkeeping and mirror marks.
_OWN_PROPERTIES = {VERSION, HEAD, COMMITS, COMMIT_FILES, PARTITIONS, WATERMARKS, PRODUCERS, MIRROR, PROMOTED, READ_ONLY}
COPY_CHUNK = 8 << 20
Copier = Callable[[Sequence[Tuple[str, str]]], None]


@dataclass
class MirrorResult:
    """What one mirror step did."""

    source: str
    target: str
    target_catalog: str
    source_snapshot_id: int | None
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    log_ends: dict[int, int] = field(default_factory=dict)
    copied_files: int = 0
    sliced_files: int = 0
    bytes_copied: int = 0
    groups: int = 0
    incremental: bool = True
    up_to_date: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mirror_record(metadata: TableMetadata) -> dict[str, Any] | None:
    """The source a target mirrors, and how far: ``{"catalog", "table", "uuid", "snapshot", "version"}``."""
    raw = metadata.properties.get(MIRROR)
    return json.loads(raw) if raw else None


def mirror(
    source_catalog: Catalog,
    source_table: str,
    target_catalog: Catalog,
    target_table: str | None = None,
    *,
    principal: str | None = None,
    copier: Copier | None = None,
    max_attempts: int = 5,
    copy_threads: int | None = None,
) -> MirrorResult:
    """Mirror everything ``source_table`` committed since the last step into the target.

    Args:
        source_catalog: The source's catalog.
        source_table: The source log table.
        target_catalog: The catalog of the copy (may be the same catalog).
        target_table: The copy's name (default: the source's).
        principal: Needs ``replicator-write`` on the target in the target catalog
            (default: ``ICELOG_PRINCIPAL``).
        copier: Copies ``(source path, target path)`` pairs byte for byte (default:
            :func:`table_copier`, threads in this process through the tables' file IO;
            ``pipelines.mirror`` has a Spark one).
        copy_threads: Threads of the default copier and of the footer reads (default:
            ``$ICELOG_MIRROR_THREADS``, 8).
        max_attempts: Steps planned again when a concurrent step moved the target's log end
            (a concurrent step that mirrored everything the source held when this call began
            ends it early: ``up_to_date`` with no ranges of its own).

    Returns:
        The offsets copied per partition and the target's log ends.

    Raises:
        AuthorizationFailed: no ``replicator-write`` grant; nothing is written.
        MirrorGap: the source's retention removed offsets never mirrored.
        MirrorSourceChanged: the source table was dropped and re-created.
        MirrorPromoted: the target was promoted.
        MirrorSchemaChanged: the source gained columns the target lacks.
        InvalidProduceOffset, PlanOutdated: concurrent steps into the same target kept
            committing before this one (``max_attempts`` times).
        CommitConflict, CommitOutcomeUnknown, StorageUnreachable: transient; run again (it resumes).
    """
    source_id = cols.qualified(source_table)
    target_id = cols.qualified(target_table or source_id)
    refuse_system_table(target_id)  # before the target is created there
    if source_catalog.name == target_catalog.name and source_id == target_id:
        raise InvalidInput(reason=f"a table cannot mirror itself ({source_id} in {source_catalog.name})")
    authorize(target_catalog, principal, REPLICATOR_WRITE, target_id)
    threads = copy_threads or Settings.load().mirror_threads
    # What this call must mirror at least: the source's log ends when it started.
    goal = {p: w.end for p, w in LogState.from_metadata(load(source_catalog, source_id).metadata).watermarks.items()}
    for attempt in range(1, max_attempts + 1):
        try:
            return _step(source_catalog, source_id, target_catalog, target_id, copier, threads)
        except (InvalidProduceOffset, PlanOutdated):
            # Another step into the same target committed since this one planned: plan again
            # from what the target holds now (with nothing left to copy, that is quick). The
            # winner may have read the source before this call began, so its commit is not
            # this call's work. Only when attempts run out does a target whose log ends reach
            # what this call was asked for end it (group offsets and producer state then
            # follow at the next step).
            if attempt < max_attempts:
                time.sleep(random.uniform(0, 0.05 * attempt))  # desynchronise steps that keep colliding
                continue
            ends = {p: w.end for p, w in LogState.from_metadata(load(target_catalog, target_id).metadata).watermarks.items()}
            if all(ends.get(p, 0) >= end for p, end in goal.items()):
                log.info("mirrored by a concurrent step", source=source_id, target=target_id, log_ends=ends)
                return MirrorResult(source_id, target_id, target_catalog.name, None, log_ends=ends, up_to_date=True)
            raise
    raise AssertionError("unreachable")


def _step(
    source_catalog: Catalog, source_id: str, target_catalog: Catalog, target_id: str, copier: Copier | None, threads: int
) -> MirrorResult:
    started = time.perf_counter()
    # The target before the source (step 1): every step that committed into the target read
    # the source before this step reads it, so this step's view of the source is never older
    # than what the target holds.
    target = _open_target(source_catalog, source_id, target_catalog, target_id)
    target_groups = _target_groups(target_catalog, target_id)
    groups = _source_groups(source_catalog, source_id)  # before the table: see step 1
    source = load(source_catalog, source_id)
    if FORMAT not in source.metadata.properties:
        raise NotALogTable(table=source_id)
    record = mirror_record(target.metadata) or {}
    if record.get("uuid") != str(source.metadata.table_uuid):
        raise MirrorSourceChanged(
            source=source_id, expected_uuid=str(record.get("uuid")), actual_uuid=str(source.metadata.table_uuid)
        )
    missing = _missing_columns(source, target)
    if missing:
        raise MirrorSchemaChanged(source=source_id, columns=missing)
    result = MirrorResult(source_id, target_id, target_catalog.name, source.metadata.current_snapshot_id)
    progress = {**record, "snapshot": source.metadata.current_snapshot_id, "version": source.metadata.properties.get(VERSION)}
    group_changes = {g: o for g, o in groups.items() if target_groups.get(g) != o}
    group_changes.update({g: {"offsets": {}, "ranges": {}} for g in target_groups if g not in groups})
    if progress == record and not group_changes:
        result.up_to_date = True
        result.log_ends = {p: w.end for p, w in LogState.from_metadata(target.metadata).watermarks.items()}
        result.seconds = time.perf_counter() - started
        return result
    token = uuid.uuid4().hex  # this step's commit id and copy names: never shared with another step
    try:
        with store_reachable(f"{source_id} to {target_id}"):  # its reads and copies, before the commit
            request = _plan(source, target, record, progress, result, copier, token, threads)
    except (MirrorGap, MirrorSourceChanged) as e:
        # Judged against the target as read: if a concurrent step moved it on since (and the
        # source's retention followed), the verdict is stale, not the source.
        if load(target_catalog, target_id).metadata.properties.get(MIRROR) != target.metadata.properties[MIRROR]:
            raise PlanOutdated(table=target_id, what=MIRROR) from e
        raise
    parts: list[tuple[str, Request]] = [(target_id, request)]
    if group_changes:
        ensure_system_table(target_catalog, GROUPS_TABLE)
        parts.append((GROUPS_TABLE, MirrorGroupOffsets(target_id, group_changes, expected=target_groups)))
        result.groups = len(group_changes)
    commit_id = f"mirror-{token}"
    # A catalog without an atomic multi-table commit (REST) takes the group offsets in a
    # commit of their own, after the data: see _commit_groups_after.
    later = parts[1:] if len(parts) > 1 and not _atomic(target_catalog) else []
    try:
        if request.producers is not None:  # before they land: see reserve_producer_ids_below
            reserve_producer_ids_below(target_catalog, producer_id_floor(request.producers))
        outcome = commit_tables(target_catalog, parts[: len(parts) - len(later)], commit_id=commit_id)[0]
    except (CommitOutcomeUnknown, CatalogUnavailable):
        raise  # the commit may have landed: its files stay (orphan cleanup gets them if not)
    except BaseException:
        discard_files(target, [f for fs in request.files.values() for f in fs])  # never committed: remove this step's copies
        raise
    _commit_groups_after(target_catalog, later, commit_id)
    if outcome.result is not None:
        result.log_ends = dict(outcome.result.log_ends)
    result.seconds = time.perf_counter() - started
    log.info("mirrored", source=source_id, target=target_id, ranges=result.ranges, files=result.copied_files)
    return result


def _atomic(catalog: Catalog) -> bool:
    try:
        check_atomic(catalog, 2)
    except AtomicCommitUnsupported:
        return False
    return True


def _commit_groups_after(catalog: Catalog, parts: Sequence[tuple[str, Request]], commit_id: str) -> None:
    """The group offsets of a step, committed after its data on a catalog that cannot take
    both at once (REST).

    Safe in this order: the data landed first, so no offset committed here passes the target's
    log end (I10), and the request still lands only on the group offsets the step read
    (``expected``). A crash between the two commits leaves the target's groups behind the
    source's, never ahead: the next step finds them differing and sets them then.
    """
    for table, request in parts:
        commit(catalog, table, request, commit_id=f"{commit_id}-groups")


def _missing_columns(source: Table, target: Table) -> list[str]:
    names = {f.name for f in target.schema().fields}
    return [f.name for f in source.schema().fields if f.name not in names]


class MirrorWrite(OffsetWriteRequest):
    """A mirror step's write: the one write a read-only target takes (besides promotion)."""

    writes_read_only = True


def _plan(
    source: Table,
    target: Table,
    record: Mapping[str, Any],
    progress: Mapping[str, Any],
    result: MirrorResult,
    copier: Copier | None,
    token: str,
    threads: int,
) -> MirrorWrite:
    """Decide what to copy: follow retention and new partitions, fail on gaps, copy the delta."""
    src = LogState.from_metadata(source.metadata)
    dst = LogState.from_metadata(target.metadata).with_partitions(max(src.partitions, 0))
    first_step = record.get("snapshot") is None
    starts: dict[int, int] = {}
    wanted: dict[int, tuple[int, int]] = {}
    for p, mark in src.watermarks.items():
        have = dst.watermarks[p]
        end = have.end
        if first_step and have.end == 0:
            end = mark.start  # a new mirror starts at the source's log start
        elif mark.start > have.end:
            raise MirrorGap(source=result.source, partition=p, missing_start=have.end, missing_end=mark.start)
        if mark.start > have.start:
            starts[p] = mark.start
        if mark.end > end:
            wanted[p] = (end, mark.end)
        elif mark.end < have.end:
            raise MirrorSourceChanged(
                source=result.source,
                expected_uuid=str(record.get("uuid")),
                actual_uuid=f"{source.metadata.table_uuid} (log end {mark.end} < mirrored {have.end} on partition {p})",
            )
    files, rows = _copy_delta(source, target, record.get("snapshot"), wanted, result, copier, token, threads)
    spans = batch_spans(target, result.target, rows, files)
    if result.incremental and any(spans.get(p) != need for p, need in wanted.items()):
        # The snapshots in between did not tell the whole story (a rollback on the source,
        # say): copy from the source's live files instead.
        discard_files(target, [f for fs in files.values() for f in fs])
        result.copied_files = result.sliced_files = result.bytes_copied = 0
        files, rows = _copy_delta(source, target, None, wanted, result, copier, token, threads)
        spans = batch_spans(target, result.target, rows, files)
    for p, need in wanted.items():
        if spans.get(p) != need:
            raise InvalidInput(
                reason=f"{result.source} partition {p}: source files cover {spans.get(p)}, not {need} (run `icelog validate` on the source)"
            )
    result.ranges = dict(spans)
    lineage = {SOURCE_SNAPSHOT: str(progress["snapshot"]), "icelog.mirror-source": f"{record['catalog']}/{record['table']}"}
    return MirrorWrite(
        result.target,
        spans,
        rows=rows,
        files=files,
        log_starts=starts,
        partitions=src.partitions,
        producers=src.producers,
        properties={MIRROR: json.dumps(dict(progress), sort_keys=True)},
        expect_properties={MIRROR: target.metadata.properties[MIRROR], PROMOTED: target.metadata.properties.get(PROMOTED)},
        lineage=lineage,
    )


def _copy_delta(
    source: Table,
    target: Table,
    since: int | None,
    wanted: Mapping[int, tuple[int, int]],
    result: MirrorResult,
    copier: Copier | None,
    token: str,
    threads: int,
) -> tuple[dict[int, list[DataFile]], dict[int, pa.Table]]:
    """Copy the source files holding the wanted offsets; slice the ones that straddle."""
    if not wanted:
        return {}, {}
    candidates = _added_since(source, since) if since is not None else None
    if candidates is None:
        result.incremental = False
        candidates = live_files(source)
    offset_id = source.schema().find_field(cols.OFFSET).field_id
    whole: dict[int, list[tuple[int, DataFile]]] = {}
    sliced: dict[int, pa.Table] = {}
    for data_file in candidates:
        p = file_partition(data_file)
        if p not in wanted or not data_file.record_count:
            continue
        first, nxt = file_offset_range(data_file, offset_id)
        lo, hi = wanted[p]
        if nxt <= lo or first >= hi:
            continue
        if first < lo:
            rows = _read(source, data_file)
            sliced[p] = rows.filter(pc.greater_equal(rows[cols.OFFSET], lo))
            result.sliced_files += 1
        else:
            whole.setdefault(p, []).append((first, data_file))
    same_schema = source.schema().as_struct() == target.schema().as_struct()
    jobs = [(p, f) for p in sorted(whole) for _, f in sorted(whole[p], key=lambda e: e[0])]
    if not same_schema:  # decode and re-encode through the target's schema
        for p, data_file in jobs:
            sliced[p] = pa.concat_tables([t for t in (sliced.get(p), _read(source, data_file)) if t is not None])
        return {}, sliced
    pairs = [(f.file_path, _target_path(target, p, f, token[:12])) for p, f in jobs]
    (copier or table_copier(source, target, threads))(pairs)
    with ThreadPoolExecutor(max_workers=threads) as pool:  # footers only: stats for the manifests
        copied = list(pool.map(lambda pair: data_files_from_parquet(target, [pair[1]])[0], pairs))
    files: dict[int, list[DataFile]] = {}
    for (p, data_file), new_file in zip(jobs, copied, strict=True):
        files.setdefault(p, []).append(new_file)
        result.copied_files += 1
        result.bytes_copied += data_file.file_size_in_bytes
    return files, sliced


def _target_path(target: Table, partition: int, data_file: DataFile, token: str) -> str:
    """Where a source file's copy goes: a name of its own per step, so concurrent steps into
    one target never write over each other's (or a committed) file."""
    digest = hashlib.sha256(data_file.file_path.encode()).hexdigest()[:12]
    return f"{target.metadata.location.rstrip('/')}/data/{cols.PARTITION}={partition}/m-{digest}-{token}-{posixpath.basename(data_file.file_path)}"


def copy_files(
    pairs: Sequence[tuple[str, str]],
    source_io: FileIO | None = None,
    target_io: FileIO | None = None,
    threads: int | None = None,
) -> None:
    """Copy files byte for byte, in ``threads`` parallel threads (default ``$ICELOG_MIRROR_THREADS``):
    local files with the kernel's ``copy_file_range`` (``shutil.copyfile``), others through the
    tables' file IO when given (it knows an object store's endpoint and credentials, e.g. a REST
    catalog's S3), else pyarrow's filesystems."""
    from pyarrow import fs as pafs

    def one(pair: tuple[str, str]) -> None:
        src, dst = pair
        if _is_local(src) and _is_local(dst):
            target_path = local_path(dst)
            os.makedirs(os.path.dirname(target_path), exist_ok=True)
            shutil.copyfile(local_path(src), target_path)
        elif source_io is not None and target_io is not None:
            _stream(source_io, src, target_io, dst)
        else:
            pafs.copy_files(src, dst, chunk_size=COPY_CHUNK)

    with ThreadPoolExecutor(max_workers=threads or Settings.load().mirror_threads) as pool:
        list(pool.map(one, pairs))


def _stream(source_io: FileIO, src: str, target_io: FileIO, dst: str) -> None:
    """One file from one store to another in ``COPY_CHUNK`` pieces (bounded memory)."""
    with source_io.new_input(src).open() as reader, target_io.new_output(dst).create(overwrite=True) as writer:
        while chunk := reader.read(COPY_CHUNK):
            writer.write(chunk)


def table_copier(source: Table, target: Table, threads: int | None = None) -> Copier:
    """The default copier of a mirror step: :func:`copy_files` through the two tables' file IO,
    so a source or target in an object store (a REST catalog over S3) is reached with its
    catalog's endpoint and credentials."""
    return functools.partial(copy_files, source_io=source.io, target_io=target.io, threads=threads)


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def _read(table: Table, data_file: DataFile) -> pa.Table:

    return _read_file(table, data_file)


def _added_since(source: Table, since: int) -> list[DataFile] | None:
    """Files added after snapshot ``since`` and still live, read only from the manifests of
    the snapshots in between; ``None`` when ``since`` is no longer an ancestor of ``main``."""
    metadata = source.metadata
    chain = []
    snapshot = metadata.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != since:
        chain.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = metadata.snapshot_by_id(parent) if parent is not None else None
    if snapshot is None:
        return None
    ids = {s.snapshot_id for s in chain}
    added: dict[str, DataFile] = {}
    deleted: set[str] = set()
    for snap in chain:
        for manifest in snap.manifests(source.io):
            if manifest.added_snapshot_id != snap.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(source.io, discard_deleted=False):
                if entry.snapshot_id not in ids:
                    continue
                if entry.status == ManifestEntryStatus.ADDED:
                    added[entry.data_file.file_path] = entry.data_file
                elif entry.status == ManifestEntryStatus.DELETED:
                    deleted.add(entry.data_file.file_path)
    return [f for path, f in added.items() if path not in deleted]


def _open_target(source_catalog: Catalog, source_id: str, catalog: Catalog, target_id: str) -> Table:
    """The target, created on first use like its source; refused if promoted or not a mirror."""
    try:
        target = catalog.load_table(target_id)
    except NoSuchTableError:
        source = load(source_catalog, source_id)
        if FORMAT not in source.metadata.properties:
            raise NotALogTable(table=source_id) from None
        target = _create_target(source_catalog.name, source_id, source, catalog, target_id)
    props = target.metadata.properties
    if props.get(PROMOTED) == "true":
        raise MirrorPromoted(table=target_id)
    if MIRROR not in props:
        raise InvalidInput(reason=f"{target_id} exists in {catalog.name} and is not a mirror; choose another --target-table")
    return target


def _create_target(source_catalog: str, source_id: str, source: Table, catalog: Catalog, target_id: str) -> Table:
    props = {k: v for k, v in source.metadata.properties.items() if k not in _OWN_PROPERTIES}
    record = {
        "catalog": source_catalog,
        "table": source_id,
        "uuid": str(source.metadata.table_uuid),
        "snapshot": None,
        "version": None,
    }
    props.update(
        {
            **LogState.initial(LogState.from_metadata(source.metadata).partitions).to_properties(),
            VERSION: "0",
            HEAD: "",
            MIRROR: json.dumps(record, sort_keys=True),
            READ_ONLY: f"{source_catalog}/{source_id}",
        }
    )
    ensure_namespace(catalog, target_id.split(".")[0])
    try:
        catalog.create_table(
            target_id, schema=source.schema(), partition_spec=source.spec(), sort_order=source.sort_order(), properties=props
        )
    except TableAlreadyExistsError:
        pass  # another mirror step created it meanwhile
    return load(catalog, target_id)


def _source_groups(catalog: Catalog, table: str) -> dict[str, dict[str, Any]]:
    """Per group, its committed offsets and individually committed ranges on ``table``
    (members and generations are session state: consumers rejoin on failover)."""
    try:
        metadata = catalog.load_table(GROUPS_TABLE).metadata
    except NoSuchTableError:
        return {}
    return _groups_on(GroupOffsetsState.from_metadata(metadata), table)


def _groups_on(state: GroupOffsetsState, table: str) -> dict[str, dict[str, Any]]:
    groups = set(state.offsets) | set(state.ranges)
    found = {
        g: {"offsets": dict(state.offsets.get(g, {}).get(table, {})), "ranges": dict(state.ranges.get(g, {}).get(table, {}))}
        for g in groups
    }
    return {g: v for g, v in found.items() if v["offsets"] or v["ranges"]}


def _target_groups(catalog: Catalog, table: str) -> dict[str, dict[str, Any]]:
    return _source_groups(catalog, table)


@dataclass
class MirrorGroupOffsets(Request):
    """Set groups' committed offsets and ranges on the target table to the source's, verbatim
    (offsets are preserved, so they mean the same records)."""

    table: str
    groups: Mapping[str, Mapping[str, Any]]
    expected: Mapping[str, Mapping[str, Any]] | None = None  # the target's groups the step planned from
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        from dataclasses import replace

        if self.expected is not None and _groups_on(state, self.table) != self.expected:
            # A concurrent step set newer offsets meanwhile: writing this plan's would move them back.
            raise PlanOutdated(table=self.table, what="consumer-group offsets")
        offsets = {g: {t: dict(ps) for t, ps in ts.items()} for g, ts in state.offsets.items()}
        ranges = {g: {t: dict(ps) for t, ps in ts.items()} for g, ts in state.ranges.items()}
        for group, mirrored in self.groups.items():
            for kept, key in ((offsets, "offsets"), (ranges, "ranges")):
                if mirrored[key]:
                    kept.setdefault(group, {})[self.table] = dict(mirrored[key])
                else:
                    kept.get(group, {}).pop(self.table, None)
        new_state = replace(state, offsets=offsets, ranges=ranges)
        return Decision(state=new_state, result={"groups": len(self.groups)})


@dataclass
class Promote(Request):
    """Make a mirror target writable and stop mirroring into it."""

    state_type = LogState

    table: str
    commit_id: str = ""
    writes_read_only = True

    def decide(self, state: LogState, table: Table) -> Decision:
        props = table.metadata.properties
        if MIRROR not in props:
            raise InvalidInput(reason=f"{self.table} is not a mirror target")
        done = props.get(PROMOTED) == "true"
        result = {"table": self.table, "promoted": True, "source": mirror_record(table.metadata)}
        # The source's commits reached this table under the mirror's commit ids: its registry
        # cannot prove that a commit id made before now never landed (on the source). A
        # producer that fails over and re-sends one gets CommitIdForgotten, not a second copy.
        forgotten = {FORGOTTEN: str(int(time.time() * 1000))}
        return Decision(state=state, result=result, properties={READ_ONLY: "", PROMOTED: "true", **forgotten}, write=not done)

    def receipt(self, result: Any) -> Any:
        return result


def promote(catalog: Catalog, table: str) -> dict[str, Any]:
    """Promote a mirror target: it becomes an ordinary writable log table; mirroring stops.

    Producer ids of the mirrored producer state are reserved in ``catalog`` first, so a new
    producer here never takes over one of them (mirror steps reserve them too, as they land;
    this covers targets mirrored by an older icelog).

    Raises:
        InvalidInput: the table is not a mirror target.
    """
    identifier = cols.qualified(table)
    mirrored = LogState.from_metadata(load(catalog, identifier).metadata).producers
    reserve_producer_ids_below(catalog, producer_id_floor(mirrored))
    return commit(catalog, identifier, Promote(identifier)).result

"""Log-table maintenance requests: partition growth, properties, retention, snapshot expiry, compaction.

``storage.admin`` runs them (``maintain``) beside orphan cleanup.

Each state change is a :class:`storage.core.commit.Decision` run through the commit core, so it
is decided on the exact base it replaces, like every append.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.types import TimestamptzType

from icelog.storage import properties
from icelog.storage.core.commit import Decision, Request, commit, is_system_table, load
from icelog.storage.core.state import SystemState
from icelog.storage.errors import InvalidInput, NotALogTable
from icelog.storage.log import schema as cols
from icelog.storage.log.files import file_offset_range, file_partition, write_log_files
from icelog.storage.log.state import LogState

MAX_PARTITIONS = 100_000
COMPACT_MIN_FILES = 8  # a partition with fewer small files is left alone


@dataclass
class PartitionGrowth(Request):
    state_type = LogState

    table: str
    count: int
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < state.partitions:
            raise InvalidInput(reason=f"partitions can be added, never removed: {state.partitions} -> {self.count!r}")
        if self.count > MAX_PARTITIONS:
            raise InvalidInput(reason=f"at most {MAX_PARTITIONS} partitions per table, not {self.count}")
        new_state = state.with_partitions(self.count)
        return Decision(state=new_state, result={"partitions": self.count}, write=self.count != state.partitions)


@dataclass
class AlterProperties(Request):
    """Set and remove a table's knobs (``storage.properties.SETTABLE``) and plain Iceberg properties, checked by
    :func:`storage.properties.alteration` before it is built. It touches no state, so it runs
    on any table icelog commits to, its system tables included (``icelog.transaction.timeout-ms``
    lives on the journal, ``icelog.groups.max-ranges`` on the group offsets)."""

    state_type = SystemState
    writes_system = True
    table: str
    updates: Mapping[str, str]
    removals: tuple[str, ...] = ()
    commit_id: str = ""

    def properties_after(self, properties: Mapping[str, str]) -> dict[str, str]:
        """The properties this commit leaves: the commit core reads its own knobs from them."""
        return {**{k: v for k, v in properties.items() if k not in self.removals}, **self.updates}

    def decide(self, state: SystemState, table: Table) -> Decision:
        before = table.metadata.properties
        changed = {k: v for k, v in self.updates.items() if before.get(k) != v}
        removed = tuple(k for k in self.removals if k in before)
        result = {"table": self.table, "set": changed, "unset": list(removed)}
        return Decision(state=state, result=result, properties=changed, remove_properties=removed, write=bool(changed or removed))

    def receipt(self, result: Any) -> Any:
        return result  # small: after an unknown outcome, the registry answers with it


def alter_properties(
    catalog: Catalog, identifier: str, updates: Mapping[str, str], removals: Sequence[str] = ()
) -> dict[str, Any]:
    """Set ``updates`` and remove ``removals`` among a table's knobs in one commit (kafka-configs
    ``--alter --add-config`` / ``--delete-config``).

    Returns:
        ``{"table", "set": {key: value}, "unset": [key]}``: what the commit changed (a value
        already set, or a key already absent, changes nothing, and then nothing is committed).

    Raises:
        InvalidProperty: a key that is not a knob, or a value out of its bounds; nothing written.
        NotALogTable, UnknownTable: no such log table (or icelog system table).
        ReadOnlyTable: a mirror target (promote it first).
    """
    ident = cols.qualified(identifier)
    canonical = properties.alteration(updates, removals, ident)
    table = load(catalog, ident)
    if properties.FORMAT not in table.metadata.properties and not is_system_table(ident):
        raise NotALogTable(table=ident)
    request = AlterProperties(ident, canonical, tuple(dict.fromkeys(removals)))
    return commit(catalog, ident, request, loaded=table).result


def live_files(table: Table) -> list[DataFile]:
    """Data files of the table's current snapshot (from manifests, no data read)."""
    return [task.file for task in table.scan().plan_files()]


def files_by_partition(table: Table) -> dict[int, list[tuple[int, int, DataFile]]]:
    """Per partition, ``(first, next, file)`` sorted by first offset."""
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    grouped: dict[int, list[tuple[int, int, DataFile]]] = {}
    for data_file in live_files(table):
        first, nxt = file_offset_range(data_file, offset_id)
        grouped.setdefault(file_partition(data_file), []).append((first, nxt, data_file))
    for entries in grouped.values():
        entries.sort(key=lambda e: e[0])
    return grouped


@dataclass
class Retention(Request):
    """Drop whole files at the head of each partition, by age or size; move ``log_start``.

    Offsets are never reused: ``log_end`` does not move, and an emptied partition keeps
    ``log_start == log_end``. Exclusive, like compaction (its overwrite stages slower than an
    append).
    """

    state_type = LogState

    exclusive: ClassVar[bool] = True

    table: str
    retention_ms: int | None = None
    retention_bytes: int | None = None
    now_ms: int | None = None
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        now_ms = self.now_ms if self.now_ms is not None else int(time.time() * 1000)
        ts_id = table.schema().find_field(cols.TIMESTAMP).field_id
        drop: list[DataFile] = []
        starts: dict[int, int] = {}
        for p, entries in files_by_partition(table).items():
            size = sum(e[2].file_size_in_bytes for e in entries)
            kept = list(entries)
            while kept:
                first, nxt, data_file = kept[0]
                newest_ms = from_bytes(TimestamptzType(), data_file.upper_bounds[ts_id]) // 1000
                too_old = self.retention_ms is not None and newest_ms < now_ms - self.retention_ms
                too_big = self.retention_bytes is not None and size - data_file.file_size_in_bytes >= self.retention_bytes
                if not (too_old or too_big):
                    break
                drop.append(data_file)
                size -= data_file.file_size_in_bytes
                kept.pop(0)
            if len(kept) != len(entries):
                starts[p] = kept[0][0] if kept else state.end(p)
        result = {"dropped_files": len(drop), "log_start": {str(p): s for p, s in starts.items()}}
        return Decision(state=state.with_starts(starts), result=result, drop_files=tuple(drop), write=bool(drop))


@dataclass
class Compaction(Request):
    """Rewrite runs of small files of a partition into one file, keeping every offset.

    The runs are fixed at the first decision: on a lost race, each run whose source files are
    all still live is committed again with the merged files already written; files appended
    meanwhile wait for the next compaction, so a retry costs a reload and a stage, not a
    rewrite. Exclusive (``storage.core.commit`` step 7): under appends landing faster than its
    commit stages, it takes the table's lease rather than lose every race.
    """

    state_type = LogState

    exclusive: ClassVar[bool] = True
    writes_system: ClassVar[bool] = True  # it keeps every record as it is: a system table may be compacted
    table: str
    target_rows: int = 5_000_000
    commit_id: str = ""
    _runs: list[tuple[int, tuple[str, ...]]] | None = None  # (partition, source paths in offset order)
    _written: dict[tuple[str, ...], list[DataFile]] = field(default_factory=dict)

    def decide(self, state: LogState, table: Table) -> Decision:
        by_partition = files_by_partition(table)
        if self._runs is None:
            self._runs = [
                (p, tuple(e[2].file_path for e in run))
                for p, entries in by_partition.items()
                for run in _small_runs(entries, self.target_rows)
            ]
        if self._runs:
            cols.check_log_spec(self.table, table.metadata)
        live = {e[2].file_path: e[2] for entries in by_partition.values() for e in entries}
        drop: list[DataFile] = []
        add: list[DataFile] = []
        for p, paths in self._runs:
            if not all(path in live for path in paths):
                continue  # another commit dropped or rewrote a source: left to the next compaction
            if paths not in self._written:
                rows = pa.concat_tables(_read_file(table, live[path]) for path in paths)
                self._written[paths] = write_log_files(table, {p: rows})
            drop.extend(live[path] for path in paths)
            add.extend(self._written[paths])
        result = {"rewritten_files": len(drop), "new_files": len(add)}
        return Decision(state=state, result=result, drop_files=tuple(drop), add_files=tuple(add), write=bool(drop))


def _small_runs(entries: list[tuple[int, int, DataFile]], target_rows: int) -> Iterator[list]:
    """Runs of small files whose offset ranges follow each other exactly.

    A discontinuity (a gap or an overlap: a broken log) ends a run, so compaction never
    merges across it and the evidence stays where the validators can see it.
    """
    run: list = []
    rows = 0
    for entry in entries:
        n = entry[2].record_count
        broken = bool(run) and entry[0] != run[-1][1]
        if broken:
            if len(run) >= COMPACT_MIN_FILES:
                yield run
            run, rows = [], 0
        if n >= target_rows or rows + n > target_rows:
            if len(run) >= COMPACT_MIN_FILES:
                yield run
            run, rows = ([], 0) if n >= target_rows else ([entry], n)
            continue
        run.append(entry)
        rows += n
    if len(run) >= COMPACT_MIN_FILES:
        yield run


def _read_file(table: Table, data_file: DataFile) -> pa.Table:
    schema = table.schema().as_arrow()
    with table.io.new_input(data_file.file_path).open() as f:
        return pq.read_table(f).select(schema.names).cast(schema).sort_by(cols.OFFSET)


def expire_snapshots(catalog: Catalog, identifier: str, keep: int = 1, older_than_ms: int | None = None) -> int:
    """Expire all but the newest ``keep`` snapshots (and only those older than the cutoff)."""
    check_positive(keep=keep)
    request = _ExpireSnapshots(identifier, keep, older_than_ms)
    return commit(catalog, identifier, request).result


@dataclass
class _ExpireSnapshots(Request):
    state_type = LogState

    writes_system: ClassVar[bool] = True  # no record changes

    table: str
    keep: int
    older_than_ms: int | None
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        meta = table.metadata
        cutoff = self.older_than_ms if self.older_than_ms is not None else int(time.time() * 1000)
        protected = {ref.snapshot_id for ref in meta.refs.values()}
        ordered = sorted(meta.snapshots, key=lambda s: s.timestamp_ms)
        doomed = [
            s.snapshot_id
            for s in ordered[: max(0, len(ordered) - self.keep)]
            if s.snapshot_id not in protected and s.timestamp_ms < cutoff
        ]
        return Decision(state=state, result=len(doomed), expire=tuple(doomed), write=bool(doomed))


def check_positive(**values: int | None) -> None:
    """Bad input changes nothing (I8): a negative retention would drop every row."""
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidInput(reason=f"{name} must be an integer >= 1, not {value!r}")

"""Writes with explicit offsets (KIP-391's ``use_offset``), for replication (docs/guarantees.md#i6-mirrors-keep-offsets).

An :class:`OffsetWriteRequest` goes through the one commit core like every other write.
Unlike an append, it does not have offsets assigned: it brings them, per partition, as rows
that already carry their system columns or as data files already in the table's location
(byte-for-byte copies of a source's files). The decision, against the exact base of the
commit, accepts a partition's batch only if it starts exactly at that partition's log end
(else :class:`InvalidProduceOffset`, carrying the log end); a batch whose own offsets are
not consecutive is refused up front (:class:`CorruptBatch`). It also carries the source's
log start (retention), partition count, producer state and lineage, so idempotent producers
and retention behave the same on the copy.

Writing with offsets needs the ``replicator-write`` permission (``storage.replication.acls``):
:func:`write_with_offsets` checks it before committing.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit, new_commit_id
from icelog.storage.errors import (
    CorruptBatch,
    InvalidInput,
    InvalidProduceOffset,
    PlanOutdated,
    UnknownPartition,
)
from icelog.storage.log import schema as cols
from icelog.storage.log.files import file_offset_range, file_partition, write_log_files
from icelog.storage.log.maintenance import files_by_partition
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.replication.acls import REPLICATOR_WRITE, authorize


@dataclass
class OffsetWriteResult:
    """What a write with offsets did: offsets added, and each partition's log end after it."""

    table: str
    ranges: dict[int, tuple[int, int]]
    log_ends: dict[int, int]
    commit_id: str
    snapshot_id: int | None = None
    duplicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _span(table: str, partition: int, offsets: np.ndarray, partitions: np.ndarray | None) -> tuple[int, int]:
    """``(first, next)`` of one piece of a batch, or :class:`CorruptBatch`."""
    if len(offsets) == 0:
        raise CorruptBatch(table=table, partition=partition, reason="an empty piece")
    first = int(offsets[0])
    if not np.array_equal(offsets, np.arange(first, first + len(offsets), dtype=offsets.dtype)):
        bad = int(np.argmax(offsets != np.arange(first, first + len(offsets), dtype=offsets.dtype)))
        raise CorruptBatch(
            table=table,
            partition=partition,
            reason=f"offsets not consecutive: {int(offsets[bad])} follows {int(offsets[bad - 1])}",
        )
    if partitions is not None and not (partitions == partition).all():
        raise CorruptBatch(table=table, partition=partition, reason="rows of another partition")
    return first, first + len(offsets)


def batch_spans(
    table: Table, identifier: str, rows: Mapping[int, pa.Table], files: Mapping[int, Sequence[DataFile]]
) -> dict[int, tuple[int, int]]:
    """Check each partition's batch is consecutive in the order given; its ``(first, next)``.

    Rows of a partition (in order) come before its files (in order).

    Raises:
        CorruptBatch: offsets not consecutive, going backward, or of another partition.
    """
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    spans: dict[int, tuple[int, int]] = {}
    for p in sorted(set(rows) | set(files)):
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise InvalidInput(reason=f"partition must be an integer >= 0, not {p!r}")
        pieces: list[tuple[int, int]] = []
        if p in rows and rows[p].num_rows:
            batch = rows[p]
            for name in (cols.OFFSET, cols.PARTITION):
                if name not in batch.column_names:
                    raise CorruptBatch(table=identifier, partition=p, reason=f"rows lack the system column {name}")
            offsets = batch.column(cols.OFFSET).to_numpy(zero_copy_only=False)
            pieces.append(_span(identifier, p, offsets, batch.column(cols.PARTITION).to_numpy(zero_copy_only=False)))
        for data_file in files.get(p, ()):
            if file_partition(data_file) != p:
                raise CorruptBatch(
                    table=identifier, partition=p, reason=f"{data_file.file_path} holds partition {file_partition(data_file)}"
                )
            first, nxt = file_offset_range(data_file, offset_id)
            if nxt - first != data_file.record_count:
                raise CorruptBatch(
                    table=identifier,
                    partition=p,
                    reason=f"{data_file.file_path}: offsets {first}..{nxt - 1} in {data_file.record_count} rows",
                )
            pieces.append((first, nxt))
        if not pieces:
            continue
        for (_, prev_next), (first, _) in itertools.pairwise(pieces):
            if first != prev_next:
                raise CorruptBatch(
                    table=identifier, partition=p, reason=f"offsets not consecutive: {first} follows {prev_next - 1}"
                )
        spans[p] = (pieces[0][0], pieces[-1][1])
    return spans


@dataclass
class OffsetWriteRequest(Request):
    """A write that supplies its offsets (KIP-391), decided against the exact commit base.

    Attributes:
        table: The target's qualified name.
        spans: ``(first, next)`` per partition, from :func:`batch_spans`.
        rows: Rows per partition carrying every system column (written as they are).
        files: Data files per partition, already in the table's location.
        log_starts: The source's log start per partition; the target's never moves back.
            A log start beyond the log end empties the partition and moves its end there
            (as a Kafka follower truncates fully and restarts at the leader's log start).
        partitions: Grow to this many partitions first.
        producers: Replace the producer state with this (the source's, verbatim).
        properties: Further table properties, committed with the data (mirror progress).
        expect_properties: Table properties that must still hold these values when the write
            lands (the mirror progress it was planned from); otherwise :class:`PlanOutdated`.
        lineage: Extra snapshot-summary entries.
    """

    state_type = LogState

    table: str
    spans: Mapping[int, tuple[int, int]]
    rows: Mapping[int, pa.Table] = field(default_factory=dict)
    files: Mapping[int, Sequence[DataFile]] = field(default_factory=dict)
    log_starts: Mapping[int, int] = field(default_factory=dict)
    partitions: int | None = None
    producers: Mapping[str, Any] | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    lineage: Mapping[str, str] = field(default_factory=dict)
    commit_id: str = ""
    expect_properties: Mapping[str, str | None] = field(default_factory=dict)  # None: not set

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        return write_log_files(table, rows)

    def decide(self, state: LogState, table: Table) -> Decision:
        if self.rows or self.files:
            cols.check_log_spec(self.table, table.metadata)
        for key, value in self.expect_properties.items():
            if table.metadata.properties.get(key) != value:
                raise PlanOutdated(table=self.table, what=key)
        base = state
        if self.partitions is not None and self.partitions > state.partitions:
            state = state.with_partitions(self.partitions)
        for p in [*self.spans, *self.log_starts]:
            if not 0 <= p < state.partitions:
                raise UnknownPartition(table=self.table, partition=p, partitions=state.partitions)
        new_state, drop = self._follow_log_starts(state, table)
        for p, (first, _) in sorted(self.spans.items()):
            if first != new_state.end(p):
                raise InvalidProduceOffset(table=self.table, partition=p, offset=first, log_end=new_state.end(p))
        new_state = new_state.with_ends({p: nxt for p, (_, nxt) in self.spans.items()})
        if self.producers is not None:
            new_state = _replace_producers(new_state, self.producers)
        result = OffsetWriteResult(
            self.table, dict(self.spans), {p: w.end for p, w in new_state.watermarks.items()}, self.commit_id
        )
        props = table.metadata.properties
        changed = (
            bool(self.spans)
            or new_state.to_properties() != base.to_properties()
            or any(props.get(k) != v for k, v in self.properties.items())
        )
        added = tuple(f for p in sorted(self.files) for f in self.files[p])
        rows = {p: r for p, r in self.rows.items() if r.num_rows}
        return Decision(
            state=new_state,
            result=result,
            rows=rows,
            ranges=dict(self.spans),
            add_files=added,
            drop_files=drop,
            lineage=dict(self.lineage),
            properties=dict(self.properties),
            write=changed,
        )

    def _follow_log_starts(self, state: LogState, table: Table) -> tuple[LogState, tuple[DataFile, ...]]:
        """Move log starts forward (never back) and drop the files wholly below them."""
        starts = {p: s for p, s in self.log_starts.items() if s > state.watermarks[p].start}
        if not starts:
            return state, ()

        state = state.with_ends({p: s for p, s in starts.items() if s > state.end(p)}).with_starts(starts)
        drop = tuple(
            data_file
            for p, entries in files_by_partition(table).items()
            if p in starts
            for _, nxt, data_file in entries
            if nxt <= starts[p]
        )
        return state, drop

    def receipt(self, result: OffsetWriteResult) -> dict[str, Any]:
        return {
            "ranges": {str(p): list(r) for p, r in result.ranges.items()},
            "log_ends": {str(p): e for p, e in result.log_ends.items()},
        }

    def from_receipt(self, receipt: Mapping[str, Any]) -> OffsetWriteResult:
        ranges = {int(p): (r[0], r[1]) for p, r in receipt["ranges"].items()}
        ends = {int(p): int(e) for p, e in receipt["log_ends"].items()}
        return OffsetWriteResult(self.table, ranges, ends, self.commit_id, None, True)


def _replace_producers(state: LogState, producers: Mapping[str, Any]) -> LogState:
    from dataclasses import replace

    return replace(state, producers=producers)


def write_with_offsets(
    catalog: Catalog,
    identifier: str,
    rows: Mapping[int, pa.Table | list[dict]],
    *,
    principal: str | None = None,
    log_starts: Mapping[int, int] | None = None,
    commit_id: str | None = None,
) -> OffsetWriteResult:
    """Append rows that carry their own offsets (KIP-391's produce with ``use_offset``).

    Args:
        catalog: The catalog of the table.
        identifier: The table.
        rows: Per partition, rows with every system column (``log_offset`` included) and
            the payload columns, in offset order.
        principal: The caller (default: ``ICELOG_PRINCIPAL``); needs ``replicator-write``.
        log_starts: Optionally move partitions' log start forward in the same commit.
        commit_id: Idempotency key.

    Returns:
        The offsets written and every partition's log end after the write.

    Raises:
        AuthorizationFailed: the principal lacks ``replicator-write`` on the table.
        InvalidProduceOffset: a batch does not start at its partition's log end.
        CorruptBatch: a batch's offsets are not consecutive.
        UnknownPartition, SchemaMismatch: bad input. Nothing is written on any error.
    """

    log_table = LogTable.open(catalog, identifier)
    authorize(catalog, principal, REPLICATOR_WRITE, log_table.identifier)
    table = log_table.table()
    arrow_schema = table.schema().as_arrow()
    batches: dict[int, pa.Table] = {}
    for p, batch in rows.items():
        if isinstance(batch, list):
            batch = pa.Table.from_pylist(batch)
        if cols.KEY_HASH in arrow_schema.names and cols.KEY_HASH not in batch.column_names:
            batch = batch.append_column(cols.KEY_HASH, pa.nulls(batch.num_rows, pa.int32()))  # derived: the writer fills it
        missing = [n for n in arrow_schema.names if n not in batch.column_names]
        if missing:
            raise cols.SchemaMismatch(table=log_table.identifier, reason=f"missing columns {missing}")
        try:
            batches[p] = batch.select(arrow_schema.names).cast(arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise cols.SchemaMismatch(table=log_table.identifier, reason=str(e)) from e
    spans = batch_spans(table, log_table.identifier, batches, {})
    request = OffsetWriteRequest(
        log_table.identifier, spans, rows=batches, log_starts=dict(log_starts or {}), commit_id=commit_id or new_commit_id()
    )
    return commit(catalog, log_table.identifier, request, commit_id=request.commit_id, resent=commit_id is not None).result

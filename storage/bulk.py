"""Bulk loads of any size into one partition, in bounded batches; resumable with an expected offset.

The seed's bulk-load case for conditional appends (KIP-27): "even if the list is much
larger than the buffer size or the producer has to be restarted, each message will be
appended to the log just once". With a start offset K, input record i (0-based) belongs at
offset K + i, and every batch is a conditional append at the offset its first record
belongs at. The log itself is the checkpoint: a restarted load reads the partition's log
end E, checks that the record at E - 1 is its own record E - 1 - K, and continues with
record E - K. A concurrent writer moves the log end under a batch, which then fails with
``OffsetMismatch``: the load stops, it never interleaves; a restart after a foreign append
finds a record at E - 1 that is not its own and stops the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pyarrow as pa

from storage import schema as cols
from storage.errors import OffsetMismatch, UnknownPartition

Batches = Callable[[int], Iterator[pa.Table]]


def bulk_load(
    log_table: Any,
    partition: int,
    batches: Batches,
    start_offset: int | None = None,
    *,
    producer: tuple[int, int, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Append ``batches(skip)`` (the input without its first ``skip`` records) to ``partition``.

    Args:
        log_table: A :class:`storage.log.LogTable`.
        batches: Yields the input's records in order, as bounded Arrow batches, from record
            ``skip`` on; memory is bounded by the batch size.
        start_offset: K: record i lands at K + i, resumably. None: plain appends at the log
            end (a restart would append again).
        producer: ``(producer_id, epoch, first_sequence)``: idempotent batches, sequences
            counted per record.

    Returns:
        ``base_offset``, ``next_offset``, ``rows`` written now, ``batches``, ``resumed_lines``
        (records found already in the log), ``snapshot_id``, ``duplicate``.

    Raises:
        OffsetMismatch: the log does not continue this load (another writer appended).
    """
    from storage.producers import ProducerBatch

    say = progress or (lambda line: None)
    done = 0
    if start_offset is not None:
        marks = log_table.watermarks()
        if partition not in marks:
            raise UnknownPartition(table=log_table.identifier, partition=partition, partitions=len(marks))
        end = marks[partition].end
        if end < start_offset:
            raise OffsetMismatch(table=log_table.identifier, partition=partition, expected=start_offset, actual=end)
        done = end - start_offset
    stream = batches(done - 1 if done else 0)
    if done:
        first = next(stream, None)
        if first is None or first.num_rows == 0 or not _same_record(log_table, partition, start_offset + done - 1, first.slice(0, 1)):
            # The log holds a record this input does not have there: another writer's.
            raise OffsetMismatch(table=log_table.identifier, partition=partition, expected=start_offset + done - 1, actual=end)
        say(f"resuming after {done:,} records already in the log")
        stream = _chain(first.slice(1), stream)
    result: dict[str, Any] = {"base_offset": None, "next_offset": None, "rows": 0, "batches": 0, "resumed_lines": done, "snapshot_id": None, "duplicate": False}
    written = done
    for rows in stream:
        if rows.num_rows == 0 and (start_offset is not None or result["batches"]):
            continue
        expected = {partition: start_offset + written} if start_offset is not None else None
        batch = ProducerBatch(producer[0], producer[1], {partition: producer[2] + written}) if producer else None
        appended = log_table.append({partition: rows}, expected, producer=batch)
        first_offset, nxt = appended.ranges[partition]
        result["base_offset"] = first_offset if result["base_offset"] is None else result["base_offset"]
        result.update(next_offset=nxt, snapshot_id=appended.snapshot_id, duplicate=result["duplicate"] or appended.duplicate)
        result["rows"] += rows.num_rows
        result["batches"] += 1
        written += rows.num_rows
        say(f"{written:,} records, log end {nxt:,}")
    if result["base_offset"] is None:  # nothing left to write
        here = (start_offset or 0) + done
        result.update(base_offset=here, next_offset=here)
    return result


def _chain(head: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    if head.num_rows:
        yield head
    yield from rest


def _same_record(log_table: Any, partition: int, offset: int, record: pa.Table) -> bool:
    """Whether the stored record at ``offset`` has ``record``'s payload."""
    stored = log_table.read(partition, offset, offset + 1)
    if stored.num_rows != 1:
        return False
    mine = log_table.conform({partition: record})[partition]
    names = [n for n in mine.column_names if n not in cols.SYSTEM_COLUMNS]
    return stored.select(names).to_pylist() == mine.select(names).to_pylist()

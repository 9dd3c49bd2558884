"""Bulk loads of any size into one partition, in bounded batches; resumable by a load id.

The bulk-load case of Kafka's conditional-publish proposal (KIP-27): "even if the list is much
larger than the buffer size or the producer has to be restarted, each message will be
appended to the log just once". With a start offset K, input record i (0-based) belongs at
offset K + i, and every batch is a conditional append at the offset its first record
belongs at. A load that finds the log not ending at K fails with ``OffsetMismatch``
naming K: two loads that both expect K never both succeed (I2), whatever their content.

Resuming rests on identity, never on equal content (I2): a load with a *load id* gives the
batch starting at input record i the commit id ``bulk-<digest of load id, partition,
K>-<i>``, recorded by the commit core in the table's commit-id registry. A restarted load
finds its own batch that ends furthest in that registry and continues with the record
after it; finding none, it starts at K. A concurrent writer moves the log end under a
batch, which then fails with ``OffsetMismatch``: the load stops, it never interleaves.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from icelog.storage.core.registry import all_commits
from icelog.storage.errors import InvalidInput, OffsetMismatch, UnknownPartition
from icelog.storage.log.keys import split_by_key
from icelog.storage.log.schema import conform_payload, declared_key_column
from icelog.storage.log.sequences import ProducerBatch

Batches = Callable[[int], Iterator[pa.Table]]
MAX_LOAD_ID = 200


def bulk_load(
    log_table: Any,
    partition: int,
    batches: Batches,
    start_offset: int | None = None,
    *,
    load_id: str | None = None,
    producer: tuple[int, int, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Append ``batches(skip)`` (the input without its first ``skip`` records) to ``partition``.

    Args:
        log_table: A :class:`storage.log.table.LogTable`.
        batches: Yields the input's records in order, as bounded Arrow batches, from record
            ``skip`` on; memory is bounded by the batch size.
        start_offset: K: record i lands at K + i; the log must end at K (or, resuming, right
            after this load's last batch). None: plain appends at the log end.
        load_id: Names the load, so that a re-run with the same id, partition and K
            continues after the batches of it that landed (found by commit id). Needs K.
        producer: ``(producer_id, epoch, first_sequence)``: idempotent batches, sequences
            counted per record.

    Returns:
        ``base_offset``, ``next_offset``, ``rows`` written now, ``batches``, ``resumed_lines``
        (records of this load id found already committed), ``snapshot_id``, ``duplicate``.

    Raises:
        OffsetMismatch: the log does not end where this load continues (another writer
            appended): ``expected`` is K, or K plus the records already written by this load.
        InvalidInput: a load id without K, or a malformed load id.
    """
    say = progress or (lambda line: None)
    done = 0
    prefix = None  # of the batches' commit ids; None: random ones
    if start_offset is not None:
        end = _log_end(log_table, partition)
        if load_id is not None:
            prefix = _commit_id_prefix(load_id, partition, start_offset)
            done = _lines_landed(log_table, prefix, partition, start_offset)
        if not done and end != start_offset:
            raise OffsetMismatch(table=log_table.identifier, partition=partition, expected=start_offset, actual=end)
        if done:
            say(f"resuming after {done} records of load {load_id!r} already in the log")
    elif load_id is not None:
        raise InvalidInput(reason="a load id needs an expected offset: the offset of the load's first record")
    result: dict[str, Any] = {
        "base_offset": None,
        "next_offset": None,
        "rows": 0,
        "batches": 0,
        "resumed_lines": done,
        "snapshot_id": None,
        "duplicate": False,
    }
    written = done
    for rows in batches(done):
        if rows.num_rows == 0 and (start_offset is not None or result["batches"]):
            continue
        expected = {partition: start_offset + written} if start_offset is not None else None
        batch = _producer_batch(producer, partition, written)
        commit_id = f"{prefix}{written}" if prefix else None
        appended = log_table.append({partition: rows}, expected, producer=batch, commit_id=commit_id)
        first_offset, nxt = appended.ranges[partition]
        result["base_offset"] = first_offset if result["base_offset"] is None else result["base_offset"]
        result.update(next_offset=nxt, snapshot_id=appended.snapshot_id, duplicate=result["duplicate"] or appended.duplicate)
        result["rows"] += rows.num_rows
        result["batches"] += 1
        written += rows.num_rows
        say(f"{written} records, log end {nxt}")
    if result["base_offset"] is None:  # nothing left to write
        here = (start_offset or 0) + done
        result.update(base_offset=here, next_offset=here)
    return result


def keyed_load(log_table: Any, batches: Iterable[pa.Table], *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Append each batch split by key: a record goes to the partition of its key (the table's
    key column, :func:`storage.log.keys.split_by_key`, as ingest and consume-produce route),
    and each batch lands in one atomic commit across its partitions (I5).

    Returns:
        ``key_column``, ``partitions`` (per partition written, ``[first offset, next offset]``
        of this load), ``rows``, ``batches`` and the last ``snapshot_id``.

    Raises:
        InvalidInput: the table has no key column to route by.
    """
    say = progress or (lambda line: None)
    table = log_table.table()
    key = declared_key_column(table.metadata.properties)
    if key not in log_table.payload_schema(table).names:
        raise InvalidInput(reason=f"{log_table.identifier} has no key column {key!r} to route by: name a partition")
    count = len(log_table.watermarks())
    result: dict[str, Any] = {"key_column": key, "partitions": {}, "rows": 0, "batches": 0, "snapshot_id": None}
    payload = log_table.payload_schema(table)
    for rows in batches:
        if not rows.num_rows:
            continue
        # Checked before routing: a key is hashed as text, and a key of another type (a JSON
        # object, a list) has none; the rows' own check names the column (SchemaMismatch).
        rows = conform_payload(log_table.identifier, rows, payload)
        appended = log_table.append(split_by_key(rows, key, count))
        for partition, (first, nxt) in appended.ranges.items():
            result["partitions"].setdefault(partition, [first, nxt])[1] = nxt
        result.update(snapshot_id=appended.snapshot_id, rows=result["rows"] + rows.num_rows, batches=result["batches"] + 1)
        say(f"{result['rows']} records in {len(result['partitions'])} partitions")
    result["partitions"] = dict(sorted(result["partitions"].items()))
    return result


def _log_end(log_table: Any, partition: int) -> int:
    marks = log_table.watermarks()
    if partition not in marks:
        raise UnknownPartition(table=log_table.identifier, partition=partition, partitions=len(marks))
    return marks[partition].end


def _producer_batch(producer: tuple[int, int, int] | None, partition: int, written: int) -> Any:

    return ProducerBatch(producer[0], producer[1], {partition: producer[2] + written}) if producer else None


def _commit_id_prefix(load_id: str, partition: int, start_offset: int) -> str:
    """Commit ids of the load's batches, minus the first record's index.

    The load id is hashed: the user's text never meets the registry's JSON (escaping would
    hide it from ``find_commit``'s substring test), and partition and K are part of the
    identity, so the same load id elsewhere is another load.
    """
    if not isinstance(load_id, str) or not load_id.strip() or len(load_id) > MAX_LOAD_ID:
        raise InvalidInput(reason=f"a load id is non-blank text of at most {MAX_LOAD_ID} characters, not {load_id!r}")
    digest = hashlib.sha256(f"{load_id}\0{partition}\0{start_offset}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"bulk-{digest}-"


def _lines_landed(log_table: Any, prefix: str, partition: int, start_offset: int) -> int:
    """Records of the load already committed: up to the end of its furthest batch in the registry.

    Batches land in order (each one expects the previous one's end), so the furthest one
    found proves all before it. If it has left the registry (``icelog.commit-ids.keep``
    younger commits), an earlier one, or none, is found: the next batch then expects an
    offset the log has passed and fails with ``OffsetMismatch``, never writing twice.
    """
    landed = 0
    for commit_id, receipt, *_ in all_commits(log_table.table()):
        if commit_id.startswith(prefix) and receipt and str(partition) in receipt:
            landed = max(landed, receipt[str(partition)][1] - start_offset)
    return landed

"""The group job: one member of a consumer group, consume–transform–produce in Spark, exactly once.

Several runs of this job, each one *member* of a consumer group, share the partitions of one
source log table the way :class:`storage.groups.consumer.Consumer` instances do: by key-hash range
(``mode="key"``, per-key order kept) or by offset chunks (``mode="chunks"``). Each run:

1. Joins the group (or, with ``key_range``/``partitions`` given, reads them without
   membership, like ``Consumer.assign``) and learns its hash ranges per partition and the
   group's offset state (stable offset plus individually committed ranges).
2. Reads with Spark the offsets not done yet (``storage.groups.ranges.pending``: IC ranges are
   skipped) whose key hash falls in its ranges, up to the log end at job start. The hash is
   ``storage.groups.consumer.SPARK_SQL_KEY_HASH``; a source with a key-hash column also prunes row
   groups by it, but the computed hash decides.
3. Caps what it takes to a prefix in offset order: ``max_records``, and the group's open-range
   bound (``icelog.groups.max-ranges``, with the consumer's back-pressure margin).
4. Applies ``transform`` (a function DataFrame -> DataFrame, default identity), and Spark's
   executors number and write the output as the target's data files
   (``pipelines.fanout``'s writer: partition by the CRC-32 of the key, offsets from the
   target's log end).
5. Commits the target's files **and** the offsets it read, as IC ranges fenced by its
   generation, together: on an SQL catalog in **one** atomic multi-table commit
   (``storage.core.commit.commit_tables``); on a REST catalog as **one transaction** of the
   member's transactional producer (``storage.producers.transactional``: the files are sent
   with ``send_files``, the ranges with ``send_ranges_to_transaction``; the coordinator journal
   decides, then the target and the group offsets each roll forward once, by the transaction id).

Exactly once: a crash before the commit leaves nothing visible (the written files are
orphans, removed by ``maintain``), and a re-run reads the same offsets again. A rebalance
between read and commit makes the commit fail with ``StaleGeneration``: nothing lands, the
files are deleted, and the next run reads by the new assignment. Another writer appending to
the target meanwhile (e.g. another member's run) is, on an SQL catalog, an ``OffsetMismatch``:
the job re-numbers and rewrites its checkpointed output and tries again, up to ``attempts``
times. On a REST catalog the output lands at the target's log end of its roll-forward: files
numbered from an older end are rewritten at their new offsets then. A run killed after the
decision is finished by the next run of the same member (``init_transactions``), by any member
joining the group (``settle_group``), or by ``icelog transactions recover``; one killed before it
leaves its files in the transaction's folder, deleted when the transaction aborts or by
orphan cleanup.

Per-key order holds: one key's records belong to one member at a time (draining hash ranges
are not read), they are read in offset order, and the output keeps that order per target
partition, so a transform should keep rows in place (``select``, ``where``, ``withColumn``).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from icelog.pipelines.fanout import write_target
from icelog.pipelines.ingest import remove_staging
from icelog.pipelines.spark import file_io_properties, is_local, read_log
from icelog.storage.core import faults
from icelog.storage.core.catalog import open_catalog
from icelog.storage.core.commit import commit_tables, new_commit_id
from icelog.storage.core.swap import is_atomic
from icelog.storage.errors import CommitOutcomeUnknown, IcelogError, InvalidInput, OffsetMismatch
from icelog.storage.groups import membership
from icelog.storage.groups.consumer import (
    BACK_PRESSURE,
    SPARK_SQL_KEY_HASH,
    Consumer,
    parse_key_range,
)
from icelog.storage.groups.membership import HashRange
from icelog.storage.groups.offsets import (
    GROUPS_TABLE,
    GroupOffsetsState,
    group_state,
    ranges_request,
)
from icelog.storage.groups.ranges import OffsetRange, RangeState, commit_range, pending
from icelog.storage.log import schema as cols
from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.telemetry import get_logger

log = get_logger("group_job")

FULL_SPACE: list[HashRange] = [(0, membership.HASH_SPACE - 1)]


@dataclass
class GroupJobResult:
    source: str
    target: str
    group: str
    member: str | None  # None: explicit ranges, no membership
    generation: int | None
    hashes: dict[int, list[HashRange]] = field(default_factory=dict)  # hash ranges read, per source partition
    consumed: dict[int, list[OffsetRange]] = field(default_factory=dict)  # offsets committed as IC ranges
    rows: int = 0  # source records consumed
    written: dict[int, list[int]] = field(default_factory=dict)  # target partition -> [first, next)
    snapshot_id: int | None = None  # the target's, when output landed in one atomic commit (SQL)
    attempts: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Member:
    member: str | None
    generation: int | None
    hashes: dict[int, list[HashRange]]
    state: GroupOffsetsState
    consumer: Consumer | None
    producer: TransactionalProducer | None = None  # without atomic multi-table commits (REST)


def group_job(
    spark: Any,
    source: str,
    target: str,
    group: str,
    *,
    member_id: str | None = None,
    partitions: list[int] | None = None,
    key_range: HashRange | str | None = None,
    transform: Callable[[Any], Any] | None = None,
    mode: str = "key",
    key_column: str | None = None,
    output_key_column: str | None = None,
    chunk_size: int = 100,
    max_records: int | None = None,
    session_timeout_ms: int = 60_000,
    leave: bool = False,
    attempts: int = 5,
    catalog_name: str | None = None,
) -> GroupJobResult:
    """Consume this member's share of ``source``, transform it, produce to ``target``, exactly once.

    Args:
        spark: A SparkSession (``pipelines.spark.spark_session``).
        source: The source log table.
        target: The log table the output is appended to.
        group: The consumer group.
        member_id: This member's id; a stable id keeps its ranges across runs (default: random).
        partitions: Source partitions to read (default: all).
        key_range: ``(lo, hi)`` or ``"LO:HI"``: read this hash range of ``partitions`` without
            joining the group (manual commits, allowed while the group has no live member);
            ``"0:65535"`` reads whole partitions.
        transform: DataFrame -> DataFrame (default identity). Its output needs the target's
            required payload columns and ``output_key_column``; other columns are ignored.
        mode: ``"key"`` (key-hash ranges) or ``"chunks"`` (offset chunks of ``chunk_size``).
        key_column: The source payload column whose hash places a record (``mode="key"``;
            default: the source's ``icelog.key-column``, else ``key``: what its writers hash).
        output_key_column: The output column whose CRC-32 picks the target partition
            (default ``key_column``).
        chunk_size: Offsets per chunk (``mode="chunks"``).
        max_records: Consume at most this many records (in partition, then offset order).
        session_timeout_ms: The member's session; longer than a run, or the run is fenced.
        leave: Leave the group when done (its ranges move to the other members at once).
        attempts: Tries of the write and commit when another writer moved the target.
        catalog_name: pyiceberg catalog name (default: the embedded one).

    Returns:
        What was consumed (offset ranges per source partition) and written.

    Raises:
        InvalidInput / SchemaMismatch: bad arguments or transform output; nothing written.
        StaleGeneration: a rebalance happened before the commit; nothing written.
        OffsetMismatch: the target kept moving for ``attempts`` tries; nothing written.
        InvalidRange: another run of this member committed these offsets first; nothing written.
        TransactionAborted: (a REST catalog) the transaction timed out or was aborted; nothing written.
    """
    started = time.perf_counter()
    _check_arguments(mode, chunk_size, max_records, attempts, transform)
    catalog = open_catalog(catalog_name)
    src, tgt = check_catalog(catalog, source, target)
    key_column = key_column or cols.declared_key_column(src.table().metadata.properties)
    if mode == "key" and key_column not in src.payload_schema().names:
        raise InvalidInput(reason=f"{src.identifier} has no payload column {key_column!r}")
    marks = src.watermarks()  # the log end at job start bounds the read
    chosen = sorted(marks) if partitions is None else sorted(set(partitions))
    if not set(chosen) <= set(marks):
        raise InvalidInput(reason=f"partitions {chosen} are not all in 0..{len(marks) - 1}")
    me = _join(catalog, src.identifier, group, chosen, key_range, member_id, mode, key_column, chunk_size, session_timeout_ms)
    result = GroupJobResult(src.identifier, tgt.identifier, group, me.member, me.generation, hashes=me.hashes)
    bound = log.bind(source=src.identifier, target=tgt.identifier, group=group, member=me.member, generation=me.generation)
    try:
        hash_of = _hash_expression(mode, key_column, chunk_size)
        frames = _read(spark, src, group, me, marks, hash_of, _prune_column(src, mode, key_column), max_records)
        if frames:
            result.consumed = {p: ranges for p, (_, ranges) in frames.items()}
            result.rows = sum(last - first + 1 for ranges in result.consumed.values() for first, last in ranges)
            _produce(catalog, src, tgt, group, me, frames, transform, output_key_column or key_column, attempts, result)
    finally:
        if leave and me.consumer is not None:
            me.consumer.close()  # its producer's too
        elif me.producer is not None:
            with contextlib.suppress(IcelogError):  # else the next run, or recover, records it
                me.producer.close()  # the last transaction's COMMITTED record
    result.seconds = time.perf_counter() - started
    bound.info("group job done", rows=result.rows, consumed=result.consumed, written=result.written)
    return result


def check_catalog(catalog: Any, source: str, target: str) -> tuple[LogTable, LogTable]:
    """What a group job needs of its catalog, checked before it joins the group or starts Spark:
    both log tables. Any catalog lands the output and the offsets together (I5): an SQL one in
    one atomic commit, a REST one in one transaction of the member's producer."""
    return LogTable.open(catalog, source), LogTable.open(catalog, target)


def _check_arguments(mode: str, chunk_size: int, max_records: int | None, attempts: int, transform: Any) -> None:
    if mode not in ("key", "chunks"):
        raise InvalidInput(reason=f"mode is 'key' or 'chunks', not {mode!r}")
    for name, value in (("chunk_size", chunk_size), ("attempts", attempts), ("max_records", max_records)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidInput(reason=f"{name} is an integer >= 1, not {value!r}")
    if transform is not None and not callable(transform):
        raise InvalidInput(reason="transform is a function DataFrame -> DataFrame")


def _join(
    catalog: Any,
    source: str,
    group: str,
    partitions: list[int],
    key_range: HashRange | str | None,
    member_id: str | None,
    mode: str,
    key_column: str,
    chunk_size: int,
    session_timeout_ms: int,
) -> _Member:
    """Join the group (or take the explicit key range) and read the group's state after it.

    Without atomic multi-table commits the member's transactional producer starts first: it
    fences an earlier run of the same member and finishes its transaction (a decided one rolls
    forward, an undecided one aborts), so the state read next holds what that run committed."""
    atomic = is_atomic(catalog)
    if key_range is not None:
        lo, hi = parse_key_range(key_range if isinstance(key_range, str) else f"{key_range[0]}:{key_range[1]}")
        producer = None if atomic else _range_producer(catalog, source, group, partitions, (lo, hi), session_timeout_ms)
        return _Member(None, None, {p: [(lo, hi)] for p in partitions}, group_state(catalog), None, producer)
    consumer = Consumer(
        catalog,
        group,
        session_timeout_ms=session_timeout_ms,
        mode=mode,
        chunk_size=chunk_size,
        key_column=key_column,
        **({"member_id": member_id} if member_id else {}),
    )
    producer = None if atomic else consumer.transactional_producer()
    consumer.subscribe(source, partitions)
    state = group_state(catalog)
    record = state.members.get(group) or membership.empty_group()
    hashes = {p: membership.fetchable_hashes(record, consumer.member_id, source, p) for p in partitions}
    return _Member(consumer.member_id, consumer.generation, hashes, state, consumer, producer)


def _range_producer(
    catalog: Any, source: str, group: str, partitions: list[int], hashes: HashRange, session_timeout_ms: int
) -> TransactionalProducer:
    """The transactional producer of runs reading ``hashes`` of ``partitions`` without membership:
    one id per group, source, partitions and range, so a re-run finishes what a killed one left."""
    tid = f"icelog-group-job/{group}/{source}/{','.join(map(str, partitions))}/{hashes[0]}:{hashes[1]}"
    if len(tid) > 256:
        tid = f"icelog-group-job/{hashlib.sha256(tid.encode()).hexdigest()}"
    producer = TransactionalProducer(catalog, tid, timeout_ms=max(session_timeout_ms, 30_000))
    producer.init_transactions()
    return producer


# --- read: this member's pending offsets --------------------------------------------------


def _hash_expression(mode: str, key_column: str, chunk_size: int) -> Any:
    """Where a record falls in ``0..65535``, in Spark SQL (``storage.groups.consumer``'s definitions)."""
    from pyspark.sql import functions as F

    if mode == "key":
        return F.expr(SPARK_SQL_KEY_HASH.format(key=f"cast(`{key_column}` as string)")).cast("int")
    # storage.groups.membership.chunk_slot: the 16-bit reversal of the chunk number mod 65536.
    chunk = f"pmod({cols.OFFSET} div {chunk_size}, {membership.HASH_SPACE})"
    return F.expr(f"conv(reverse(lpad(conv({chunk}, 10, 2), 16, '0')), 2, 10)").cast("int")


def _prune_column(src: LogTable, mode: str, key_column: str) -> str | None:
    """The source's stored key-hash column, when it hashes ``key_column`` (row-group pruning)."""
    iceberg = src.table()
    stored = cols.key_column(iceberg.schema(), iceberg.metadata.properties)
    return cols.KEY_HASH if mode == "key" and stored == key_column else None


def _within(column: Any, ranges: list[HashRange]) -> Any:
    from functools import reduce

    return reduce(lambda a, b: a | b, [column.between(lo, hi) for lo, hi in ranges])


def _read(
    spark: Any,
    src: LogTable,
    group: str,
    me: _Member,
    marks: Mapping[int, Any],
    hash_of: Any,
    prune: str | None,
    max_records: int | None,
) -> dict[int, tuple[Any, list[OffsetRange]]]:
    """Per source partition: this member's pending records to consume, and their offsets as ranges."""
    from pyspark.sql import functions as F

    budget = max_records
    frames: dict[int, tuple[Any, list[OffsetRange]]] = {}
    for p, hashes in sorted(me.hashes.items()):
        rs = me.state.range_state(group, src.identifier, p, marks[p].start)
        gaps = pending(rs, rs.committed, marks[p].end - 1)
        if not hashes or not gaps or budget == 0:
            continue
        df = read_log(spark, src, p, gaps[0][0], gaps[-1][1] + 1).where(_within(F.col(cols.OFFSET), gaps))
        if prune is not None:  # files written before the column existed hold nulls
            df = df.where(F.col(prune).isNull() | _within(F.col(prune), hashes))
        if hashes != FULL_SPACE:
            df = df.where(_within(hash_of, hashes))
        ranges = take(rs, _runs(df, 2 * me.state.max_ranges + 2), budget, me.state.max_ranges)
        if not ranges:
            continue
        if budget is not None:
            budget -= sum(last - first + 1 for first, last in ranges)
        frames[p] = (df.where(F.col(cols.OFFSET) <= ranges[-1][1]), ranges)
    return frames


def _runs(df: Any, limit: int) -> list[OffsetRange]:
    """The first ``limit`` maximal runs of consecutive offsets in ``df`` (only the runs reach the driver)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(cols.PARTITION).orderBy(cols.OFFSET)
    runs = (
        df.select(cols.PARTITION, cols.OFFSET)
        .withColumn("_run", F.col(cols.OFFSET) - F.row_number().over(order))  # constant along a run
        .groupBy("_run")
        .agg(F.min(cols.OFFSET).alias("first"), F.max(cols.OFFSET).alias("last"))
        .orderBy("first")
        .limit(limit)
        .collect()
    )
    return [(r["first"], r["last"]) for r in runs]


def take(state: RangeState, runs: list[OffsetRange], max_records: int | None, max_ranges: int) -> list[OffsetRange]:
    """The prefix (in offset order) of ``runs`` to consume and commit as IC ranges.

    At most ``max_records`` offsets; and, like ``Consumer.poll``'s back-pressure, no run that
    would grow the partition's open ranges past ``BACK_PRESSURE * max_ranges`` (runs that
    close or extend a gap always go), so the commit never passes ``icelog.groups.max-ranges``.

    Args:
        state: The partition's stable offset and IC ranges; ``runs`` are pending offsets of it.
        runs: Sorted, disjoint, non-adjacent ``(first, last)`` runs of pending offsets.
        max_records: Offsets budget (None: no cap).
        max_ranges: The group table's ``icelog.groups.max-ranges``.
    """
    limit = int(max_ranges * BACK_PRESSURE)
    taken: list[OffsetRange] = []
    for first, last in runs:
        if max_records is not None:
            budget = max_records - sum(b - a + 1 for a, b in taken)
            if budget <= 0:
                break
            last = min(last, first + budget - 1)
        after = commit_range(state, first, last)
        if len(after.ranges) > max(limit, len(state.ranges)):
            break
        state = after
        taken.append((first, last))
    return taken


# --- transform, write, commit ---------------------------------------------------------------


def _produce(
    catalog: Any,
    src: LogTable,
    tgt: LogTable,
    group: str,
    me: _Member,
    frames: Mapping[int, tuple[Any, list[OffsetRange]]],
    transform: Callable[[Any], Any] | None,
    out_key: str,
    attempts: int,
    result: GroupJobResult,
) -> None:
    """Transform, write and commit with the consumed ranges; a moved target is rewritten and retried
    (an SQL catalog), or renumbered at its roll-forward (a REST catalog's transaction)."""
    out = _transformed([df for _, (df, _) in sorted(frames.items())], transform, tgt, out_key)
    consumed = {(src.identifier, p): ranges for p, (_, ranges) in frames.items()}
    if me.producer is not None:
        result.attempts = 1
        result.written = _write_in_transaction(me.producer, tgt, group, me, out, out_key, consumed)
        return
    for attempt in range(1, attempts + 1):
        result.attempts = attempt
        try:
            outcomes = _write_and_commit(catalog, tgt, group, me, out, out_key, consumed)
        except OffsetMismatch as e:
            if attempt == attempts:
                raise
            log.info("target moved; writing again", target=tgt.identifier, attempt=attempt, error=str(e))
            continue
        if len(outcomes) == 2:  # output landed with the offsets
            result.written = {int(p): list(r) for p, r in outcomes[0].result.ranges.items()}
            result.snapshot_id = outcomes[0].snapshot_id
        return


def _transformed(frames: list[Any], transform: Callable[[Any], Any] | None, tgt: LogTable, out_key: str) -> Any:
    """The output rows, checkpointed so the counting and the writing pass see one plan."""
    from pyspark.sql import DataFrame

    df = frames[0]
    for frame in frames[1:]:
        df = df.unionByName(frame)
    # Read order (partition, offset): the output keeps each key's order, and a rewrite the same rows.
    df = df.orderBy(cols.PARTITION, cols.OFFSET)
    out = df if transform is None else transform(df)
    if not isinstance(out, DataFrame):
        raise InvalidInput(reason=f"the transform returned {type(out).__name__}, not a Spark DataFrame")
    payload = tgt.payload_schema()
    missing = [f.name for f in payload if not f.nullable and f.name not in out.columns]
    if out_key not in out.columns:
        missing.append(out_key)
    if missing:
        raise cols.SchemaMismatch(
            table=tgt.identifier, reason=f"the transform's output lacks columns {missing}; it has {out.columns}"
        )
    return out.localCheckpoint(eager=True)


def _write_in_transaction(
    producer: TransactionalProducer,
    tgt: LogTable,
    group: str,
    me: _Member,
    out: Any,
    out_key: str,
    consumed: Mapping[tuple[str, int], list[OffsetRange]],
) -> dict[int, list[int]]:
    """Executors write the output into the transaction's folder of the target (the table's
    warehouse); the files and the consumed ranges, fenced by the member's generation, commit as
    one transaction. Returns the target's offsets ``{partition: [first, next)}``."""
    producer.begin_transaction()
    staging = producer.data_dir(tgt.identifier)
    sent = False
    try:
        files, expected = write_target(out, tgt, out_key, staging)
        faults.checkpoint(faults.AFTER_INGEST_WRITE)
        if files:
            producer.send_files(tgt.identifier, files, expected)
        sent = True  # the producer knows the folder now: an abort deletes it (its own, or the journal's)
        producer.send_ranges_to_transaction(consumed, group, member=me.member, generation=me.generation)
        committed = producer.commit_transaction()
    except BaseException:
        with contextlib.suppress(Exception):  # a decided one is refused: it rolls forward
            producer.abort_transaction()
        if not sent:
            local = is_local(staging)
            remove_staging(
                staging.removeprefix("file://") if local else staging,
                None if local else file_io_properties(tgt.table().io.properties),
            )
        raise
    return {int(p): list(r) for p, r in committed.get(tgt.identifier, {}).items()}


def _write_and_commit(
    catalog: Any,
    tgt: LogTable,
    group: str,
    me: _Member,
    out: Any,
    out_key: str,
    consumed: Mapping[tuple[str, int], list[OffsetRange]],
) -> list[Any]:
    """Executors write the output; one atomic commit lands it with the consumed ranges, or nothing."""
    commit_id = new_commit_id()  # sent once, by the one commit below: a first send
    staging = f"{tgt.table().metadata.location.removeprefix('file://')}/data/_group-job-{commit_id}"
    try:
        files, expected = write_target(out, tgt, out_key, staging)
        faults.checkpoint(faults.AFTER_INGEST_WRITE)
        parts = [(tgt.identifier, tgt.files_request(files, expected, commit_id=commit_id))] if files else []
        parts.append((GROUPS_TABLE, ranges_request(catalog, group, consumed, member=me.member, generation=me.generation)))
        return commit_tables(catalog, parts, commit_id=commit_id, resent=False)
    except CommitOutcomeUnknown:
        raise  # the files may have landed: keep them (a re-run finds the commit id or orphans them)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)  # nothing committed: the files are garbage
        raise

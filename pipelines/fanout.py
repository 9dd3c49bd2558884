"""The transactional fan-out job: one source log table -> several tables, exactly once.

A consume–transform–produce copier in Spark. Each run:

1. ``init_transactions`` for its transactional id: fences any older instance and finishes
   what a crashed run left (a prepared transaction rolls forward, an ongoing one aborts).
2. Reads the source from the group's committed offsets up to the log end at job start.
3. Routes each row to a target table by the value of ``route_column`` (``routes``: value ->
   table; other values are skipped), and within it to a partition by the CRC-32 of the key.
4. Spark's executors number and write the rows as data files of the targets (offsets from
   the targets' log ends at job start; no shuffle, nothing through the driver).
5. Commits every target's files and the group's new source position in **one** transaction.

A re-run after a crash therefore writes each source record exactly once: either the last
transaction committed (and the group's offsets moved past its records), or it did not (and
it is aborted; the records are read again). Another writer appending to a target meanwhile
aborts the transaction with ``OffsetMismatch`` (an AbortableError) on an SQL catalog: run the job
again. On a REST catalog the journal decides and each target takes its files at its log end when
it rolls forward (renumbered if another writer moved it).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from pyiceberg.catalog import Catalog

from icelog.pipelines.ingest import _spark_type, slice_bases, write_slices
from icelog.pipelines.spark import file_io_properties, is_local, read_log
from icelog.storage.core import faults
from icelog.storage.core.catalog import open_catalog
from icelog.storage.errors import InvalidInput
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log import schema as cols
from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.telemetry import get_logger

log = get_logger("fanout")


@dataclass
class FanoutResult:
    source: str
    group: str
    read: dict[int, tuple[int, int]] = field(default_factory=dict)
    written: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    rows: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_ranges(log_table: LogTable, committed: Mapping[int, int], limit: int | None = None) -> dict[int, tuple[int, int]]:
    """Per source partition, ``[from, to)``: the group's position (or the log start) to the log end."""
    ranges = {}
    for p, mark in log_table.watermarks().items():
        start = max(committed.get(p, 0), mark.start)  # retention may have passed the position
        end = mark.end if limit is None else min(mark.end, start + limit)
        if end > start:
            ranges[p] = (start, end)
    return ranges


def fanout(
    spark: Any,
    source: str,
    group: str,
    routes: Mapping[str, str],
    *,
    route_column: str = "key",
    key_column: str = "key",
    transactional_id: str | None = None,
    catalog_name: str | Catalog | None = None,
    max_records_per_partition: int | None = None,
) -> FanoutResult:
    """Copy new source records to the routed tables and move the group, in one transaction.

    Args:
        spark: A SparkSession (``pipelines.spark.spark_session``).
        source: The source log table.
        group: The consumer group whose committed offsets mark the source position.
        routes: ``{route value: target table}``; rows with other values are not copied.
        route_column: The source payload column whose value picks the target.
        key_column: The column whose CRC-32 picks the target partition (``storage.log.keys``).
        transactional_id: Stable identity of this copier (default ``fanout:<source>:<group>``).
        catalog_name: pyiceberg catalog name, or a catalog already open (default: the embedded one).
        max_records_per_partition: Read at most this many records per source partition.

    Raises:
        InvalidInput: bad routes or columns; nothing written.
        OffsetMismatch: a target moved since the job started; the transaction is aborted.
        ProducerFenced: a newer instance of this copier took over.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    if not routes:
        raise InvalidInput(reason="fan-out needs at least one route: {value: table}")
    catalog = open_catalog(catalog_name)
    src = LogTable.open(catalog, source)
    targets = {value: LogTable.open(catalog, table) for value, table in routes.items()}
    for column in {route_column, key_column}:
        if column not in src.payload_schema().names:
            raise InvalidInput(reason=f"{src.identifier} has no payload column {column!r}")
    producer = TransactionalProducer(catalog, transactional_id or f"fanout:{src.identifier}:{group}")
    producer.init_transactions()  # recovery of a crashed run happens here
    ranges = source_ranges(src, committed_offsets(catalog, group, src.identifier), max_records_per_partition)
    result = FanoutResult(src.identifier, group, ranges)
    if not ranges:
        result.seconds = time.perf_counter() - started
        return result

    frames = [read_log(spark, src, p, a, b) for p, (a, b) in sorted(ranges.items())]
    df = frames[0]
    for frame in frames[1:]:
        df = df.unionByName(frame)
    # Read order: source partition, then offset, so per-key order is kept and the same source
    # gives the same offsets. Checkpointed: the counting and the writing pass see one plan.
    df = df.orderBy(cols.PARTITION, cols.OFFSET).localCheckpoint(eager=True)
    with producer.transaction():
        for value, target in sorted(targets.items()):
            routed = df.where(F.col(route_column) == F.lit(value))
            files, expected = write_target(routed, target, key_column, producer.data_dir(target.identifier))
            if files:
                result.rows += producer.send_files(target.identifier, files, expected)
        producer.send_offsets_to_transaction({(src.identifier, p): b for p, (_, b) in ranges.items()}, group)
        faults.checkpoint(faults.AFTER_TXN_STAGE)
    result.written = producer.last_commit
    result.seconds = time.perf_counter() - started
    log.info("fanned out", source=src.identifier, group=group, rows=result.rows, written=result.written)
    return result


def write_target(df: Any, target: LogTable, key_column: str, directory: str) -> tuple[dict[int, list[str]], dict[int, int]]:
    """Executors number and write ``df``'s rows as ``target``'s data files (see ``pipelines.ingest``)
    in ``directory``: a local folder, or an object store's URI (a REST catalog's warehouse), which
    executors write to through pyarrow with the table's FileIO settings."""
    from pyspark.sql import functions as F

    iceberg = target.table()
    state = target.state()
    ends = {p: w.end for p, w in state.watermarks.items()}
    payload = cols.payload_arrow_schema(iceberg.schema())
    part = F.pmod(F.crc32(F.coalesce(F.col(key_column).cast("string"), F.lit("")).cast("binary")), F.lit(state.partitions)).cast(
        "int"
    )
    columns = [
        (F.col(f.name).cast(_spark_type(f.type)) if f.name in df.columns else F.lit(None).cast(_spark_type(f.type))).alias(f.name)
        for f in payload
    ]
    routed = df.select(part.alias(cols.PARTITION), *columns)
    counts = routed.groupBy(F.spark_partition_id().alias("_task"), cols.PARTITION).count().collect()
    if not counts:
        return {}, {}
    bases = slice_bases([(r["_task"], r[cols.PARTITION], r["count"]) for r in counts], ends)
    local = is_local(directory)
    written = write_slices(
        routed,
        bases,
        ends,
        iceberg.schema(),
        directory.removeprefix("file://") if local else directory,
        key_column=cols.key_column(iceberg.schema(), iceberg.properties),
        io_properties=None if local else file_io_properties(iceberg.io.properties),  # executors write to the store
    )
    return written, {p: ends[p] for p in written}

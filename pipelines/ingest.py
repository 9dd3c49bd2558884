"""The ingest job: landing files -> a log table, exactly once per run key.

Spark's executors read the source, route rows to log partitions, number them from the
watermarks read at job start, and write Parquet data files (one log partition and one
contiguous offset range per file). The driver then commits those files in one conditional,
idempotent commit through ``storage``: rows never funnel through the driver.

Idempotence: the producer's client id is derived from the run key (for example
``ingest:2013-01-05``), and each partition's batch starts at sequence 0. Re-running a run
(or a backfill of the same interval) re-sends the same batches, which the commit
recognises as duplicates: nothing is written twice (I4). The dedupe window is the
producer expiry (``icelog.producer.expiry-ms``, 7 days by default).
"""

from __future__ import annotations

import glob
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

from storage import schema as cols
from storage.catalog import open_catalog
from storage.errors import InvalidInput, OffsetMismatch
from storage.log import LogTable
from storage.producers import ProducerBatch, ProducerIdentity, init_producer

log = structlog.get_logger("icelog.ingest")
KEY_COLUMN = "icelog.key-column"
FORMATS = {"parquet": "parquet", "csv": "csv", "json": "json", "jsonl": "json"}


@dataclass
class IngestResult:
    table: str
    run_key: str
    rows: int
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    duplicate: bool = False
    snapshot_id: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def producer_for_run(catalog: Any, table: str, run_key: str) -> ProducerIdentity:
    """The producer of a run: reused as is when the run key already has one (no epoch bump,
    so a re-run's batches are recognised as duplicates), created otherwise."""
    client_id = f"ingest:{run_key}"
    for pid, entry in LogTable.open(catalog, table).state().producers.items():
        if entry["client"] == client_id:
            return ProducerIdentity(int(pid), entry["epoch"], client_id)
    return init_producer(catalog, table, client_id)


def source_files(source: str) -> list[str]:
    """Files of a landing path: a file, a folder (recursively), or a glob."""
    if os.path.isdir(source):
        found = [p for p in glob.glob(os.path.join(source, "**", "*"), recursive=True) if os.path.isfile(p) and not os.path.basename(p).startswith(("_", "."))]
    else:
        found = [p for p in glob.glob(source) if os.path.isfile(p)]
    return sorted(found)


def ingest(
    spark: Any,
    table: str,
    source: str,
    run_key: str,
    *,
    fmt: str = "parquet",
    key_column: str | None = None,
    partition_column: str | None = None,
    catalog_name: str | None = None,
    only_partitions: list[int] | None = None,
) -> IngestResult:
    """Ingest the files under ``source`` into ``table`` exactly once for ``run_key``.

    Args:
        spark: A SparkSession (``pipelines.spark.spark_session``).
        table: The log table.
        source: Landing file, folder or glob.
        run_key: Idempotency key of this run (the same interval must use the same key).
        fmt: ``parquet``, ``csv`` (with header) or ``json``/``jsonl`` (JSON Lines).
        key_column: Route rows by CRC-32 of this column (``storage.keys``); default: the
            table property ``icelog.key-column``, else ``key``.
        partition_column: Or take the log partition from this integer column.
        catalog_name: pyiceberg catalog name (default: the embedded one).
        only_partitions: Load only rows routed to these log partitions.

    Raises:
        InvalidInput / SchemaMismatch: bad format, columns or partition values (nothing written).
        OffsetMismatch: another writer appended since the job started; re-run the job.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    if fmt not in FORMATS:
        raise InvalidInput(reason=f"unknown source format {fmt!r}; one of {sorted(FORMATS)}")
    if key_column is not None and partition_column is not None:
        raise InvalidInput(reason="route rows by key_column or by partition_column, not both")
    catalog = open_catalog(catalog_name)
    log_table = LogTable.open(catalog, table)
    if partition_column is None:
        key_column = key_column or log_table.table().metadata.properties.get(KEY_COLUMN, "key")
    bound = log.bind(table=log_table.identifier, run_key=run_key)
    files = source_files(source)
    if not files:
        bound.info("no landing files", source=source)
        return IngestResult(log_table.identifier, run_key, 0, seconds=time.perf_counter() - started)

    iceberg = log_table.table()
    state = log_table.state()
    ends = {p: w.end for p, w in state.watermarks.items()}
    payload = cols.payload_arrow_schema(iceberg.schema())
    reader = spark.read.format(FORMATS[fmt])
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    df = reader.load(files)
    route = key_column or partition_column
    unknown = [c for c in (route,) if c not in df.columns]
    missing_required = [f.name for f in payload if not f.nullable and f.name not in df.columns]
    if unknown or missing_required:
        raise cols.SchemaMismatch(table=log_table.identifier, reason=f"source lacks columns {unknown + missing_required}; it has {df.columns}")

    partitions = state.partitions
    if only_partitions is not None and not set(only_partitions) <= set(range(partitions)):
        raise InvalidInput(reason=f"partitions {sorted(only_partitions)} are not all in 0..{partitions - 1}")
    if key_column:
        part = F.pmod(F.crc32(F.coalesce(F.col(key_column).cast("string"), F.lit("")).cast("binary")), F.lit(partitions)).cast("int")
    else:
        part = F.col(partition_column).cast("int")
    df = df.withColumn(cols.PARTITION, part)
    if partition_column:  # a key hash is always in range; a user's column may not be
        bad = df.where(F.col(cols.PARTITION).isNull() | (F.col(cols.PARTITION) < 0) | (F.col(cols.PARTITION) >= partitions)).limit(1).collect()
        if bad:
            raise InvalidInput(reason=f"row routed to partition {bad[0][cols.PARTITION]!r}, outside 0..{partitions - 1}")

    identity = producer_for_run(catalog, log_table.identifier, run_key)
    # Partitions this run already wrote (an earlier, partial backfill): recorded per partition
    # in the producer's state; re-sending them alongside new ones would be a half-duplicate.
    done = {int(p): tuple(s["batches"][0][2:]) for p, s in state.producers.get(str(identity.producer_id), {}).get("partitions", {}).items() if s["batches"]}
    wanted = set(range(partitions) if only_partitions is None else only_partitions) - set(done)
    if not wanted:
        bound.info("run already ingested", partitions=sorted(done))
        return IngestResult(log_table.identifier, run_key, 0, done, True, state.snapshot_id, time.perf_counter() - started)
    df = df.where(F.col(cols.PARTITION).isin(sorted(wanted)))
    payload_columns = []
    for f in payload:
        spark_type = _spark_type(f.type)
        payload_columns.append((F.col(f.name).cast(spark_type) if f.name in df.columns else F.lit(None).cast(spark_type)).alias(f.name))
    routed = df.select(F.col(cols.PARTITION).cast("int").alias(cols.PARTITION), *payload_columns, F.col("_metadata.file_path").alias("_file"), F.col("_metadata.file_block_start").alias("_block"))

    # Pass 1: rows per (input task, log partition). Pass 2 numbers each task's rows from the
    # base offset its slice starts at, so no shuffle is needed; every task writes one file per
    # log partition holding a contiguous offset range. commit_files re-checks that the files
    # tile each partition exactly, so a split planned differently in the two passes fails
    # loudly instead of committing a gap.
    counts = routed.groupBy(F.spark_partition_id().alias("_task"), cols.PARTITION).agg(F.count("*").alias("n"), F.min(F.struct("_file", "_block")).alias("_start")).collect()
    bases = slice_bases([(r["_task"], r[cols.PARTITION], r["n"], (r["_start"]["_file"], r["_start"]["_block"])) for r in counts], ends)
    now_us = int(time.time() * 1_000_000)
    routed = routed.drop("_file", "_block")
    numbered = routed.mapInArrow(
        _numberer(bases, ends, identity.producer_id, identity.epoch, now_us),
        _numbered_schema(routed.schema),
    )
    staging = f"{iceberg.metadata.location.removeprefix('file://')}/data/_ingest-{uuid.uuid4().hex}"
    (
        numbered.withColumn("_p", F.col(cols.PARTITION))
        .sortWithinPartitions("_p", cols.OFFSET)  # the partitioned writer sorts by _p anyway; keep offsets in order
        .write.partitionBy("_p")
        .parquet(staging)
    )
    written: dict[int, list[str]] = {}
    for path in glob.glob(os.path.join(staging, "_p=*", "*.parquet")):
        written.setdefault(int(path.split("_p=")[1].split("/")[0]), []).append(path)
    rows = 0
    try:
        counts = {p: sum(_rows(f) for f in fs) for p, fs in written.items()}
        rows = sum(counts.values())
        result = log_table.commit_files(
            written,
            {p: ends[p] for p in written},
            producer=ProducerBatch(identity.producer_id, identity.epoch, {p: 0 for p in written}),
        )
    except OffsetMismatch:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if result.duplicate:
        shutil.rmtree(staging, ignore_errors=True)  # never committed: this run had landed before
    bound.info("ingested", rows=rows, duplicate=result.duplicate, snapshot_id=result.snapshot_id)
    return IngestResult(log_table.identifier, run_key, rows, dict(result.ranges), result.duplicate, result.snapshot_id, time.perf_counter() - started)


def slice_bases(counts: list[tuple[int, int, int, tuple[str, int]]], ends: dict[int, int]) -> dict[tuple[int, int], int]:
    """First offset of each (task, partition) slice.

    Slices follow each other in source order: tasks ordered by the (file, block) they read
    (Spark schedules splits by size, not by name; ``pipelines.spark`` keeps one file per
    split), rows in the order each task reads them.

    Args:
        counts: ``(task, partition, rows, (file, block start))`` from pass 1.
        ends: Log end offset per partition at job start.
    """
    first_file: dict[int, tuple[str, int]] = {}
    for task, _, _, start in counts:
        first_file[task] = min(first_file.get(task, start), start)
    bases: dict[tuple[int, int], int] = {}
    cursor = dict(ends)
    for task, partition, n, _ in sorted(counts, key=lambda c: (first_file[c[0]], c[0])):
        bases[(task, partition)] = cursor[partition]
        cursor[partition] += n
    return bases


def _numbered_schema(routed: Any) -> Any:
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType, TimestampType

    system = [
        StructField(cols.PARTITION, IntegerType(), nullable=False),
        StructField(cols.OFFSET, LongType(), nullable=False),
        StructField(cols.TIMESTAMP, TimestampType(), nullable=False),
        StructField(cols.PRODUCER_ID, LongType(), nullable=False),
        StructField(cols.PRODUCER_EPOCH, IntegerType(), nullable=False),
        StructField(cols.PRODUCER_SEQ, IntegerType(), nullable=False),
    ]
    return StructType(system + [f for f in routed.fields if f.name != cols.PARTITION])


def _numberer(bases: dict[tuple[int, int], int], ends: dict[int, int], producer_id: int, epoch: int, now_us: int):
    """The executor side of pass 2: Arrow batches in, system columns numbered, out."""

    def number(batches):
        import numpy as np
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        cursor: dict[int, int] = {}
        for batch in batches:
            parts = batch.column(cols.PARTITION).to_numpy(zero_copy_only=False).astype(np.int32)
            offsets = np.empty(len(parts), dtype=np.int64)
            seqs = np.empty(len(parts), dtype=np.int32)
            for p in np.unique(parts):
                mask = parts == p
                first = cursor.get(int(p), bases[(task, int(p))])
                n = int(mask.sum())
                offsets[mask] = np.arange(first, first + n, dtype=np.int64)
                seqs[mask] = np.arange(first - ends[int(p)], first - ends[int(p)] + n, dtype=np.int32)
                cursor[int(p)] = first + n
            n = len(parts)
            system = [
                pa.array(parts, pa.int32()),
                pa.array(offsets),
                pa.array(np.full(n, now_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pa.array(np.full(n, producer_id, dtype=np.int64)),
                pa.array(np.full(n, epoch, dtype=np.int32)),
                pa.array(seqs),
            ]
            names = [cols.PARTITION, cols.OFFSET, cols.TIMESTAMP, cols.PRODUCER_ID, cols.PRODUCER_EPOCH, cols.PRODUCER_SEQ]
            payload = [c for c in batch.schema.names if c != cols.PARTITION]
            yield pa.RecordBatch.from_arrays(system + [batch.column(c) for c in payload], names + payload)

    return number


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _spark_type(arrow_type: Any) -> str:
    import pyarrow as pa

    t = pa.types
    if t.is_large_string(arrow_type) or t.is_string(arrow_type):
        return "string"
    if t.is_timestamp(arrow_type):
        return "timestamp" if arrow_type.tz else "timestamp_ntz"
    mapping = {pa.int32(): "int", pa.int64(): "long", pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.date32(): "date"}
    if arrow_type in mapping:
        return mapping[arrow_type]
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        return "binary"
    raise InvalidInput(reason=f"unsupported payload type {arrow_type}")

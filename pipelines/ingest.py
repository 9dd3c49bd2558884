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

from storage import faults
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


def producer_for_run(catalog: Any, table: str, run_key: str, producers: dict[str, Any]) -> ProducerIdentity:
    """The producer of a run: reused as is when the run key already has one in ``producers``
    (the table's producer state; no epoch bump, so a re-run's batches are recognised as
    duplicates), created otherwise."""
    client_id = f"ingest:{run_key}"
    for pid, entry in producers.items():
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

    identity = producer_for_run(catalog, log_table.identifier, run_key, dict(state.producers))
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
    routed = df.select(F.col(cols.PARTITION).cast("int").alias(cols.PARTITION), *payload_columns)

    # Pass 1: rows per (input task, log partition). Pass 2 numbers each task's rows from the
    # base offset its slice starts at (no shuffle), and the executor writes one Parquet file
    # per log partition it holds, with the table's schema and field ids, in offset order.
    # commit_files re-checks that the files tile each partition exactly, so splits planned
    # differently in the two passes would fail loudly instead of committing a gap.
    counts = routed.groupBy(F.spark_partition_id().alias("_task"), cols.PARTITION).count().collect()
    bases = slice_bases([(r["_task"], r[cols.PARTITION], r["count"]) for r in counts], ends)
    staging = f"{iceberg.metadata.location.removeprefix('file://')}/data/_ingest-{uuid.uuid4().hex}"
    writer = SliceWriter(bases, ends, identity.producer_id, identity.epoch, int(time.time() * 1_000_000), iceberg.schema().as_arrow(), staging)
    files = routed.mapInArrow(writer, "path string, partition int, rows long").collect()
    written: dict[int, list[str]] = {}
    for f in files:
        written.setdefault(f["partition"], []).append(f["path"])
    faults.checkpoint(faults.AFTER_INGEST_WRITE)
    rows = 0
    try:
        rows = sum(f["rows"] for f in files)
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


def slice_bases(counts: list[tuple[int, int, int]], ends: dict[int, int]) -> dict[tuple[int, int], int]:
    """First offset of each (input split, partition) slice: slices follow each other in split order.

    Rows are numbered in Spark's read order: input splits as Spark plans them (one file per
    split, larger files first; ``pipelines.spark`` fixes the sizes so the plan does not depend
    on the cluster), rows within a split in file order. The same files give the same offsets.

    Args:
        counts: ``(task, partition, rows)`` from pass 1.
        ends: Log end offset per partition at job start.
    """
    bases: dict[tuple[int, int], int] = {}
    cursor = dict(ends)
    for task, partition, n in sorted(counts):
        bases[(task, partition)] = cursor[partition]
        cursor[partition] += n
    return bases


@dataclass
class SliceWriter:
    """Pass 2, on the executors: number a task's rows and write them, one file per partition.

    Called by ``mapInArrow`` with the task's Arrow batches; yields one small row per file
    written (path, partition, rows): only that reaches the driver.
    """

    bases: dict[tuple[int, int], int]
    ends: dict[int, int]
    producer_id: int | None  # None: transactional rows carry no producer sequence
    epoch: int
    now_us: int
    schema: Any  # the table's Arrow schema, with Iceberg field ids
    staging: str

    def _producer_columns(self, n: int, seq0: int) -> list[Any]:
        import numpy as np
        import pyarrow as pa

        if self.producer_id is None:
            return [pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32()), pa.nulls(n, pa.int32())]
        return [
            pa.array(np.full(n, self.producer_id, dtype=np.int64)),
            pa.array(np.full(n, self.epoch, dtype=np.int32)),
            pa.array(np.arange(seq0, seq0 + n, dtype=np.int32)),
        ]

    def __call__(self, batches):
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        cursor: dict[int, int] = {}
        pending: dict[int, list[Any]] = {}
        pending_rows: dict[int, int] = {}
        files: dict[int, tuple[str, Any]] = {}
        counts: dict[int, int] = {}
        payload = [f for f in self.schema if f.name not in cols.SYSTEM_COLUMNS]

        def flush(p: int) -> None:
            # Row groups of ~1M rows: small writes would make many tiny row groups.
            if p not in files:
                path = f"{self.staging}/p={p}/task-{task:05d}-{uuid.uuid4().hex[:8]}.parquet"
                os.makedirs(os.path.dirname(path), exist_ok=True)
                files[p] = (path, pq.ParquetWriter(path, self.schema, compression="zstd"))
            files[p][1].write_table(pa.Table.from_batches(pending.pop(p), schema=self.schema))
            pending_rows[p] = 0

        try:
            for batch in batches:
                parts = batch.column(cols.PARTITION).to_numpy(zero_copy_only=False).astype(np.int32)
                order = np.argsort(parts, kind="stable")  # group by partition, keep read order
                grouped = batch.take(pa.array(order))
                present, starts = np.unique(parts[order], return_index=True)
                bounds = list(starts) + [len(parts)]
                for i, p in enumerate(int(x) for x in present):
                    rows = grouped.slice(bounds[i], bounds[i + 1] - bounds[i])
                    n = rows.num_rows
                    first = cursor.get(p, self.bases[(task, p)])
                    cursor[p] = first + n
                    seq0 = first - self.ends[p]
                    columns = [
                        pa.array(np.full(n, p, dtype=np.int32)),
                        pa.array(np.arange(first, first + n, dtype=np.int64)),
                        pa.array(np.full(n, self.now_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                        *self._producer_columns(n, seq0),
                        *(rows.column(f.name).cast(f.type) for f in payload),
                    ]
                    pending.setdefault(p, []).append(pa.RecordBatch.from_arrays(columns, schema=self.schema))
                    pending_rows[p] = pending_rows.get(p, 0) + n
                    counts[p] = counts.get(p, 0) + n
                    if pending_rows[p] >= 1_000_000:
                        flush(p)
            for p in list(pending):
                flush(p)
        finally:
            for _, w in files.values():
                w.close()
        out = pa.schema([("path", pa.string()), ("partition", pa.int32()), ("rows", pa.int64())])
        for p, (path, _) in sorted(files.items()):
            yield pa.RecordBatch.from_pylist([{"path": path, "partition": p, "rows": counts[p]}], schema=out)


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

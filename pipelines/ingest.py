"""The ingest job: landing files -> a log table, exactly once per source file, at any age.

Spark's executors read the source, route rows to log partitions, number them from the
watermarks read at job start, and write Parquet data files (one log partition and one
contiguous offset range per file). The driver then commits those files, together with their
ingest-ledger entries, in one atomic, conditional multi-table commit through ``storage``:
rows never funnel through the driver. On a catalog without atomic multi-table commits (REST),
the data table's conditional commit carries the ledger entries and decides; the ledger rolls
forward after it (``storage.ingest.ledger``).

Object stores: with an S3 warehouse (the lakehouse profile: a PostgreSQL catalog, an ``s3://``
warehouse), executors write the data files straight to S3 through pyarrow, with the table's FileIO
settings shipped to them (Spark itself never opens an ``s3://`` path: no Hadoop connector). Landing
files under an ``s3://`` URI are listed on the driver and read by the executors the same way, one
task per file; the ledger identifies them by URI.

Exactly once: the ingest ledger (``storage.ingest.ledger``) records every loaded file (path, size,
modification time, content fingerprint, and the offsets its rows got) in the same commit as
the rows, or (REST) in the rows' commit's receipt, rolled forward into the ledger before any
run plans. A re-run, a backfill, or Airflow's own backfill of the same day loads only the
files not loaded yet, however long ago the rest was loaded, and reports what it skipped.
Two runs racing over the same files: both expect the same log end offsets, so at most one
commits; the other fails with ``OffsetMismatch`` and its re-run skips the loaded files.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from pyiceberg.catalog import Catalog

from icelog.pipelines.spark import executor_filesystem, file_io_properties, is_local, spark_schema, sparkable_schema
from icelog.storage.core import faults
from icelog.storage.core.catalog import open_catalog
from icelog.storage.core.commit import commit, commit_tables, new_commit_id
from icelog.storage.core.swap import is_atomic
from icelog.storage.errors import CatalogUnavailable, CommitOutcomeUnknown, InvalidInput
from icelog.storage.ingest import ledger
from icelog.storage.log import schema as cols
from icelog.storage.log.files import arrow_location, parquet_encodings, row_groups, with_encoded_key_hash, write_log_files
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.properties import KEY_COLUMN
from icelog.storage.telemetry import get_logger

log = get_logger("ingest")
FORMATS = {"parquet": "parquet", "csv": "csv", "json": "json", "jsonl": "json"}


@dataclass
class IngestResult:
    table: str
    run_key: str | None
    rows: int
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    duplicate: bool = False  # nothing new: every listed file was loaded before
    snapshot_id: int | None = None
    seconds: float = 0.0
    loaded: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_source(source: str) -> None:
    """Refuse a landing path that names nothing: a typo must not read as "nothing new to load".

    (A scheduled run of a day with no landing folder yet is another matter: ``ingest`` itself
    loads nothing then, and says so.) An object store's URI is listed by ``ingest`` itself,
    with the catalog's FileIO settings: it is not checked here.
    """
    if not is_local(source):
        return
    if not os.path.exists(source) and not glob.glob(source):
        raise InvalidInput(reason=f"no file, folder or glob match at {source!r}: nothing to ingest")


def source_files(source: str) -> list[str]:
    """Files of a landing path: a file, a folder (recursively), or a glob."""
    if os.path.isdir(source):
        found = [
            p
            for p in glob.glob(os.path.join(source, "**", "*"), recursive=True)
            if os.path.isfile(p) and not os.path.basename(p).startswith(("_", "."))
        ]
    else:
        found = [p for p in glob.glob(source) if os.path.isfile(p)]
    return sorted(found)


@dataclass(frozen=True)
class StoredSourceFile(ledger.SourceFile):
    """A landing file in an object store (``s3://bucket/key``), fingerprinted through pyarrow."""

    filesystem: Any = field(default=None, compare=False, repr=False)

    def with_fingerprint(self) -> StoredSourceFile:
        if self.fingerprint is not None:
            return self
        digest = hashlib.sha256()
        with self.filesystem.open_input_stream(_store_path(self.path)) as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return replace(self, fingerprint=f"sha256:{digest.hexdigest()}")


def stored_source_files(source: str, io: Any) -> list[StoredSourceFile]:
    """Files of an object-store landing URI: an object, a "folder" (recursively) or a glob,
    listed with the table's FileIO settings (``io``)."""
    from pyarrow import fs as pafs

    scheme = urlparse(source).scheme
    filesystem, path = arrow_location(io, source)
    wildcard = next((i for i, c in enumerate(path) if c in "*?["), None)
    root = path if wildcard is None else path[: path.rfind("/", 0, wildcard)]
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File and wildcard is None:
        infos = [info]
    elif info.type == pafs.FileType.Directory:
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    else:
        infos = []
    found = [
        StoredSourceFile(f"{scheme}://{i.path}", i.size, i.mtime_ns or 0, filesystem=filesystem)
        for i in infos
        if i.type == pafs.FileType.File
        and (wildcard is not None or not i.base_name.startswith(("_", ".")))
        and (wildcard is None or fnmatch.fnmatchcase(i.path, path))
    ]
    return sorted(found, key=lambda f: f.path)


def _store_path(uri: str) -> str:
    parsed = urlparse(uri)
    return f"{parsed.netloc}{parsed.path}"


def ingest(
    spark: Any,
    table: str,
    source: str,
    run_key: str | None = None,
    *,
    fmt: str = "parquet",
    key_column: str | None = None,
    partition_column: str | None = None,
    catalog_name: str | Catalog | None = None,
    only_partitions: list[int] | None = None,
    reload_changed: bool = False,
    verify: bool = False,
    progress: Callable[[str], None] | None = None,
) -> IngestResult:
    """Load the files under ``source`` into ``table``, each file exactly once.

    Args:
        spark: A SparkSession (``pipelines.spark.spark_session``).
        table: The log table.
        source: Landing file, folder or glob.
        run_key: A label for this run (e.g. ``flights:2013-01-05``), kept in the ledger.
        fmt: ``parquet``, ``csv`` (with header) or ``json``/``jsonl`` (JSON Lines).
        key_column: Route rows by CRC-32 of this column (``storage.log.keys``); default: the
            table property ``icelog.key-column``, else ``key``.
        partition_column: Or take the log partition from this integer column.
        catalog_name: pyiceberg catalog name, or a catalog already open (default: the embedded one).
        only_partitions: Load only rows routed to these log partitions (the rest of each
            file stays loadable by a later run).
        reload_changed: Load a file whose content changed since it was loaded again, as new
            rows, instead of refusing it.
        verify: Fingerprint every listed file, not only new or changed-looking ones.
        progress: Called with one line per step.

    Raises:
        InvalidInput / SchemaMismatch: bad format, columns or partition values (nothing written).
        SourceFileChanged: a loaded file's content changed (nothing written).
        OffsetMismatch: another writer appended since the job started; re-run the job.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    say = progress or (lambda line: None)
    if fmt not in FORMATS:
        raise InvalidInput(reason=f"unknown source format {fmt!r}; one of {sorted(FORMATS)}")
    if key_column is not None and partition_column is not None:
        raise InvalidInput(reason="route rows by key_column or by partition_column, not both")
    catalog = open_catalog(catalog_name)
    ident = LogTable.open(catalog, table).identifier
    ledger.ensure_ledger(catalog)
    # The ledger holds every file the log ends include: a run that committed after this read
    # moved the ends, so this run's conditional commit cannot land on top of it.
    tables = ledger.read_for_plan(catalog, ident)
    iceberg = tables[ident]
    state = LogState.from_metadata(iceberg.metadata)
    partitions = state.partitions
    if only_partitions is not None and not set(only_partitions) <= set(range(partitions)):
        raise InvalidInput(reason=f"partitions {sorted(only_partitions)} are not all in 0..{partitions - 1}")
    wanted = set(range(partitions) if only_partitions is None else only_partitions)
    if partition_column is None:
        key_column = key_column or iceberg.metadata.properties.get(KEY_COLUMN, cols.DEFAULT_KEY_COLUMN)
    bound = log.bind(table=ident, run_key=run_key)

    local = is_local(source)
    io_properties = None if local else file_io_properties(iceberg.io.properties)
    if local:
        listed = [ledger.SourceFile.stat(p) for p in source_files(source)]
    else:
        listed = stored_source_files(source, iceberg.io)
    say(f"{len(listed)} files under {source}")
    plan = ledger.plan(
        ident,
        listed,
        ledger.entries(tables[ledger.LEDGER_TABLE], ident, [f.path for f in listed]),
        wanted,
        reload_changed=reload_changed,
        verify=verify,
    )
    result = IngestResult(
        ident, run_key, 0, duplicate=bool(listed) and not plan.load, snapshot_id=state.snapshot_id, skipped=plan.skipped
    )
    if plan.skipped:
        say(f"skipping {len(plan.skipped)} files already loaded")
    if not plan.load:
        bound.info("nothing to load", listed=len(listed), skipped=len(plan.skipped))
        result.seconds = time.perf_counter() - started
        return result
    say(f"loading {len(plan.load)} new files")

    payload = cols.payload_arrow_schema(iceberg.schema())
    df = read_sources(spark, plan.load, fmt, io_properties)
    route = key_column or partition_column
    unknown = [c for c in (route,) if c not in df.columns]
    missing_required = [f.name for f in payload if not f.nullable and f.name not in df.columns]
    if unknown or missing_required:
        raise cols.SchemaMismatch(table=ident, reason=f"source lacks columns {unknown + missing_required}; it has {df.columns}")
    if key_column:
        part = F.pmod(F.crc32(F.coalesce(F.col(key_column).cast("string"), F.lit("")).cast("binary")), F.lit(partitions)).cast(
            "int"
        )
    else:
        part = F.col(partition_column).cast("int")
    df = df.withColumn(cols.PARTITION, part)
    if partition_column:  # a key hash is always in range; a user's column may not be
        bad = (
            df.where(F.col(cols.PARTITION).isNull() | (F.col(cols.PARTITION) < 0) | (F.col(cols.PARTITION) >= partitions))
            .limit(1)
            .collect()
        )
        if bad:
            raise InvalidInput(reason=f"row routed to partition {bad[0][cols.PARTITION]!r}, outside 0..{partitions - 1}")
    df = df.where(_partition_filter(F, plan.partitions))
    payload_columns = []
    for f in payload:
        spark_type = _spark_type(f.type)
        payload_columns.append(
            (F.col(f.name).cast(spark_type) if f.name in df.columns else F.lit(None).cast(spark_type)).alias(f.name)
        )
    routed = df.select(F.col(cols.PARTITION).cast("int").alias(cols.PARTITION), F.col("_file"), *payload_columns)

    # Pass 1: rows per (input split, source file, log partition). One split never packs two
    # files (pipelines.spark), so each split's slice of a partition is one file's rows.
    say("pass 1: counting rows per split and partition")
    counts = routed.groupBy(F.spark_partition_id().alias("_task"), "_file", cols.PARTITION).count().collect()
    if not counts:
        return _record_empty(catalog, ident, plan, run_key, partitions, result, started)
    ends = {p: w.end for p, w in state.watermarks.items()}
    bases = slice_bases([(r["_task"], r[cols.PARTITION], r["count"]) for r in counts], ends)
    split_file = {r["_task"]: _source_path(r["_file"]) for r in counts}

    # Pass 2: executors number each split's rows from its slices' bases and write them.
    say("pass 2: numbering and writing data files")
    # Sent once, by the one commit below (a re-run makes a new one): a first send, so its lookup
    # reads only registry files younger than it, and a gone older one cannot refuse it.
    commit_id = new_commit_id()
    location = iceberg.metadata.location
    staging = f"{location.removeprefix('file://') if is_local(location) else location}/data/_ingest-{commit_id}"
    staging_io = None if is_local(location) else file_io_properties(iceberg.io.properties)
    slice_counts = {(r["_task"], r[cols.PARTITION]): r["count"] for r in counts}
    written = write_slices(
        routed.drop("_file"),
        bases,
        ends,
        iceberg.schema(),
        staging,
        key_column=cols.key_column(iceberg.schema(), iceberg.properties),
        io_properties=staging_io,
    )
    faults.checkpoint(faults.AFTER_INGEST_WRITE)
    say(f"committing {sum(map(len, written.values()))} data files")

    file_ranges = file_offsets(bases, slice_counts, split_file)
    rows = sum(r["count"] for r in counts)
    atomic = is_atomic(catalog)
    try:
        data = LogTable(catalog, ident).files_request(written, {p: ends[p] for p in written}, commit_id=commit_id)
        if atomic:  # the data and its ledger rows in one commit
            entries = _ledger_request(catalog, ident, plan, file_ranges, partitions, run_key, commit_id)
            outcome = commit_tables(catalog, [(ident, data), (ledger.LEDGER_TABLE, entries)], commit_id=commit_id, resent=False)[
                0
            ]
        else:  # the data commit decides, carrying its ledger rows; the ledger rolls forward below
            rows_of_ledger = ledger.ledger_rows(ident, plan.load, file_ranges, plan.partitions, partitions, run_key, commit_id)
            outcome = commit(catalog, ident, ledger.carrying(data, rows_of_ledger), commit_id=commit_id, resent=False)
    except (CommitOutcomeUnknown, CatalogUnavailable):
        raise  # the commit may have landed: its files stay (orphan cleanup removes them if not)
    except BaseException:
        remove_staging(staging, staging_io)  # nothing committed: the files are garbage
        raise
    if not atomic:  # a failure from here on leaves the data committed: the next run rolls the ledger forward
        faults.checkpoint(faults.AFTER_INGEST_DATA_COMMIT)
        ledger.record(catalog, ident, commit_id, rows_of_ledger)
    appended = outcome.result
    result.rows, result.ranges, result.snapshot_id = rows, dict(appended.ranges), outcome.snapshot_id
    result.loaded = [
        {
            "path": f.path,
            "rows": sum(n - a for s in file_ranges.get(f.path, {}).values() for a, n in s),
            "ranges": file_ranges.get(f.path, {}),
        }
        for f in plan.load
    ]
    result.seconds = time.perf_counter() - started
    bound.info("ingested", rows=rows, files=len(plan.load), skipped=len(plan.skipped), snapshot_id=outcome.snapshot_id)
    say(f"committed {rows} rows from {len(plan.load)} files (snapshot {outcome.snapshot_id})")
    return result


def _partition_filter(F: Any, partitions: dict[str, set[int]]) -> Any:
    """Rows to load: per file, the log partitions it still lacks (usually all wanted, one set)."""
    groups: dict[frozenset[int], list[str]] = {}
    for path, parts in partitions.items():
        groups.setdefault(frozenset(parts), []).append(path)
    if len(groups) == 1:
        return F.col(cols.PARTITION).isin(sorted(next(iter(groups))))
    condition = F.lit(False)
    for parts, paths in groups.items():
        uris = [u for p in paths for u in ((f"file://{p}", f"file:{p}") if is_local(p) else (p,))]
        condition = condition | (F.col("_file").isin(uris) & F.col(cols.PARTITION).isin(sorted(parts)))
    return condition


def _source_path(uri: str) -> str:
    """The ledger's path of a row's ``_file``: a local file's real path, an object's URI as listed."""
    return os.path.realpath(unquote(urlparse(uri).path)) if is_local(uri) else uri


def remove_staging(staging: str, io_properties: dict[str, str] | None) -> None:
    """Delete an uncommitted run's data files (a local folder, or an object-store prefix)."""
    if io_properties is None:
        shutil.rmtree(staging, ignore_errors=True)
        return
    filesystem, path = executor_filesystem(io_properties, staging)
    try:
        filesystem.delete_dir(path)
    except OSError:  # nothing was written, or the store is gone: orphan cleanup removes what is left
        log.warning("staging not removed", staging=staging)


def read_sources(spark: Any, files: list[ledger.SourceFile], fmt: str, io_properties: dict[str, str] | None) -> Any:
    """The source files as one DataFrame with a ``_file`` column: one input split per file.

    Local files are read by Spark. An object store's files are read by the executors with pyarrow,
    through the table's FileIO settings (Spark has no S3 connector here): one task per file, the
    files in a fixed order (largest first, then by path), so both passes see the same splits.
    """
    from pyspark.sql import functions as F

    if io_properties is None:
        reader = spark.read.format(FORMATS[fmt])
        if fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        return reader.load([f.path for f in files]).withColumn("_file", F.input_file_name())
    import pyarrow as pa

    paths = [f.path for f in sorted(files, key=lambda f: (-f.size, f.path))]
    reader = StoredFileReader(paths, FORMATS[fmt], io_properties)
    if fmt == "parquet":  # footers only: read on the driver, in threads
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:
            found = list(pool.map(reader.schema_of, range(len(paths))))
    else:  # CSV and JSON have no footer: executors read each file to infer its columns
        found = spark.sparkContext.parallelize(range(len(paths)), len(paths)).map(reader.schema_of).collect()
    schema = sparkable_schema(
        pa.unify_schemas([pa.ipc.read_schema(pa.py_buffer(s)) for s in found], promote_options="permissive")
    )
    reader = replace(reader, schema=schema.append(pa.field("_file", pa.string())))
    return spark.range(0, len(paths), 1, len(paths)).mapInArrow(reader, spark_schema(reader.schema))


@dataclass(frozen=True)
class StoredFileReader:
    """On the executors: read object-store source files with pyarrow (parquet, csv, json lines).

    ``schema_of`` gives one file's Arrow schema (serialized); called by ``mapInArrow`` over
    ``spark.range`` (one id per task), the reader yields the file's rows in the unified
    ``schema``, with the file's URI in ``_file``.
    """

    paths: list[str]
    fmt: str
    io_properties: dict[str, str]
    schema: Any = None

    def _read(self, path: str) -> Any:
        import pyarrow.csv as pcsv
        import pyarrow.json as pjson
        import pyarrow.parquet as pq

        filesystem, where = executor_filesystem(self.io_properties, path)
        if self.fmt == "parquet":
            return pq.read_table(where, filesystem=filesystem)
        with filesystem.open_input_stream(where) as f:
            return pcsv.read_csv(f) if self.fmt == "csv" else pjson.read_json(f)

    def schema_of(self, index: int) -> bytes:
        import pyarrow.parquet as pq

        path = self.paths[index]
        if self.fmt == "parquet":  # the footer is enough
            filesystem, where = executor_filesystem(self.io_properties, path)
            with filesystem.open_input_file(where) as f:
                return pq.read_schema(f).remove_metadata().serialize().to_pybytes()
        return self._read(path).schema.serialize().to_pybytes()

    def __call__(self, batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column("id").to_pylist():
                path = self.paths[index]
                source = self._read(path)
                columns = [
                    pa.array([path] * source.num_rows, pa.string())
                    if f.name == "_file"
                    else source.column(f.name).cast(f.type)
                    if f.name in source.column_names
                    else pa.nulls(source.num_rows, f.type)
                    for f in self.schema
                ]
                yield from pa.Table.from_arrays(columns, schema=self.schema).to_batches(max_chunksize=100_000)


def _ledger_request(
    catalog: Any, ident: str, plan: ledger.Plan, file_ranges: dict, partitions: int, run_key: str | None, commit_id: str
) -> ledger.LedgerAppend:
    book = catalog.load_table(ledger.LEDGER_TABLE)
    rows = ledger.ledger_rows(ident, plan.load, file_ranges, plan.partitions, partitions, run_key, commit_id)
    files = write_log_files(book, {ident: rows})
    return ledger.LedgerAppend(tuple(files), rows.num_rows)


def _record_empty(
    catalog: Any, ident: str, plan: ledger.Plan, run_key: str | None, partitions: int, result: IngestResult, started: float
) -> IngestResult:
    """New files without rows (for the wanted partitions): record them, so they count as loaded."""
    commit_id = new_commit_id()  # a first send, as the data commit's
    outcome = commit_tables(
        catalog,
        [(ledger.LEDGER_TABLE, _ledger_request(catalog, ident, plan, {}, partitions, run_key, commit_id))],
        commit_id=commit_id,
        resent=False,
    )[0]
    result.loaded = [{"path": f.path, "rows": 0, "ranges": {}} for f in plan.load]
    result.seconds = time.perf_counter() - started
    log.info("recorded empty files", table=ident, files=len(plan.load), ledger_snapshot=outcome.snapshot_id)
    return result


def file_offsets(
    bases: dict[tuple[int, int], int], counts: dict[tuple[int, int], int], split_file: dict[int, str]
) -> dict[str, dict[int, list[list[int]]]]:
    """Offsets each source file's rows got: ``{path: {partition: [[first, next], ...]}}``,
    adjacent spans merged (a large file's splits usually follow each other)."""
    out: dict[str, dict[int, list[list[int]]]] = {}
    for (task, p), first in sorted(bases.items(), key=lambda kv: kv[1]):
        spans = out.setdefault(split_file[task], {}).setdefault(p, [])
        nxt = first + counts[(task, p)]
        if spans and spans[-1][1] == first:
            spans[-1][1] = nxt
        else:
            spans.append([first, nxt])
    return out


def write_slices(
    routed: Any,
    bases: dict[tuple[int, int], int],
    ends: dict[int, int],
    schema: Any,
    directory: str,
    producer_id: int | None = None,
    epoch: int = 0,
    key_column: str | None = None,
    io_properties: dict[str, str] | None = None,
) -> dict[int, list[str]]:
    """Pass 2: executors number each split's rows from its slices' bases and write them, one
    Parquet file per (split, log partition), into ``directory``; returns the files per partition.

    ``routed`` holds the log partition column and the payload columns, read exactly as in the
    pass that counted the slices (the same splits). Only file paths and counts reach the driver.
    ``key_column`` (``storage.log.schema.key_column`` of the table) fills ``log_key_hash``: each
    executor hashes a file's distinct keys once (``storage.log.keys``, where Spark SQL's md5 per
    row cost more than the whole Python write), and writes it in the key-hash layout
    (``storage.log.files``).
    ``io_properties`` (``pipelines.spark.file_io_properties`` of the table's FileIO): ``directory``
    is an object store's URI, which executors write to straight through pyarrow.
    """
    writer = SliceWriter(
        bases,
        ends,
        producer_id,
        epoch,
        int(time.time() * 1_000_000),
        schema.as_arrow(),
        directory,
        io_properties,
        key_column if cols.KEY_HASH in schema.column_names else None,
    )
    written: dict[int, list[str]] = {}
    for f in routed.mapInArrow(writer, "path string, partition int, rows long").collect():
        written.setdefault(f["partition"], []).append(f["path"])
    return written


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
    io_properties: dict[str, str] | None = None  # set: ``staging`` is an object store's URI
    key_column: str | None = None  # hashed into ``log_key_hash`` per file (None: left null)

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
            # Row groups of ~1M rows: small writes would make many tiny row groups. Each flush
            # holds consecutive offsets; with log_key_hash it is written clustered by it.
            if p not in files:
                path = f"{self.staging}/p={p}/task-{task:05d}-{uuid.uuid4().hex[:8]}.parquet"
                options = parquet_encodings(self.schema.names)
                if self.io_properties is None:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    target, filesystem = path, None
                else:
                    filesystem, target = executor_filesystem(self.io_properties, path)
                writer = pq.ParquetWriter(target, self.schema, filesystem=filesystem, compression="zstd", **options)
                files[p] = (path, writer)
            rows, keys = with_encoded_key_hash(pa.Table.from_batches(pending.pop(p), schema=self.schema), self.key_column)
            for group in row_groups(pa.Table.from_arrays(rows.columns, schema=self.schema), keys):
                files[p][1].write_table(group)  # each write starts a row group
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
                    columns = dict(
                        zip(
                            (
                                cols.PARTITION,
                                cols.OFFSET,
                                cols.TIMESTAMP,
                                cols.PRODUCER_ID,
                                cols.PRODUCER_EPOCH,
                                cols.PRODUCER_SEQ,
                            ),
                            (
                                pa.array(np.full(n, p, dtype=np.int32)),
                                pa.array(np.arange(first, first + n, dtype=np.int64)),
                                pa.array(np.full(n, self.now_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                                *self._producer_columns(n, seq0),
                            ),
                            strict=True,
                        )
                    )
                    for f in payload:
                        columns[f.name] = rows.column(f.name).cast(f.type)
                    if cols.KEY_HASH in self.schema.names:  # filled per file at the flush, from key_column
                        columns[cols.KEY_HASH] = pa.nulls(n, pa.int32())
                    arrays = [columns[f.name] for f in self.schema]
                    pending.setdefault(p, []).append(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
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
    mapping = {
        pa.int32(): "int",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.bool_(): "boolean",
        pa.date32(): "date",
    }
    if arrow_type in mapping:
        return mapping[arrow_type]
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        return "binary"
    raise InvalidInput(reason=f"unsupported payload type {arrow_type}")

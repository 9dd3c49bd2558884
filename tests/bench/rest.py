"""``--only rest``: icelog on an Iceberg REST catalog over S3, beside plain references
on the same throwaway SeaweedFS server in the same run.

* a conditional 1,000-row append beside plain pyiceberg ``Table.append`` of the same rows;
* a bulk append of narrow rows beside ``pq.write_table`` of the same rows (with the system
  columns) into the same bucket through pyarrow's S3FileSystem;
* the deep check beside a bare scan of ``log_partition, log_offset`` of the same files from S3
  (a pyarrow dataset over the table's FileIO, summed by DuckDB), on both layouts icelog writes;
* 2- and 10-table transactions (the journal decides, each table rolls forward) beside a single
  1-row append on the same server, and the time from the decision to the last roll-forward.

``record`` is :func:`tests.bench.run.record`, passed in (``run`` is ``__main__`` when benches run).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import load_catalog

from icelog.storage.core.catalog import open_catalog
from icelog.storage.core.metadata_files import file_system
from icelog.storage.log.scan import parquet_from, planned_paths
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.bench.report import Target

WARMUPS = 10  # appends before sampling: the table has ~10 commits when sampling starts


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_rest(root: Path, quick: bool, record: Callable[..., None]) -> None:
    """Start a SeaweedFS server in a temp dir under ``root``, run the three benches, stop it."""
    from infra import seaweedfs

    directory = Path(tempfile.mkdtemp(prefix="seaweedfs-", dir=root))
    config = seaweedfs.start(directory)
    try:
        cat = open_catalog("bench", **config)
        # The reference is plain pyiceberg as a user has it: its own RestCatalog and FileIO.
        _append_latency(cat, load_catalog("plain", **config), 5 if quick else 30, record)
        _bulk(cat, 200_000 if quick else 5_000_000, record)
        _deep_check(cat, 400_000 if quick else 20_000_000, record)
        _transactions(cat, 5 if quick else 30, record)
    finally:
        seaweedfs.stop(directory)


def _append_latency(cat: Any, plain_cat: Any, samples: int, record: Callable[..., None]) -> None:
    """Conditional 1k-row appends at ~10 commits beside plain pyiceberg appends on the same server
    (through ``plain_cat``, pyiceberg's own catalog), sampled alternately so that both see the
    same load."""
    t = LogTable.create(cat, "bench.latency", partitions=1)
    schema = pa.schema([("key", pa.large_string()), ("value", pa.large_string())])
    rows = pa.table(
        {
            "key": pa.array([f"k{i % 997}" for i in range(1000)], pa.large_string()),
            "value": pa.array(["v" * 16] * 1000, pa.large_string()),
        },
        schema=schema,
    )
    plain_cat.create_namespace("plain")
    plain = plain_cat.create_table("plain.latency", schema=schema)
    for _ in range(WARMUPS):
        t.append({0: rows}, expected_offsets={0: t.watermarks()[0].end})
        plain.append(rows)
    icelog_lat, plain_lat = [], []
    for _ in range(samples):
        end = t.watermarks()[0].end
        icelog_lat.append(timed(lambda end=end: t.append({0: rows}, expected_offsets={0: end})))
        plain_lat.append(timed(lambda: plain.append(rows)))
    assert t.watermarks()[0].end == (WARMUPS + samples) * 1000
    record(
        f"REST+S3: conditional append 1k rows @ {WARMUPS} commits p50",
        statistics.median(icelog_lat) * 1000,
        "ms",
        "plain pyiceberg Table.append, same rows and server, p50",
        statistics.median(plain_lat) * 1000,
        Target("ratio", "<=", 0.7),
    )


def _bulk(cat: Any, rows: int, record: Callable[..., None], rounds: int = 3) -> None:
    """Appends of ``rows`` narrow rows beside ``pq.write_table`` of the same rows (system columns
    included, hashes precomputed) into the same bucket, in the table's data/ folder: ``rounds``
    of each, alternately (both see the same load), medians compared."""
    t = LogTable.create(cat, "bench.bulk", partitions=1)
    data = pa.table(
        {
            "key": pa.array(np.char.add("k", (np.arange(rows) % 1000).astype(str)), pa.large_string()),
            "value": pa.nulls(rows, pa.large_string()),
        }
    )
    table = t.table()
    located = file_system(table.io, table.metadata.location)
    assert located is not None, "the table's FileIO is not pyarrow's"
    fs, base = located
    from tests.bench.run import bulk_reference_rows  # run imports this module when the bench runs

    ref_table = ref_path = None
    icelog_s, ref_s = [], []
    for k in range(rounds):
        icelog_s.append(timed(lambda k=k: t.append({0: data}, expected_offsets={0: k * rows})))
        if ref_table is None:
            ref_table = bulk_reference_rows(data, t.table().scan(limit=1).to_arrow().schema)
        ref_path = f"{base}/data/ref-bulk-{k}.parquet"
        ref_s.append(timed(lambda path=ref_path, ref=ref_table: pq.write_table(ref, path, filesystem=fs, compression="zstd")))
        assert pq.read_metadata(ref_path, filesystem=fs).num_rows == rows
        fs.delete_file(ref_path)
    assert t.watermarks()[0].end == rounds * rows and t.read(0, 0, 1).num_rows == 1
    record(
        f"REST+S3: bulk append {rows:,} narrow rows (median of {rounds})",
        rows / statistics.median(icelog_s) / 1e6,
        "Mrows/s",
        "pq.write_table, same rows, same bucket (pyarrow S3FileSystem)",
        rows / statistics.median(ref_s) / 1e6,
        Target("ratio", ">=", 0.8),
    )


def _deep_check(cat: Any, rows: int, record: Callable[..., None]) -> None:
    """The deep check of S3 files on both layouts (offset order; clustered by key hash) beside a
    bare scan of the two columns it reads from the same files."""
    from tests.bench.run import deep_check_tables  # run imports this module when the bench runs

    for layout, t in deep_check_tables(cat, rows, chunk=5_000_000).items():
        table = t.table()
        report = check_contiguity(table, deep=True)
        assert report.ok and report.rows == rows, report.violations[:3]
        paths = planned_paths(table)
        con = duckdb.connect()

        def bare(table: Any = table, paths: list[str] = paths, con: Any = con) -> None:
            source = parquet_from(con, paths, table.io)
            con.execute(f"SELECT sum(log_partition), sum(log_offset) FROM {source}").fetchall()

        deep_s, bare_s = [], []
        for _ in range(5):  # alternately: both see the same load
            deep_s.append(timed(lambda table=table: check_contiguity(table, deep=True)))
            bare_s.append(timed(bare))
        record(
            f"REST+S3: deep check {rows:,} rows, {layout} ({len(paths)} files)",
            rows / statistics.median(deep_s) / 1e6,
            "Mrows/s",
            "bare scan of log_partition, log_offset, same S3 files (pyarrow dataset, DuckDB sum)",
            rows / statistics.median(bare_s) / 1e6,
            Target("ratio", ">=", 0.8),
        )


def _transactions(cat: Any, samples: int, record: Callable[..., None]) -> None:
    """``commit_transaction`` of 1-row sends to 2 and 10 tables beside a 1-row append (sampled
    alternately), and the time from the decision (PREPARE_COMMIT) to the last table rolled forward at 10 tables."""
    from icelog.storage.core import faults
    from icelog.storage.producers.transactional import TransactionalProducer

    tables = [LogTable.create(cat, f"bench.txn{i}", partitions=1) for i in range(10)]
    single_table = LogTable.create(cat, "bench.single", partitions=1)
    one = [{"key": "k", "value": "v"}]
    producer = TransactionalProducer(cat, "bench-rest")
    producer.init_transactions()
    decided: list[float] = []
    original = faults.checkpoint

    def checkpoint(name: str) -> None:  # the decision's time, read by the 10-table samples
        if name == faults.AFTER_TXN_PREPARE:
            decided.append(time.perf_counter())
        original(name)

    faults.checkpoint = checkpoint
    try:
        for width in (2, 10):
            single, lat, whole, rolled = [], [], [], []
            for _ in range(WARMUPS // 2 + samples):
                single.append(timed(lambda: single_table.append({0: one})))
                began = time.perf_counter()
                producer.begin_transaction()
                for t in tables[:width]:
                    producer.send(t.identifier, 0, one)
                lat.append(timed(producer.commit_transaction))
                whole.append(time.perf_counter() - began)
                rolled.append(time.perf_counter() - decided[-1])
            single, lat, rolled = single[WARMUPS // 2 :], lat[WARMUPS // 2 :], rolled[WARMUPS // 2 :]
            whole = whole[WARMUPS // 2 :]
            record(
                f"REST+S3: {width}-table transaction commit p50",
                statistics.median(lat) * 1000,
                "ms",
                "single 1-row append, same server, p50",
                statistics.median(single) * 1000,
                Target("ratio", "<=", 3.0 if width == 2 else 12.0),
            )
            # The sends write the data files on REST: the whole transaction shows what moved there.
            record(
                f"REST+S3: {width}-table transaction, begin to commit p50",
                statistics.median(whole) * 1000,
                "ms",
                "single 1-row append, same server, p50",
                statistics.median(single) * 1000,
            )
        record(
            "REST+S3: 10-table transaction, decision to the last roll-forward p50",
            statistics.median(rolled) * 1000,
            "ms",
            "",
            None,
        )
        record(
            "REST+S3: 10-table transaction, decision to the last roll-forward p99",
            float(np.percentile(rolled, 99)) * 1000,
            "ms",
            "",
            None,
        )
    finally:
        faults.checkpoint = original

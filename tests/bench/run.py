"""``make bench``: icelog figures beside references measured in the same run, on this machine.

Every figure carries its target (:class:`tests.bench.report.Target`), so the one table printed at
the end says met or missed per row. A full run writes that table into BENCHMARKS.md between its
markers and ``bench-results/latest.json``; ``--quick`` shrinks every size for a smoke run (CI) and
writes only the JSON. Machines here are noisy (2 cores): read medians and ratios, not single numbers.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import itertools
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from icelog.storage.core.catalog import LogSqlCatalog
from icelog.storage.log.keys import key_hashes
from icelog.storage.log.scan import planned_paths
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from icelog.validations.contiguity import check_contiguity
from tests.bench.report import Figure, Target, figure, render_section, render_table, replace_section

RESULTS: list[Figure] = []


def record(
    name: str, value: float, unit: str, reference: str = "", ref_value: float | None = None, target: Target | str | None = None
) -> None:
    """Keep one figure for the final table and print it as it comes (a full run takes long).

    ``target`` is a :class:`Target`, or a stated one such as ``"target <= 1.5x"`` (parsed by
    :meth:`Target.parse`; text that names no bound is shown and reported as not checked).
    """
    fig = figure(name, value, unit, reference, ref_value, target)
    RESULTS.append(fig)
    ref = f"{ref_value:,.1f} {unit} ({reference})" if ref_value is not None else reference
    ratio_text = f"  ratio {fig.ratio:.2f}" if fig.ratio is not None else ""
    print(f"{name:<58} {value:>12,.1f} {unit:<7} | {ref}{ratio_text}  {fig.verdict}", flush=True)


def pcts(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(0.95 * (len(ordered) - 1))] * 1000


def catalog(root: Path, name: str = "bench") -> LogSqlCatalog:
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    return LogSqlCatalog(name, uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'warehouse'}")


def batch(n: int, seed: int = 0) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([f"k{(seed + i) % 997}" for i in range(n)], pa.large_string()),
            "value": pa.array(["v" * 16] * n, pa.large_string()),
        }
    )


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_append_latency(root: Path, checkpoints: list[int], samples: int) -> LogTable:
    """Conditional 1,000-row appends at growing history, beside plain pyiceberg Table.append."""
    cat = catalog(root / "latency")
    t = LogTable.create(cat, "bench.latency", partitions=1)
    rows = batch(1000)
    done = 0
    for checkpoint in checkpoints:
        while done < checkpoint - samples:
            t.append({0: rows})
            done += 1
        lat = []
        for _ in range(samples):
            end = t.watermarks()[0].end
            lat.append(timed(lambda end=end: t.append({0: rows}, {0: end})))
            done += 1
        p50, p95 = pcts(lat)
        # Plain pyiceberg's append slows with history (its manifests are never merged away), so the
        # target compares the first checkpoint alone; later ones show the reference up to 300 commits.
        ref = pyiceberg_append_latency(root / f"plain{checkpoint}", min(checkpoint, 300), samples)
        record(
            f"conditional append 1k rows @ {checkpoint} commits: p50",
            p50,
            "ms",
            f"plain pyiceberg append @ {min(checkpoint, 300)} commits p50",
            ref[0],
            Target("ratio", "<=", 0.5) if checkpoint == checkpoints[0] else None,
        )
        record(f"conditional append 1k rows @ {checkpoint} commits: p95", p95, "ms", "plain pyiceberg p95", ref[1])
    # Flatness compares two tables side by side, one append to each in turn: the checkpoints above
    # are minutes apart, and the machine's drift over them (its page cache full of the history's
    # metadata) moved the ratio by 0.3 or more on its own.
    young = LogTable.create(cat, "bench.young", partitions=1)
    for _ in range(checkpoints[0]):
        young.append({0: rows})
    lat = {"old": [], "young": []}
    for i in range(samples):
        for name, table in (("old", t), ("young", young)) if i % 2 else (("young", young), ("old", t)):
            end = table.watermarks()[0].end
            lat[name].append(timed(lambda table=table, end=end: table.append({0: rows}, {0: end})))
    record(
        f"conditional append p50 @ {checkpoints[-1]} commits (flat history, alternated)",
        pcts(lat["old"])[0],
        "ms",
        f"the same @ {checkpoints[0]} commits, appends alternated",
        pcts(lat["young"])[0],
        Target("ratio", "<=", 1.05),
    )
    # What each commit writes and every reader parses: the metadata JSON, commit-id registry included.
    size = {
        name: len(table.table().io.new_input(table.table().metadata_location)) / 1024
        for name, table in (("old", t), ("young", young))
    }
    record(
        f"metadata JSON per commit @ {checkpoints[-1]} commits",
        size["old"],
        "KB",
        f"the same @ {checkpoints[0]} commits",
        size["young"],
        Target("value", "<=", 30),
    )
    return t


def pyiceberg_append_latency(root: Path, history: int, samples: int) -> tuple[float, float]:
    cat = catalog(root)
    cat.create_namespace("plain")
    schema = pa.schema([("key", pa.large_string()), ("value", pa.large_string())])
    table = cat.create_table("plain.t", schema=schema)
    rows = batch(1000).cast(schema)
    for _ in range(max(0, history - samples)):
        table.append(rows)
    lat = [timed(lambda: table.append(rows)) for _ in range(samples)]
    return pcts(lat)


def bench_idempotent_overhead(root: Path, samples: int) -> None:
    cat = catalog(root / "idem")
    plain = LogTable.create(cat, "bench.plain", partitions=1)
    idem = LogTable.create(cat, "bench.idem", partitions=1)
    me = init_producer(cat, "bench.idem", "bench")
    rows = batch(1000)
    for _ in range(10):  # warm up both
        plain.append({0: rows})
    seq = 0
    for _ in range(10):
        idem.append({0: rows}, producer=ProducerBatch(me.producer_id, 0, {0: seq}))
        seq += 1000
    plain_lat, idem_lat = [], []
    for _ in range(samples):
        end = plain.watermarks()[0].end
        plain_lat.append(timed(lambda end=end: plain.append({0: rows}, {0: end})))
        end = idem.watermarks()[0].end
        idem_lat.append(
            timed(lambda end=end, seq=seq: idem.append({0: rows}, {0: end}, producer=ProducerBatch(me.producer_id, 0, {0: seq})))
        )
        seq += 1000
    record(
        "idempotent+conditional append 1k rows p50",
        pcts(idem_lat)[0],
        "ms",
        "plain conditional append p50",
        pcts(plain_lat)[0],
        Target("ratio", "<=", 1.1, "overhead ≤ 10%"),
    )


def bench_producer_state(root: Path, producers: int, batches: int) -> None:
    cat = catalog(root / "pstate")
    t = LogTable.create(cat, "bench.p", partitions=1, properties={"icelog.producer.expiry-ms": str(3_600_000)})
    ids = [init_producer(cat, "bench.p", f"c{i}").producer_id for i in range(producers)]
    seqs = dict.fromkeys(ids, 0)
    per = batches // producers
    started = time.perf_counter()
    for _ in range(per):
        for pid in ids:
            t.append({0: [{"key": "k"}]}, producer=ProducerBatch(pid, 0, {0: seqs[pid]}))
            seqs[pid] += 1
    peak = len(t.table().metadata.properties["icelog.producers"])
    # Now let every one of them go idle past a 1 s expiry; the next producer commit prunes them.
    with t.table().transaction() as txn:
        txn.set_properties({"icelog.producer.expiry-ms": "1000"})
    time.sleep(1.1)
    survivor = init_producer(cat, "bench.p", "survivor")
    t.append({0: [{"key": "k"}]}, producer=ProducerBatch(survivor.producer_id, 0, {0: 0}))
    after = len(t.table().metadata.properties["icelog.producers"])
    # O(active producers): expiring all but one must shrink the state by about their number.
    record(
        f"producer state after {per * producers:,} batches / {producers:,} producers",
        peak / 1024,
        "KiB",
        f"{(time.perf_counter() - started):.0f} s to write; after expiry (1 active)",
        after / 1024,
        Target("ratio", ">=", producers / 2, f"O(active producers): {producers:,} active → 1"),
    )


def bulk_reference_rows(data: pa.Table, arrow: pa.Schema) -> pa.Table:
    """The bulk bench's rows as the log table stores them (system columns of one append, the key
    hashes precomputed): what a plain ``pq.write_table`` reference writes."""
    rows = data.num_rows
    return pa.table(
        {
            "log_partition": pa.array(np.zeros(rows, np.int32)),
            "log_offset": pa.array(np.arange(rows, dtype=np.int64)),
            "log_timestamp": pa.array(np.zeros(rows, np.int64)).cast(pa.timestamp("us", tz="UTC")),
            "producer_id": pa.nulls(rows, pa.int64()),
            "producer_epoch": pa.nulls(rows, pa.int32()),
            "producer_seq": pa.nulls(rows, pa.int32()),
            "key": data["key"],
            "value": data["value"],
            "log_key_hash": pa.array(key_hashes(data["key"])),
        }
    ).cast(arrow)


def bench_bulk(root: Path, rows: int) -> None:
    cat = catalog(root / "bulk")
    t = LogTable.create(cat, "bench.bulk", partitions=1)
    data = pa.table(
        {
            "key": pa.array(np.char.add("k", (np.arange(rows) % 1000).astype(str)), pa.large_string()),
            "value": pa.nulls(rows, pa.large_string()),
        }
    )
    elapsed = timed(lambda: t.append({0: data}))
    full = t.read(0, 0, 1)  # correctness guard: the rows are there
    assert full.num_rows == 1 and t.watermarks()[0].end == rows
    arrow = t.table().scan(limit=1).to_arrow().schema
    ref_table = bulk_reference_rows(data, arrow)
    ref = timed(lambda: pq.write_table(ref_table, root / "bulk_ref.parquet", compression="zstd"))
    record(
        f"bulk append {rows:,} narrow rows",
        rows / elapsed / 1e6,
        "Mrows/s",
        "pyarrow.parquet.write_table, same rows",
        rows / ref / 1e6,
        Target("ratio", ">=", 0.9),
    )
    on_disk = sum(os.path.getsize(p) for p in planned_paths(t.table()))
    record(
        f"bulk append {rows:,} narrow rows: bytes on disk",
        on_disk / 1e6,
        "MB",
        "the same rows in offset order, one pyarrow.parquet.write_table",
        os.path.getsize(root / "bulk_ref.parquet") / 1e6,
        Target("ratio", "<=", 1.2),
    )


def deep_check_tables(cat: Any, rows: int, chunk: int) -> dict[str, LogTable]:
    """Two 4-partition tables of ``rows`` rows, appended ``chunk`` rows per partition at a time,
    by the file layout icelog writes them in: offset order (no key column) and clustered by key
    hash (a key column, 10,000 keys)."""
    layouts = {
        "offset order": LogTable.create(cat, "bench.deep", partitions=4, payload=[{"name": "v", "type": "int"}]),
        "clustered by key hash": LogTable.create(
            cat, "bench.deep_keyed", partitions=4, payload=[{"name": "key", "type": "string"}]
        ),
    }
    for layout, t in layouts.items():
        for start in range(0, rows, chunk * 4):
            n = min(chunk, (rows - start) // 4)
            payload = (
                {"v": pa.array(np.arange(n, dtype=np.int32))}
                if layout == "offset order"
                else {"key": pa.array(np.char.add("k", (np.arange(n) % 10_000).astype(str)))}
            )
            t.append({p: pa.table(payload) for p in range(4)})
    return layouts


def bench_validation(root: Path, rows: int) -> None:
    """The deep check on each file layout icelog writes (offset order; clustered by key hash)
    beside a bare DuckDB scan of the two columns it reads, from the same files."""
    cat = catalog(root / "deep")
    for layout, t in deep_check_tables(cat, rows, chunk=10_000_000).items():
        _bench_deep_check(root, t.table(), rows, layout)


def _bench_deep_check(root: Path, table: Any, rows: int, layout: str) -> None:
    report = check_contiguity(table, deep=True)
    assert report.ok and report.rows == rows, report.violations[:3]
    deep_s = statistics.median(timed(lambda: check_contiguity(table, deep=True)) for _ in range(5))
    paths = planned_paths(table)
    con = duckdb.connect()
    bare = statistics.median(
        timed(lambda: con.execute("SELECT sum(log_partition), sum(log_offset) FROM read_parquet($p)", {"p": paths}).fetchall())
        for _ in range(5)
    )
    record(
        f"deep validation of {rows:,} rows, {layout}",
        rows / deep_s / 1e6,
        "Mrows/s",
        "a bare DuckDB scan of log_partition, log_offset of the same files",
        rows / bare / 1e6,
        Target("ratio", ">=", 0.8),
    )
    if layout == "offset order":
        size = sum(os.path.getsize(p) for p in paths)
        dest = root / "cp_ref"
        dest.mkdir()
        cp = timed(lambda: subprocess.run(["cp", *paths, str(dest)], check=True))
        record(
            f"deep validation throughput ({size / 1e6:,.0f} MB of Parquet)",
            size / deep_s / 1e6,
            "MB/s",
            "cp of the same files",
            size / cp / 1e6,
        )


def bench_metadata_check(t: LogTable) -> None:
    table = t.table()
    files = len(list(table.scan().plan_files()))
    elapsed = statistics.median(timed(lambda: check_contiguity(table)) for _ in range(3))
    plan = statistics.median(timed(lambda: list(table.scan().plan_files())) for _ in range(3))
    record(
        f"metadata-only check, {files:,} files",
        elapsed * 1000,
        "ms",
        "pyiceberg planning the same scan (plan_files)",
        plan * 1000,
        Target("ratio", "<=", 0.5),
    )


def bench_spark_ingest(root: Path, rows: int) -> None:
    """The Spark ingest job beside a plain df.write.parquet of the same DataFrame."""
    from icelog.pipelines.ingest import ingest
    from icelog.pipelines.spark import spark_session
    from icelog.storage.core.catalog import LogSqlCatalog

    landing = root / "spark-landing"
    landing.mkdir(parents=True)
    per_file = rows // 8
    for f in range(8):
        n = np.arange(f * per_file, (f + 1) * per_file)
        pq.write_table(
            pa.table({"key": pa.array(np.char.add("k", (n % 10_000).astype(str))), "value": pa.array(n.astype(str))}),
            landing / f"part-{f}.parquet",
        )
    os.environ["PYICEBERG_CATALOG__SPARKBENCH__URI"] = f"sqlite:///{root / 'spark.db'}"
    os.environ["PYICEBERG_CATALOG__SPARKBENCH__WAREHOUSE"] = f"file://{root / 'spark-wh'}"
    (root / "spark-wh").mkdir()
    cat = LogSqlCatalog(
        "sparkbench",
        uri=os.environ["PYICEBERG_CATALOG__SPARKBENCH__URI"],
        warehouse=os.environ["PYICEBERG_CATALOG__SPARKBENCH__WAREHOUSE"],
    )
    spark = spark_session("local[*]", "icelog-bench")
    df = spark.read.parquet(str(landing))
    df.count()  # warm the session and the file listing for both sides
    from pyspark.sql import functions as F

    def by_partition(i: int) -> None:
        """What a user would run instead: the same rows written one folder per log partition,
        as Spark's own Iceberg writer does for a partitioned table (the fair reference)."""
        df = spark.read.parquet(str(landing)).withColumn("log_partition", F.pmod(F.hash("key"), F.lit(8)))
        df.write.mode("overwrite").partitionBy("log_partition").parquet(str(root / f"partitioned{i}"))

    def handoff() -> None:
        """The floor of a Python-numbered write: the same rows read and handed to Python workers
        as Arrow batches (what pass 2 receives), with nothing done to them."""
        df = spark.read.parquet(str(landing)).withColumn("log_partition", F.pmod(F.hash("key"), F.lit(8)))
        df.mapInArrow(_count_batches, "rows long").collect()

    times, refs, partitioned, handoffs, stages = [], [], [], [], []
    for i in range(3):
        LogTable.create(cat, f"bench.spark{i}", partitions=8)
        marks = [(time.perf_counter(), "start")]
        times.append(
            timed(
                lambda i=i, marks=marks: ingest(
                    spark,
                    f"bench.spark{i}",
                    str(landing),
                    f"run{i}",
                    catalog_name="sparkbench",
                    progress=lambda line: marks.append((time.perf_counter(), line)),
                )
            )
        )
        marks.append((time.perf_counter(), "done"))
        stages.append(_ingest_stages(marks))
        refs.append(timed(lambda i=i: spark.read.parquet(str(landing)).write.mode("overwrite").parquet(str(root / f"plain{i}"))))
        partitioned.append(timed(lambda i=i: by_partition(i)))
        handoffs.append(timed(handoff))
    assert LogTable(cat, "bench.spark0").state().watermarks[0].end > 0
    record(
        f"Spark ingest of {rows:,} narrow rows (median of 3)",
        rows / statistics.median(times) / 1e6,
        "Mrows/s",
        "df.write.partitionBy(log partition) of the same DataFrame",
        rows / statistics.median(partitioned) / 1e6,
        Target("ratio", ">=", 0.8),
    )
    record(
        f"Spark ingest of {rows:,} narrow rows, against a plain write",
        rows / statistics.median(times) / 1e6,
        "Mrows/s",
        "plain df.write.parquet of the same DataFrame (one file per task)",
        rows / statistics.median(refs) / 1e6,
    )
    record(
        "Spark: the Arrow hand-off to Python workers alone",
        rows / statistics.median(handoffs) / 1e6,
        "Mrows/s",
        "df.write.partitionBy(log partition), same run",
        rows / statistics.median(partitioned) / 1e6,
    )
    for stage in stages[0]:
        record(
            f"Spark ingest stage: {stage} (median of 3)",
            statistics.median(s[stage] for s in stages),
            "s",
            "the whole ingest",
            statistics.median(times),
        )
    spark.stop()


def _count_batches(batches: Any) -> Any:
    """A mapInArrow function that only receives its task's batches (module level: picklable)."""
    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))


def _ingest_stages(marks: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds per stage of one ingest, from its progress lines (``pass 1: ...`` starts pass 1)."""
    names = {
        "loading": "read schemas and set up",
        "pass 1": "pass 1 (count)",
        "pass 2": "pass 2 (number and write)",
        "committing": "commit",
    }
    stages: dict[str, float] = {}
    for (start, line), (end, _) in itertools.pairwise(marks):
        name = next((v for k, v in names.items() if line.startswith(k)), "list, plan and the rest")
        stages[name] = stages.get(name, 0.0) + end - start
    return stages


def bench_spark_scale(root: Path, rows: int) -> None:
    """The Spark ingest path on ``rows`` generated rows: time, and the peak resident memory of
    the Python driver and of the Spark JVM (driver and executors: local mode), sampled from
    /proc during the ingest (not ``ru_maxrss``: in a full run that is the whole bench's peak)."""
    import threading

    from icelog.pipelines.ingest import ingest
    from icelog.pipelines.spark import spark_session
    from icelog.storage.core.catalog import LogSqlCatalog
    from tests.support.quality_bench import tree_rss_mb

    landing = root / "scale-landing"
    landing.mkdir(parents=True)
    files, per_file = 32, rows // 32
    for f in range(files):  # one file at a time: the generator's memory stays bounded
        n = np.arange(f * per_file, (f + 1) * per_file)
        pq.write_table(
            pa.table({"key": pa.array(np.char.add("k", (n % 100_000).astype(str))), "value": pa.array(n)}),
            landing / f"part-{f:03d}.parquet",
        )
        del n
    os.environ["PYICEBERG_CATALOG__SCALE__URI"] = f"sqlite:///{root / 'scale.db'}"
    os.environ["PYICEBERG_CATALOG__SCALE__WAREHOUSE"] = f"file://{root / 'scale-wh'}"
    (root / "scale-wh").mkdir()
    cat = LogSqlCatalog(
        "scale", uri=os.environ["PYICEBERG_CATALOG__SCALE__URI"], warehouse=os.environ["PYICEBERG_CATALOG__SCALE__WAREHOUSE"]
    )
    LogTable.create(
        cat, "bench.scale", partitions=8, payload=[{"name": "key", "type": "string"}, {"name": "value", "type": "long"}]
    )
    spark = spark_session("local[*]", "icelog-bench-scale")
    me = os.getpid()
    peak = {"jvm": 0.0, "driver": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            own = (
                int(
                    next(
                        line.split()[1]
                        for line in Path(f"/proc/{me}/status").read_text().splitlines()
                        if line.startswith("VmRSS:")
                    )
                )
                / 1024
            )
            peak["jvm"], peak["driver"] = max(peak["jvm"], tree_rss_mb(me) - own), max(peak["driver"], own)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    seconds = timed(lambda: ingest(spark, "bench.scale", str(landing), "scale", catalog_name="scale"))
    done.set()
    sampler.join()
    driver_mb = peak["driver"]
    assert sum(w.end for w in LogTable(cat, "bench.scale").watermarks().values()) == files * per_file
    record(
        f"Spark ingest of {files * per_file:,} generated rows",
        files * per_file / seconds / 1e6,
        "Mrows/s",
        f"{seconds:.0f} s; peak RSS: Python driver {driver_mb:,.0f} MiB, Spark JVM {peak['jvm']:,.0f} MiB",
    )
    spark.stop()


def bench_ledger(root: Path, entries: int, commits: int) -> None:
    """Ingest-ledger lookups (skip decisions of one run) with ``entries`` entries for the table."""
    from icelog.storage.core.commit import commit_tables
    from icelog.storage.ingest import ledger
    from icelog.storage.log.files import write_log_files

    cat = catalog(root, "ledger")
    ledger.ensure_ledger(cat)
    per = entries // commits
    for c in range(commits):
        files = [
            ledger.SourceFile(f"/landing/t/date={c:05d}/part-{i:04d}.parquet", 1000 + i, 10**18 + i, f"sha256:{c:05d}{i:04d}")
            for i in range(per)
        ]
        rows = ledger.ledger_rows(
            "bench.t", files, {f.path: {0: [[0, 10]]} for f in files}, {f.path: {0} for f in files}, 1, f"run{c}", f"commit{c}"
        )
        book = cat.load_table(ledger.LEDGER_TABLE)
        commit_tables(
            cat, [(ledger.LEDGER_TABLE, ledger.LedgerAppend(tuple(write_log_files(book, {"bench.t": rows})), rows.num_rows))]
        )
    day = [ledger.SourceFile(f"/landing/t/date={commits // 2:05d}/part-{i:04d}.parquet", 1000 + i, 10**18 + i) for i in range(50)]
    day += [ledger.SourceFile(f"/landing/t/date=late/new-{i}.parquet", 1, 1, "sha256:x") for i in range(2)]

    def lookup():
        book = cat.load_table(ledger.LEDGER_TABLE)
        found = ledger.entries(book, "bench.t", [f.path for f in day])
        planned = ledger.plan("bench.t", day, found, {0})
        assert len(planned.skipped) == 50 and len(planned.load) == 2

    samples = [timed(lookup) for _ in range(5)]
    record(
        f"ingest-ledger lookup of a 52-file day, {entries:,} entries (p50)",
        statistics.median(samples) * 1000,
        "ms",
        "",
        None,
        Target("value", "<", 2000, "fast: well under a Spark job's start of 10–20 s"),
    )


def bench_gx(root: Path) -> None:
    from icelog.pipelines.flights import create_table, load_flights
    from icelog.validations.quality import run_suite

    cat = catalog(root / "gx")
    table, _ = create_table(cat)
    flights = load_flights()
    table.append({p: flights.slice(p * 42_097, 42_097) for p in range(8)})
    # full=True: otherwise a second pass validates only the rows committed since the first (none).
    elapsed = timed(lambda: run_suite(table.table(), docs_root=root / "gx-docs", full=True))
    started = time.perf_counter()
    second = run_suite(table.table(), docs_root=root / "gx-docs", full=True)
    again = time.perf_counter() - started
    assert second.scope["rows"] == flights.num_rows, second.scope
    record(
        f"GX suite on {flights.num_rows:,} flights rows (first run, incl. import)",
        elapsed,
        "s",
        "second run, same process",
        again,
    )


def bench_transactions(root: Path, samples: int, concurrent_txns: int) -> None:
    """Commit latency of 2- and 10-table transactions beside a single conditional append; throughput."""
    from icelog.storage.producers.transactional import TransactionalProducer

    cat = catalog(root / "txn")
    tables = [LogTable.create(cat, f"bench.t{i}", partitions=4) for i in range(10)]
    one = batch(1)
    single = []
    for _ in range(samples):
        end = tables[0].watermarks()[0].end
        single.append(timed(lambda end=end: tables[0].append({0: one}, {0: end})))
    s50, s95 = pcts(single)
    record("single-table conditional append (1 row): p50", s50, "ms", "", None)
    producer = TransactionalProducer(cat, "bench")
    producer.init_transactions()
    for width in (2, 10):
        lat, whole = [], []
        for _ in range(samples):
            began = time.perf_counter()
            producer.begin_transaction()
            for t in tables[:width]:
                producer.send(t.identifier, 0, one)
            lat.append(timed(producer.commit_transaction))
            whole.append((time.perf_counter() - began) * 1000)
        p50, p95 = pcts(lat)
        record(
            f"{width}-table transaction commit: p50",
            p50,
            "ms",
            "single conditional append p50",
            s50,
            Target("ratio", "<=", 2.0 if width == 2 else 6.0),  # the SQL fast path's targets
        )
        record(f"{width}-table transaction commit: p95", p95, "ms", "single conditional append p95", s95)
        if width == 2:
            record(
                "2-table transaction, begin to commit: p50",
                statistics.median(whole),
                "ms",
                "single conditional append p50",
                s50,
                Target("ratio", "<=", 2.5),
            )
    started = time.perf_counter()
    for _ in range(samples):
        with producer.transaction():
            producer.send(tables[0].identifier, 1, one)
            producer.send(tables[1].identifier, 1, one)
    sequential = samples / (time.perf_counter() - started)
    record("small 2-table transactions, sequential", sequential, "txn/s", "", None)
    spec = json.dumps({"uri": str(cat.properties["uri"]), "warehouse": str(cat.properties["warehouse"])})
    procs = [subprocess.Popen([sys.executable, "-c", _TXN_WORKER, spec, str(i), str(concurrent_txns)]) for i in range(4)]
    started = time.perf_counter()
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - started
    assert codes == [0, 0, 0, 0], codes
    record(
        "small 2-table transactions, 4 producers, disjoint partitions",
        4 * concurrent_txns / elapsed,
        "txn/s",
        "sequential, same run",
        sequential,
    )


# One transactional producer process: N transactions on partition i of two tables.
_TXN_WORKER = """
import json, sys
from icelog.storage.core.catalog import LogSqlCatalog
from icelog.storage.producers.transactional import TransactionalProducer
import pyarrow as pa
spec, i, n = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cat = LogSqlCatalog("bench", uri=spec["uri"], warehouse=spec["warehouse"])
producer = TransactionalProducer(cat, f"bench-{i}")
producer.init_transactions()
row = pa.table({"key": ["k"], "value": ["v"]})
for _ in range(n):
    with producer.transaction():
        producer.send("bench.t2", i, row)
        producer.send("bench.t3", i, row)
"""


def _read_bytes() -> int:
    """Bytes this process read through read()/pread() so far (page cache or disk alike)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def bench_key_range(root: Path, rows: int) -> None:
    """A consumer reading one quarter of the key-hash space of a partition, beside reading it all."""
    from icelog.storage.groups.consumer import Consumer

    cat = catalog(root / "keyrange")
    t = LogTable.create(cat, "bench.keys", 1)
    per = rows // 4
    for i in range(4):
        n = np.arange(i * per, (i + 1) * per)
        t.append(
            {0: pa.table({"key": np.char.add("user-", (n % 5_000).astype(str)), "value": np.char.add("v" * 33, n.astype(str))})}
        )

    def read(key_range: tuple[int, int] | None) -> tuple[float, int, int]:
        consumer = Consumer(cat, "bench")
        consumer.assign("bench.keys", [0], key_range=key_range)
        before, started = _read_bytes(), time.perf_counter()
        got = sum(b.num_rows for b in consumer.poll(rows))
        return time.perf_counter() - started, _read_bytes() - before, got

    whole = [read(None) for _ in range(3)]
    quarter = [read((0, 16383)) for _ in range(3)]
    w_s, q_s = statistics.median(r[0] for r in whole), statistics.median(r[0] for r in quarter)
    w_b, q_b = statistics.median(r[1] for r in whole), statistics.median(r[1] for r in quarter)
    label = f"{rows:,} rows, 4 files; quarter = {quarter[0][2]:,} rows"
    record(
        f"key-range read, 1/4 of hash space: bytes ({label})",
        q_b / 1e6,
        "MB",
        "whole-partition read",
        w_b / 1e6,
        Target("ratio", "<=", 0.3),
    )
    record(
        "key-range read, 1/4 of hash space: time (median of 3)",
        q_s * 1000,
        "ms",
        "whole-partition read",
        w_s * 1000,
        Target("ratio", "<=", 0.4),
    )


def bench_mirror(root: Path, files: int, rows_per_file: int) -> None:
    """The mirror: one incremental step on a table of ``files`` tiny files, and the bulk
    first step of 16 files beside ``cp -r`` of them, alternated, medians of 4. The tables come from the
    mirror benchmarks' builders (``tests/support/mirror_bench.py``)."""
    from icelog.storage.replication.mirror import mirror
    from tests.support.mirror_bench import PRINCIPAL, catalogs, fill

    source, target = catalogs(root / "mirror-steps")
    orders = fill(source, "orders", 4, files // 4, 10)
    first = mirror(source, "orders", target, principal=PRINCIPAL)
    orders.append({1: [{"key": "new", "value": "v"}]})
    started = time.perf_counter()
    step = mirror(source, "orders", target, principal=PRINCIPAL)
    seconds = time.perf_counter() - started
    assert first.copied_files == files and step.incremental and step.copied_files == 1
    record(
        f"mirror: incremental step after one small commit, {files:,} files",
        seconds * 1000,
        "ms",
        f"first mirror of the {files:,} files",
        first.seconds * 1000,
        Target("value", "<", 2000),
    )

    source, target = catalogs(root / "mirror-bulk")
    data = Path(
        fill(source, "bulk", 4, 4, rows_per_file, payload_bytes=32).table().metadata.location.removeprefix("file://"), "data"
    )
    size_mb = sum(f.stat().st_size for f in data.rglob("*.parquet")) / 1e6

    # Alternated, medians of 4: both are mostly the kernel copying (copy_file_range), so each run's time
    # follows the page cache and the writeback of the runs before it (one cp took 0.33 s, the
    # next 3.6 s); a best of 2 swung 0.51-0.97x between runs. The order flips every run, and each
    # step starts after a sync, so that neither runs beside the other's writeback.
    def copy_with_cp(run: int) -> None:
        subprocess.run(["cp", "-r", str(data), str(root / f"mirror-cp{run}")], check=True)

    def copy_with_mirror(run: int) -> None:
        mirror(source, "bulk", target, f"logs.bulk{run}", principal=PRINCIPAL)

    cp_s: list[float] = []
    mirror_s: list[float] = []
    pairs = [(cp_s, copy_with_cp), (mirror_s, copy_with_mirror)]
    for run in range(4):
        for times, step in pairs if run % 2 == 0 else pairs[::-1]:
            os.sync()
            times.append(timed(functools.partial(step, run)))
        shutil.rmtree(root / f"mirror-cp{run}")  # (disk space)
    record(
        f"bulk mirror, first step of {size_mb:,.0f} MB in 16 files (median of 4)",
        size_mb / statistics.median(mirror_s),
        "MB/s",
        "cp -r of the same data files, median of 4, alternated",
        size_mb / statistics.median(cp_s),
        Target("ratio", ">=", 0.7),
    )


def bench_quality(root: Path, rows: int, increment: int, engines: list[str]) -> None:
    """GX validation, each run in a fresh process (``tests/support/quality_bench.py``):
    full on each engine, then incremental after one ``increment``-row commit; Spark beside pandas."""
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.support.quality_bench import build_increment, build_table, run_child

    workdir = root / "quality"
    workdir.mkdir()
    table = build_table(SqlCatalog("bench", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}/warehouse"), rows)
    full = {engine: run_child(workdir, engine, full=True) for engine in engines}
    table.append({0: build_increment(increment)})
    incremental = {engine: run_child(workdir, engine, full=False) for engine in engines}
    assert all(r["success"] for r in [*full.values(), *incremental.values()])
    for engine in engines:
        record(
            f"GX validation ({engine}), incremental: {increment:,}-row commit on {rows:,} rows",
            incremental[engine]["seconds"],
            "s",
            f"full validation ({engine})",
            full[engine]["seconds"],
        )
    if "spark" in full and "pandas" in full:
        record(
            f"GX validation on Spark, full, {rows:,} rows",
            full["spark"]["seconds"],
            "s",
            "pandas (DuckDB → pandas), same rows",
            full["pandas"]["seconds"],
        )
        record(
            "GX validation on Spark, full: peak RSS (Python + JVM)",
            full["spark"]["peak_rss_mb_process_tree"],
            "MB",
            "pandas, same rows",
            full["pandas"]["peak_rss_mb_process_tree"],
        )


class Unavailable(Exception):
    """A bench whose module has not landed yet."""


def _append_until(spec: dict, stop: Any, name: str) -> None:
    """A process appending single rows back to back until ``stop`` is set (commit pressure)."""
    log_table = LogTable(LogSqlCatalog("bench", **spec), "bench.hot")
    n = 0
    while not stop.is_set():
        log_table.append({0: [{"key": name, "value": f"{name}-{n}"}]})
        n += 1


def bench_compaction_contention(root: Path, files: int, runs: int) -> None:
    """Compaction of ``files`` small files while two processes append back to back (without
    the commit core's lease it would lose every race), beside the same compaction alone."""
    import multiprocessing

    from icelog.storage.core.commit import commit
    from icelog.storage.log.maintenance import Compaction

    contended, alone, attempts = [], [], []
    for run in range(runs):
        for kind in ("alone", "contended"):
            directory = root / f"compaction-{kind}-{run}"
            cat = catalog(directory)
            t = LogTable.create(cat, "bench.hot", partitions=1)
            for i in range(files):
                t.append({0: [{"key": "k", "value": f"v{i}"}]})
            context = multiprocessing.get_context("spawn")  # no forked catalog connections
            stop = context.Event()
            spec = {"uri": f"sqlite:///{directory / 'catalog.db'}", "warehouse": f"file://{directory / 'warehouse'}"}
            procs = [
                context.Process(target=_append_until, args=(spec, stop, f"w{i}")) for i in range(2 if kind == "contended" else 0)
            ]
            for proc in procs:
                proc.start()
            while kind == "contended" and t.watermarks()[0].end < files + 20:  # both appending
                time.sleep(0.05)
            started = time.perf_counter()
            outcome = commit(cat, "bench.hot", Compaction("bench.hot"), max_attempts=30)
            (contended if kind == "contended" else alone).append(time.perf_counter() - started)
            if kind == "contended":
                attempts.append(outcome.attempts)
            stop.set()
            for proc in procs:
                proc.join()
            assert outcome.result["rewritten_files"] >= files and check_contiguity(t.table(), deep=True).ok
    record(
        f"compaction of {files} small files beside 2 processes appending back to back (median of {runs}; attempts {attempts})",
        1000 * statistics.median(contended),
        "ms",
        "the same compaction alone",
        1000 * statistics.median(alone),
        Target("value", "<", 10_000, "lands: before the lease, 30 lost races in 88 s"),
    )


def bench_cli(root: Path, runs: int) -> None:
    """The read-only commands' start-up on SQLite, PostgreSQL and REST: ``tests/bench/cli.py``."""
    from tests.bench.cli import bench_cli as bench

    bench(root, runs, record)


def bench_state_scale_when_present(root: Path, quick: bool) -> None:
    """Producer and partition state at scale (``tests/bench/state_scale.py``, being written)."""
    try:
        from tests.bench.state_scale import bench_state_scale
    except ModuleNotFoundError as missing:
        if missing.name != "tests.bench.state_scale":
            raise
        raise Unavailable("tests/bench/state_scale.py is not there yet") from None
    (root / "state-scale").mkdir()
    bench_state_scale(root / "state-scale", quick, record)


def bench_rest_on_s3(root: Path, quick: bool) -> None:
    """icelog on an Iceberg REST catalog over S3 (a throwaway SeaweedFS server): ``tests/bench/rest.py``."""
    from tests.bench.rest import bench_rest

    bench_rest(root, quick, record)


def benches(root: Path, q: bool) -> dict[str, Callable[[], None]]:
    """Every bench by its ``--only`` name, at full or ``--quick`` sizes, in the order a full run takes."""
    return {
        "latency": lambda: bench_metadata_check(
            bench_append_latency(root, [10, 100] if q else [10, 1_000, 10_000], 10 if q else 50)
        ),
        "idempotent": lambda: bench_idempotent_overhead(root, 10 if q else 100),
        "producer-state": lambda: bench_producer_state(root, 20 if q else 1_000, 200 if q else 10_000),
        "bulk": lambda: bench_bulk(root, 200_000 if q else 5_000_000),
        "validation": lambda: bench_validation(root, 4_000_000 if q else 100_000_000),
        "gx": lambda: bench_gx(root),
        "transactions": lambda: bench_transactions(root, 10 if q else 100, 5 if q else 50),
        "spark": lambda: bench_spark_ingest(root, 400_000 if q else 10_000_000),
        "ledger": lambda: bench_ledger(root, 2_000 if q else 100_000, 10 if q else 100),
        "spark-scale": lambda: bench_spark_scale(root, 320_000 if q else 100_000_000),
        "key-range": lambda: bench_key_range(root, 200_000 if q else 2_000_000),
        "mirror": lambda: bench_mirror(root, 400 if q else 10_000, 20_000 if q else 3_000_000),
        # --quick skips Spark here: make test-slow runs the small Spark validation.
        "quality": lambda: bench_quality(
            root, 100_000 if q else 10_000_000, 10_000 if q else 1_000_000, ["pandas"] if q else ["pandas", "spark"]
        ),
        "state-scale": lambda: bench_state_scale_when_present(root, q),
        "compaction": lambda: bench_compaction_contention(root, 30 if q else 50, 1 if q else 3),
        "cli": lambda: bench_cli(root / "cli", 3 if q else 15),
        "rest": lambda: bench_rest_on_s3(root, q),
    }


def run_info(chosen: list[str]) -> dict[str, Any]:
    """Where and when: the header of the generated section and of the JSON."""
    repo = Path(__file__).resolve().parents[2]
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "--short", "HEAD") + (
        " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    )
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("pyiceberg", "pyarrow", "duckdb", "pyspark"))
    return {
        "command": shlex.join(["python", "-m", "tests.bench.run", *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg(),
        "versions": f"Python {platform.python_version()}, {versions}",
        "benches": chosen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run, not figures (never written to BENCHMARKS.md)"
    )
    parser.add_argument("--out", default="bench-results/latest.json")
    parser.add_argument("--only", default="", help="comma-separated names: " + ",".join(benches(Path(), False)))
    parser.add_argument(
        "--write-md",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replace the generated section of --md (default: on for a full run of every bench)",
    )
    parser.add_argument("--md", type=Path, default=Path(__file__).resolve().parents[2] / "BENCHMARKS.md")
    args = parser.parse_args()
    if args.quick and args.write_md:
        parser.error("--quick figures are smoke sizes: they never go into BENCHMARKS.md (--out writes the JSON)")
    write_md = args.write_md if args.write_md is not None else not (args.quick or args.only)
    root = Path(tempfile.mkdtemp(prefix="icelog-bench-"))
    available = benches(root, args.quick)
    chosen = args.only.split(",") if args.only else list(available)
    if unknown := set(chosen) - set(available):
        parser.error(f"unknown bench {sorted(unknown)}; choose from {','.join(available)}")
    info = run_info(chosen)
    failed, info["unavailable"] = [], []
    print(f"{'figure':<58} {'value':>12} {'unit':<7} | reference (same run)")
    try:
        for name in chosen:
            try:
                available[name]()
            except Unavailable as why:
                print(f"{name}: not available ({why})", flush=True)
                info["unavailable"].append(name)
            except Exception:  # the other benches still run; the exit code says it
                traceback.print_exc()
                failed.append(name)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    info["load_end"], info["failed"] = os.getloadavg(), failed
    print("\n" + ("--quick: smoke sizes, not figures\n" if args.quick else "") + render_table(RESULTS))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"quick": args.quick, **info, "results": [f.as_json() for f in RESULTS]}, indent=2))
    print(f"wrote {args.out}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (BENCHMARKS.md not written)")
    if write_md:
        args.md.write_text(replace_section(args.md.read_text(), render_section(RESULTS, info)))
        print(f"wrote the generated section of {args.md}")


if __name__ == "__main__":
    main()

"""Produce through ``icelog serve`` vs ``LogTable.append``: throughput and acknowledgement latency.

confluent-kafka sends 100-byte records idempotently (``linger.ms=5``, ``acks=all``) to a gateway on a
fresh SQLite catalog; every acknowledgement comes after the Iceberg commit. The reference appends the
same records in-process with ``LogTable.append``, in batches of the size the gateway's commits had
(the median of five runs).
The gateway's cost is its process's CPU time per record against ``LogTable.append``'s: on 2 cores
the client's own per-record Python work (``produce()``, a delivery callback) shares the machine
and bounds the wall throughput, so records/s is the client and gateway together.
Not part of ``make bench`` yet: ``python -m tests.bench.gateway_produce [--records N] [--linger-ms MS ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from icelog.pipelines.gateway.records import Batch
from icelog.pipelines.gateway.topics import batch_rows, create_topic
from icelog.storage.log.table import LogTable
from tests.support.catalogs import CatalogSpec

ROOT = Path(__file__).resolve().parents[2]
VALUE = b"x" * 100
PACED_RATE, PACED_SECONDS = 2_000, 5  # records/s, seconds


def _spec(directory: Path, name: str) -> CatalogSpec:
    (directory / "warehouse").mkdir(parents=True)
    return CatalogSpec("sqlite", name, f"sqlite:///{directory / 'catalog.db'}", f"file://{directory / 'warehouse'}")


def through_gateway(directory: Path, records: int, linger_ms: float) -> dict:
    from confluent_kafka import Producer

    spec = _spec(directory, "bench")
    create_topic(spec.open(), "db.bench", 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "icelog.pipelines.cli", "serve", "--output", "json", "--port", "0", "--linger-ms", str(linger_ms)],
        stdout=subprocess.PIPE,
        env=spec.env(),
        cwd=ROOT,
    )
    try:
        port = json.loads(proc.stdout.readline())["port"]
        producer = Producer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True, "acks": "all", "linger.ms": 5, "log_level": 0}
        )
        producer.produce("db.bench", value=VALUE, partition=0)  # the producer id and the first commit, not timed
        producer.flush(60)
        before = len(LogTable.open(spec.open(), "db.bench").table().metadata.snapshots)
        latencies: list[float] = []
        cpu_before = _cpu_seconds(proc.pid)
        started = time.perf_counter()
        for _ in range(records):
            sent = time.perf_counter()
            producer.produce(
                "db.bench", value=VALUE, partition=0, on_delivery=lambda e, m, s=sent: latencies.append(time.perf_counter() - s)
            )
            producer.poll(0)
        assert producer.flush(300) == 0
        seconds = time.perf_counter() - started
        gateway_cpu = _cpu_seconds(proc.pid) - cpu_before
        commits = len(LogTable.open(spec.open(), "db.bench").table().metadata.snapshots) - before
        # Paced: the latency of an acknowledgement when the client is not queueing behind itself.
        paced: list[float] = []
        start = time.perf_counter()
        for i in range(PACED_RATE * PACED_SECONDS):
            while time.perf_counter() < start + i / PACED_RATE:
                producer.poll(0.0005)
            sent = time.perf_counter()
            producer.produce(
                "db.bench", value=VALUE, partition=0, on_delivery=lambda e, m, s=sent: paced.append(time.perf_counter() - s)
            )
        assert producer.flush(300) == 0
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()
    latencies.sort()
    paced.sort()
    return {
        "paced_p50_ms": 1000 * statistics.median(paced),
        "paced_p99_ms": 1000 * paced[int(0.99 * (len(paced) - 1))],
        "records_per_s": records / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "commits": commits,
        "records_per_commit": records / max(commits, 1),
        "cpu_us_per_record": 1e6 * gateway_cpu / records,
    }


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid``, all its threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


REFERENCE_RUNS = 5  # one run of ~10 appends swung 2x from run to run; the median of five is steadier


def through_append(directory: Path, records: int, batch: int) -> dict:
    """``LogTable.append`` of the same records in ``batch``-sized appends: the median of
    ``REFERENCE_RUNS`` runs, each on a table of its own."""
    catalog = _spec(directory, "direct").open()
    now = int(time.time() * 1000)
    keys, values = pa.nulls(batch, pa.large_binary()), pa.array([VALUE] * batch, pa.large_binary())
    rows: pa.Table = batch_rows(Batch(0, 0, -1, -1, -1, keys, values, None, np.full(batch, now)))
    appends = max(records // batch, 1)
    runs = []
    for run in range(REFERENCE_RUNS):
        log_table = create_topic(catalog, f"db.bench{run}", 1)
        log_table.append({0: rows.slice(0, 1)})
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(appends):
            log_table.append({0: rows})
        runs.append((time.perf_counter() - started, time.process_time() - cpu))
    appended = appends * batch
    seconds = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    return {"records_per_s": appended / seconds, "cpu_us_per_record": 1e6 * cpu / appended, "batch": batch}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--linger-ms", type=float, nargs="+", default=[5.0, 20.0])
    args = parser.parse_args()
    for linger in args.linger_ms:
        with tempfile.TemporaryDirectory() as tmp:
            gw = through_gateway(Path(tmp) / "gw", args.records, linger)
            direct = through_append(Path(tmp) / "direct", args.records, max(int(gw["records_per_commit"]), 1))
        ratio = gw["cpu_us_per_record"] / direct["cpu_us_per_record"]
        print(
            f"window {linger:g} ms: gateway {gw['records_per_s']:,.0f} records/s, ack p50 {gw['p50_ms']:.0f} ms, "
            f"p99 {gw['p99_ms']:.0f} ms (paced at {PACED_RATE}/s: p50 {gw['paced_p50_ms']:.0f} ms, p99 {gw['paced_p99_ms']:.0f} ms), "
            f"{gw['commits']} commits ({gw['records_per_commit']:,.0f} records each); "
            f"LogTable.append in batches of {direct['batch']:,}: {direct['records_per_s']:,.0f} records/s; "
            f"CPU per record: gateway process {gw['cpu_us_per_record']:.1f} us, LogTable.append {direct['cpu_us_per_record']:.1f} us; "
            f"gateway cost {ratio:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()

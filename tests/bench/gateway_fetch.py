"""Fetch through ``icelog serve`` vs DuckDB reading the same rows from the Iceberg table.

N records of 100 bytes are appended to one partition of a fresh SQLite catalog with
``LogTable.append`` (in batches, as a producer's commits land). confluent-kafka then reads them
all from offset 0 through a gateway (``consume()`` in batches of 1,000, ``read_committed``); the
reference is DuckDB reading the same rows (offset, key, value, headers, record timestamp) from
the table's data files, in the same run. Both timings include opening: the consumer's bootstrap
and the files' planning. On 2 cores the consumer's own Python work shares the machine with the
gateway, so records/s is the client and gateway together.
Not part of ``make bench`` yet: ``python -m tests.bench.gateway_fetch [--records N]`` (figures in BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from icelog.pipelines.gateway.records import decode_batches, encode_batch
from icelog.pipelines.gateway.topics import batch_rows, create_topic
from icelog.storage.log.scan import planned_paths
from icelog.storage.log.table import LogTable
from tests.bench.gateway_produce import ROOT, VALUE, _cpu_seconds, _spec

APPEND_BATCH = 10_000


def fill(spec, records: int) -> None:
    log_table = create_topic(spec.open(), "db.bench", 1)
    now = int(time.time() * 1000)
    for start in range(0, records, APPEND_BATCH):
        n = min(APPEND_BATCH, records - start)
        # Through the wire format, as a producer's batch arrives (the rows of the Kafka record schema).
        (batch,) = decode_batches(encode_batch(0, [(i, now, f"k{start + i}".encode(), VALUE, ()) for i in range(n)]))
        log_table.append({0: batch_rows(batch)})


def through_gateway(spec, records: int) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    proc = subprocess.Popen(
        [sys.executable, "-m", "icelog.pipelines.cli", "serve", "--output", "json", "--port", "0"],
        stdout=subprocess.PIPE,
        env=spec.env(),
        cwd=ROOT,
    )
    try:
        port = json.loads(proc.stdout.readline())["port"]
        consumer = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "group.id": "bench",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.max.bytes": 64 << 20,
                "log_level": 0,
            }
        )
        cpu_before = _cpu_seconds(proc.pid)
        started = time.perf_counter()
        consumer.assign([TopicPartition("db.bench", 0, 0)])
        got, last = 0, -1
        while got < records:
            for msg in consumer.consume(1000, 1.0):
                assert msg.error() is None, msg.error()
                assert msg.offset() == last + 1
                last = msg.offset()
                got += 1
        seconds = time.perf_counter() - started
        gateway_cpu = _cpu_seconds(proc.pid) - cpu_before
        consumer.close()
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()
    return {"records_per_s": records / seconds, "seconds": seconds, "cpu_us_per_record": 1e6 * gateway_cpu / records}


def through_duckdb(spec, records: int) -> dict:
    started = time.perf_counter()
    paths = planned_paths(LogTable.open(spec.open(), "db.bench").table())
    rows = duckdb.sql(
        f"SELECT log_offset, key, value, headers, record_timestamp FROM read_parquet({paths!r}) ORDER BY log_offset"
    ).to_arrow_table()
    seconds = time.perf_counter() - started
    assert rows.num_rows == records
    return {"records_per_s": records / seconds, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(Path(tmp) / "cat", "bench")
        fill(spec, args.records)
        gw = through_gateway(spec, args.records)
        db = through_duckdb(spec, args.records)
    print(
        f"fetch {args.records:,} records of {len(VALUE)} bytes: gateway + confluent-kafka {gw['records_per_s']:,.0f} records/s "
        f"({gw['seconds']:.2f} s, gateway CPU {gw['cpu_us_per_record']:.1f} us/record); "
        f"DuckDB from the Iceberg files {db['records_per_s']:,.0f} records/s ({db['seconds']:.2f} s); "
        f"DuckDB / gateway {db['records_per_s'] / gw['records_per_s']:.1f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()

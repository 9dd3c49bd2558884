"""Files left on disk by lost races: writers contend on one table, no maintenance runs.

``python -m tests.bench.lost_races [--commits 1500] [--writers 3]``: each writer process keeps one
``LogTable`` (its cached base) and makes conditional appends, re-reading the log end after each
``OffsetMismatch`` as a key-value store's leader does. At the end it prints, as JSON, the commits
that landed, the mismatches, and the files under the table: data files no snapshot references,
and Avro files (manifests and manifest lists) and metadata files per landed commit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from icelog.storage.core.catalog import LogSqlCatalog
from icelog.storage.errors import OffsetMismatch
from icelog.storage.log.files import local_path
from icelog.storage.log.table import LogTable

TABLE = "bench.contended"


def _catalog(root: str) -> LogSqlCatalog:
    return LogSqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def _writer(root: str, commits: int, out: multiprocessing.Queue) -> None:
    table = LogTable(_catalog(root), TABLE)
    landed = mismatches = 0
    end = table.state().end(0)
    while landed < commits:
        try:
            result = table.append({0: [{"key": str(os.getpid()), "value": str(landed)}]}, expected_offsets={0: end})
        except OffsetMismatch as e:
            mismatches += 1
            end = e.actual
            continue
        landed += 1
        end = result.ranges[0][1]
    out.put({"landed": landed, "mismatches": mismatches})


def run(commits: int, writers: int) -> dict:
    root = tempfile.mkdtemp(prefix="icelog-lost-races-")
    LogTable.create(_catalog(root), TABLE, 1, properties={"icelog.snapshots.keep": "10"})
    queue: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    procs = [ctx.Process(target=_writer, args=(root, commits // writers, queue)) for _ in range(writers)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - started
    table = LogTable(_catalog(root), TABLE).table()
    location = Path(local_path(table.metadata.location))
    referenced = {local_path(t.file.file_path) for t in table.scan().plan_files()}
    data = [str(p) for p in (location / "data").rglob("*.parquet")]
    landed = sum(r["landed"] for r in results)
    return {
        "commits": landed,
        "writers": writers,
        "mismatches": sum(r["mismatches"] for r in results),
        "seconds": round(elapsed, 1),
        "data_files": len(data),
        "unreferenced_data_files": sum(1 for p in data if p not in referenced),
        "avro_files_per_commit": round(len(list((location / "metadata").glob("*.avro"))) / landed, 2),
        "metadata_json_per_commit": round(len(list((location / "metadata").glob("*.metadata.json"))) / landed, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1500)
    parser.add_argument("--writers", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.commits, args.writers)))

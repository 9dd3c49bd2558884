"""Benchmark: GX validation on Spark against pandas, full against incremental.

Run: ``python -m tests.support.quality_bench ROWS [--engine spark|pandas] [--increment N]``.
Each measurement runs in a fresh process so that peak memory (this process and its children,
the Spark JVM among them) belongs to it alone. ``make test-slow`` runs a small version
(``tests/validations/test_quality_bench.py``); ``python -m tests.bench.run --only quality`` records it.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 5_000_000


def build_table(catalog, rows: int, partitions: int = 4):
    import numpy as np
    import pyarrow as pa

    from icelog.storage.log.table import LogTable

    table = LogTable.create(catalog, "bench.events", partitions=partitions)
    per = rows // partitions
    for p in range(partitions):
        done = 0
        while done < per:
            n = min(CHUNK, per - done)
            keys = pa.array(np.char.add("k", (np.arange(done, done + n) % 1000).astype(str)))
            table.append({p: pa.table({"key": keys, "value": keys})})
            done += n
    return table


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (the Spark JVM is one), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, StopIteration):
            continue
    return total


class PeakMemory:
    """Samples the process tree's resident memory every 0.2 s; ``peak_mb`` is the highest seen."""

    def __init__(self) -> None:
        import os
        import threading

        self.peak_mb, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(os.getpid(),), daemon=True)
        self._thread.start()

    def _run(self, pid: int) -> None:
        while not self._stop.wait(0.2):
            self.peak_mb = max(self.peak_mb, tree_rss_mb(pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def measure(workdir: Path, engine: str, *, full: bool) -> dict:
    """One validation in this process (called in a child process by :func:`main`)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from icelog.validations.quality import run_suite

    catalog = SqlCatalog("bench", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}/warehouse")
    table = catalog.load_table("bench.events")
    spark = None
    if engine == "spark":
        from icelog.pipelines.spark import spark_session

        spark = spark_session("local[2]", "icelog-bench", {"spark.driver.memory": "4g"})
    peak = PeakMemory()
    started = time.perf_counter()
    result = run_suite(table, docs_root=workdir / f"gx-{engine}", full=full, engine=engine, spark=spark)
    seconds = time.perf_counter() - started
    tree_mb = peak.stop()
    if spark is not None:
        spark.stop()
        spark.sparkContext._gateway.shutdown() if getattr(spark.sparkContext, "_gateway", None) else None
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "engine": engine,
        "mode": result.scope["mode"],
        "rows_validated": result.scope["rows"],
        "success": result.success,
        "seconds": round(seconds, 1),
        "peak_rss_mb_python": round(own),
        "peak_rss_mb_process_tree": round(tree_mb),
    }


def run_child(workdir: Path, engine: str, full: bool) -> dict:
    code = f"import json,sys; from pathlib import Path; from tests.support.quality_bench import measure; print('RESULT' + json.dumps(measure(Path({str(workdir)!r}), {engine!r}, full={full})))"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(proc.stderr[-3000:])
    out = json.loads(line[6:])
    out["process_seconds"] = round(time.perf_counter() - started, 1)
    return out


def main(rows: int, engines: list[str], increment: int) -> list[dict]:
    from pyiceberg.catalog.sql import SqlCatalog

    workdir = Path(tempfile.mkdtemp(prefix="icelog-qbench-"))
    catalog = SqlCatalog("bench", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}/warehouse")
    started = time.perf_counter()
    table = build_table(catalog, rows)
    results = [{"built_rows": rows, "build_seconds": round(time.perf_counter() - started, 1)}]
    for engine in engines:
        results.append(run_child(workdir, engine, full=True))
        print(json.dumps(results[-1]), flush=True)
    if increment:
        table.append({0: build_increment(increment)})
        for engine in engines:
            results.append(run_child(workdir, engine, full=False) | {"increment": increment})
            print(json.dumps(results[-1]), flush=True)
    return results


def build_increment(n: int):
    import numpy as np
    import pyarrow as pa

    keys = pa.array(np.char.add("k", (np.arange(n) % 1000).astype(str)))
    return pa.table({"key": keys, "value": keys})


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("rows", type=int)
    parser.add_argument("--engine", action="append", default=None)
    parser.add_argument("--increment", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(main(args.rows, args.engine or ["spark"], args.increment), indent=1))

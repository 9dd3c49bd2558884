"""Conditional appends, one writer: the time of one ``LogTable.append`` with expected offsets.

``python -m tests.bench.conditional_append [--appends 100]``: on a fresh embedded SQLite catalog
(a temporary home), 10 appends to warm up, then ``--appends`` appends of 10 rows to one
partition, each naming the log end it expects. Prints one line: the median (p50) and p90 wall
milliseconds of one append, the median CPU milliseconds, and the code measured. For an A/B of
two checkouts, run it with each one's venv in turn (``farm-bench --vs``) and compare medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import icelog
from icelog.storage.core.catalog import LogSqlCatalog, embedded_properties
from icelog.storage.log.table import LogTable

WARM_UP = 10
ROWS = [{"key": f"k{i}", "value": "v" * 64} for i in range(10)]


def main(appends: int) -> str:
    home = Path(tempfile.mkdtemp(prefix="bench-append-"))
    table = LogTable.create(LogSqlCatalog("icelog", **embedded_properties(home)), "db.bench", 1)
    for i in range(WARM_UP):
        table.append({0: ROWS}, {0: i * len(ROWS)})
    wall, cpu = [], []
    for i in range(WARM_UP, WARM_UP + appends):
        started, started_cpu = time.perf_counter(), time.process_time()
        table.append({0: ROWS}, {0: i * len(ROWS)})
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    wall.sort()
    return (
        f"p50_ms={statistics.median(wall):.3f} cpu_p50_ms={statistics.median(cpu):.3f} "
        f"p90_ms={wall[int(len(wall) * 0.9)]:.3f} n={appends} code={Path(icelog.__file__).resolve().parents[1]}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=100)
    print(main(parser.parse_args().appends))

"""Mirror benchmarks (slow; ``pytest -m slow tests/storage/replication/test_mirror_bench.py -s``).

* Bulk mirror throughput (MB/s) beside ``cp -r`` of the same data files, same run (target >= 0.7x).
* One incremental step after one small commit, on a table of 1,000 and of 10,000 files
  (target < 2 s, and proportional to the delta, not to the table).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from icelog.storage.replication.mirror import mirror
from tests.support.mirror_bench import PRINCIPAL, catalogs, fill

pytestmark = pytest.mark.slow


def test_bench_incremental_mirror_is_proportional_to_the_delta(tmp_path):
    figures = {}
    for files in (1_000, 10_000):
        source, target = catalogs(tmp_path / str(files))
        src = fill(source, "orders", 4, files // 4, 10)
        first = mirror(source, "orders", target, principal=PRINCIPAL)
        assert first.copied_files == files
        src.append({1: [{"key": "new", "value": "v"}]})
        started = time.perf_counter()
        step = mirror(source, "orders", target, principal=PRINCIPAL)
        figures[files] = time.perf_counter() - started
        assert step.incremental and step.copied_files == 1
        print(
            f"\nmirror bench: first mirror of {files:,} files: {first.seconds:.1f} s; incremental step after one small commit: {figures[files] * 1000:.0f} ms"
        )
    assert figures[10_000] < 2.0, figures


def test_bench_bulk_mirror_throughput_beside_cp(tmp_path):
    source, target = catalogs(tmp_path)
    rows_per_file = int(os.environ.get("ICELOG_BENCH_MIRROR_ROWS", "1000000"))
    src = fill(source, "bulk", 4, 4, rows_per_file, payload_bytes=32)  # 16 files
    data = Path(src.table().metadata.location.removeprefix("file://"), "data")
    size_mb = sum(f.stat().st_size for f in data.rglob("*.parquet")) / 1e6
    cp_runs, mirror_runs = [], []
    for run in range(2):  # alternate, best of two each: the machine is noisy and caches warm up
        subprocess.run(["sync"], check=True)
        started = time.perf_counter()
        subprocess.run(["cp", "-r", str(data), str(tmp_path / f"cp-copy{run}")], check=True)
        cp_runs.append(time.perf_counter() - started)
        shutil.rmtree(tmp_path / f"cp-copy{run}")
        subprocess.run(["sync"], check=True)
        started = time.perf_counter()
        result = mirror(source, "bulk", target, f"logs.bulk{run}", principal=PRINCIPAL)
        mirror_runs.append(time.perf_counter() - started)
        assert result.copied_files == 16 and not result.sliced_files
    cp_s, mirror_s = min(cp_runs), min(mirror_runs)
    print(
        f"\nmirror bench: bulk mirror of {size_mb:,.0f} MB in 16 files: {size_mb / mirror_s:,.0f} MB/s ({mirror_s:.2f} s); "
        f"cp -r of the same files: {size_mb / cp_s:,.0f} MB/s ({cp_s:.2f} s); ratio {cp_s / mirror_s:.2f} "
        f"(runs: mirror {[round(x, 2) for x in mirror_runs]} s, cp {[round(x, 2) for x in cp_runs]} s)"
    )

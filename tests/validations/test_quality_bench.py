"""Benchmark: GX validation on Spark against pandas, full against incremental, a small version
(``make test-slow``). The harness, and the command for a full-size run, is ``tests/support/quality_bench.py``.
"""

from __future__ import annotations

import pytest

from tests.support.quality_bench import main


@pytest.mark.slow
def test_bench_spark_and_pandas_validate_the_same_table():
    results = main(200_000, ["pandas", "spark"], 10_000)
    full = [r for r in results[1:] if r["mode"] == "full"]
    incremental = [r for r in results[1:] if r["mode"] == "incremental"]
    assert all(r["success"] for r in results[1:])
    assert all(r["rows_validated"] == 200_000 for r in full) and all(r["rows_validated"] == 10_000 for r in incremental)

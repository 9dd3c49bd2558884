"""I2 and I1 under real concurrency: OS processes racing on one partition, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict

import pytest

from storage.log import LogTable
from tests.catalogs import CatalogSpec
from validations.contiguity import check_contiguity


def run_workers(spec: CatalogSpec, argv_list: list[list[str]], timeout: float = 240) -> list[dict]:
    spec_json = json.dumps(asdict(spec))
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.workers", argv[0], spec_json, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv in argv_list
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        lines += [json.loads(line) for line in out.splitlines() if line.strip()]
    return lines


@pytest.mark.parametrize("round_", range(2))
def test_i2_processes_with_same_expected_offset_exactly_one_commits(catalog_spec, round_):
    t = LogTable.create(catalog_spec.open(), "db.race", partitions=2)
    t.append({0: [{"key": "seed"}] * 3})
    outcomes = run_workers(catalog_spec, [["conditional_once", "db.race", "0", "3", f"w{i}"] for i in range(6)])
    winners = [o for o in outcomes if o["committed"]]
    losers = [o for o in outcomes if not o["committed"]]
    assert len(winners) == 1, outcomes
    assert winners[0]["range"] == [3, 4]
    assert all(o["error"]["error"] == "OffsetMismatch" and o["error"]["actual"] == 4 for o in losers)
    data = t.read(0)
    assert data.column("log_offset").to_pylist() == [0, 1, 2, 3]
    assert data.column("key").to_pylist()[3] == winners[0]["tag"]
    assert check_contiguity(t.table(), deep=True).ok


def test_i2_retry_loops_leave_a_contiguous_log_of_exactly_the_acknowledged_rows(catalog_spec):
    t = LogTable.create(catalog_spec.open(), "db.race", partitions=3)
    writers, per_writer = 4, 8
    acks = run_workers(catalog_spec, [["conditional_loop", "db.race", "1", str(per_writer), f"w{i}"] for i in range(writers)])
    assert len(acks) == writers * per_writer
    data = t.read(1)
    offsets = data.column("log_offset").to_pylist()
    assert offsets == list(range(writers * per_writer))
    by_offset = dict(zip(offsets, data.column("value").to_pylist()))
    assert {a["offset"]: a["value"] for a in acks} == by_offset
    assert not [v for v, n in Counter(by_offset.values()).items() if n > 1]
    assert check_contiguity(t.table(), deep=True).ok
    assert t.watermarks()[1].end == writers * per_writer


def test_i1_unconditional_appends_from_many_processes_never_duplicate(catalog_spec):
    t = LogTable.create(catalog_spec.open(), "db.race", partitions=2)
    acks = run_workers(catalog_spec, [["append_rows", "db.race", "0", "5", f"w{i}"] for i in range(5)])
    ranges = sorted(tuple(a["range"]) for a in acks)
    assert ranges == [(i * 5, i * 5 + 5) for i in range(5)]
    assert t.read(0).column("log_offset").to_pylist() == list(range(25))
    assert check_contiguity(t.table(), deep=True).ok

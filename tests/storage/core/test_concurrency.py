"""I2 and I1 under real concurrency: OS processes racing on one partition, SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter

import pytest

from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.processes import run_workers


@pytest.mark.parametrize("round_", [0, pytest.param(1, marks=pytest.mark.slow)])
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


def test_i2_retry_loops_leave_a_contiguous_log_of_exactly_the_acknowledged_rows(heavy_spec, tmp_path):
    t = LogTable.create(heavy_spec.open(), "db.race", partitions=3)
    writers, per_writer = 4, 8
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    argv = [["conditional_loop", "db.race", "1", str(per_writer), f"w{i}", str(barrier), str(writers)] for i in range(writers)]
    lines = run_workers(heavy_spec, argv)
    acks = [line for line in lines if "offset" in line]
    refused = [line for line in lines if "mismatch" in line]
    assert len(acks) == writers * per_writer
    # I2: an acknowledged conditional append landed exactly at the offset it expected.
    assert [(a["offset"], a["next"]) for a in acks] == [(a["expected"], a["expected"] + 1) for a in acks]
    # The barrier made every writer expect offset 0 at once: one won, the others were refused.
    assert sum(a["expected"] == 0 for a in acks) == 1
    assert sum(r["expected"] == 0 for r in refused) >= writers - 1
    assert all(
        r["mismatch"]["error"] == "OffsetMismatch" and r["mismatch"]["actual"] > r["expected"]
        for r in refused
        if r["mismatch"]["error"] == "OffsetMismatch"
    )
    data = t.read(1)
    offsets = data.column("log_offset").to_pylist()
    assert offsets == list(range(writers * per_writer))
    by_offset = dict(zip(offsets, data.column("value").to_pylist(), strict=False))
    assert {a["offset"]: a["value"] for a in acks} == by_offset
    assert not [v for v, n in Counter(by_offset.values()).items() if n > 1]
    assert check_contiguity(t.table(), deep=True).ok
    assert t.watermarks()[1].end == writers * per_writer


def test_i2_commits_to_other_partitions_never_refuse_a_conditional_append(catalog_spec, tmp_path):
    """One writer appends conditionally to partition 0 while two others race on partition 1:
    every compare-and-swap the partition-0 writer loses is to a commit on partition 1, so it
    re-decides and is never refused; each of its appends lands at the offset it expected."""
    t = LogTable.create(catalog_spec.open(), "db.race", partitions=2)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    argv = [["conditional_loop", "db.race", "0", "5", "mine", str(barrier), "3"]]
    argv += [["conditional_loop", "db.race", "1", "5", f"other{i}", str(barrier), "3"] for i in range(2)]
    lines = run_workers(catalog_spec, argv)
    mine = [line for line in lines if line["value"].startswith("mine-")]
    assert [(m.get("expected"), m.get("offset")) for m in mine] == [(i, i) for i in range(5)]  # no refusal at all
    others = [line for line in lines if line["value"].startswith("other") and "offset" in line]
    assert sorted(o["offset"] for o in others) == list(range(10))
    assert all(o["offset"] == o["expected"] for o in others)
    assert t.read(0).column("value").to_pylist() == [f"mine-{i}" for i in range(5)]
    assert check_contiguity(t.table(), deep=True).ok


def test_i1_unconditional_appends_from_many_processes_never_duplicate(heavy_spec):
    t = LogTable.create(heavy_spec.open(), "db.race", partitions=2)
    acks = run_workers(heavy_spec, [["append_rows", "db.race", "0", "5", f"w{i}"] for i in range(5)])
    ranges = sorted(tuple(a["range"]) for a in acks)
    assert ranges == [(i * 5, i * 5 + 5) for i in range(5)]
    assert t.read(0).column("log_offset").to_pylist() == list(range(25))
    assert check_contiguity(t.table(), deep=True).ok

"""The chaos harness (on SQLite, PostgreSQL and REST): short runs in ``make test``, long ones under ``slow``, and the
end-of-run checks themselves on synthetic data (a planted duplicate, a dropped acknowledged
row, a key out of order each make them fail), so a passing run means something.

I1, I2, I4, I5, I6, I7, I9 and I10 are all defended at once by a run: every validator on every
table, acknowledged rows against stored rows, the copy and the group output against the input.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from tests.chaos.run import (
    Config,
    check_acked,
    check_copy,
    check_group,
    check_group_commits,
    check_run,
    check_soak,
    run_chaos,
    soak_table,
)
from tests.chaos.workers import batch_rows


def _stored(worker: str, batch: int, rows: int, partition: int, base: int) -> list[tuple[str, int, int]]:
    return [(r["value"], partition, base + i) for i, r in enumerate(batch_rows(worker, batch, rows))]


def _ack(worker: str, batch: int, rows: int, partition: int, base: int, **extra) -> dict:
    return {
        "worker": worker,
        "batch": batch,
        "rows": rows,
        "partition": partition,
        "range": [base, base + rows],
        "duplicate": False,
        **extra,
    }


def test_i7_checker_passes_acked_rows_and_an_unacked_batch_stored_once():
    stored = _stored("producer0", 0, 3, 0, 0) + _stored("appender0", 0, 2, 0, 3) + _stored("producer0", 1, 3, 0, 5)
    acks = [_ack("producer0", 0, 3, 0, 0), _ack("appender0", 0, 2, 0, 3, expected=3)]  # batch 1: outcome unknown
    assert check_acked(stored, acks, ["appender0", "producer0"]) == []


def test_i7_checker_fails_on_a_dropped_acknowledged_row():
    stored = _stored("producer0", 0, 3, 0, 0)
    failures = check_acked(stored[:1] + stored[2:], [_ack("producer0", 0, 3, 0, 0)], ["producer0"])
    assert failures == ["acknowledged row 'producer0:0:1' (partition 0, offset 1) lost"]


def test_i4_checker_fails_on_a_planted_duplicate():
    stored = _stored("producer0", 0, 3, 0, 0)
    failures = check_acked(stored + [(stored[1][0], 0, 3)], [_ack("producer0", 0, 3, 0, 0)], ["producer0"])
    assert failures == ["row 'producer0:0:1' stored 2 times, at [(0, 1), (0, 3)]"]


def test_i2_checker_fails_on_a_row_at_another_offset_or_a_conditional_append_elsewhere():
    stored = _stored("appender0", 0, 2, 1, 4)
    assert check_acked(stored, [_ack("appender0", 0, 2, 1, 4, expected=2)], ["appender0"]) == [
        "appender0 batch 0 expected offset 2 but landed at 4 (I2)"
    ]
    moved = check_acked(stored, [_ack("appender0", 0, 2, 1, 3)], ["appender0"])
    assert moved and all("stored at" in f for f in moved)
    assert check_acked(stored + [("stranger:0:0", 1, 6)], [], ["appender0"]) == [
        "row 'stranger:0:0' written by no writer of the run"
    ]


def test_i7_checker_allows_rows_below_log_start_only_when_retention_could_drop_them():
    acks = [_ack("soak", 0, 3, 0, 0, sent=100.0), _ack("soak", 1, 3, 0, 3, sent=200.0)]
    kept = _stored("soak", 1, 3, 0, 3)  # retention moved log_start to 3
    assert check_acked(kept, acks, ["soak"], {0: 3}, retention_cutoff=150.0) == []
    # The same rows dropped, but their append began after the cutoff: retention could not drop them.
    assert check_acked(kept, acks, ["soak"], {0: 3}, retention_cutoff=50.0) == [
        f"acknowledged row 'soak:0:{i}' (partition 0, offset {i}) dropped by retention (log_start 3) though its append began 50.0 s after the cutoff"
        for i in range(3)
    ]
    # At or above log_start an acknowledged row is never allowed to be missing.
    assert check_acked(kept[1:], acks, ["soak"], {0: 3}, retention_cutoff=250.0) == [
        "acknowledged row 'soak:1:0' (partition 0, offset 3) lost"
    ]


def _window(commits: int, p50: float, metadata_bytes: int, snapshots: int = 20, manifests: int = 5, commit_ids: int = 50) -> dict:
    return {
        "commits": commits,
        "p50_ms": p50,
        "p95_ms": 2 * p50,
        "max_ms": 3 * p50,
        "metadata_bytes": metadata_bytes,
        "snapshots": snapshots,
        "manifests": manifests,
        "commit_ids": commit_ids,
    }


def test_soak_check_passes_a_plateau_and_fails_growth():
    flat = [_window(100 * (i + 1), 60.0, 40_000 + 500 * min(i, 3), commit_ids=min(250, 100 * (i + 1))) for i in range(10)]
    assert check_soak(flat, 1000, 100) == []
    linear = [{**w, "metadata_bytes": 20_000 * (i + 1)} for i, w in enumerate(flat)]
    assert check_soak(linear, 1000, 100) == [
        "metadata_bytes kept growing: 200000 at the end, over 154096 (1.5x the first half's largest, 100000, + 4096)"
    ]
    slower = flat[:-1] + [{**flat[-1], "p50_ms": 181.0}]
    assert check_soak(slower, 1000, 100) == ["commit latency grew: p50 181.0 ms in the last window, 60.0 ms in the first (> 3x)"]
    # Manifests saw-tooth up to the merge count: a run sampled as 2, 4, ... 20 is bounded, 60 is not.
    drifting = [{**w, "manifests": 2 * (i + 1)} for i, w in enumerate(flat)]
    assert check_soak(drifting, 1000, 100) == []
    assert [f.split(":")[0] for f in check_soak(drifting[:-1] + [{**flat[-1], "manifests": 60}], 1000, 100)] == [
        "manifests kept growing"
    ]
    snapshots = flat[:-1] + [{**flat[-1], "snapshots": 40}]
    assert [f.split(":")[0] for f in check_soak(snapshots, 1000, 100)] == ["snapshots kept growing"]
    assert check_soak(flat[:3], 1000, 100) == ["the soak recorded 3 windows of 100 commits, expected 10"]
    assert soak_table(flat[:1])[1].split() == ["soak:", "100", "60.0", "120.0", "180.0", "40000", "20", "5", "100"]


def test_i9_checker_fails_on_a_copy_twice_missing_or_changed():
    source = [(0, 0, "a"), (0, 1, "b"), (1, 0, "c")]
    good = [("0:0", "A"), ("0:1", "B"), ("1:0", "C")]
    assert check_copy(source, good) == []
    assert check_copy(source, good + [("0:1", "B")]) == ["source record 0:1 copied 2 times"]
    assert check_copy(source, good[1:]) == ["source record 0:0 never copied"]
    assert check_copy(source, [("0:0", "a"), *good[1:]]) == ["source record 0:0: copied as 'a', expected 'A'"]


def test_i10_checker_fails_on_a_key_out_of_order_twice_or_lost():
    source = [(0, 0, "k1"), (0, 1, "k2"), (0, 2, "k1"), (1, 0, "k1")]
    good = [("k1", "0:0"), ("k1", "1:0"), ("k2", "0:1"), ("k1", "0:2")]
    assert check_group(source, good, [("member0", 0, 2)]) == []
    swapped = [good[3], good[1], good[2], good[0]]
    assert check_group(source, swapped, []) == ["key 'k1' of partition 0: offset 0 processed after offset 2"]
    assert check_group(source, good + [good[0]], []) == [
        "source record 0:0 processed 2 times",
        "key 'k1' of partition 0: offset 0 processed after offset 2",
    ]
    assert check_group(source, good[:3], [("member1", 0, 2)]) == [
        "source record 0:2 never processed",
        "member1 acknowledged 0:2, not in the output",
    ]


def test_i10_offsets_only_group_checker_fails_on_a_record_committed_twice_out_of_order_or_short():
    """The REST group check (members commit offsets alone, acknowledged after the commit)."""
    source = [(0, 0, "k1"), (0, 1, "k2"), (0, 2, "k1"), (1, 0, "k1")]
    acked = [("member0", 0, 0, "k1"), ("member1", 1, 0, "k1"), ("member0", 0, 2, "k1")]  # 0:1's commit unacknowledged
    assert check_group_commits(source, acked, {0: 3, 1: 1}) == []
    assert check_group_commits(source, acked + [("member1", 0, 2, "k1")], {0: 3, 1: 1}) == [
        "source record 0:2 committed 2 times, by ['member0', 'member1']"
    ]
    assert check_group_commits(source, [acked[2], acked[0]], {0: 3, 1: 1}) == [
        "member0: key 'k1' of partition 0: offset 0 committed after offset 2"
    ]
    assert check_group_commits(source, acked, {0: 2, 1: 1}) == [
        "partition 0: the group's committed offset is 2, the log ends at 3"
    ]
    assert check_group_commits(source, [("member0", 0, 1, "k1"), ("member0", 0, 9, "k9")], {0: 3, 1: 1}) == [
        "member0 acknowledged 0:1 with key 'k1', 'k2' in the source",
        "member0 acknowledged 0:9, which has no source record",
    ]


def test_a_failed_run_prints_its_seed_replay_history_and_failed_check():
    from tests.chaos.run import Report

    report = Report("sqlite", 42, replay="--catalog sqlite --seed 42 --duration 50")
    report.events = [{"t": 3.5, "action": "kill -9", "worker": "producer0", "detail": ""}]
    report.failures = {"acked": ["acknowledged row 'producer0:3:1' (partition 0, offset 61) lost"], "copy": []}
    text = report.describe()
    assert not report.ok and "seed=42: FAILED" in text
    assert "replay: python -m tests.chaos.run --catalog sqlite --seed 42 --duration 50" in text
    assert "    3.50s kill -9  producer0" in text
    assert "FAILED acked: acknowledged row 'producer0:3:1' (partition 0, offset 61) lost" in text


def _assert_ok(report, config: Config) -> None:
    assert report.ok, report.describe()
    kinds = [e["action"] for e in report.events]
    hard = {"kill -9", "slow"} & set(kinds)  # a slow fault starts with a kill -9
    assert hard and "sigterm" in kinds, report.describe()  # a run without faults proves nothing
    assert report.counts["rows"] > 0 and report.counts["group_commits"] > 0, report.describe()
    assert report.counts["copied"] > 0, report.describe()  # the copier's transactions, on REST too
    if report.catalog == "rest":  # the server was killed
        assert "catalog-down" in kinds, report.describe()
    assert (
        report.counts["soak_commits"] >= config.soak_commits and len(report.soak) >= config.soak_commits // config.soak_window
    ), report.describe()


# The soak: 200 commits reported every 50, on a table whose retention keeps 10 s.
SHORT = Config(
    duration=50,
    seed=14,
    producers=1,
    appenders=1,
    members=2,
    interval=(2.0, 5.0),
    faults=("kill", "sigterm", "slow"),
    soak_commits=200,
    soak_window=50,
    retention_ms=10_000,
)


def test_a_worker_that_crashes_as_the_run_stops_fails_the_run(tmp_path: Path):
    """stop_all judges how each worker ends: one that crashed on its own since the last reap, or
    exits with a crash code on SIGTERM, is a failure; one that stops cleanly is not."""
    import subprocess
    import sys
    import time

    from tests.chaos.run import Controller, Report

    report = Report(catalog="sqlite", seed=0)
    controller = Controller(tmp_path, {}, report, echo=False)
    # Each waiting worker writes its ready file once its SIGTERM handler is set.
    waiting = "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit({code})); pathlib.Path({ready!r}).touch(); time.sleep(60)"
    scripts = {
        "clean": waiting.format(code=0, ready=str(tmp_path / "clean.ready")),
        "crashes-on-term": waiting.format(code=3, ready=str(tmp_path / "crashes-on-term.ready")),
        "crashed-before": "raise SystemExit(4)",
    }
    for name, code in scripts.items():
        controller.log(name).parent.mkdir(parents=True)
        controller.log(name).write_text(f"{name}\n")
        controller.procs[name] = subprocess.Popen([sys.executable, "-c", code])
    controller.procs["crashed-before"].wait()
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"{n}.ready").exists() for n in ("clean", "crashes-on-term")):
        assert time.monotonic() < deadline, "the workers never set their SIGTERM handlers"
        time.sleep(0.05)
    controller.stop_all()
    failures = report.failures.get("workers", [])
    assert len(failures) == 2, failures
    assert any(f.startswith("crashes-on-term exited with 3 after SIGTERM") for f in failures), failures
    assert any(f.startswith("crashed-before exited with 4 on its own") for f in failures), failures


def test_chaos_short_sqlite(tmp_path: Path):
    report = run_chaos(SHORT, tmp_path, "sqlite", echo=False)
    _assert_ok(report, SHORT)
    assert any(e["action"] == "slow" for e in report.events), report.describe()
    # Retention ran, and the checks allowed for it: rows below log_start gone, rows above stored.
    assert report.counts["soak_log_start"] > 0 and report.counts["soak_rows_stored"] > 0, report.describe()
    _assert_a_planted_duplicate_fails(tmp_path, "sqlite")


def _assert_a_planted_duplicate_fails(workdir: Path, kind: str, rest_dir: Path | None = None) -> None:
    """The same checks on the run's real tables fail once an acknowledged row is stored twice."""
    from icelog.storage.log.table import LogTable
    from tests.chaos.run import EVENTS, Report, _specs

    source, target = _specs(workdir, kind, None, rest_dir)
    events = LogTable(source.open(), EVENTS)
    events.append({0: events.read(0, 0, 1).select(["key", "value"])})
    again = Report(kind, 0)
    check_run(workdir, source, target, again)
    assert any("stored 2 times" in f for f in again.failures["acked"]), again.describe()


# On REST (a SeaweedFS server of the test's own): worker faults and kill -9 of the server.
SHORT_REST = dataclasses.replace(
    SHORT,
    duration=45,
    seed=2126,
    interval=(3.0, 6.0),
    faults=("kill", "sigterm", "slow", "catalog-down"),
    outage=(1.0, 3.0),
    soak_commits=100,
)


def test_chaos_short_rest(tmp_path: Path, own_seaweedfs):
    report = run_chaos(SHORT_REST, tmp_path, "rest", echo=False, rest_dir=own_seaweedfs)
    _assert_ok(report, SHORT_REST)
    # The copier's and the group members' transactions rolled forward table by table (the
    # members' output and range commits: "group" checks the output), and the mirror carried the
    # log to SQLite.
    assert report.counts["mirror_steps"] > 0 and "copy" in report.failures, report.describe()
    assert report.counts["consumed"] > 0, report.describe()
    _assert_a_planted_duplicate_fails(tmp_path, "rest", own_seaweedfs)


@pytest.mark.slow
def test_chaos_long_rest(tmp_path: Path, own_seaweedfs):
    config = Config(duration=600, seed=2122, faults=("kill", "sigterm", "slow", "catalog-down"))
    _assert_ok(run_chaos(config, tmp_path, "rest", echo=False, rest_dir=own_seaweedfs), config)


@pytest.mark.slow  # the pair took 2.6 to 7 minutes on 2 cores: over make test's share
def test_chaos_short_postgres(tmp_path: Path, postgres_server):
    _assert_ok(run_chaos(SHORT, tmp_path, "postgres", postgres_server, echo=False), SHORT)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_chaos_long(tmp_path: Path, request, kind):
    config = Config(duration=600, seed=1414, faults=("kill", "sigterm", "slow"))
    pg = request.getfixturevalue("postgres_server") if kind == "postgres" else None
    _assert_ok(run_chaos(config, tmp_path, kind, pg, echo=False), config)


@pytest.mark.slow
def test_chaos_postgres_with_catalog_down_and_disk_full(tmp_path: Path):
    """Every fault kind at once, on a PostgreSQL server of its own (catalog-down stops it)."""
    from infra import postgres

    config = Config(
        duration=120,
        seed=1415,
        producers=1,
        appenders=1,
        members=2,
        interval=(3.0, 8.0),
        soak_commits=300,
        soak_window=50,
        retention_ms=10_000,
        warehouse_tmpfs_mb=256,
    )
    server = Path(
        tempfile.mkdtemp(prefix="icelog-pg-chaos-")
    )  # pytest's tmp_path is private to root; the server runs as postgres
    try:
        report = run_chaos(config, tmp_path / "run", "postgres", postgres.start(server), echo=False, pg_dir=server)
    finally:
        postgres.stop(server)
    assert {"catalog-down", "disk-full", "slow"} <= {e["action"] for e in report.events}, report.describe()
    _assert_ok(report, config)

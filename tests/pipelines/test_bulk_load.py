"""Bulk loads (``icelog produce --expected-offset K [--load-id L]``): each line exactly once, at K + i.

Real processes: the loader is the ``icelog`` CLI, killed with SIGKILL at random points.
Resuming rests on the load's commit ids, never on rows that merely look like the input.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from icelog.pipelines.cli import cli
from icelog.storage.log.table import LogTable

LINES = 3000
K = 5


def write_input(path, n: int = LINES) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"key": f"k{i % 17}", "value": f"line-{i}"}) + "\n")


def loader(spec, path, log, batch: int = 50, stdin=None) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "icelog.pipelines.cli",
        "--output",
        "json",
        "produce",
        "db.bulk",
        "--partition",
        "1",
        "--expected-offset",
        str(K),
        "--load-id",
        "big-load",
        "--input",
        str(path),
        "--batch-size",
        str(batch),
    ]
    return subprocess.Popen(argv, env={**os.environ, **spec.env()}, stdin=stdin, stdout=log, stderr=subprocess.STDOUT)


def prepared(spec) -> LogTable:
    t = LogTable.create(spec.open(), "db.bulk", partitions=2)
    t.append({1: [{"key": "before", "value": f"pre-{i}"} for i in range(K)]}, {1: 0})
    return t


def test_i2_bulk_load_killed_five_times_lands_every_line_once_at_k_plus_i(sqlite_spec, tmp_path):
    t = prepared(sqlite_spec)
    source = tmp_path / "big.jsonl"
    write_input(source)
    rng = random.Random(int(os.environ.get("ICELOG_TEST_SEED", "7")))
    ends = []
    for attempt in range(5):
        with open(tmp_path / f"loader-{attempt}.log", "w") as log:
            proc = loader(sqlite_spec, source, log)
            # Kill once the log moved past where this attempt started, at a random later point.
            start = t.watermarks()[1].end
            deadline = time.monotonic() + 120
            while t.watermarks()[1].end == start and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        ends.append(t.watermarks()[1].end)
    assert ends == sorted(ends) and ends[-1] > K  # it made progress and never went back
    with open(tmp_path / "loader-final.log", "w") as log:
        final = loader(sqlite_spec, source, log)
        assert final.wait(timeout=300) == 0, (tmp_path / "loader-final.log").read_text()[-2000:]
    done = json.loads((tmp_path / "loader-final.log").read_text().strip().splitlines()[-1])
    assert done["next_offset"] == K + LINES and done["resumed_lines"] == ends[-1] - K
    rows = t.read(1)
    assert rows["log_offset"].to_pylist() == list(range(K + LINES))
    assert rows["value"].to_pylist() == [f"pre-{i}" for i in range(K)] + [f"line-{i}" for i in range(LINES)]


def test_i2_a_concurrent_writer_stops_the_bulk_load_it_never_interleaves(sqlite_spec, tmp_path):
    t = prepared(sqlite_spec)
    source = tmp_path / "big.jsonl"
    write_input(source)
    lines = source.read_bytes().splitlines(keepends=True)
    with open(tmp_path / "loader.log", "w") as log:
        # The loader reads stdin: after 100 lines it waits for more, and the foreign row lands
        # exactly between two of its batches (no race to win, however busy the machine).
        proc = loader(sqlite_spec, "-", log, batch=20, stdin=subprocess.PIPE)
        proc.stdin.write(b"".join(lines[:100]))
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while t.watermarks()[1].end < K + 100 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert t.watermarks()[1].end == K + 100, (tmp_path / "loader.log").read_text()[-2000:]
        t.append({1: [{"key": "intruder", "value": "foreign"}]})
        try:
            proc.stdin.write(b"".join(lines[100:]))
        except BrokenPipeError:  # it may stop before reading all of it
            pass
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        assert proc.wait(timeout=300) == 3
    err = json.loads((tmp_path / "loader.log").read_text().strip().splitlines()[-1])
    assert err["error"] == "OffsetMismatch"
    values = t.read(1)["value"].to_pylist()
    foreign = values.index("foreign")
    assert values[:K] == [f"pre-{i}" for i in range(K)]
    assert values[K:foreign] == [f"line-{i}" for i in range(100)]  # its first 100 lines, in order
    assert values[foreign + 1 :] == []  # nothing of the loader's after the foreign row
    # Run again with the same arguments: it sees the foreign record at the log end and stops.
    with open(tmp_path / "again.log", "w") as log:
        assert loader(sqlite_spec, source, log).wait(timeout=300) == 3
    assert t.read(1)["value"].to_pylist() == values


@pytest.mark.parametrize("lines", [1])
def test_empty_or_tiny_inputs_resume_cleanly(sqlite_spec, tmp_path, lines):
    t = prepared(sqlite_spec)
    source = tmp_path / "small.jsonl"
    write_input(source, lines)
    for _ in range(2):
        with open(tmp_path / "l.log", "w") as log:
            assert loader(sqlite_spec, source, log).wait(timeout=300) == 0, (tmp_path / "l.log").read_text()
    assert t.watermarks()[1].end == K + lines


def produce(spec, *args: str, stdin: str, code: int) -> dict:
    result = CliRunner().invoke(
        cli,
        ["--output", "json", "produce", "db.bulk", "--partition", "1", *args],
        input=stdin,
        env=spec.env(),
        catch_exceptions=False,
    )
    assert result.exit_code == code, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def jsonl(*rows: tuple[str, str]) -> str:
    return "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in rows)


def test_i2_two_producers_expecting_the_same_offset_with_equal_lines_one_fails(sqlite_spec):
    t = prepared(sqlite_spec)
    deposit = jsonl(("a", "deposit 10"))
    assert produce(sqlite_spec, "--expected-offset", str(K), stdin=deposit, code=0)["next_offset"] == K + 1
    err = produce(sqlite_spec, "--expected-offset", str(K), stdin=deposit, code=3)
    assert (err["error"], err["expected"], err["actual"]) == ("OffsetMismatch", K, K + 1)
    assert t.read(1)["value"].to_pylist()[K:] == ["deposit 10"]


def test_i2_equal_trailing_lines_are_not_proof_a_load_wrote_them_it_never_interleaves(sqlite_spec):
    t = prepared(sqlite_spec)
    produce(sqlite_spec, "--expected-offset", str(K), stdin=jsonl(("x", "A-0"), ("b", "2")), code=0)
    before = t.read(1)["value"].to_pylist()
    for lines in ([("c", "B-0"), ("b", "2")], [("c", "B-0"), ("b", "2"), ("d", "B-2")]):
        err = produce(sqlite_spec, "--expected-offset", str(K), stdin=jsonl(*lines), code=3)
        assert (err["error"], err["expected"], err["actual"]) == ("OffsetMismatch", K, K + 2)
        # A load id it never used is no identity either: nothing of this input is in the log.
        produce(sqlite_spec, "--expected-offset", str(K), "--load-id", "b", stdin=jsonl(*lines), code=3)
    assert t.read(1)["value"].to_pylist() == before


def test_i2_an_offset_mismatch_names_the_offset_the_user_typed(sqlite_spec):
    prepared(sqlite_spec)
    produce(sqlite_spec, stdin=jsonl(*[("k", f"v{i}") for i in range(20)]), code=0)
    err = produce(sqlite_spec, "--expected-offset", "3", stdin=jsonl(("k", "late")), code=3)
    assert (err["expected"], err["actual"]) == (3, K + 20)
    assert f"expected offset 3 but the log end offset is {K + 20}" in err["message"]


def test_i2_a_load_id_resumes_after_its_own_batches_only(sqlite_spec):
    t = prepared(sqlite_spec)
    first = [("k", f"line-{i}") for i in range(5)]
    args = ("--expected-offset", str(K), "--load-id", "nightly", "--batch-size", "2")
    assert produce(sqlite_spec, *args, stdin=jsonl(*first[:3]), code=0)["next_offset"] == K + 3
    done = produce(sqlite_spec, *args, stdin=jsonl(*first), code=0)  # the re-run, with the whole input
    assert (done["resumed_lines"], done["rows"], done["next_offset"]) == (3, 2, K + 5)
    again = produce(sqlite_spec, *args, stdin=jsonl(*first), code=0)
    assert (again["resumed_lines"], again["rows"]) == (5, 0)
    assert t.read(1)["value"].to_pylist()[K:] == [v for _, v in first]
    # The same load id at another offset is another load: the log does not end there.
    produce(sqlite_spec, "--expected-offset", "0", "--load-id", "nightly", stdin=jsonl(*first), code=3)

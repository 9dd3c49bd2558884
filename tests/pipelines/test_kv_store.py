"""KIP-27's worked example: a key-value store on one log partition (pipelines.examples.kv_store).

The race test runs two leaders as real OS processes through the example's command line, on
SQLite and on a real PostgreSQL server. I2 is what keeps their read-modify-writes from
losing an update.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from icelog.pipelines.examples.kv_store import KVStore, ReplayGap, TooManyConflicts, main
from icelog.storage.errors import InvalidInput
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "icelog.pipelines.examples.kv_store"]


def run_cli(spec, *args: str) -> tuple[int, list[dict]]:
    done = subprocess.run([*CLI, *args], env=spec.env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode in (0, 2, 3), done.stderr[-3000:]
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_i2_two_leader_processes_incrementing_one_counter_lose_no_update(catalog_spec):
    LogTable.create(catalog_spec.open(), "db.kv", partitions=1)
    times = 30
    procs = [
        subprocess.Popen(
            [*CLI, "db.kv", "incr", "counter", "--times", str(times)],
            env=catalog_spec.env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    leaders = []
    for proc, (out, err) in zip(procs, outputs, strict=False):
        assert proc.returncode == 0, err[-3000:]
        leaders.append([json.loads(line) for line in out.splitlines() if line.strip()])

    acks = [a for lines in leaders for a in lines]
    assert [len(lines) for lines in leaders] == [times, times]
    fresh = KVStore(catalog_spec.open(), "db.kv")
    assert fresh.get("counter") == 2 * times  # replayed from the log: no lost update
    assert sorted(a["value"] for a in acks) == list(range(1, 2 * times + 1))  # each ack saw every earlier one

    log = LogTable(catalog_spec.open(), "db.kv")
    data = log.read(0)
    offsets = data.column("log_offset").to_pylist()
    assert offsets == list(range(2 * times))  # contiguous, nothing else written
    in_log = dict(zip(offsets, data.column("value").to_pylist(), strict=False))
    assert {a["offset"]: json.dumps(a["value"]) for a in acks} == in_log  # every ack exactly once, where it said
    assert check_contiguity(log.table(), deep=True).ok

    for lines in leaders:  # each write landed exactly where its leader expected
        for before, write in zip(lines, lines[1:], strict=False):
            others = write["offset"] - before["offset"] - 1  # the other leader's records in between
            # no mismatch: right after its own last write; m mismatches: m moves of the log end
            assert others == 0 if write["mismatches"] == 0 else others >= write["mismatches"], lines
    # (so wherever the leaders' writes interleave, the later one must have seen a mismatch;
    # the interleaved test below covers the retry path even when the processes did not overlap)


def test_i2_stale_leader_mismatches_catches_up_incrementally_and_decides_again(catalog):
    LogTable.create(catalog, "db.kv", partitions=1)
    a = KVStore(catalog, "db.kv")
    a.put("counter", 10)
    a.put("other", "x")
    b = KVStore(catalog, "db.kv")  # bootstraps [0, 2)
    b.incr("counter")
    b.put("other", "y")  # the log ends at 4; a still believes 2
    reads = []
    read = a.log.read
    a.log.read = lambda p, start=None, end=None, **kw: reads.append((start, end)) or read(p, start, end, **kw)

    write = a.incr("counter")

    assert reads == [(2, 4)]  # only the records it missed, up to the offset the mismatch reported
    assert (write.offset, write.value, write.mismatches) == (4, 12, 1)  # decided on b's 11, not its own 10
    assert (a.next_offset, a.mismatches, a.data) == (5, 1, {"counter": 12, "other": "y"})
    assert KVStore(catalog, "db.kv").data == a.data


def test_i2_retries_are_bounded_with_a_typed_error_and_write_nothing(catalog):
    LogTable.create(catalog, "db.kv", partitions=1)
    a = KVStore(catalog, "db.kv", max_attempts=1)
    KVStore(catalog, "db.kv").put("k", "theirs")
    with pytest.raises(TooManyConflicts) as raised:
        a.put("k", "mine")
    assert (raised.value.key, raised.value.attempts) == ("k", 1)
    assert pickle.loads(pickle.dumps(raised.value)).fields == raised.value.fields
    assert LogTable(catalog, "db.kv").read(0).column("value").to_pylist() == ['"theirs"']
    assert a.get("k") == "theirs"  # it caught up, so calling again is safe
    assert a.put("k", "mine").offset == 1


def test_put_delete_update_replay_to_the_same_state(catalog):
    LogTable.create(catalog, "db.kv", partitions=1)
    store = KVStore(catalog, "db.kv")
    store.put("a", 1)
    store.put("b", {"nested": [1, 2]})
    store.delete("a")
    store.put("c", "text")
    store.update("b", lambda old: {**old, "more": True})
    store.delete("missing")
    store.put("a", 3)
    expected = {"a": 3, "b": {"nested": [1, 2], "more": True}, "c": "text"}
    assert store.data == expected and store.next_offset == 7

    replayed = KVStore(catalog, "db.kv")
    assert (replayed.data, replayed.next_offset) == (expected, 7)
    assert replayed.get("missing") is None
    values = LogTable(catalog, "db.kv").read(0).column("value").to_pylist()
    assert values[2] is None and values[5] is None  # deletes are tombstones
    with pytest.raises(InvalidInput):
        replayed.incr("c")
    assert replayed.next_offset == 7  # a refused update writes nothing


def test_a_store_refuses_a_partition_whose_history_is_incomplete(sqlite_catalog, monkeypatch):
    LogTable.create(sqlite_catalog, "db.kv", partitions=1)
    KVStore(sqlite_catalog, "db.kv").put("a", 1)
    original = LogTable.read
    monkeypatch.setattr(LogTable, "read", lambda self, p, start=None, end=None, **kw: original(self, p, 1, end, **kw))
    with pytest.raises(ReplayGap) as raised:
        KVStore(sqlite_catalog, "db.kv")
    assert raised.value.offset == 0


def test_cli_creates_the_table_and_prints_json(sqlite_spec, monkeypatch, capsys):
    assert run_cli(sqlite_spec, "db.cli", "put", "n", "41") == (
        0,
        [{"op": "put", "key": "n", "value": 41, "offset": 0, "mismatches": 0}],
    )
    for name, value in sqlite_spec.env().items():  # the rest in-process: the same main(), faster
        monkeypatch.setenv(name, value)

    def cli(*args: str) -> tuple[int, list[dict]]:
        code = main(["db.cli", *args])
        return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert cli("incr", "n", "--times", "2") == (
        0,
        [{"op": "incr", "key": "n", "value": v, "offset": o, "mismatches": 0} for v, o in ((42, 1), (43, 2))],
    )
    assert cli("put", "s", "hello")[1][0]["value"] == "hello"
    assert cli("delete", "s") == (0, [{"op": "delete", "key": "s", "value": None, "offset": 4, "mismatches": 0}])
    assert cli("get", "s") == (0, [{"key": "s", "value": None, "found": False, "next_offset": 5}])
    assert cli("dump") == (0, [{"table": "db.cli", "partition": 0, "next_offset": 5, "data": {"n": 43}}])
    cli("put", "s", "x")
    code, [error] = cli("incr", "s")
    assert (code, error["error"]) == (2, "InvalidInput")
    assert LogTable(sqlite_spec.open(), "db.cli").watermarks()[0].end == 6

"""A consume-transform-produce program (``eos_copier``, confluent-kafka's public API) run as its own
process against ``icelog serve``, once undisturbed and once with the gateway ``kill -9``ed and
restarted under it: every input record's output is found exactly once, by a read_committed
consumer and by DuckDB on the Iceberg table, and no aborted record anywhere."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Producer

from icelog.pipelines.gateway.topics import create_topic
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from tests.gateway.conftest import ROOT, Served, quiet_logs
from tests.gateway.reading import read_all, stored


def _fill(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **quiet_logs()})
    for i in range(count):
        producer.produce(topic, value=f"in-{i}".encode(), partition=i % 2)
    assert producer.flush(60) == 0


def _run_copier(served: Served, source: str, sink: str, group: str, count: int, during=None) -> subprocess.CompletedProcess:
    """The copier's exit code and output (it gives up after 240 s with exit code 3)."""
    errors = served.directory / "copier.err"
    with open(errors, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gateway.eos_copier", served.bootstrap, source, sink, group, str(count), "3"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            if during is not None:
                during()
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, errors.read_text())


def _check(spec, served: Served, source: str, sink: str, group: str, count: int) -> None:
    want = sorted(f"out-{i}".encode() for i in range(count))
    consumed = read_all(served.bootstrap, sink, "read_committed", count)
    assert sorted(v for _, _, v in consumed) == want  # each exactly once, no aborted-N
    in_table = stored(spec, sink)
    assert sorted(v for _, _, v in in_table) == want
    assert sorted(in_table) == consumed  # the same records at the same offsets
    for p in (0, 1):  # the copy keeps partitions, and each partition's order
        assert [int(v[4:]) for q, _, v in in_table if q == p] == list(range(p, count, 2))
    assert committed_offsets(spec.open(), group, source) == {0: count // 2, 1: count // 2}


def test_consume_transform_produce_copies_each_record_once(gateway, module_spec):
    source, sink, group = "db.eos_in", "db.eos_out", "eos-copier"
    for name in (source, sink):
        create_topic(module_spec.open(), name, 2)
    count = 200
    _fill(gateway.bootstrap, source, count)
    done = _run_copier(gateway, source, sink, group, count)
    assert done.returncode == 0, done.stderr
    assert "aborted on purpose" in done.stderr
    _check(module_spec, gateway, source, sink, group, count)


@pytest.mark.slow
def test_consume_transform_produce_survives_kill_9_of_the_gateway(sqlite_spec, tmp_path):
    source, sink, group = "db.eos_in", "db.eos_out", "eos-copier"
    for name in (source, sink):
        create_topic(sqlite_spec.open(), name, 2)
    served = Served(sqlite_spec, tmp_path)
    served.start()
    count = 1000
    try:
        _fill(served.bootstrap, source, count)
        # Every commit holds 0.3 s after its swap before it answers: the kill may land on a
        # transaction that is committed but not acknowledged as well as on an open one.
        served.stop()
        served.start(ICELOG_DELAY_AT="after_catalog_swap:0.3")

        def crash() -> None:
            output = LogTable.open(sqlite_spec.open(), sink)
            deadline = time.monotonic() + 120
            while sum(m.end for m in output.watermarks().values()) < 100 and time.monotonic() < deadline:
                time.sleep(0.2)
            served.kill()
            time.sleep(1)
            served.restart()

        killer = threading.Thread(target=crash)
        done = _run_copier(served, source, sink, group, count, during=killer.start)
        killer.join()
        assert served.starts == 3
        assert done.returncode == 0, done.stderr
        # The restarted gateway lost the open transaction: the copier was told to abort it.
        assert "aborting: " in done.stderr and "aborted on purpose" in done.stderr
        _check(sqlite_spec, served, source, sink, group, count)
        assert served.stop() == 0
    finally:
        if served.proc.poll() is None:
            served.kill()

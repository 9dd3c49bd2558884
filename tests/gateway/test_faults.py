"""The gateway killed, stopped and restarted under an idempotent confluent-kafka producer:
no acknowledged record lost, none written twice, no gap in the offsets."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from icelog.pipelines.gateway.topics import create_topic
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.conftest import TOPIC, Served, quiet_logs


def _table(spec) -> dict[int, list[bytes]]:
    log_table = LogTable.open(spec.open(), TOPIC)
    out = {}
    for p in (0, 1):
        rows = log_table.read(p)
        assert rows["log_offset"].to_pylist() == list(range(rows.num_rows)), "a gap in the offsets"
        out[p] = rows["value"].to_pylist()
    assert run_checks(log_table.table()).violations == []
    return out


def _send(served, count: int, during, **config) -> list[tuple]:
    """Produce ``count`` records (values b"0", b"1", ...) over both partitions; ``during()`` starts
    in a thread once the first records are acknowledged."""
    producer = Producer(
        {
            "bootstrap.servers": served.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 20,
            "reconnect.backoff.max.ms": 200,
            **quiet_logs(),
            **config,
        }
    )
    reports: list[tuple] = []
    fault = threading.Thread(target=during)
    for i in range(2):  # the producer id is leased and the first batches land before the fault
        producer.produce(TOPIC, value=str(i).encode(), partition=i % 2, on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(30) == 0
    for i in range(2, count):
        producer.produce(TOPIC, value=str(i).encode(), partition=i % 2, on_delivery=lambda e, m: reports.append((e, m)))
        producer.poll(0)
        if i == 100:
            fault.start()
        time.sleep(0.002)
    fault.join()
    producer.flush(90)
    return [(e, m.partition(), m.offset(), m.value()) for e, m in reports]


def test_kill_9_and_restart_under_an_idempotent_producer_loses_and_duplicates_nothing(sqlite_spec, tmp_path):
    # Every commit of the first process sleeps a second after its catalog swap, before the
    # produce is answered: the kill lands on batches that are committed but not acknowledged,
    # which the producer re-sends to the restarted gateway (duplicates by identity).
    create_topic(sqlite_spec.open(), TOPIC, 2)
    served = Served(sqlite_spec, tmp_path)
    served.start(ICELOG_DELAY_AT="after_catalog_swap:1")

    try:

        def crash():
            time.sleep(0.5)
            served.kill()
            time.sleep(0.5)
            served.restart()

        reports = _send(served, 600, crash)
        assert served.starts == 2
        assert all(e is None for e, *_ in reports), {str(e) for e, *_ in reports if e is not None}
        stored = _table(sqlite_spec)
        for p in (0, 1):
            sent = [str(i).encode() for i in range(p, 600, 2)]
            assert stored[p] == sent  # each exactly once, in the order sent
            assert sorted((o, v) for _, q, o, v in reports if q == p) == list(enumerate(sent))
        assert served.stop() == 0
    finally:
        if served.proc.poll() is None:
            served.kill()


def test_sigterm_commits_every_acknowledged_record_and_exits_0(served, sqlite_spec):
    exit_codes = []

    def stop():
        time.sleep(0.5)
        exit_codes.append(served.stop())

    reports = _send(served, 600, stop, **{"message.timeout.ms": 4000})
    assert exit_codes == [0], served.stderr()
    acked = [(p, o, v) for e, p, o, v in reports if e is None]
    assert acked, "nothing was acknowledged before the stop"
    stored = _table(sqlite_spec)
    for p, o, v in acked:
        assert stored[p][o] == v
    for p in (0, 1):
        assert len(set(stored[p])) == len(stored[p])

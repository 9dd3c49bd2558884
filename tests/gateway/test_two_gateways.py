"""Two ``icelog serve`` processes over one PostgreSQL catalog: all their state is in the catalog,
so their commits contend on its compare-and-swap like any two writers, and a producer's
identity (id, epoch, sequences) means the same on both."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaException, Producer

from icelog.pipelines.gateway.topics import create_topic
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.conftest import TOPIC, Served, quiet_logs

PARTITIONS = 2


def _produce(served: Served, tag: str, count: int, reports: list, started: threading.Event) -> None:
    """``count`` records ``{tag}{i}`` over both partitions from one idempotent producer, paced so
    that the other gateway's commits interleave with this one's."""
    producer = Producer(
        {
            "bootstrap.servers": served.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 25,
            "reconnect.backoff.max.ms": 200,
            **quiet_logs(),
        }
    )
    for i in range(count):
        producer.produce(
            TOPIC, value=f"{tag}{i}".encode(), partition=i % PARTITIONS, on_delivery=lambda e, m: reports.append((e, m))
        )
        producer.poll(0)
        if i == 1:  # the producer id is leased and the first records land before anything else
            assert producer.flush(120) == 0
        if i == 100:
            started.set()
        time.sleep(0.003)
    assert producer.flush(120) == 0


def test_two_gateways_on_one_postgres_catalog_lose_and_duplicate_nothing_across_a_kill(postgres_spec, tmp_path):
    create_topic(postgres_spec.open(), TOPIC, PARTITIONS)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Gateway a holds every commit a moment after its swap, so its kill lands on batches that are
    # committed but not acknowledged: the producer re-sends them to the restarted a, where they
    # must be found duplicates by identity, not appended again beside b's records.
    a, b = Served(postgres_spec, tmp_path / "a"), Served(postgres_spec, tmp_path / "b")
    a.start(ICELOG_DELAY_AT="after_catalog_swap:1")
    b.start()
    count = 300
    reports: dict[str, list] = {"a": [], "b": []}
    started = {"a": threading.Event(), "b": threading.Event()}
    try:
        producers = [
            threading.Thread(target=_produce, args=(served, tag, count, reports[tag], started[tag]))
            for tag, served in (("a", a), ("b", b))
        ]
        for thread in producers:
            thread.start()
        assert started["a"].wait(120) and started["b"].wait(120)
        time.sleep(0.5)  # inside a's commits, each held a second after its swap
        a.kill()
        time.sleep(0.5)
        a.restart()
        for thread in producers:
            thread.join(300)
            assert not thread.is_alive()

        errors = {str(e) for tag in reports for e, _ in reports[tag] if e is not None}
        assert not errors, errors
        log_table = LogTable.open(postgres_spec.open(), TOPIC)
        for p in range(PARTITIONS):
            rows = log_table.read(p)
            assert rows["log_offset"].to_pylist() == list(range(rows.num_rows)), "a gap in the offsets"
            stored = rows["value"].to_pylist()
            for tag in ("a", "b"):
                sent = [f"{tag}{i}".encode() for i in range(p, count, PARTITIONS)]
                assert [v for v in stored if v.startswith(tag.encode())] == sent  # each once, in the order sent
                # Every acknowledgement names the offset the record really holds, on either gateway.
                acked = {m.value(): m.offset() for e, m in reports[tag] if m.partition() == p}
                assert acked == {v: o for o, v in enumerate(stored) if v.startswith(tag.encode())}
        assert run_checks(log_table.table()).violations == []  # deep contiguity, producers, transactions
        assert a.stop() == 0 and b.stop() == 0
    finally:
        for served in (a, b):
            if served.proc is not None and served.proc.poll() is None:
                served.kill()


def test_a_transactional_producer_on_one_gateway_is_fenced_by_a_new_instance_on_the_other(postgres_spec, tmp_path):
    """The epoch is the catalog's: a zombie on gateway a is fenced by the same transactional.id
    initialized on gateway b, and nothing it produced becomes visible."""
    create_topic(postgres_spec.open(), TOPIC, PARTITIONS)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Served(postgres_spec, tmp_path / "a"), Served(postgres_spec, tmp_path / "b")
    a.start()
    b.start()
    try:
        zombie = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": "copier", **quiet_logs()})
        zombie.init_transactions(60)
        zombie.begin_transaction()
        zombie.produce(TOPIC, value=b"zombie-1", partition=0)
        zombie.flush(30)  # staged on a
        current = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "copier", **quiet_logs()})
        current.init_transactions(60)  # on b: epoch + 1
        zombie.produce(TOPIC, value=b"zombie-2", partition=1)  # a new partition: AddPartitionsToTxn is fenced
        with pytest.raises(KafkaException) as raised:
            zombie.commit_transaction(30)
        assert raised.value.args[0].fatal()
        current.begin_transaction()
        current.produce(TOPIC, value=b"current", partition=0)
        current.commit_transaction(60)
        log_table = LogTable.open(postgres_spec.open(), TOPIC)
        assert log_table.read(0)["value"].to_pylist() == [b"current"]
        assert log_table.read(1).num_rows == 0
        assert run_checks(log_table.table()).violations == []
        assert a.stop() == 0 and b.stop() == 0
    finally:
        for served in (a, b):
            if served.proc is not None and served.proc.poll() is None:
                served.kill()

"""Kafka transactions through ``icelog serve`` with unmodified confluent-kafka: commit, abort, and
what a read_committed or read_uncommitted consumer, icelog and DuckDB then find."""

from __future__ import annotations

import time

import duckdb
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from icelog.storage.log.scan import planned_paths
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.conftest import quiet_logs


def transactional(bootstrap: str, tid: str, **config) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **quiet_logs(), **config})
    producer.init_transactions(60)
    return producer


def read_all(bootstrap: str, topic: str, isolation: str, expect: int, wait: float = 20) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record of both partitions a consumer reads from 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "assign-only",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **quiet_logs(),
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if len(got) >= expect:
                    break  # and nothing more came for a poll
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.value()))
    finally:
        consumer.close()
    return sorted(got)


def stored(spec, topic: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of the Iceberg table, read by DuckDB from the planned files."""
    table = LogTable.open(spec.open(), topic).table()
    assert run_checks(table).violations == []
    paths = planned_paths(table)
    if not paths:
        return []
    return sorted(duckdb.sql(f"SELECT log_partition, log_offset, value FROM read_parquet({paths!r})").fetchall())


def test_a_committed_transaction_is_read_once_and_an_aborted_one_never(gateway, module_spec, topic):
    producer = transactional(gateway.bootstrap, f"tx-{topic}")
    reports: list[tuple] = []
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=f"c{i}".encode(), partition=i % 2, on_delivery=lambda e, m: reports.append((e, m.offset())))
    producer.commit_transaction(60)
    # Acknowledged before the commit decides offsets: librdkafka numbers a batch from the -1 answered.
    # Acknowledged once staged, before the commit decides offsets: the answer's base offset is -1,
    # which librdkafka reports as no offset for a batch's first record (and counts on from).
    assert [e for e, _ in reports] == [None] * 6 and None in [o for _, o in reports]

    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=f"a{i}".encode(), partition=i % 2)
    producer.flush(30)  # staged at the gateway, acknowledged, then aborted
    producer.abort_transaction(60)

    producer.begin_transaction()
    producer.produce(topic, value=b"c6", partition=0)
    producer.commit_transaction(60)

    expected = [(0, 0, b"c0"), (0, 1, b"c2"), (0, 2, b"c4"), (0, 3, b"c6"), (1, 0, b"c1"), (1, 1, b"c3"), (1, 2, b"c5")]
    for isolation in ("read_committed", "read_uncommitted"):
        assert read_all(gateway.bootstrap, topic, isolation, len(expected)) == expected, isolation
    assert stored(module_spec, topic) == expected


def test_an_open_transaction_is_invisible_until_it_commits(gateway, topic):
    producer = transactional(gateway.bootstrap, f"tx-{topic}")
    producer.begin_transaction()
    producer.produce(topic, value=b"later", partition=1)
    producer.flush(30)
    for isolation in ("read_committed", "read_uncommitted"):
        assert read_all(gateway.bootstrap, topic, isolation, 0, wait=2) == []
    producer.commit_transaction(60)
    assert read_all(gateway.bootstrap, topic, "read_uncommitted", 1) == [(1, 0, b"later")]


def test_a_new_instance_fences_the_old_one_which_writes_nothing(gateway, module_spec, topic):
    tid = f"tx-{topic}"
    zombie = transactional(gateway.bootstrap, tid)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(30)
    current = transactional(gateway.bootstrap, tid)  # epoch + 1: the zombie's transaction is aborted
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(30)
    assert raised.value.args[0].fatal()
    current.begin_transaction()
    current.produce(topic, value=b"current", partition=0)
    current.commit_transaction(60)
    assert read_all(gateway.bootstrap, topic, "read_committed", 1) == [(0, 0, b"current")]
    assert stored(module_spec, topic) == [(0, 0, b"current")]

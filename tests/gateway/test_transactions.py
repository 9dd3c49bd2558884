"""Kafka transactions through ``icelog serve`` with unmodified clients (confluent-kafka, kafka-python,
aiokafka) and raw requests: commit, abort, fencing, bad input, and what consumers and DuckDB then find."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway.records import CONTROL, TRANSACTIONAL, encode_batch
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers.journal_state import JOURNAL
from tests.gateway.conftest import quiet_logs
from tests.gateway.raw import Connection
from tests.gateway.reading import read_all, stored


def transactional(bootstrap: str, tid: str, **config) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **quiet_logs(), **config})
    producer.init_transactions(60)
    return producer


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


# --- bad input, through the raw protocol ------------------------------------------------------


def _init(conn: Connection, tid: str) -> tuple[int, int]:
    answer = conn.call(22, 4, {"transactional_id": tid, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1})
    assert answer.error_code == ErrorCode.none
    return answer.producer_id, answer.producer_epoch


def _add(conn: Connection, tid: str, pid: int, epoch: int, topic: str, partitions=(0,)) -> list[ErrorCode]:
    body = {
        "v3_and_below_transactional_id": tid,
        "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}],
    }
    answer = conn.call(24, 3, body)
    return [p.partition_error_code for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition]


def _end(conn: Connection, tid: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
    body = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": commit}
    return conn.call(26, 3, body).error_code


def _txn_offsets(
    conn: Connection, tid: str, pid: int, epoch: int, group: str, topic: str, member: str = "", generation: int = -1
):
    body = {
        "transactional_id": tid,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "generation_id": generation,
        "member_id": member,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1}]}],
    }
    return [p.error_code for t in conn.call(28, 3, body).topics for p in t.partitions]


def _flagged(batch: bytes, attributes: int) -> bytes:
    """``batch`` with these attributes (bytes 21-22) and its CRC-32C (bytes 17-20) recomputed."""
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def _produce(conn: Connection, topic: str, pid: int, epoch: int, sequence: int, tid: str | None) -> ErrorCode:
    batch = _flagged(encode_batch(0, [(0, 1_000, None, b"x", ())], (pid, epoch, sequence)), TRANSACTIONAL)
    data = {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch)}]}
    answer = conn.call(0, 9, {"transactional_id": tid, "acks": -1, "timeout": 5000, "topic_data": [data]})
    return answer.responses[0].partition_responses[0].error_code


def test_bad_transactional_requests_get_typed_errors_and_write_nothing(gateway, module_spec, topic):
    tid = f"raw-{topic}"
    before = LogTable.open(module_spec.open(), topic).watermarks()
    with Connection(gateway.bootstrap) as conn:
        pid, epoch = _init(conn, tid)
        # EndTxn with no transaction open
        assert _end(conn, tid, pid, epoch, commit=True) == ErrorCode.invalid_txn_state
        assert _end(conn, tid, pid, epoch, commit=False) == ErrorCode.invalid_txn_state
        # AddPartitionsToTxn for an unknown topic, a missing partition, icelog's own tables
        assert _add(conn, tid, pid, epoch, "db.nothing_here") == [ErrorCode.unknown_topic_or_partition]
        assert _add(conn, tid, pid, epoch, topic, (0, 7)) == [
            ErrorCode.operation_not_attempted,
            ErrorCode.unknown_topic_or_partition,
        ]
        assert _add(conn, tid, pid, epoch, "icelog_system.transactions") == [ErrorCode.topic_authorization_failed]
        # a transactional batch for a partition not added, and one with no transaction at all
        assert _produce(conn, topic, pid, epoch, 0, tid) == ErrorCode.invalid_txn_state
        # TxnOffsetCommit for a group never added to the transaction, and for an unknown group's member
        assert _add(conn, tid, pid, epoch, topic) == [ErrorCode.none]
        assert _txn_offsets(conn, tid, pid, epoch, "no-such-group", topic) == [ErrorCode.invalid_txn_state]
        body = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "group_id": "no-such-group"}
        assert conn.call(25, 3, body).error_code == ErrorCode.none
        assert _txn_offsets(conn, tid, pid, epoch, "no-such-group", topic, "m-1", 3) == [ErrorCode.unknown_member_id]
        # a wrong epoch: older is fenced, a producer id that is not the transactional id's is unmapped
        assert _add(conn, tid, pid, epoch - 1, topic) == [ErrorCode.producer_fenced]
        assert _add(conn, tid, pid + 1000, epoch, topic) == [ErrorCode.invalid_producer_id_mapping]
        assert _end(conn, tid, pid, epoch + 1, commit=True) == ErrorCode.producer_fenced
        assert _end(conn, tid, pid + 1000, epoch, commit=False) == ErrorCode.invalid_producer_id_mapping
        assert _produce(conn, topic, pid, epoch - 1, 0, tid) == ErrorCode.invalid_producer_epoch
        # a good batch, then the same sequence again (a duplicate, staged once), then a gap
        assert _produce(conn, topic, pid, epoch, 0, tid) == ErrorCode.none
        assert _produce(conn, topic, pid, epoch, 0, tid) == ErrorCode.none
        assert _produce(conn, topic, pid, epoch, 5, tid) == ErrorCode.out_of_order_sequence_number
        assert _end(conn, tid, pid, epoch, commit=False) == ErrorCode.none
    assert LogTable.open(module_spec.open(), topic).watermarks() == before
    with Connection(gateway.bootstrap) as conn:  # still serving, and a commit now writes one record
        pid, epoch = _init(conn, tid)
        assert _add(conn, tid, pid, epoch, topic) == [ErrorCode.none]
        assert _produce(conn, topic, pid, epoch, 0, tid) == ErrorCode.none
        assert _produce(conn, topic, pid, epoch, 0, tid) == ErrorCode.none  # a resend: staged once
        assert _end(conn, tid, pid, epoch, commit=True) == ErrorCode.none
    assert LogTable.open(module_spec.open(), topic).watermarks()[0].end == before[0].end + 1


def test_a_control_batch_is_refused(gateway, module_spec, topic):
    batch = _flagged(encode_batch(0, [(0, 1_000, None, b"x", ())]), CONTROL)
    data = {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch)}]}
    with Connection(gateway.bootstrap) as conn:
        answer = conn.call(0, 9, {"acks": -1, "timeout": 5000, "topic_data": [data]})
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.invalid_record
    assert LogTable.open(module_spec.open(), topic).watermarks()[0].end == 0


def test_find_coordinator_names_the_gateway_for_a_transactional_id(gateway):
    with Connection(gateway.bootstrap) as conn:
        answer = conn.call(10, 4, {"key_type": 1, "coordinator_keys": ["some-tid"]})
        assert answer.coordinators[0].error_code == ErrorCode.none
        assert answer.coordinators[0].port == gateway.port
        assert (
            conn.call(10, 4, {"key_type": 2, "coordinator_keys": ["x"]}).coordinators[0].error_code == ErrorCode.invalid_request
        )


# --- kafka-python and aiokafka --------------------------------------------------------------------


def test_kafka_python_commits_and_aborts_transactions(gateway, module_spec, topic):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id=f"kp-{topic}", linger_ms=5)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(4):
        producer.send(topic, value=f"c{i}".encode(), partition=i % 2)
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send(topic, value=b"aborted", partition=0)
    producer.flush()
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send(topic, value=b"c4", partition=0)
    producer.commit_transaction()
    producer.close()
    expected = [(0, 0, b"c0"), (0, 1, b"c2"), (0, 2, b"c4"), (1, 0, b"c1"), (1, 1, b"c3")]
    assert read_all(gateway.bootstrap, topic, "read_committed", len(expected)) == expected
    assert stored(module_spec, topic) == expected


def test_aiokafka_commits_and_aborts_transactions(gateway, module_spec, topic):
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id=f"aio-{topic}", linger_ms=5)
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(4):
                    await producer.send(topic, value=f"c{i}".encode(), partition=i % 2)
            with pytest.raises(RuntimeError):
                async with producer.transaction():
                    await producer.send_and_wait(topic, value=b"aborted", partition=1)
                    raise RuntimeError("abort")
            async with producer.transaction():
                await producer.send(topic, value=b"c4", partition=1)
        finally:
            await producer.stop()

    asyncio.run(run())
    expected = [(0, 0, b"c0"), (0, 1, b"c2"), (1, 0, b"c1"), (1, 1, b"c3"), (1, 2, b"c4")]
    assert read_all(gateway.bootstrap, topic, "read_committed", len(expected)) == expected
    assert stored(module_spec, topic) == expected


def test_offsets_sent_with_a_generation_the_group_left_behind_abort_the_transaction(gateway, module_spec, topic):
    """KIP-447's fence: a member's group metadata from before a rebalance makes
    send_offsets_to_transaction fail abortably, and neither the records nor the offsets land."""
    group = f"fence-{topic}"
    config = {"bootstrap.servers": gateway.bootstrap, "group.id": group, "enable.auto.commit": False, **quiet_logs()}

    def joined(consumer: Consumer) -> None:
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert consumer.assignment()

    first = Consumer({**config, "session.timeout.ms": 6000})
    first.subscribe([topic])
    joined(first)
    stale = first.consumer_group_metadata()
    second = Consumer({**config, "session.timeout.ms": 6000})
    second.subscribe([topic])
    deadline = time.monotonic() + 60
    while len(first.assignment()) != 1 and time.monotonic() < deadline:  # the rebalance: one partition each
        first.poll(0.2)
        second.poll(0.2)
    assert len(first.assignment()) == 1
    producer = transactional(gateway.bootstrap, f"tx-{topic}")
    producer.begin_transaction()
    producer.produce(topic, value=b"never", partition=0)
    with pytest.raises(KafkaException) as raised:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, 0)], stale, 30)
    assert raised.value.args[0].txn_requires_abort()
    producer.abort_transaction(30)
    first.close()
    second.close()
    assert LogTable.open(module_spec.open(), topic).watermarks()[0].end == 0
    assert committed_offsets(module_spec.open(), group, topic) == {}


def test_a_gateway_starting_on_a_sql_catalog_creates_no_journal_and_recovers_nothing_after_a_kill(served, sqlite_spec):
    """Start-up recovery on an atomic catalog: without a journal it creates none; with one whose
    transactions all ended (a commit, then kill -9) it finds nothing to do and the gateway serves."""
    assert served.stop() == 0, served.stderr()
    assert not sqlite_spec.open().table_exists(JOURNAL)
    served.restart()
    producer = transactional(served.bootstrap, "sql-restarted")
    producer.begin_transaction()
    producer.produce("db.events", value=b"committed", partition=0)
    producer.commit_transaction(60)
    served.kill()
    served.restart()
    try:
        producer.begin_transaction()
        producer.produce("db.events", value=b"after", partition=0)
        producer.commit_transaction(60)
    except KafkaException as e:  # the restarted gateway lost the producer's session: abortable, with an epoch bump
        assert e.args[0].txn_requires_abort(), e
        producer.abort_transaction(60)
        producer.begin_transaction()
        producer.produce("db.events", value=b"after", partition=0)
        producer.commit_transaction(60)
    assert served.stop() == 0, served.stderr()
    assert "recovery at start-up" not in served.stderr()
    assert [(p, o, v) for p, o, v in stored(sqlite_spec, "db.events")] == [(0, 0, b"committed"), (0, 1, b"after")]

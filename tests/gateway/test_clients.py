"""kafka-python and aiokafka, unmodified, against ``icelog serve``; confluent-kafka's offset lookups."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from icelog.storage.log.table import LogTable
from tests.gateway.conftest import quiet_logs


def test_kafka_python_produces_idempotently_and_reads_back(gateway, module_spec, topic):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap, enable_idempotence=True, acks="all", linger_ms=5)
    futures = [
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2, headers=[("i", str(i).encode())])
        for i in range(20)
    ]
    producer.flush(30)
    metas = [f.get(timeout=30) for f in futures]
    producer.close()
    assert [(m.partition, m.offset) for m in metas] == [(i % 2, i // 2) for i in range(20)]

    consumer = KafkaConsumer(bootstrap_servers=gateway.bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    consumer.assign([KTopicPartition(topic, 1)])
    consumer.seek(KTopicPartition(topic, 1), 4)
    got, deadline = [], time.monotonic() + 30
    while len(got) < 6 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [(r.offset, r.key, r.value, list(r.headers)) for r in records]
    consumer.close()
    assert got == [
        (o, f"k{2 * o + 1}".encode(), f"v{2 * o + 1}".encode(), [("i", str(2 * o + 1).encode())]) for o in range(4, 10)
    ]
    assert LogTable.open(module_spec.open(), topic).watermarks()[1].end == 10


def test_aiokafka_produces_and_reads_back(gateway, module_spec, topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, enable_idempotence=True, linger_ms=5)
        await producer.start()
        try:
            metas = [
                await producer.send_and_wait(topic, f"a{i}".encode(), key=b"k", partition=0, timestamp_ms=1_000 + i)
                for i in range(10)
            ]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=gateway.bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = ATopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 10:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=500), 30)
                got += [(r.offset, r.value, r.timestamp) for r in batch.get(tp, [])]
        finally:
            await consumer.stop()
        return metas, got

    metas, got = asyncio.run(run())
    assert [m.offset for m in metas] == list(range(10))
    assert got == [(i, f"a{i}".encode(), 1_000 + i) for i in range(10)]


def test_list_offsets_earliest_latest_and_by_time(gateway, topic):
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True, **quiet_logs()})
    for i in range(3):
        producer.produce(topic, value=f"early{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    time.sleep(0.05)
    between_ms = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(2):
        producer.produce(topic, value=f"late{i}".encode(), partition=0)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "unused", **quiet_logs()})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30) == (0, 5)
        assert consumer.get_watermark_offsets(TopicPartition(topic, 1), timeout=30) == (0, 0)
        # by time: the first offset appended at or after the time (icelog's append time, log_timestamp)
        (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, between_ms)], timeout=30)
        assert found.offset == 3
        (none,) = consumer.offsets_for_times([TopicPartition(topic, 0, int(time.time() * 1000) + 60_000)], timeout=30)
        assert none.offset == -1  # no record that late
    finally:
        consumer.close()


def test_the_admin_client_creates_topics_with_the_kafka_schema(gateway, module_spec):
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, **quiet_logs()})
    futures = admin.create_topics(
        [NewTopic("db.made", num_partitions=3, replication_factor=1), NewTopic("bare", num_partitions=-1, replication_factor=1)]
    )
    for f in futures.values():
        assert f.result(30) is None
    assert LogTable.open(module_spec.open(), "db.made").state().partitions == 3
    assert LogTable.open(module_spec.open(), "logs.bare").state().partitions == 1  # a bare name is in namespace logs

    refused = admin.create_topics(
        [
            NewTopic("db.made", num_partitions=1, replication_factor=1),
            NewTopic("icelog_system.x", num_partitions=1, replication_factor=1),
            NewTopic("db.bad-name", num_partitions=1, replication_factor=1),
            NewTopic("db.checked", num_partitions=2, replication_factor=1),
        ],
        validate_only=True,
    )
    codes = {}
    for name, f in refused.items():
        try:
            f.result(30)
            codes[name] = None
        except KafkaException as e:
            codes[name] = e.args[0].code()
    assert codes == {
        "db.made": KafkaError.TOPIC_ALREADY_EXISTS,
        "icelog_system.x": KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "db.bad-name": KafkaError.TOPIC_EXCEPTION,
        "db.checked": None,
    }
    assert not module_spec.open().table_exists("db.checked")  # validate_only creates nothing

    # produced to right away, read back as any topic
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True, **quiet_logs()})
    producer.produce("db.made", value=b"first", partition=2)
    assert producer.flush(30) == 0
    assert LogTable.open(module_spec.open(), "db.made").read(2)["value"].to_pylist() == [b"first"]


def test_metadata_lists_log_tables_and_never_system_tables(gateway, module_spec, topic):
    assert module_spec.open().table_exists("icelog_system.producer_ids")  # made by the gateway at start
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, **quiet_logs()})
    listed = admin.list_topics(timeout=30).topics
    assert topic in listed and len(listed[topic].partitions) == 2
    assert not [name for name in listed if name.startswith("icelog_system.")]

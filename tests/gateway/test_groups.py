"""Consumer groups through ``icelog serve`` with unmodified clients: rebalances, commits, resumes,
and what icelog's own group state shows of them."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Producer

from icelog.pipelines.gateway.topics import create_topic
from icelog.storage.groups.offsets import committed_offsets
from tests.gateway.clients import Member, describe, until
from tests.gateway.conftest import quiet_logs

_names = iter(range(10**6))


def _topic(spec, partitions: int) -> str:
    name = f"db.g{next(_names)}_{int(time.time() * 1000) % 10**6}"
    create_topic(spec.open(), name, partitions)
    return name


def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **quiet_logs()})
    for p in range(partitions):
        for i in range(start, start + per_partition):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p)
    assert producer.flush(60) == 0


@pytest.mark.parametrize("n", [20, pytest.param(1000, marks=pytest.mark.slow)])
def test_a_group_of_three_rebalances_when_one_leaves_and_consumes_everything(gateway, module_spec, n):
    topic, group = _topic(module_spec, 6), f"three{n}"
    _produce(gateway.bootstrap, topic, 6, n)
    seen: list = []
    members = [Member(gateway.bootstrap, group, topic, seen) for _ in range(3)]
    for m in members:
        m.start()
    until(lambda: all(len(m.assignment()) == 2 for m in members), 90, "three members with two partitions each")
    until(lambda: len(set(seen)) >= 6 * n, 90 + n / 10, "the first records")
    members[0].leave.set()
    members[0].join(30)
    until(lambda: sorted(members[1].assignment() + members[2].assignment()) == list(range(6)), 90, "the two left to share six")
    _produce(gateway.bootstrap, topic, 6, n, start=n)
    until(lambda: len(set(seen)) == 6 * 2 * n, 90 + n / 10, "every record")
    for m in members[1:]:
        m.leave.set()
        m.join(30)
    assert not any(m.errors for m in members)
    assert set(seen) == {(p, o) for p in range(6) for o in range(2 * n)}

    described = describe(module_spec, group)
    assert {(e["partition"], e["committed_offset"]) for e in described["partitions"]} == {(p, 2 * n) for p in range(6)}
    assert described["members"] == []  # all left: the last round recorded an empty group
    assert described["generation"] >= 3


def test_kafka_python_commits_and_a_new_consumer_resumes_there(gateway, module_spec):
    from kafka import KafkaConsumer

    topic, group = _topic(module_spec, 2), "kp"
    _produce(gateway.bootstrap, topic, 2, 10)

    def consume(count: int) -> list:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=gateway.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            max_poll_records=count,
        )
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            # A long poll: kafka-python 3.0.12 stops heartbeating when a rejoin completes after
            # its poll timed out (a join here includes a catalog commit, so it can take a while).
            for records in consumer.poll(timeout_ms=3000, max_records=count - len(got)).values():
                got += [(r.partition, r.offset) for r in records]
        consumer.commit()
        consumer.close()
        return got

    first = consume(12)
    assert len(first) == 12
    second = consume(8)
    assert sorted(first + second) == [(p, o) for p in range(2) for o in range(10)]
    spec = module_spec.open()
    assert committed_offsets(spec, group, topic) == {0: 10, 1: 10}


def test_aiokafka_commits_and_resumes_after_a_restart(gateway, module_spec):
    from aiokafka import AIOKafkaConsumer

    topic, group = _topic(module_spec, 2), "aio"
    _produce(gateway.bootstrap, topic, 2, 10)

    async def consume(count: int) -> list:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=gateway.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        got: list = []
        deadline = time.monotonic() + 60
        try:
            while len(got) < count and time.monotonic() < deadline:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=200, max_records=count - len(got)), 60)
                got += [(r.partition, r.offset) for records in batch.values() for r in records]
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    first = asyncio.run(consume(5))
    second = asyncio.run(consume(15))
    assert sorted(first + second) == [(p, o) for p in range(2) for o in range(10)]
    assert committed_offsets(module_spec.open(), group, topic) == {0: 10, 1: 10}


def test_admin_clients_create_describe_and_delete_topics_and_describe_the_cluster(gateway, module_spec):
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, **quiet_logs()})
    name = f"db.adm{next(_names)}"
    admin.create_topics([NewTopic(name, 3)])[name].result(60)
    assert name in admin.list_topics(timeout=30).topics

    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    described = next(iter(configs.values())).result(60)
    properties = module_spec.open().load_table(name).metadata.properties
    assert {k: c.value for k, c in described.items()} == dict(properties)
    assert all(c.is_read_only for c in described.values())

    cluster = admin.describe_cluster().result(60)
    assert (cluster.cluster_id, [n.port for n in cluster.nodes]) == (f"icelog-{module_spec.name}", [gateway.port])

    kadmin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        by_type = kadmin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all")
        assert set(next(iter(by_type.values()))[name]) == set(properties)
        assert kadmin.describe_cluster()["cluster_id"] == f"icelog-{module_spec.name}"
        kadmin.delete_topics([name])
    finally:
        kadmin.close()
    assert not module_spec.open().table_exists(name)
    again = f"db.adm{next(_names)}"
    admin.create_topics([NewTopic(again, 1)])[again].result(60)
    admin.delete_topics([again])[again].result(60)
    assert not module_spec.open().table_exists(again)
    assert admin.delete_topics(["icelog_system.group_offsets"])["icelog_system.group_offsets"].exception(60) is not None


def test_admin_clients_list_and_describe_groups_and_their_offsets(gateway, module_spec):
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, group = _topic(module_spec, 2), f"listed{next(_names)}"
    _produce(gateway.bootstrap, topic, 2, 3)
    seen: list = []
    member = Member(gateway.bootstrap, group, topic, seen)
    member.start()
    try:
        until(lambda: len(set(seen)) == 6, 90, "six records")
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap, **quiet_logs()})
        listed = admin.list_consumer_groups().result(60)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(60)
        assert len(described.members) == 1
        assert sorted(tp.partition for tp in described.members[0].assignment.topic_partitions) == [0, 1]
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0), TopicPartition(topic, 1)])]
        offsets = admin.list_consumer_group_offsets(request)[group].result(60)
        assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 3), (1, 3)]
    finally:
        member.leave.set()
        member.join(30)

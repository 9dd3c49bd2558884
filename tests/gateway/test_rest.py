"""``icelog serve`` over an Iceberg REST catalog (SeaweedFS REST + S3) with unmodified confluent-kafka:
an idempotent producer, a transactional producer with a consumer group's offsets (multi-table
commits are not atomic there: the coordinator journal decides, each table rolls forward), and a
consumer group of two members; then what is owed to the journal at SIGTERM, a gateway killed
between the roll-forwards of a decided transaction, and a group's offsets fetched before its
roll-forward."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from icelog.pipelines.gateway.topics import create_topic
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers.journal_state import JOURNAL
from icelog.validations.checks import run_checks
from tests.gateway.clients import Member, consume, describe, produce, table_rows, until
from tests.gateway.conftest import Served, quiet_logs
from tests.gateway.reading import read_all, stored
from tests.support.faults import kill_at
from tests.support.transactions import journal, staged_files

pytestmark = pytest.mark.integration

TOPIC = "db.events"


@pytest.fixture
def rest_gateway(rest_spec, tmp_path):
    """A gateway over the SeaweedFS REST catalog holding ``db.events`` (2 partitions)."""
    create_topic(rest_spec.open(), TOPIC, 2)
    server = Served(rest_spec, tmp_path)
    server.start()
    yield server
    assert server.stop() == 0, server.stderr()


def test_rest_an_idempotent_producer_lands_each_record_once_at_exact_offsets(rest_gateway, rest_spec):
    records = [(i % 2, f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())], 1_700_000_000_000 + i) for i in range(40)]
    reports = produce(rest_gateway.bootstrap, TOPIC, records)
    assert [r[0] for r in reports] == [None] * 40
    for p in (0, 1):
        assert [r[2] for r in reports if r[1] == p] == list(range(20))

    got = consume(rest_gateway.bootstrap, TOPIC, {0: 0, 1: 0}, 40)
    for p in (0, 1):
        seen = [g for g in got if g[0] == p]
        assert [g[1] for g in seen] == list(range(20))
        assert [(g[2], g[3], g[4], g[5]) for g in seen] == [(k, v, h, ts) for q, k, v, h, ts in records if q == p]

    rows = table_rows(rest_spec, TOPIC)
    assert sorted(rows) == sorted((g[0], g[1], g[2], g[3]) for g in got)
    assert stored(rest_spec, TOPIC) == sorted((g[0], g[1], g[3]) for g in got)  # DuckDB, and run_checks clean
    assert len(LogTable.open(rest_spec.open(), TOPIC).state().producers) == 1


def test_rest_a_transaction_commits_its_records_and_group_offsets_and_an_aborted_one_leaves_nothing(rest_gateway, rest_spec):
    source, group = "db.source", "rest-copier"
    create_topic(rest_spec.open(), source, 2)
    produce(rest_gateway.bootstrap, source, [(i % 2, None, f"in-{i}".encode(), [], 1_000 + i) for i in range(6)])

    consumer = Consumer(
        {
            "bootstrap.servers": rest_gateway.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
            **quiet_logs(),
        }
    )
    consumer.subscribe([source])
    read: list = []
    deadline = time.monotonic() + 60
    while len(read) < 6 and time.monotonic() < deadline:
        read += [m for m in consumer.consume(10, 0.5) if m.error() is None]
    assert len(read) == 6

    producer = Producer(
        {"bootstrap.servers": rest_gateway.bootstrap, "transactional.id": "rest-tx", "linger.ms": 5, **quiet_logs()}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for m in read:
        producer.produce(TOPIC, value=m.value().replace(b"in-", b"out-"), partition=m.partition())
    positions = consumer.position(consumer.assignment())
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
    producer.commit_transaction(60)

    producer.begin_transaction()
    for i in range(4):
        producer.produce(TOPIC, value=f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(30)  # staged at the gateway, then aborted
    producer.abort_transaction(60)
    consumer.close()

    expected = sorted((p, o, f"out-{i}".encode()) for p in (0, 1) for o, i in enumerate(i for i in range(6) if i % 2 == p))
    assert read_all(rest_gateway.bootstrap, TOPIC, "read_committed", len(expected)) == expected
    assert stored(rest_spec, TOPIC) == expected  # no aborted record in the table
    catalog = rest_spec.open()
    assert committed_offsets(catalog, group, source) == {0: 3, 1: 3}
    for name in (TOPIC, source, JOURNAL):
        assert run_checks(catalog.load_table(name)).violations == [], name
    # Through the coordinator journal: the first decided (PREPARE_COMMIT), rolled forward, and
    # recorded COMMITTED with the producer's next journal step (here: the gateway's stop). The
    # second was aborted before any decision: sends write nothing to the journal, so it never
    # heard of it, and the abort deleted the files the sends had written.
    assert staged_files(LogTable.open(catalog, TOPIC)) == []
    assert rest_gateway.stop() == 0, rest_gateway.stderr()
    states: dict[str, list[str]] = {}
    for r in journal(catalog):
        if r["transactional_id"] == "rest-tx":
            states.setdefault(r["txn_id"], []).append(r["txn_state"])
    assert [s[-1] for s in states.values()] == ["COMMITTED"]
    assert "PREPARE_COMMIT" in next(iter(states.values()))


def test_rest_a_group_of_two_reads_a_topic_and_commits_its_offsets(rest_gateway, rest_spec):
    produce(rest_gateway.bootstrap, TOPIC, [(i % 2, None, f"{i}".encode(), [], 1_000 + i) for i in range(20)])
    group, seen = "rest-two", []
    members = [Member(rest_gateway.bootstrap, group, TOPIC, seen) for _ in range(2)]
    for m in members:
        m.start()
    try:
        until(lambda: all(len(m.assignment()) == 1 for m in members), 60, "two members with one partition each")
        until(lambda: len(set(seen)) == 20, 60, "every record")
    finally:
        for m in members:
            m.leave.set()
            m.join(30)
    assert not any(m.errors for m in members)
    assert set(seen) == {(p, o) for p in (0, 1) for o in range(10)}
    assert committed_offsets(rest_spec.open(), group, TOPIC) == {0: 10, 1: 10}
    described = describe(rest_spec, group)
    assert {(e["partition"], e["committed_offset"]) for e in described["partitions"]} == {(0, 10), (1, 10)}


def test_rest_the_last_transaction_is_recorded_committed_when_the_gateway_stops(rest_gateway, rest_spec):
    """Without atomic commits COMMITTED is written after the roll-forward, with the producer's next
    journal step: a gateway stopped with SIGTERM writes it for the transactions it committed last."""
    producer = Producer({"bootstrap.servers": rest_gateway.bootstrap, "transactional.id": "rest-last", **quiet_logs()})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"last", partition=1)
    producer.commit_transaction(60)
    assert rest_gateway.stop() == 0, rest_gateway.stderr()
    catalog = rest_spec.open()
    assert [r["txn_state"] for r in journal(catalog) if r["transactional_id"] == "rest-last"][-1] == "COMMITTED"
    assert stored(rest_spec, TOPIC) == [(1, 0, b"last")]


def test_rest_a_transaction_open_when_the_gateway_stops_is_aborted(rest_gateway, rest_spec):
    producer = Producer({"bootstrap.servers": rest_gateway.bootstrap, "transactional.id": "rest-open", **quiet_logs()})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"never", partition=0)
    producer.flush(30)  # staged at the gateway
    assert rest_gateway.stop() == 0, rest_gateway.stderr()
    catalog = rest_spec.open()
    # Never decided: the journal never heard of it (sends write nothing there), and the stop's
    # abort deleted what its sends had written.
    assert [r for r in journal(catalog) if r["transactional_id"] == "rest-open"] == []
    assert staged_files(LogTable.open(catalog, TOPIC)) == []
    assert stored(rest_spec, TOPIC) == []


def _paused_over_two_topics(rest_spec, tmp_path, other: str, point: str) -> tuple[Served, Path]:
    """``db.events`` and ``other`` (2 partitions each), and a gateway that pauses at ``point``
    (for ``kill_at``); returns it with its pause file."""
    catalog = rest_spec.open()
    for name in (TOPIC, other):
        create_topic(catalog, name, 2)
    served = Served(rest_spec, tmp_path)
    pause = tmp_path / "paused"
    served.start(ICELOG_PAUSE_AT=point, ICELOG_PAUSE_FILE=str(pause))
    return served, pause


def test_rest_a_gateway_killed_between_the_roll_forwards_of_a_decided_transaction(rest_spec, tmp_path):
    """Killed after the journal decided (PREPARE_COMMIT) and one table took its part: the client's
    commit meets the restarted gateway, which does not hold the transaction (abortable, with an
    epoch bump); the bump's InitProducerId rolls the decided transaction forward: both tables
    hold it once, and the journal records it COMMITTED."""
    other = "db.other"
    served, pause = _paused_over_two_topics(rest_spec, tmp_path, other, "between_table_swaps")
    try:
        producer = Producer(
            {
                "bootstrap.servers": served.bootstrap,
                "transactional.id": "rest-killed",
                "reconnect.backoff.max.ms": 500,
                "metadata.recovery.strategy": "none",
                **quiet_logs(),
            }
        )
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"decided-a", partition=0)
        producer.produce(other, value=b"decided-b", partition=1)
        outcome: list = []

        def commit() -> None:
            try:
                producer.commit_transaction(120)
                outcome.append(None)
            except KafkaException as e:
                outcome.append(e.args[0])

        committer = threading.Thread(target=commit)
        committer.start()
        kill_at(served.proc, pause, timeout=60)
        served.proc.stdout.close()
        served.restart()
        committer.join(150)
        assert outcome, "commit_transaction did not return"
        if outcome[0] is not None:  # the restarted gateway did not hold it: the client aborts, with a bump
            assert outcome[0].txn_requires_abort(), outcome[0]
            producer.abort_transaction(60)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"next", partition=0)
        producer.commit_transaction(60)
        assert stored(rest_spec, TOPIC) == [(0, 0, b"decided-a"), (0, 1, b"next")]
        assert stored(rest_spec, other) == [(1, 0, b"decided-b")]
        states = [r["txn_state"] for r in journal(rest_spec.open()) if r["transactional_id"] == "rest-killed"]
        assert states.count("COMMITTED") >= 1 and "ABORTED" not in states
    finally:
        if served.proc.poll() is None:
            assert served.stop() == 0, served.stderr()


def test_rest_a_gateway_that_starts_rolls_forward_a_decided_transaction_without_any_client(rest_spec, tmp_path):
    """Killed right after the journal decided a transaction (PREPARE_COMMIT, no table has its part),
    with its client gone: a gateway that starts finishes it in the background, as Kafka's
    coordinator does when it loads its log. Its listener is up before (the recovery is held 8 s
    between the tables' parts here), and no request touches the transaction."""
    catalog = rest_spec.open()
    other = "db.other"
    served, pause = _paused_over_two_topics(rest_spec, tmp_path, other, "after_txn_prepare")
    producer = Producer({"bootstrap.servers": served.bootstrap, "transactional.id": "rest-orphaned", **quiet_logs()})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"decided-a", partition=0)
    producer.produce(other, value=b"decided-b", partition=1)

    def commit() -> None:
        with contextlib.suppress(KafkaException):  # its gateway is gone
            producer.commit_transaction(10)

    committer = threading.Thread(target=commit)
    committer.start()
    kill_at(served.proc, pause, timeout=60)
    served.proc.stdout.close()
    committer.join(60)  # the client gave up: it asks no gateway anything from here on
    states = [r["txn_state"] for r in journal(catalog) if r["transactional_id"] == "rest-orphaned"]
    assert states[-1] == "PREPARE_COMMIT"
    assert stored(rest_spec, TOPIC) == [] and stored(rest_spec, other) == []

    (tmp_path / "fresh").mkdir()
    fresh = Served(rest_spec, tmp_path / "fresh")  # another port: the old client cannot reach it
    fresh.start(ICELOG_DELAY_AT="between_table_swaps:8")
    try:
        # Listening while the recovery is held: it did not run before the listener.
        assert "COMMITTED" not in [r["txn_state"] for r in journal(catalog) if r["transactional_id"] == "rest-orphaned"]

        def committed() -> bool:
            return "COMMITTED" in [r["txn_state"] for r in journal(rest_spec.open()) if r["transactional_id"] == "rest-orphaned"]

        until(committed, 90, "the start-up recovery")
        assert stored(rest_spec, TOPIC) == [(0, 0, b"decided-a")]
        assert stored(rest_spec, other) == [(1, 0, b"decided-b")]
    finally:
        assert fresh.stop() == 0, fresh.stderr()
    assert "recovery at start-up: rolled forward" in fresh.stderr()


def _group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
            **quiet_logs(),
        }
    )


def test_rest_offsets_fetched_while_a_decided_transaction_rolls_forward_are_its_own(rest_spec, tmp_path):
    """The journal decided a transaction with a group's offsets and its tables are still to roll
    forward (held 4 s after the decision here; a gateway killed there leaves it so until someone
    finishes it): the group's committed offsets asked meanwhile, as a consumer taking over asks
    them, roll it forward first and are the transaction's, never the ones before it (which
    would read its input again and write its output twice)."""
    catalog = rest_spec.open()
    source, group = "db.source", "rest-takeover"
    for name in (TOPIC, source):
        create_topic(catalog, name, 2)
    served = Served(rest_spec, tmp_path)
    served.start(ICELOG_DELAY_AT="after_txn_prepare:4")
    try:
        produce(served.bootstrap, source, [(i % 2, None, f"in-{i}".encode(), [], 1_000 + i) for i in range(4)])
        producer = Producer({"bootstrap.servers": served.bootstrap, "transactional.id": "rest-held", **quiet_logs()})
        producer.init_transactions(60)
        offsets = [TopicPartition(source, 0, 2), TopicPartition(source, 1, 2)]
        outside = _group_consumer(served.bootstrap, group)  # never joins: no member, generation -1
        metadata = outside.consumer_group_metadata()
        outside.close()
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"out", partition=0)
        producer.send_offsets_to_transaction(offsets, metadata, 60)
        committer = threading.Thread(target=producer.commit_transaction, args=(60,))
        committer.start()
        deadline = time.monotonic() + 30
        while not any(r["txn_state"] == "PREPARE_COMMIT" for r in journal(catalog) if r["transactional_id"] == "rest-held"):
            assert time.monotonic() < deadline, "the transaction was never decided"
            time.sleep(0.2)
        taker = _group_consumer(served.bootstrap, group)
        try:
            committed = taker.committed([TopicPartition(source, 0), TopicPartition(source, 1)], timeout=30)
        finally:
            taker.close()
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 2), (1, 2)]
        assert stored(rest_spec, TOPIC) == [(0, 0, b"out")]  # rolled forward with them
        committer.join(60)
        assert not committer.is_alive()
        assert committed_offsets(rest_spec.open(), group, source) == {0: 2, 1: 2}
        assert stored(rest_spec, TOPIC) == [(0, 0, b"out")]  # once
    finally:
        assert served.stop() == 0, served.stderr()

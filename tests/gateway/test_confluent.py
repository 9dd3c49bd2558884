"""Unmodified confluent-kafka (librdkafka) against ``icelog serve``: idempotent produce, read_committed
fetch by assignment, and the Iceberg table holding exactly what the client saw, offset for offset."""

from __future__ import annotations

import duckdb
from confluent_kafka import KafkaError, Producer

from icelog.storage.log.scan import planned_paths
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.clients import consume, produce, table_rows
from tests.gateway.conftest import quiet_logs


def test_an_idempotent_producer_and_a_read_committed_consumer_see_the_table_as_it_is(gateway, module_spec, topic):
    base_ts = 1_700_000_000_123  # milliseconds survive the round trip
    records = [
        (
            i % 2,
            None if i == 3 else f"k{i}".encode(),
            f"v{i}".encode() * (i + 1),
            [("n", str(i).encode()), ("empty", None)],
            base_ts + i,
        )
        for i in range(60)
    ]
    reports = produce(gateway.bootstrap, topic, records)
    assert [r[0] for r in reports] == [None] * 60
    # Offsets are exact and gap-free per partition, in the order sent.
    for p in (0, 1):
        assert [r[2] for r in reports if r[1] == p] == list(range(30))

    got = consume(gateway.bootstrap, topic, {0: 0, 1: 0}, 60)
    by_partition = {p: [g for g in got if g[0] == p] for p in (0, 1)}
    for p in (0, 1):
        sent = [r for r in records if r[0] == p]
        seen = by_partition[p]
        assert [g[1] for g in seen] == list(range(30))
        assert [(g[2], g[3], g[4], g[5]) for g in seen] == [(k, v, h, ts) for _, k, v, h, ts in sent]

    # The Iceberg table holds the same records at the same offsets: through icelog and through DuckDB.
    rows = table_rows(module_spec, topic)
    assert sorted(rows) == sorted((g[0], g[1], g[2], g[3]) for g in got)
    table = LogTable.open(module_spec.open(), topic).table()
    paths = planned_paths(table)
    duck = duckdb.sql(f"SELECT log_partition, log_offset, key, value FROM read_parquet({paths!r})").fetchall()
    assert sorted(duck) == sorted(rows)
    assert run_checks(table).violations == []
    # Every row carries the producer's id, epoch and sequences: one icelog producer.
    producers = LogTable.open(module_spec.open(), topic).state().producers
    assert len(producers) == 1


def test_a_fetch_from_inside_a_batch_starts_at_that_offset(gateway, topic):
    produce(
        gateway.bootstrap, topic, [(0, f"k{i}".encode(), f"v{i}".encode(), [], 1_000 + i) for i in range(10)], **{"linger.ms": 50}
    )
    got = consume(gateway.bootstrap, topic, {0: 7}, 3)
    assert [(g[1], g[3]) for g in got] == [(7, b"v7"), (8, b"v8"), (9, b"v9")]


def test_compressed_batches_are_stored_uncompressed_and_read_back(gateway, module_spec, topic):
    sent = []
    for n, codec in enumerate(["gzip", "snappy", "lz4", "zstd"]):
        records = [(1, f"k{i}".encode(), (f"{codec} {i} " * 20).encode(), [], 5_000 + i) for i in range(25)]
        reports = produce(gateway.bootstrap, topic, records, **{"compression.type": codec, "linger.ms": 20})
        assert [r[:3] for r in reports] == [(None, 1, 25 * n + i) for i in range(25)], codec
        sent += [r[2] for r in records]
    got = consume(gateway.bootstrap, topic, {1: 0}, 100)
    assert [g[3] for g in got] == sent
    assert [r[3] for r in table_rows(module_spec, topic)] == sent


def test_an_unknown_topic_is_reported_and_nothing_is_created(gateway, module_spec):
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "message.timeout.ms": 3000, **quiet_logs()})
    errors = []
    producer.produce("db.nothing", value=b"x", partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._MSG_TIMED_OUT, KafkaError._UNKNOWN_TOPIC)
    assert not module_spec.open().table_exists("db.nothing")

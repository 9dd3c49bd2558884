"""What a consumer and DuckDB find in a topic: the gateway transaction tests' readers."""

from __future__ import annotations

import time

import duckdb
from confluent_kafka import Consumer, TopicPartition

from icelog.storage.log.scan import parquet_from, planned_paths
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.conftest import quiet_logs


def read_all(bootstrap: str, topic: str, isolation: str, expect: int, wait: float = 20, **config) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record of both partitions a consumer reads from 0
    (``config``: more librdkafka settings, such as SASL's)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "assign-only",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **quiet_logs(),
            **config,
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
    """(partition, offset, value) of the Iceberg table, read by DuckDB from the planned files (local,
    or on S3 through the table's FileIO: DuckDB's httpfs extension cannot be installed here)."""
    table = LogTable.open(spec.open(), topic).table()
    assert run_checks(table).violations == []
    paths = planned_paths(table)
    if not paths:
        return []
    con = duckdb.connect()
    source = parquet_from(con, paths, table.io)
    return sorted(con.sql(f"SELECT log_partition, log_offset, value FROM {source}").fetchall())

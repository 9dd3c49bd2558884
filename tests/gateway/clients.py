"""Confluent-kafka clients the gateway tests share: a producer, an assign-only consumer, a
group member in its own thread, the table's rows and ``icelog groups describe``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from icelog.storage.log.table import LogTable
from tests.gateway.conftest import ROOT, quiet_logs


def produce(bootstrap: str, topic: str, records: list[tuple], **config) -> list[tuple]:
    """Send ``(partition, key, value, headers, timestamp_ms)`` records; the delivery reports, in order of delivery."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **quiet_logs(), **config})
    reports = []

    def delivered(err, msg):
        reports.append((err, msg.partition(), msg.offset(), msg.key(), msg.value()))

    for partition, key, value, headers, ts in records:
        producer.produce(topic, key=key, value=value, partition=partition, headers=headers, timestamp=ts, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    return reports


def consume(bootstrap: str, topic: str, start: dict[int, int], count: int, timeout: float = 30) -> list[tuple]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "assign-only",  # required by the client; assign() uses no group protocol
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **quiet_logs(),
        }
    )
    consumer.assign([TopicPartition(topic, p, o) for p, o in start.items()])
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1]))
    finally:
        consumer.close()
    return got


def table_rows(spec, topic: str) -> list[tuple]:
    log_table = LogTable.open(spec.open(), topic)
    rows = []
    for p in (0, 1):
        t = log_table.read(p)
        for o, k, v in zip(t["log_offset"].to_pylist(), t["key"].to_pylist(), t["value"].to_pylist(), strict=True):
            rows.append((p, o, k, v))
    return rows


def describe(spec, group: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "icelog.pipelines.cli", "groups", "describe", "--group", group, "--output", "json"],
        capture_output=True,
        text=True,
        env=spec.env(),
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


class Member(threading.Thread):
    """One confluent-kafka group member polling in its own thread, committing what it read."""

    def __init__(self, bootstrap: str, group: str, topic: str, seen: list) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
                **quiet_logs(),
            }
        )
        self.assigned: list[int] = []  # kept by the callbacks (assignment() waits for poll() to return)
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        self.seen = seen
        self.leave = threading.Event()
        self.errors: list = []

    def run(self) -> None:
        try:
            while not self.leave.is_set():
                messages = [m for m in self.consumer.consume(50, 0.2) if not m.error()]
                if messages:
                    self.seen += [(m.partition(), m.offset()) for m in messages]
                    self.consumer.commit(asynchronous=False)  # the positions after what it read
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
        finally:
            self.consumer.close()  # LeaveGroup

    def _assigned(self, consumer, partitions) -> None:
        self.assigned = sorted(tp.partition for tp in partitions)

    def _revoked(self, consumer, partitions) -> None:
        self.assigned = []

    def assignment(self) -> list[int]:
        return self.assigned


def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)

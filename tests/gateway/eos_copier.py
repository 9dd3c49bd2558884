"""A consume-transform-produce program on confluent-kafka's public API, in the shape of its
``eos-transactions.py`` example: read ``in-N`` from the input topic in a consumer group, write
``out-N`` to the same partition of the output topic, and commit the group's positions in the same
transaction. One transaction (the ``abort_at``-th) is aborted on purpose, after producing
``aborted-N`` records. Exits 0 once the positions it committed cover ``count`` input records.

Run as its own process: ``python -m tests.gateway.eos_copier BOOTSTRAP IN OUT GROUP COUNT [ABORT_AT]``.
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def rewind(consumer: Consumer) -> None:
    """Back to the group's committed positions: what the aborted transaction read is read again."""
    for tp in consumer.committed(consumer.assignment(), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))


def main(bootstrap: str, source: str, sink: str, group: str, count: int, abort_at: int, debug: str | None = None) -> int:
    # No re-bootstrap when the one gateway is down (librdkafka's default since 2.10): it
    # decommissions the broker that the producer caches as its group coordinator, and
    # send_offsets_to_transaction then waits on it forever (librdkafka issues #5511, #5456).
    common = {
        "bootstrap.servers": bootstrap,
        "log_level": 0 if debug is None else 7,
        "reconnect.backoff.max.ms": 500,
        "metadata.recovery.strategy": "none",
    }
    if debug is not None:
        common["debug"] = debug
    consumer = Consumer(
        {
            **common,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000,
        }
    )
    producer = Producer({**common, "transactional.id": f"{group}-copier", "linger.ms": 5, "transaction.timeout.ms": 60_000})
    consumer.subscribe([source])
    producer.init_transactions(120)
    committed: dict[int, int] = {}
    transactions, deadline = 0, time.monotonic() + 240
    while sum(committed.values()) < count:
        if time.monotonic() > deadline:
            print(f"gave up: committed {committed}", file=sys.stderr)
            return 3
        messages = [m for m in consumer.consume(50, 0.5) if m.error() is None]
        if not messages:
            continue
        transactions += 1
        producer.begin_transaction()
        try:
            for m in messages:
                producer.produce(sink, value=m.value().replace(b"in-", b"out-"), partition=m.partition())
            if transactions == abort_at:
                for m in messages:
                    producer.produce(sink, value=m.value().replace(b"in-", b"aborted-"), partition=m.partition())
                producer.flush(30)
                producer.abort_transaction(60)
                print(f"aborted on purpose: {len(messages)} records", file=sys.stderr, flush=True)
                rewind(consumer)
                continue
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
            while True:
                try:
                    producer.commit_transaction(60)
                    break
                except KafkaException as e:
                    if not e.args[0].retriable() or time.monotonic() > deadline:
                        raise
                    print(f"retrying the commit: {e.args[0]}", file=sys.stderr, flush=True)
            committed.update({tp.partition: tp.offset for tp in positions if tp.offset >= 0})
            print(f"committed {committed}", file=sys.stderr, flush=True)
        except KafkaException as e:
            error = e.args[0]
            if error.fatal() or not error.txn_requires_abort():
                print(f"fatal: {error}", file=sys.stderr)
                return 2
            print(f"aborting: {error}", file=sys.stderr, flush=True)
            producer.abort_transaction(60)
            rewind(consumer)
    consumer.close()
    print(f"done: {transactions} transactions, committed {committed}")
    return 0


if __name__ == "__main__":
    bootstrap, source, sink, group, count = sys.argv[1:6]
    abort_at = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    sys.exit(main(bootstrap, source, sink, group, int(count), abort_at, os.environ.get("EOS_COPIER_DEBUG")))

"""Produce and fetch at the wire: coalesced commits, idempotent producers' duplicates and gaps,
acks=0, and a long-polling fetch that holds up no other connection (a raw client, one gateway
with a 300 ms coalescing window)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway.records import decode_batches, encode_batch
from icelog.storage.log.table import LogTable
from tests.gateway.clients import until
from tests.gateway.conftest import Served
from tests.gateway.raw import Connection, frame, parse

API_VERSIONS = {"client_software_name": "raw", "client_software_version": "1"}


@pytest.fixture(scope="module")
def slow_linger(module_spec, tmp_path_factory):
    server = Served(module_spec, tmp_path_factory.mktemp("linger"), linger_ms=300)
    server.start()
    yield server
    assert server.stop() == 0, server.stderr()


def produce(
    conn: Connection, topic: str, partition: int, values: list[bytes], producer=(-1, -1, -1), acks: int = -1, ts: int = 1_000
):
    batch = encode_batch(0, [(i, ts + i, None, v, ()) for i, v in enumerate(values)], producer)
    data = {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
    conn.send(frame(0, 9, {"acks": acks, "timeout": 5000, "topic_data": [data]}))
    if acks == 0:
        return None
    return parse(0, 9, conn.read_frame()).responses[0].partition_responses[0]


def _snapshots(spec, topic) -> int:
    return len(LogTable.open(spec.open(), topic).table().metadata.snapshots)


def test_batches_of_many_connections_within_the_window_share_one_commit(slow_linger, module_spec, topic):
    answers, start = {}, threading.Barrier(4)

    def client(n: int) -> None:
        with Connection(slow_linger.bootstrap) as conn:
            start.wait()
            answers[n] = produce(conn, topic, n % 2, [f"c{n}-{i}".encode() for i in range(3)])

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a.error_code == ErrorCode.none for a in answers.values())
    for p in (0, 1):
        assert sorted(a.base_offset for n, a in answers.items() if n % 2 == p) == [0, 3]
    assert _snapshots(module_spec, topic) == 1  # four produces, one commit
    rows = LogTable.open(module_spec.open(), topic).read(0)
    by_offset = dict(zip(rows["log_offset"].to_pylist(), rows["value"].to_pylist(), strict=True))
    for n, a in answers.items():  # each acknowledged with the offsets its records really got
        if n % 2 == 0:
            assert [by_offset[a.base_offset + i] for i in range(3)] == [f"c{n}-{i}".encode() for i in range(3)]


def test_an_idempotent_producer_resend_is_a_duplicate_and_a_gap_or_new_epoch_is_refused(slow_linger, module_spec, topic):
    with Connection(slow_linger.bootstrap) as conn:
        init = conn.call(22, 4, {"transactional_id": None, "transaction_timeout": 60_000})
        assert init.error_code == ErrorCode.none and init.producer_epoch == 0
        pid = init.producer_id
        first = produce(conn, topic, 0, [b"a", b"b", b"c"], (pid, 0, 0))
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        again = produce(conn, topic, 0, [b"a", b"b", b"c"], (pid, 0, 0))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, 0)  # the original offsets
        gap = produce(conn, topic, 0, [b"x"], (pid, 0, 5))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        epoch = produce(conn, topic, 0, [b"x"], (pid, 1, 0))
        assert epoch.error_code == ErrorCode.invalid_producer_epoch
        unknown = produce(conn, topic, 0, [b"x"], (pid + 1000, 3, 0))
        assert unknown.error_code == ErrorCode.unknown_producer_id
        nxt = produce(conn, topic, 0, [b"d"], (pid, 0, 3))
        assert (nxt.error_code, nxt.base_offset) == (ErrorCode.none, 3)
    assert LogTable.open(module_spec.open(), topic).read(0)["value"].to_pylist() == [b"a", b"b", b"c", b"d"]


def test_a_resend_sharing_a_window_with_a_new_batch_of_another_partition_is_answered_per_partition(
    slow_linger, module_spec, topic
):
    """librdkafka re-sends its unanswered batches after a reconnect one partition at a time: a
    re-send of partition 0 can share the linger window with partition 1's next batch. Each is
    answered on its own: the re-send with its original offsets, the new batch appended."""
    with Connection(slow_linger.bootstrap) as conn:
        pid = conn.call(22, 4, {"transactional_id": None, "transaction_timeout": 60_000}).producer_id

        def both(batches: dict[int, tuple[list[bytes], int]]):
            data = [
                {"index": p, "records": encode_batch(0, [(i, 1_000 + i, None, v, ()) for i, v in enumerate(vs)], (pid, 0, seq))}
                for p, (vs, seq) in batches.items()
            ]
            conn.send(frame(0, 9, {"acks": -1, "timeout": 5000, "topic_data": [{"name": topic, "partition_data": data}]}))
            answer = parse(0, 9, conn.read_frame()).responses[0].partition_responses
            return {r.index: (r.error_code, r.base_offset) for r in answer}

        assert both({0: ([b"a0", b"a1"], 0), 1: ([b"b0"], 0)}) == {0: (ErrorCode.none, 0), 1: (ErrorCode.none, 0)}
        assert both({0: ([b"a0", b"a1"], 0), 1: ([b"b1", b"b2"], 1)}) == {0: (ErrorCode.none, 0), 1: (ErrorCode.none, 1)}
        assert both({1: ([b"b1", b"b2"], 1), 0: ([b"a2"], 2)}) == {1: (ErrorCode.none, 1), 0: (ErrorCode.none, 2)}
    log_table = LogTable.open(module_spec.open(), topic)
    assert log_table.read(0)["value"].to_pylist() == [b"a0", b"a1", b"a2"]
    assert log_table.read(1)["value"].to_pylist() == [b"b0", b"b1", b"b2"]


def test_a_transactional_id_keeps_its_producer_id_and_each_init_bumps_its_epoch(slow_linger, topic):
    with Connection(slow_linger.bootstrap) as conn:
        body = {"transactional_id": f"txn-{topic}", "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1}
        first, second = conn.call(22, 4, body), conn.call(22, 4, body)
        assert (first.error_code, second.error_code) == (ErrorCode.none, ErrorCode.none)
        assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
        # A client bumping an epoch that is no longer the current one is fenced.
        stale = {**body, "producer_id": first.producer_id, "producer_epoch": first.producer_epoch}
        assert conn.call(22, 4, stale).error_code == ErrorCode.producer_fenced
        assert conn.call(22, 4, {**body, "transaction_timeout": 0}).error_code == ErrorCode.invalid_transaction_timeout


def test_acks_0_gets_no_answer_and_is_written(slow_linger, module_spec, topic):
    with Connection(slow_linger.bootstrap) as conn:
        produce(conn, topic, 1, [b"fire", b"forget"], acks=0)
        assert conn.call(18, 3, API_VERSIONS).error_code == ErrorCode.none  # the next answer is this one's
    deadline = time.monotonic() + 10
    while LogTable.open(module_spec.open(), topic).watermarks()[1].end < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert LogTable.open(module_spec.open(), topic).read(1)["value"].to_pylist() == [b"fire", b"forget"]


def _fetch(topic: str, offset: int, max_wait_ms: int) -> bytes:
    partitions = [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]
    body = {"max_wait": max_wait_ms, "min_bytes": 1, "isolation_level": 1, "topics": [{"topic": topic, "partitions": partitions}]}
    return frame(1, 12, {**body, "forgotten_topics_data": []})


def test_a_long_polling_fetch_holds_up_no_other_connection_and_wakes_on_a_commit(slow_linger, topic):
    with Connection(slow_linger.bootstrap) as poller, Connection(slow_linger.bootstrap) as other:
        started = time.monotonic()
        poller.send(_fetch(topic, 0, 8_000))
        time.sleep(0.3)
        assert other.call(18, 3, API_VERSIONS).error_code == ErrorCode.none
        assert time.monotonic() - started < 3  # answered while the fetch waits
        answer = produce(other, topic, 0, [b"wake"])
        assert answer.error_code == ErrorCode.none
        fetched = parse(1, 12, poller.read_frame())
        assert time.monotonic() - started < 6  # woken by the commit, not by max_wait
    part = fetched.responses[0].partitions[0]
    assert (part.error_code, part.high_watermark, part.last_stable_offset, part.aborted_transactions) == (
        ErrorCode.none,
        1,
        1,
        (),
    )
    (batch,) = decode_batches(part.records)
    assert [r.value for r in batch.records] == [b"wake"]


def test_a_fetch_outside_the_log_is_offset_out_of_range(slow_linger, topic):
    with Connection(slow_linger.bootstrap) as conn:
        conn.send(_fetch(topic, 5, 0))
        part = parse(1, 12, conn.read_frame()).responses[0].partitions[0]
    assert part.error_code == ErrorCode.offset_out_of_range


def test_a_topic_without_the_kafka_schema_is_readable_and_not_writable(slow_linger, module_spec):
    log_table = LogTable.create(
        module_spec.open(), "db.typed", 1, payload=[{"name": "key", "type": "string"}, {"name": "n", "type": "long"}]
    )
    log_table.append({0: [{"key": "k1", "n": 7}]})
    with Connection(slow_linger.bootstrap) as conn:
        assert produce(conn, "db.typed", 0, [b"x"]).error_code == ErrorCode.invalid_record
        conn.send(_fetch("db.typed", 0, 0))
        part = parse(1, 12, conn.read_frame()).responses[0].partitions[0]
    (batch,) = decode_batches(part.records)
    assert [(r.key, r.value) for r in batch.records] == [(b"k1", b'{"key": "k1", "n": 7}')]


def test_a_bad_timestamp_is_refused_alone_and_no_timestamp_reads_back_as_the_append_time(slow_linger, module_spec, topic):
    results = {}

    def bad() -> None:
        with Connection(slow_linger.bootstrap) as conn:
            results["bad"] = produce(conn, topic, 0, [b"far"], ts=2**62)

    with Connection(slow_linger.bootstrap) as conn:
        worker = threading.Thread(target=bad)
        worker.start()  # within the same coalescing window as the good one
        good = produce(conn, topic, 0, [b"good"], ts=-1)
        worker.join()
        assert results["bad"].error_code == ErrorCode.invalid_timestamp
        assert (good.error_code, good.base_offset) == (ErrorCode.none, 0)
        conn.send(_fetch(topic, 0, 0))
        part = parse(1, 12, conn.read_frame()).responses[0].partitions[0]
    (batch,) = decode_batches(part.records)
    appended = LogTable.open(module_spec.open(), topic).read(0)["log_timestamp"][0].as_py()
    assert [(r.value, r.timestamp_ms) for r in batch.records] == [(b"good", int(appended.timestamp() * 1000))]


def test_a_batch_that_waited_through_a_commit_is_not_held_for_another_window(module_spec, topic, tmp_path):
    """The window opens when a batch arrives: one that came during the previous commit (each held
    2 s here, longer than the 1.5 s window) is committed as soon as that commit ends, not a whole
    window later."""
    location = Path(LogTable.open(module_spec.open(), topic).table().metadata.location.removeprefix("file://"))
    written = len(list((location / "metadata").glob("*.metadata.json")))
    server = Served(module_spec, tmp_path, linger_ms=1500)
    server.start(ICELOG_DELAY_AT="after_metadata_write:2")
    acked: dict[str, float] = {}

    def client(name: str) -> None:
        with Connection(server.bootstrap) as conn:
            assert produce(conn, topic, 0, [name.encode()]).error_code == ErrorCode.none
            acked[name] = time.monotonic()

    try:
        first = threading.Thread(target=client, args=("a",))
        first.start()
        # b arrives while a's commit is held after its metadata write: a's window has closed.
        until(lambda: len(list((location / "metadata").glob("*.metadata.json"))) > written, 30, "a's commit")
        client("b")
        first.join()
    finally:
        assert server.stop() == 0, server.stderr()
    assert _snapshots(module_spec, topic) == 2  # two windows, two commits
    # b's own commit takes 2 s; waiting another window after a's commit would add 1.5 s.
    assert acked["b"] - acked["a"] < 3.0, acked

"""Bad input never crashes the gateway or writes anything; other connections keep working."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway import wire
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.gateway.raw import Connection, frame, parse, produce_frame

API_VERSIONS = {"client_software_name": "raw", "client_software_version": "1"}


def _state(spec, topic):
    log_table = LogTable.open(spec.open(), topic)
    return log_table.table().metadata.current_snapshot_id, log_table.watermarks()


def _alive(gateway) -> None:
    with Connection(gateway.bootstrap) as conn:
        answer = conn.call(18, 3, API_VERSIONS)
        assert answer.error_code == ErrorCode.none


def test_api_versions_lists_exactly_what_is_served(gateway):
    with Connection(gateway.bootstrap) as conn:
        answer = conn.call(18, 3, API_VERSIONS)
    served = {(k.api_key, k.min_version, k.max_version) for k in answer.api_keys}
    assert served == {(k, lo, hi) for k, (lo, hi) in wire.SUPPORTED.items()}


def test_a_newer_api_versions_gets_unsupported_version_and_the_list_and_the_connection_stays(gateway):
    with Connection(gateway.bootstrap) as conn:
        conn.send(frame(18, 4, API_VERSIONS)[:6] + b"\x00\x04" + frame(18, 4, API_VERSIONS)[8:])
        answer = parse(18, 0, conn.read_frame())
        assert answer.error_code == ErrorCode.unsupported_version
        assert {k.api_key for k in answer.api_keys} == set(wire.SUPPORTED)
        assert conn.call(18, 3, API_VERSIONS).error_code == ErrorCode.none


def _huge_array() -> bytes:
    """A Metadata v9 request whose topics array claims 4 billion elements (kio would allocate them)."""
    data = frame(3, 9, {"topics": [{"name": "x"}]})
    at = 4 + 8 + 2 + len("raw") + 1  # size, key/version/correlation, client id, header tags
    assert data[at] == 2  # one topic, as a compact array length (n + 1)
    body = data[4:at] + b"\xff\xff\xff\xff\x0f" + data[at + 1 :]
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize(
    "data",
    [
        _huge_array(),
        struct.pack(">i", 2**31 - 1) + b"\x00" * 16,  # a 2 GB frame: refused before anything is allocated
        struct.pack(">i", -5) + b"\x00" * 16,
        struct.pack(">i", 3) + b"abc",  # too short for a header
        frame(3, 9, {"topics": None})[:4] + struct.pack(">hhi", 999, 0, 1) + frame(3, 9, {"topics": None})[12:],  # unknown key
        frame(3, 9, {"topics": None})[:6] + struct.pack(">h", 99) + frame(3, 9, {"topics": None})[8:],  # unknown version
        frame(3, 9, {"topics": None}) + b"",  # (sanity: a valid frame is answered; see below)
    ],
    ids=["huge-array", "2GB", "negative", "short", "unknown-key", "unknown-version", "valid"],
)
def test_an_unacceptable_frame_closes_only_its_connection(gateway, data):
    with Connection(gateway.bootstrap) as conn:
        conn.send(data)
        if data == frame(3, 9, {"topics": None}):
            assert conn.read_frame() is not None
        else:
            assert conn.closed_by_server()
    _alive(gateway)


def test_a_client_that_disconnects_mid_request_leaves_the_gateway_serving(gateway, module_spec, topic):
    before = _state(module_spec, topic)
    data = produce_frame(topic, 0, [b"half"])
    for cut in (2, 10, len(data) // 2, len(data) - 1):
        with Connection(gateway.bootstrap) as conn:
            conn.send(data[:cut])
    _alive(gateway)
    assert _state(module_spec, topic) == before


def test_corrupt_unknown_and_system_writes_are_refused_and_write_nothing(gateway, module_spec, topic):
    before = _state(module_spec, topic)
    cases = [
        (produce_frame(topic, 0, [b"x"], corrupt=True), ErrorCode.corrupt_message),
        (produce_frame(topic, 7, [b"x"]), ErrorCode.unknown_topic_or_partition),
        (produce_frame("db.no_such_topic", 0, [b"x"]), ErrorCode.unknown_topic_or_partition),
        (produce_frame("bad name!", 0, [b"x"]), ErrorCode.unknown_topic_or_partition),
        (produce_frame("icelog_system.producer_ids", 0, [b"x"]), ErrorCode.topic_authorization_failed),
    ]
    with Connection(gateway.bootstrap) as conn:
        for data, code in cases:
            conn.send(data)
            answer = parse(0, 9, conn.read_frame())
            assert answer.responses[0].partition_responses[0].error_code == code
    assert _state(module_spec, topic) == before
    assert not module_spec.open().table_exists("db.no_such_topic")


def _seeds(topic: str) -> list[bytes]:
    fetch = {
        "max_wait": 0,
        "min_bytes": 1,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [],
    }
    list_offsets = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    return [
        frame(18, 3, API_VERSIONS),
        frame(3, 9, {"topics": [{"name": topic}]}),
        frame(1, 12, fetch),
        frame(2, 7, list_offsets),
        frame(22, 4, {"transactional_id": None, "transaction_timeout": 1000}),
        produce_frame(topic, 0, [b"seed"]),
        frame(17, 1, {"mechanism": "PLAIN"}),
        frame(36, 2, {"auth_bytes": b"\0user\0password"}),
        *_group_seeds(topic),
    ]


def _group_seeds(topic: str) -> list[bytes]:
    """One frame of each group and admin API (DeleteTopics left out: a mutated name could be a real topic)."""
    member = {"group_id": "fuzz", "generation_id": 1, "member_id": "m", "group_instance_id": None}
    commit = {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_metadata": None}]}
    join = {"group_id": "fuzz", "session_timeout": 1000, "rebalance_timeout": 1000, "member_id": "", "group_instance_id": None,
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"\x00\x00"}]}  # fmt: skip
    return [
        frame(10, 4, {"key_type": 0, "coordinator_keys": ["fuzz"]}),
        frame(11, 5, join),
        frame(14, 3, {**member, "assignments": [{"member_id": "m", "assignment": b"\x00\x00\x00\x00\x00\x01"}]}),
        frame(12, 4, member),
        frame(13, 5, {"group_id": "fuzz", "members": [{"member_id": "m", "group_instance_id": None, "reason": None}]}),
        frame(
            8,
            8,
            {
                "group_id": "fuzz",
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [commit],
            },
        ),  # fmt: skip
        frame(9, 8, {"groups": [{"group_id": "fuzz", "topics": None}], "require_stable": False}),
        frame(15, 5, {"groups": ["fuzz"], "include_authorized_operations": False}),
        frame(16, 4, {"states_filter": []}),
        frame(32, 4, {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}]}),
        frame(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1}),
        *_transaction_seeds(topic),
    ]


def _transaction_seeds(topic: str) -> list[bytes]:
    """One frame of each transaction API."""
    producer = {"transactional_id": "fuzz-txn", "producer_id": 0, "producer_epoch": 0}
    offsets = {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1}]}
    add = {
        "v3_and_below_transactional_id": "fuzz-txn",
        "v3_and_below_producer_id": 0,
        "v3_and_below_producer_epoch": 0,
        "v3_and_below_topics": [{"name": topic, "partitions": [0]}],
    }
    return [
        frame(22, 4, {"transactional_id": "fuzz-txn", "transaction_timeout": 1000, "producer_id": -1, "producer_epoch": -1}),
        frame(24, 3, add),
        frame(25, 3, {**producer, "group_id": "fuzz"}),
        frame(28, 3, {**producer, "group_id": "fuzz", "generation_id": -1, "member_id": "", "topics": [offsets]}),
        frame(26, 3, {**producer, "committed": False}),
    ]


@st.composite
def mutated(draw, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "random"]))
        at = draw(st.integers(4, max(4, len(data) - 1)))
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            data = data[:at]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            return bytes(draw(st.binary(min_size=0, max_size=64)))
    keep_size = draw(st.booleans())
    return struct.pack(">i", len(data) - 4) + bytes(data[4:]) if keep_size else bytes(data)


@pytest.mark.parametrize("examples", [150, pytest.param(3000, marks=pytest.mark.slow)])
def test_random_and_mutated_frames_never_stop_the_gateway_nor_write_garbage(gateway, module_spec, topic, examples):
    seeds = _seeds(topic)
    witness = Connection(gateway.bootstrap)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=mutated(seeds))
    def send(data: bytes) -> None:
        with Connection(gateway.bootstrap, timeout=2) as conn:
            try:
                conn.send(data)
                conn.sock.shutdown(socket.SHUT_WR)
                while conn.read_frame() is not None:
                    pass
            except (TimeoutError, ConnectionError, struct.error):
                pass
        # The other connection is answered at once, every time.
        assert witness.call(18, 3, API_VERSIONS).error_code == ErrorCode.none

    try:
        send()
    finally:
        witness.close()
    log_table = LogTable.open(module_spec.open(), topic)
    assert set(log_table.read(0)["value"].to_pylist()) <= {b"seed"}
    assert run_checks(log_table.table()).violations == []

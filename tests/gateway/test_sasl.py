"""``icelog serve --sasl-users``: unmodified clients authenticate by PLAIN and SCRAM; nothing else gets in."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from confluent_kafka import KafkaError, Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from tests.gateway.conftest import Served, quiet_logs
from tests.gateway.raw import Connection, frame, produce_frame
from tests.gateway.reading import read_all, stored

USER, PASSWORD = "alice", "s3cret:with=odd,chars"
INSIDE = 99  # the correlation id of a request only an authenticated connection gets answered
API_VERSIONS = {"client_software_name": "raw", "client_software_version": "1"}


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sasl") / "users"
    path.write_text(f"# who may connect\n{USER}:{PASSWORD}\nbob:other\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def secured(module_spec, users_file, tmp_path_factory):
    """A gateway with SASL users, on the shared catalog."""
    server = Served(module_spec, tmp_path_factory.mktemp("serve-sasl"))
    server.start(ICELOG_SERVE_SASL_USERS=str(users_file))
    yield server
    assert server.stop() == 0, server.stderr()


def sasl(mechanism: str, password: str = PASSWORD) -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": USER, "sasl.password": password}


def _authenticated(bootstrap: str, version: int = 1) -> Connection:
    """A raw connection in by SASL PLAIN (handshake v1 and SaslAuthenticate, or v0 and a raw token)."""
    conn = Connection(bootstrap)
    answer = conn.call(17, version, {"mechanism": "PLAIN"})
    assert answer.error_code == ErrorCode.none and "SCRAM-SHA-256" in answer.mechanisms
    token = f"\0{USER}\0{PASSWORD}".encode()
    if version == 0:
        conn.send(struct.pack(">i", len(token)) + token)
        assert conn.read_frame() == b""
    else:
        assert conn.call(36, 2, {"auth_bytes": token}).error_code == ErrorCode.none
    return conn


def _metadata_answered(conn: Connection) -> bool:
    return conn.call(3, 9, {"topics": None}).brokers[0].port > 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_produces_and_consumes_after_authenticating(secured, module_spec, topic, mechanism):
    reports = []
    producer = Producer({"bootstrap.servers": secured.bootstrap, "enable.idempotence": True, **sasl(mechanism), **quiet_logs()})
    for i in range(6):
        producer.produce(topic, value=f"{mechanism}-{i}".encode(), partition=i % 2, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(60) == 0
    assert reports == [None] * 6
    expected = [(i % 2, i // 2, f"{mechanism}-{i}".encode()) for i in range(6)]
    assert read_all(secured.bootstrap, topic, "read_committed", 6, **sasl(mechanism)) == sorted(expected)
    assert stored(module_spec, topic) == sorted(expected)


def test_kafka_python_authenticates_by_scram_sha_256(secured, module_spec, topic):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}
    auth |= {"sasl_plain_username": USER, "sasl_plain_password": PASSWORD}
    producer = KafkaProducer(bootstrap_servers=secured.bootstrap, enable_idempotence=True, **auth)
    metas = [producer.send(topic, value=f"kp{i}".encode(), partition=0).get(timeout=30) for i in range(3)]
    producer.close()
    assert [m.offset for m in metas] == [0, 1, 2]
    consumer = KafkaConsumer(bootstrap_servers=secured.bootstrap, enable_auto_commit=False, **auth)
    consumer.assign([KTopicPartition(topic, 0)])
    consumer.seek(KTopicPartition(topic, 0), 0)
    got, deadline = [], time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got += [r.value for r in records]
    consumer.close()
    assert got == [b"kp0", b"kp1", b"kp2"]


def test_aiokafka_authenticates_by_plain(secured, topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
    auth |= {"sasl_plain_username": USER, "sasl_plain_password": PASSWORD}

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=secured.bootstrap, **auth)
        await producer.start()
        try:
            metas = [await producer.send_and_wait(topic, f"ai{i}".encode(), partition=1) for i in range(3)]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=secured.bootstrap, enable_auto_commit=False, **auth)
        await consumer.start()
        try:
            tp = ATopicPartition(topic, 1)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 3:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=500), 30)
                got += [r.value for r in batch.get(tp, [])]
        finally:
            await consumer.stop()
        return [m.offset for m in metas], got

    assert asyncio.run(run()) == ([0, 1, 2], [b"ai0", b"ai1", b"ai2"])


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_is_refused_and_writes_nothing(secured, module_spec, topic, mechanism):
    errors, reports = [], []
    config = {"bootstrap.servers": secured.bootstrap, "message.timeout.ms": 3000, "error_cb": errors.append}
    producer = Producer({**config, **sasl(mechanism, "wrong"), **quiet_logs()})
    producer.produce(topic, value=b"intruder", partition=0, on_delivery=lambda e, m: reports.append(e))
    producer.flush(20)
    assert [e.code() for e in reports] == [KafkaError._MSG_TIMED_OUT]
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert stored(module_spec, topic) == []


def test_a_wrong_password_gets_sasl_authentication_failed_and_the_connection_closes(secured):
    for user, password in ((USER, "wrong"), ("nobody", PASSWORD), ("bob", PASSWORD)):
        with Connection(secured.bootstrap) as conn:
            assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
            answer = conn.call(36, 2, {"auth_bytes": f"\0{user}\0{password}".encode()})
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert conn.closed_by_server()


@pytest.mark.parametrize("api", ["produce", "metadata", "fetch-offsets"])
def test_a_request_before_authentication_closes_the_connection_and_others_are_served(secured, module_spec, topic, api):
    data = {
        "produce": produce_frame(topic, 0, [b"unauthenticated"]),
        "metadata": frame(3, 9, {"topics": None}),
        "fetch-offsets": frame(9, 8, {"groups": [{"group_id": "g", "topics": None}], "require_stable": False}),
    }[api]
    with _authenticated(secured.bootstrap) as witness:
        for handshake_first in (False, True):
            with Connection(secured.bootstrap) as conn:
                assert conn.call(18, 3, API_VERSIONS).error_code == ErrorCode.none  # always answered
                if handshake_first:  # a handshake alone does not let anything through
                    assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
                conn.send(data)
                assert conn.closed_by_server()
            assert _metadata_answered(witness)
    assert stored(module_spec, topic) == []


@pytest.mark.parametrize("version", [0, 1])
def test_an_authenticated_connection_is_served_after_either_handshake_version(secured, version):
    with _authenticated(secured.bootstrap, version) as conn:
        assert _metadata_answered(conn)


def test_a_large_frame_before_authentication_closes_the_connection(secured):
    with _authenticated(secured.bootstrap) as witness:
        with Connection(secured.bootstrap) as conn:
            conn.send(struct.pack(">i", 512 * 1024 + 1) + frame(18, 3, API_VERSIONS)[4:])
            assert conn.closed_by_server()
        assert _metadata_answered(witness)
        big = frame(3, 9, {"topics": [{"name": "x" * 30_000}] * 20})  # 600 kB: fine once authenticated
        witness.send(big)
        assert witness.read_frame() is not None


def test_sasl_again_after_authenticating_closes_the_connection(secured):
    for version in (0, 1):
        with _authenticated(secured.bootstrap, version) as conn:
            conn.send(frame(17, 1, {"mechanism": "PLAIN"}))
            assert conn.closed_by_server()


def test_an_unknown_mechanism_is_refused_with_the_served_list(secured):
    with Connection(secured.bootstrap) as conn:
        answer = conn.call(17, 1, {"mechanism": "GSSAPI"})
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert list(answer.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert conn.closed_by_server()


def test_without_users_a_handshake_gets_illegal_sasl_state_as_from_a_plaintext_listener(gateway):
    with Connection(gateway.bootstrap) as conn:
        assert conn.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.illegal_sasl_state
        assert _metadata_answered(conn)


@st.composite
def sasl_frames(draw) -> bytes:
    """A handshake, then a mutated SaslAuthenticate or raw token, or random bytes."""
    version = draw(st.sampled_from([0, 1]))
    mechanism = draw(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "X"]))
    token = bytearray(
        draw(st.sampled_from([f"\0{USER}\0x".encode(), b"n,,n=alice,r=abc", b"c=biws,r=abc,p=AAAA", b""]))
        + draw(st.binary(max_size=12))
    )
    if token and draw(st.booleans()):
        token[draw(st.integers(0, len(token) - 1))] ^= 1 << draw(st.integers(0, 7))
    follow = (
        struct.pack(">i", len(token)) + bytes(token)
        if version == 0
        else frame(36, draw(st.integers(0, 2)), {"auth_bytes": bytes(token)})
    )
    if draw(st.booleans()):
        cut = draw(st.integers(4, len(follow)))
        follow = struct.pack(">i", cut - 4) + follow[4:cut]
    return frame(17, version, {"mechanism": mechanism}) + follow + frame(3, 9, {"topics": None}, correlation_id=INSIDE)


def test_bad_sasl_frames_never_get_in_nor_stop_the_gateway(secured, module_spec, topic):
    with _authenticated(secured.bootstrap) as witness:

        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(data=sasl_frames())
        def send(data: bytes) -> None:
            answered = []
            with Connection(secured.bootstrap, timeout=2) as conn:
                try:
                    conn.send(data + produce_frame(topic, 0, [b"fuzz"]))
                    conn.sock.shutdown(socket.SHUT_WR)
                    while (answer := conn.read_frame()) is not None:
                        answered.append(answer[:4])
                except (TimeoutError, ConnectionError):
                    pass
            assert struct.pack(">i", INSIDE) not in answered  # the Metadata after the bad token
            assert _metadata_answered(witness)

        send()
    assert stored(module_spec, topic) == []

"""The classic group protocol request by request (raw frames): fencing by generation, session
expiry, and bad input that must be refused without writing anything."""

from __future__ import annotations

import struct
import threading
import time

from kio.schema.errors import ErrorCode

from icelog.storage.groups.offsets import GROUPS_TABLE, committed_offsets, describe_group
from tests.gateway.raw import Connection

JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH, FIND, DESCRIBE, LIST = 11, 14, 12, 13, 8, 9, 10, 15, 16


def assignment(topic: str, partitions: list[int]) -> bytes:
    """A consumer-protocol assignment (version 0), as the clients' assignors encode it."""
    name = topic.encode()
    return (
        struct.pack(">hih", 0, 1, len(name))
        + name
        + struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
        + b"\xff\xff\xff\xff"
    )


def join(conn: Connection, group: str, member: str = "", session_ms: int = 6000, rebalance_ms: int = 10000):
    body = {
        "group_id": group,
        "session_timeout": session_ms,
        "rebalance_timeout": rebalance_ms,
        "member_id": member,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\x00\x00"}],
    }
    answer = conn.call(JOIN, 5, body)
    if answer.error_code == ErrorCode.member_id_required:
        answer = conn.call(JOIN, 5, {**body, "member_id": answer.member_id})
    return answer


def sync(conn: Connection, group: str, member: str, generation: int, given: dict[str, bytes]):
    body = {"group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": None}
    return conn.call(SYNC, 3, {**body, "assignments": [{"member_id": m, "assignment": a} for m, a in given.items()]})


def commit(conn: Connection, group: str, member: str, generation: int, topic: str, offsets: dict[int, int]) -> list:
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": generation,
        "member_id": member,
        "group_instance_id": None,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": p, "committed_offset": o, "committed_metadata": None} for p, o in offsets.items()
                ],
            }
        ],
    }
    answer = conn.call(COMMIT, 8, body)
    return [(p.partition_index, p.error_code) for t in answer.topics for p in t.partitions]


def heartbeat(conn: Connection, group: str, member: str, generation: int) -> ErrorCode:
    body = {"group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": None}
    return conn.call(HEARTBEAT, 4, body).error_code


def _produce(conn: Connection, topic: str, partition: int, n: int) -> None:
    from tests.gateway.raw import parse, produce_frame

    conn.send(produce_frame(topic, partition, [b"x"] * n))
    assert parse(0, 9, conn.read_frame()).responses[0].partition_responses[0].error_code == ErrorCode.none


def _groups_snapshot(spec):
    catalog = spec.open()
    return catalog.load_table(GROUPS_TABLE).metadata.current_snapshot_id if catalog.table_exists(GROUPS_TABLE) else None


def test_the_gateway_is_the_coordinator(gateway):
    with Connection(gateway.bootstrap) as conn:
        answer = conn.call(FIND, 3, {"key": "g", "key_type": 0})
        assert (answer.error_code, answer.node_id, answer.port) == (ErrorCode.none, 0, gateway.port)
        batched = conn.call(FIND, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]})
        assert [(c.key, c.error_code, c.port) for c in batched.coordinators] == [("a", 0, gateway.port), ("b", 0, gateway.port)]
        transactions = conn.call(FIND, 3, {"key": "t", "key_type": 1})  # a transactional id
        assert (transactions.error_code, transactions.port) == (ErrorCode.none, gateway.port)


def test_a_stale_generation_is_fenced_and_its_commit_writes_nothing(gateway, module_spec, topic):
    group = f"fence-{topic}"
    with Connection(gateway.bootstrap) as a, Connection(gateway.bootstrap, timeout=30) as b:
        _produce(a, topic, 0, 5)
        first = join(a, group)
        assert first.error_code == ErrorCode.none and first.leader == first.member_id
        me, generation = first.member_id, first.generation_id
        assert sync(a, group, me, generation, {me: assignment(topic, [0, 1])}).assignment == assignment(topic, [0, 1])
        assert commit(a, group, me, generation, topic, {0: 2}) == [(0, ErrorCode.none)]
        record = describe_group(module_spec.open(), group)
        assert record["generation"] == generation  # the generation handed out is icelog's
        owners = {e["partition"]: list(e["owners"]) for e in record["partitions"]}
        assert owners == {0: [me], 1: [me]}

        # A second member joins: a new round, which waits for the first to rejoin.
        joined_b: list = []
        second = threading.Thread(target=lambda: joined_b.append(join(b, group)))
        second.start()
        deadline = time.monotonic() + 20
        while (code := heartbeat(a, group, me, generation)) == ErrorCode.none and time.monotonic() < deadline:
            time.sleep(0.1)
        assert code == ErrorCode.rebalance_in_progress
        assert commit(a, group, me, generation, topic, {0: 3}) == [(0, ErrorCode.none)]  # still its generation
        rejoined = join(a, group, me)
        second.join(30)
        assert rejoined.generation_id == joined_b[0].generation_id == generation + 1

        before = _groups_snapshot(module_spec)
        assert commit(a, group, me, generation, topic, {0: 5}) == [(0, ErrorCode.illegal_generation)]
        assert heartbeat(a, group, me, generation) == ErrorCode.illegal_generation
        assert _groups_snapshot(module_spec) == before
        assert committed_offsets(module_spec.open(), group, topic) == {0: 3}

        # The leader assigns; both get their share and commit at the new generation.
        new = rejoined.generation_id
        leader = a if rejoined.leader == me else b
        given = {me: assignment(topic, [0]), joined_b[0].member_id: assignment(topic, [1])}
        leader_id = rejoined.leader
        follower, follower_id = (b, joined_b[0].member_id) if leader is a else (a, me)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(sync(follower, group, follower_id, new, {})))
        waiting.start()
        time.sleep(0.3)
        assert sync(leader, group, leader_id, new, given).assignment == given[leader_id]
        waiting.join(30)
        assert got[0].assignment == given[follower_id]
        assert commit(a, group, me, new, topic, {0: 5}) == [(0, ErrorCode.none)]
        assert committed_offsets(module_spec.open(), group, topic) == {0: 5}


def test_a_member_whose_session_lapses_is_removed(gateway, module_spec, topic):
    group = f"lapse-{topic}"
    with Connection(gateway.bootstrap) as conn:
        first = join(conn, group, session_ms=1000)
        sync(conn, group, first.member_id, first.generation_id, {first.member_id: assignment(topic, [0])})
        time.sleep(2.5)  # no heartbeat
        assert heartbeat(conn, group, first.member_id, first.generation_id) == ErrorCode.unknown_member_id
        described = conn.call(DESCRIBE, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
        assert (described.group_state, described.members) == ("Empty", ())
    deadline = time.monotonic() + 10
    while describe_group(module_spec.open(), group)["members"] and time.monotonic() < deadline:
        time.sleep(0.2)
    record = describe_group(module_spec.open(), group)
    assert record["members"] == [] and record["generation"] == first.generation_id + 1


def test_bad_group_requests_are_refused_and_the_gateway_serves_on(gateway, module_spec, topic):
    group = f"bad-{topic}"
    with Connection(gateway.bootstrap) as conn:
        before = _groups_snapshot(module_spec)
        assert join(conn, "").error_code == ErrorCode.invalid_group_id
        assert join(conn, group, session_ms=10).error_code == ErrorCode.invalid_session_timeout
        assert join(conn, group, member="nobody").error_code == ErrorCode.unknown_member_id
        no_protocols = {"group_id": group, "session_timeout": 6000, "rebalance_timeout": 6000, "member_id": "",
                        "protocol_type": "consumer", "protocols": []}  # fmt: skip
        assert conn.call(JOIN, 3, no_protocols).error_code == ErrorCode.inconsistent_group_protocol
        assert heartbeat(conn, "unknown", "m", 1) == ErrorCode.unknown_member_id
        assert sync(conn, "unknown", "m", 1, {}).error_code == ErrorCode.unknown_member_id
        assert conn.call(LEAVE, 0, {"group_id": "unknown", "member_id": "m"}).error_code == ErrorCode.unknown_member_id
        assert commit(conn, "unknown", "m", 1, topic, {0: 0}) == [(0, ErrorCode.unknown_member_id)]
        assert conn.call(DESCRIBE, 0, {"groups": ["unknown"]}).groups[0].group_state == "Dead"
        fetched = conn.call(FETCH, 7, {"group_id": "unknown", "topics": [{"name": topic, "partition_indexes": [0]}]})
        assert fetched.topics[0].partitions[0].committed_offset == -1
        assert _groups_snapshot(module_spec) == before  # nothing written

        # A simple (assign-only) consumer's commits: an unknown topic, a negative offset, one past the log end.
        assert commit(conn, group, "", -1, "db.no_such_topic", {0: 0}) == [(0, ErrorCode.unknown_topic_or_partition)]
        assert commit(conn, group, "", -1, topic, {0: -5, 1: 10**9}) == [
            (0, ErrorCode.offset_out_of_range),
            (1, ErrorCode.offset_out_of_range),
        ]
        assert _groups_snapshot(module_spec) == before

        # Malformed assignment bytes are handed out as they came; icelog records no partitions for them.
        first = join(conn, group)
        garbage = b"\xff\xff\xff\x7f\x00"
        assert sync(conn, group, first.member_id, first.generation_id, {first.member_id: garbage}).assignment == garbage
        assert all(not e["owners"] for e in describe_group(module_spec.open(), group)["partitions"])
        assert conn.call(LEAVE, 3, {"group_id": group, "members": [{"member_id": first.member_id}]}).error_code == 0
        assert conn.call(18, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0

"""Kafka's classic consumer-group protocol over icelog's consumer groups; the gateway coordinates every group.

The join and sync rounds run here, in memory (one gateway process coordinates a group):
JoinGroup answers once every member has rejoined or the rebalance timeout lapsed, the leader
gets the members' subscriptions and assigns client-side (the assignor's bytes are the
clients'), SyncGroup hands the assignments out. What icelog fences and describes is written
to its group state as the rounds complete (``storage.groups.classic``): the generation a round
hands out is the one icelog recorded, so an OffsetCommit of an older generation is refused
there, by the same check icelog's own consumers meet. A member's session is kept here from its
heartbeats, and written through to icelog often enough that icelog never sees it lapse first.

A Kafka OffsetCommit of offset N for a partition marks everything below N done (icelog's stable
offset N - 1, committed offset N: the next to read); OffsetFetch answers the committed offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from pyiceberg.catalog import Catalog

from icelog.pipelines.gateway.topics import table_name
from icelog.storage import errors
from icelog.storage.groups.classic import assign_partitions, new_generation
from icelog.storage.groups.offsets import (
    GroupAction,
    commit_offsets,
    group_action,
    group_state,
    validate_group_id,
)
from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import settle_decided

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
SESSION_MS = (1_000, 1_800_000)  # session timeouts accepted (Kafka's brokers default to 6 s .. 30 min)
REAP_SECONDS = 0.25  # how often lapsed sessions are looked for
NOT_REQUESTED = -(2**31)  # authorized operations: the client did not ask


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


@dataclass(eq=False)
class Member:
    member_id: str
    client_id: str
    session_ms: int
    rebalance_ms: int
    protocols: list[tuple[str, bytes]]
    heartbeat: float = field(default_factory=time.monotonic)
    recorded: float = field(default_factory=time.monotonic)  # its last heartbeat written to icelog
    assignment: bytes = b""
    join: asyncio.Future | None = None  # its JoinGroup, waiting for the round
    sync: asyncio.Future | None = None  # its SyncGroup, waiting for the leader's

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # member ids handed out, not yet joined: their deadline
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    round: asyncio.Task | None = None
    recording: bool = False  # the round's generation is being written: changes now need another round
    again: bool = False


def _answer(future: asyncio.Future | None, data: dict[str, Any]) -> None:
    if future is not None and not future.done():
        future.set_result(data)


class Coordinator:
    """Every group's join state in this gateway, and the requests that read or change it."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.groups: dict[str, Group] = {}
        self._writes: set[asyncio.Task] = set()  # heartbeats being written to icelog

    # --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------------

    async def join(self, request: Any, version: int, client_id: str | None) -> dict[str, Any]:
        member_id = request.member_id

        def refused(code: ErrorCode, member: str = member_id) -> dict[str, Any]:
            return {"error_code": code, "generation_id": -1, "member_id": member, "leader": "", "protocol_name": None}

        if not valid_group(request.group_id):
            return refused(ErrorCode.invalid_group_id)
        session_ms = _ms(request.session_timeout)
        rebalance_ms = _ms(getattr(request, "rebalance_timeout", request.session_timeout))
        if not SESSION_MS[0] <= session_ms <= SESSION_MS[1] or rebalance_ms <= 0:
            return refused(ErrorCode.invalid_session_timeout)
        protocols = [(p.name, p.metadata) for p in request.protocols]
        group = self.groups.setdefault(request.group_id, Group(request.group_id))
        others = [m for m in group.members.values() if m.member_id != member_id]
        names = {name for name, _ in protocols}
        if not request.protocol_type or not protocols or len(names) != len(protocols):
            return refused(ErrorCode.inconsistent_group_protocol)
        if others and (request.protocol_type != group.protocol_type or not _common(others, names)):
            return refused(ErrorCode.inconsistent_group_protocol)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4:  # the client joins again with this id (KIP-394)
                group.pending[member_id] = time.monotonic() + session_ms / 1000
                return refused(ErrorCode.member_id_required, member_id)
        elif member_id not in group.members and member_id not in group.pending:
            return refused(ErrorCode.unknown_member_id)
        group.pending.pop(member_id, None)
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = Member(member_id, client_id or "", session_ms, rebalance_ms, protocols)
        else:
            member.session_ms, member.rebalance_ms, member.protocols = session_ms, rebalance_ms, protocols
            _answer(member.join, refused(ErrorCode.rebalance_in_progress))  # a JoinGroup it sent before
        if not others:
            group.protocol_type = request.protocol_type
        member.heartbeat = time.monotonic()
        member.join = asyncio.get_running_loop().create_future()
        self._changed(group)
        return await member.join

    async def sync(self, request: Any) -> dict[str, Any]:
        group = self.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group is not None else None
        if group is None or member is None:
            return {"error_code": ErrorCode.unknown_member_id}
        if request.generation_id != group.generation:
            return {"error_code": ErrorCode.illegal_generation}
        if (getattr(request, "protocol_type", None) or group.protocol_type) != group.protocol_type or (
            getattr(request, "protocol_name", None) or group.protocol
        ) != group.protocol:
            return {"error_code": ErrorCode.inconsistent_group_protocol}
        member.heartbeat = time.monotonic()
        if group.state == PREPARING:
            return {"error_code": ErrorCode.rebalance_in_progress}
        if group.state == STABLE:
            return self._assignment(group, member)
        _answer(member.sync, {"error_code": ErrorCode.rebalance_in_progress})
        member.sync = asyncio.get_running_loop().create_future()
        wait = member.sync
        if member.member_id == group.leader:
            await self._assign(group, {a.member_id: a.assignment or b"" for a in request.assignments})
        return await wait

    async def _assign(self, group: Group, given: dict[str, bytes]) -> None:
        """Record the leader's assignment in icelog, then hand it out (unless a new round began meanwhile)."""
        generation = group.generation
        owned = {m: _partitions(given.get(m, b"")) for m in group.members}
        try:
            await asyncio.to_thread(assign_partitions, self.catalog, group.group_id, generation, owned)
        except errors.IcelogError as e:  # StaleGeneration: icelog moved on (a member lapsed there); or no commit
            log.warning("group %s: the assignment of generation %d was not recorded: %s", group.group_id, generation, e)
            if group.generation == generation and group.state == COMPLETING:
                self._prepare(group)
            return
        if group.generation != generation or group.state != COMPLETING:
            return
        group.state = STABLE
        for m in group.members.values():
            m.assignment = given.get(m.member_id, b"")
            _answer(m.sync, self._assignment(group, m))
            m.sync = None

    def _assignment(self, group: Group, member: Member) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.none,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "assignment": member.assignment,
        }

    async def heartbeat(self, request: Any) -> dict[str, Any]:
        group = self.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group is not None else None
        if group is None or member is None:
            return {"error_code": ErrorCode.unknown_member_id}
        member.heartbeat = time.monotonic()
        if request.generation_id != group.generation:
            return {"error_code": ErrorCode.illegal_generation}
        if group.state == PREPARING:
            return {"error_code": ErrorCode.rebalance_in_progress}
        if group.state == STABLE and time.monotonic() - member.recorded > member.session_ms / 4000:
            member.recorded = time.monotonic()
            # In the background: a slow catalog must not hold the answer up (the client sends its
            # next heartbeat only after it), or the session would lapse here while it waits.
            task = asyncio.create_task(self._record_heartbeat(group, member, group.generation))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return {"error_code": ErrorCode.none}

    async def _record_heartbeat(self, group: Group, member: Member, generation: int) -> None:
        action = GroupAction(group.group_id, member.member_id, "heartbeat", session_ms=member.session_ms)
        try:
            await asyncio.to_thread(group_action, self.catalog, action)
        except errors.StaleGeneration:  # icelog let the member go (the gateway was too slow): a new round
            if group.generation == generation and group.state != PREPARING and member.member_id in group.members:
                self._prepare(group)
        except errors.IcelogError as e:
            log.warning("group %s: a heartbeat was not recorded: %s", group.group_id, e)

    async def leave(self, request: Any, version: int) -> dict[str, Any]:
        group = self.groups.get(request.group_id)
        ids = [request.member_id] if version < 3 else [m.member_id for m in request.members]
        results = []
        for member_id in ids:
            known = group is not None and member_id in group.members
            if known:
                self._remove(group, member_id)  # type: ignore[arg-type]
            results.append({"member_id": member_id, "error_code": ErrorCode.none if known else ErrorCode.unknown_member_id})
        if version < 3:
            return {"error_code": results[0]["error_code"]}
        return {"error_code": ErrorCode.none, "members": results}

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        gone = {"error_code": ErrorCode.unknown_member_id, "generation_id": -1, "member_id": member_id, "leader": ""}
        _answer(member.join, gone)
        _answer(member.sync, {"error_code": ErrorCode.unknown_member_id})
        self._changed(group)

    # --- rounds ---------------------------------------------------------------------------------

    def _changed(self, group: Group) -> None:
        """A member joined or left: a round starts, or the running one looks again."""
        if group.recording:
            group.again = True
        if group.state == PREPARING:
            group.changed.set()
        else:
            self._prepare(group)

    def _prepare(self, group: Group) -> None:
        for m in group.members.values():
            _answer(m.sync, {"error_code": ErrorCode.rebalance_in_progress})
            m.sync = None
        group.state = PREPARING
        group.round = asyncio.create_task(self._round(group))

    async def _round(self, group: Group) -> None:
        """Wait for every member to rejoin (or the rebalance timeout), record the generation, answer the joins."""
        deadline = time.monotonic() + max((m.rebalance_ms for m in group.members.values()), default=0) / 1000
        while any(m.join is None for m in group.members.values()) and (left := deadline - time.monotonic()) > 0:
            group.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(group.changed.wait(), left)
        for m in [m for m in group.members.values() if m.join is None]:
            del group.members[m.member_id]  # did not rejoin in time
        joined = dict(group.members)
        protocol = _choose(list(joined.values()))
        group.recording, group.again = True, False
        try:
            record = await asyncio.to_thread(
                new_generation, self.catalog, group.group_id, {m: s.session_ms for m, s in joined.items()}
            )
        except errors.IcelogError as e:
            log.warning("group %s: a new generation was not recorded: %s", group.group_id, e)
            for m in group.members.values():  # they find the coordinator again and rejoin
                _answer(m.join, {"error_code": ErrorCode.coordinator_not_available, "generation_id": -1, "leader": ""})
            group.state, group.recording, group.round = EMPTY, False, None
            group.members.clear()
            return
        group.recording, group.round = False, None
        group.generation = record["generation"]
        log.info("group %s: generation %d with %d members", group.group_id, group.generation, len(joined))
        group.state, group.protocol = (COMPLETING, protocol) if joined else (EMPTY, None)
        if group.leader not in joined:
            group.leader = next(iter(joined), None)
        now = time.monotonic()
        for m in joined.values():
            m.recorded = m.heartbeat = now
            _answer(m.join, self._joined(group, m))
            m.join = None
        if group.again or any(m.member_id not in joined for m in group.members.values()):
            self._prepare(group)  # someone came or went while the generation was written

    def _joined(self, group: Group, member: Member) -> dict[str, Any]:
        leader = member.member_id == group.leader
        return {
            "error_code": ErrorCode.none,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "leader": group.leader,
            "member_id": member.member_id,
            "members": [
                {"member_id": m.member_id, "group_instance_id": None, "metadata": m.metadata(group.protocol)}
                for m in group.members.values()
            ]
            if leader
            else [],
        }

    def reap(self) -> None:
        """Remove members whose session lapsed without a heartbeat (one waiting in a join or sync is exempt)."""
        now = time.monotonic()
        for group in list(self.groups.values()):
            group.pending = {m: at for m, at in group.pending.items() if at > now}
            for m in list(group.members.values()):
                waiting = m.join is not None or (m.sync is not None and not m.sync.done())
                if not waiting and now - m.heartbeat > m.session_ms / 1000:
                    log.info("group %s: member %s's session lapsed", group.group_id, m.member_id)
                    self._remove(group, m.member_id)
            if group.state == EMPTY and not group.members and not group.pending and group.round is None:
                del self.groups[group.group_id]  # its record stays in icelog

    def close(self) -> None:
        """Answer every waiting join and sync (the gateway stops): the clients find a coordinator again."""
        for group in self.groups.values():
            if group.round is not None:
                group.round.cancel()
            for m in group.members.values():
                _answer(m.join, {"error_code": ErrorCode.not_coordinator, "generation_id": -1, "leader": ""})
                _answer(m.sync, {"error_code": ErrorCode.not_coordinator})

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REAP_SECONDS)
            self.reap()

    # --- OffsetCommit, OffsetFetch ----------------------------------------------------------------

    async def commit(self, request: Any) -> dict[str, Any]:
        wanted = [(t.name, p.partition_index, p.committed_offset) for t in request.topics for p in t.partitions]
        code = self._commit_refusal(request)
        codes: dict[tuple[str, int], ErrorCode] = {}
        if code is None and request.member_id:
            self.groups[request.group_id].members[request.member_id].heartbeat = time.monotonic()
        if code is None:
            member = request.member_id or None
            codes = await asyncio.to_thread(self._commit, request.group_id, wanted, member, request.generation_id_or_member_epoch)
            group = self.groups.get(request.group_id)
            if ErrorCode.illegal_generation in codes.values() and group is not None and member in group.members:
                if group.generation == request.generation_id_or_member_epoch and group.state != PREPARING:
                    self._prepare(group)  # icelog fenced a member the gateway still had: a new round
            elif member is not None and group is not None and member in group.members:
                group.members[member].recorded = group.members[member].heartbeat = time.monotonic()
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, p, _ in wanted:
            topics.setdefault(topic, []).append({"partition_index": p, "error_code": code or codes[(topic, p)]})
        return {"topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    def _commit_refusal(self, request: Any) -> ErrorCode | None:
        """Kafka's coordinator checks, on the join state here (icelog checks the generation again)."""
        if not valid_group(request.group_id):
            return ErrorCode.invalid_group_id
        group = self.groups.get(request.group_id)
        generation, member = request.generation_id_or_member_epoch, request.member_id
        if generation < 0 and not member:  # a consumer outside the group protocol (assign()): only while the group is empty
            return ErrorCode.unknown_member_id if group is not None and group.members else None
        if group is None or member not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        return None

    def _commit(
        self, group: str, wanted: list[tuple[str, int, int]], member: str | None, generation: int
    ) -> dict[tuple[str, int], ErrorCode]:
        """Check each partition, commit the good ones in one icelog commit (in a thread)."""
        codes, offsets = check_positions(self.catalog, wanted)
        if not offsets:
            return codes
        fence = {"member": member, "generation": None if member is None else generation, "fenced": True}
        try:
            commit_offsets(self.catalog, group, offsets, **fence)  # type: ignore[arg-type]
        except errors.StaleGeneration:
            failed = ErrorCode.illegal_generation
        except errors.InvalidOffset:
            failed = ErrorCode.offset_out_of_range
        except errors.IcelogError as e:
            log.warning("group %s: an offset commit failed: %s", group, e)
            failed = ErrorCode.coordinator_not_available
        else:
            return codes
        return {k: failed if c == ErrorCode.none else c for k, c in codes.items()}

    def fetch_offsets(self, request: Any, version: int) -> dict[str, Any]:
        """Committed offsets (the next to read; -1 for none) of the asked groups (in a thread).

        Without atomic multi-table commits, a decided transaction's offsets land in a roll-forward
        of their own: every one registered with an asked group is rolled forward first, so a
        consumer that takes over after a crash never starts from offsets about to move. While
        one is still undecided, a client that requires stable offsets (KIP-447, a read_committed
        consumer) is answered UNSTABLE_OFFSET_COMMIT, which it retries.
        """
        asked = [(g.group_id, g.topics) for g in request.groups] if version >= 8 else [(request.group_id, request.topics)]
        unstable = {group for group, _ in asked if valid_group(group) and self._pending(group)}
        if not getattr(request, "require_stable", False):
            unstable = set()
        state = group_state(self.catalog)
        answers = []
        for group, topics in asked:
            if not valid_group(group):
                answers.append({"group_id": group, "error_code": ErrorCode.invalid_group_id, "topics": []})
                continue
            stored = state.offsets.get(group, {})
            if topics is None:  # every partition the group committed
                wanted = [(t, [int(p) for p in ps]) for t, ps in sorted(stored.items())]
            else:
                wanted = [(t.name, list(t.partition_indexes)) for t in topics]
            answer = []
            for topic, partitions in wanted:
                name = table_name(topic)
                rows = []
                for p in partitions:
                    known = name is not None and str(p) in stored.get(name, {}) and group not in unstable
                    committed = state.range_state(group, name, p, 0).committed if known else -1  # type: ignore[arg-type]
                    rows.append(
                        {
                            "partition_index": p,
                            "committed_offset": committed,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": ErrorCode.unstable_offset_commit if group in unstable else ErrorCode.none,
                        }
                    )
                answer.append({"name": topic, "partitions": rows})
            answers.append({"group_id": group, "error_code": ErrorCode.none, "topics": answer})
        if version >= 8:
            return {"groups": answers}
        first = answers[0]
        if version < 2 and first["error_code"] != ErrorCode.none:
            return {"topics": [{"name": t.name, "partitions": [{"partition_index": p, "committed_offset": -1,
                     "metadata": "", "error_code": first["error_code"]} for p in t.partition_indexes]}
                               for t in request.topics or ()]}  # fmt: skip
        return {"topics": first["topics"], "error_code": first["error_code"]}

    def _pending(self, group: str) -> bool:
        """Roll forward the decided transactions registered with ``group``; whether one that is
        not decided yet remains (always False on an atomic catalog)."""
        try:
            _, undecided = settle_decided(self.catalog, group)
        except errors.IcelogError as e:  # its offsets may be about to move: not stable
            log.warning("group %r: a transaction registered with it cannot be finished now: %s", group, e)
            return True
        return bool(undecided)

    # --- ListGroups, DescribeGroups -------------------------------------------------------------

    def list(self, request: Any, recorded: list[str]) -> dict[str, Any]:
        """Every group in icelog's group state (``recorded``) or in a round here."""
        wanted = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
        listed = []
        for group_id in sorted(set(recorded) | set(self.groups)):
            group = self.groups.get(group_id)
            state = group.state if group is not None else EMPTY
            if wanted and state.lower() not in wanted:
                continue
            protocol_type = (group.protocol_type if group is not None else None) or ""
            listed.append({"group_id": group_id, "protocol_type": protocol_type, "group_state": state})
        return {"error_code": ErrorCode.none, "groups": listed}

    def describe(self, request: Any, recorded: list[str]) -> dict[str, Any]:
        """Each asked group's state, protocol and members; an unknown group is Dead, as in Kafka."""
        described = []
        for group_id in request.groups:
            group = self.groups.get(group_id)
            members: list[dict[str, Any]] = []
            if group is not None:
                members = [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": None,
                        "client_id": m.client_id,
                        "client_host": "/127.0.0.1",
                        "member_metadata": m.metadata(group.protocol),
                        "member_assignment": m.assignment if group.state == STABLE else b"",
                    }
                    for m in group.members.values()
                ]
                entry = {
                    "group_state": group.state,
                    "protocol_type": group.protocol_type or "",
                    "protocol_data": group.protocol or "",
                }
            else:
                entry = {"group_state": EMPTY if group_id in recorded else DEAD, "protocol_type": "", "protocol_data": ""}
            code = ErrorCode.none if valid_group(group_id) else ErrorCode.invalid_group_id
            described.append(
                {"error_code": code, "group_id": group_id, "members": members, "authorized_operations": NOT_REQUESTED, **entry}
            )
        return {"groups": described}


def valid_group(group: Any) -> bool:
    try:
        validate_group_id(group)
    except errors.InvalidInput:
        return False
    return True


def _common(members: list[Member], names: set[str]) -> bool:
    """Whether a protocol ``names`` has is one every member has too."""
    return any(all(any(n == name for n, _ in m.protocols) for m in members) for name in names)


def _choose(members: list[Member]) -> str | None:
    """The protocol every member supports that most members prefer (ties: the earlier in the first member's list)."""
    if not members:
        return None
    shared = [n for n, _ in members[0].protocols if all(any(n == x for x, _ in m.protocols) for m in members)]
    votes = dict.fromkeys(shared, 0)
    for m in members:
        vote = next((n for n, _ in m.protocols if n in votes), None)
        if vote is not None:
            votes[vote] += 1
    return max(shared, key=lambda n: votes[n]) if shared else None


def _partitions(assignment: bytes) -> dict[str, list[int]]:
    """The tables and partitions of a consumer-protocol assignment (version, [topic, [partition]],
    user data); empty for bytes that are not one (the bytes are still handed out as they came)."""
    try:
        at = 2
        (count,) = struct.unpack_from(">i", assignment, at)
        at += 4
        if not 0 <= count <= len(assignment):
            return {}
        out: dict[str, list[int]] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">h", assignment, at)
            at += 2
            if size < 0 or at + size > len(assignment):
                return {}
            topic = assignment[at : at + size].decode("utf-8")
            at += size
            (n,) = struct.unpack_from(">i", assignment, at)
            at += 4
            if not 0 <= n <= (len(assignment) - at) // 4:
                return {}
            partitions = list(struct.unpack_from(f">{n}i", assignment, at))
            at += 4 * n
            name = table_name(topic)
            if name is not None:
                out.setdefault(name, []).extend(p for p in partitions if p >= 0)
        return out
    except (struct.error, UnicodeDecodeError):
        return {}


def check_positions(
    catalog: Catalog, wanted: list[tuple[str, int, int]]
) -> tuple[dict[tuple[str, int], ErrorCode], dict[tuple[str, int], int]]:
    """Each ``(topic, partition, offset)`` of an offset commit checked against its partition's
    log (in a thread): the answer's code per ``(topic, partition)``, and the positions to commit
    per ``(table, partition)`` (those whose code is NONE)."""
    codes: dict[tuple[str, int], ErrorCode] = {}
    offsets: dict[tuple[str, int], int] = {}
    marks: dict[str, Any] = {}
    for topic, p, offset in wanted:
        name = table_name(topic)
        if name is not None and name not in marks:
            try:
                marks[name] = LogTable(catalog, name).watermarks()
            except errors.IcelogError:
                marks[name] = {}
        mark = marks.get(name, {}).get(p) if name is not None else None
        if mark is None:
            codes[(topic, p)] = ErrorCode.unknown_topic_or_partition
        elif not 0 <= offset <= mark.end:
            codes[(topic, p)] = ErrorCode.offset_out_of_range
        else:
            offsets[(name, p)] = offset  # type: ignore[index]
            codes[(topic, p)] = ErrorCode.none
    return codes, offsets

"""Consumer-group offsets, kept durably in the catalog (Kafka's ``__consumer_offsets``).

The system table ``icelog_system.group_offsets`` holds, in its properties, every group's
committed position per source (table, partition)::

    {"<group>": {"<table>": {"<partition>": <next offset to read>}}}

The convention is Kafka's: a committed offset is the *next* offset to read. A commit runs
through the commit core, so it can join a transaction's atomic multi-table commit
(exactly-once consume–transform–produce).

Consumer groups keep two more properties in the same table, apart from the stable offsets
(as cooperative consumption separates them; docs/consumer-groups.md):

* ``icelog.group-ranges``: individually committed (IC) ranges above each stable offset,
  ``{"<group>": {"<table>": {"<partition>": [[first, last], ...]}}}``, at most
  ``icelog.groups.max-ranges`` (default 1,000) per partition (``storage.groups.ranges``);
* ``icelog.group-members``: members, generation, assignment and draining hash ranges per
  group (``storage.groups.membership``).

The *stable offset* (the last offset done, inclusive) is ``committed - 1``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit
from icelog.storage.core.system import ensure_system_table
from icelog.storage.errors import (
    IcelogError,
    InvalidInput,
    InvalidOffset,
    InvalidRange,
    RangeLimitExceeded,
    StaleGeneration,
    UnknownGroup,
)
from icelog.storage.groups import membership
from icelog.storage.groups.group_state import GROUPS_TABLE, GroupOffsetsState, describe  # noqa: F401 (re-exported)
from icelog.storage.groups.ranges import (
    RangeError,
    RangeState,
    check_range,
    commit_range,
    normalize,
)
from icelog.storage.log.schema import qualified
from icelog.storage.log.table import LogTable


def validate_group_id(group: Any) -> None:
    """A group id is non-blank text of at most 256 characters (I8)."""
    if not isinstance(group, str) or not group.strip() or len(group) > 256:
        raise InvalidInput(reason="a group id is a non-empty string of at most 256 characters")


def validate_offsets(group: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Check a group's offsets to commit: ``{(table, partition): next_offset}`` (I8)."""
    validate_group_id(group)
    if not offsets:
        raise InvalidInput(reason="no offsets to commit")
    for key, offset in offsets.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int)):
            raise InvalidInput(reason=f"offsets are keyed by (table, partition), not {key!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**63:
            raise InvalidOffset(partition=key[1], offset=offset, reason="a committed offset is an integer >= 0")


@dataclass
class CommitGroupOffsets(Request):
    """Set a group's positions. Offsets never pass the source's log end (I10).

    With ``fenced``, the commit is a group member's (``member``/``generation``, as
    :class:`CommitRanges` fences them: :class:`StaleGeneration`), or with ``member`` None one
    allowed only while the group has no live member. Without it, nothing is fenced (a
    transaction's offsets, a manual commit).
    """

    group: str
    offsets: Mapping[tuple[str, int], int]
    log_ends: Mapping[tuple[str, int], int]
    commit_id: str = ""
    member: str | None = None
    generation: int | None = None
    fenced: bool = False
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        if self.fenced:
            record = _group_copy(state, self.group)
            _fence(self.group, record, self.member, self.generation, _now_ms())
            state = _with_group(state, self.group, record)
        updates: dict[tuple[str, int], RangeState] = {}
        for (source, p), offset in sorted(self.offsets.items()):
            end = self.log_ends[(source, p)]
            if offset > end:
                raise InvalidOffset(partition=p, offset=offset, reason=f"beyond the log end {end} of {source}")
            ranges = state.ranges.get(self.group, {}).get(source, {}).get(str(p), [])
            updates[(source, p)] = normalize(offset - 1, [tuple(r) for r in ranges])  # type: ignore[misc]
        return Decision(
            state=with_range_states(state, self.group, updates), result={"group": self.group, "committed": len(self.offsets)}
        )


def with_range_states(state: GroupOffsetsState, group: str, updates: Mapping[tuple[str, int], RangeState]) -> GroupOffsetsState:
    """``state`` with these partitions' stable offsets (as Kafka committed offsets) and IC ranges."""
    offsets = {g: {t: dict(ps) for t, ps in ts.items()} for g, ts in state.offsets.items()}
    ranges = {g: {t: dict(ps) for t, ps in ts.items()} for g, ts in state.ranges.items()}
    for (source, p), rs in updates.items():
        offsets.setdefault(group, {}).setdefault(source, {})[str(p)] = rs.committed
        mine = ranges.setdefault(group, {}).setdefault(source, {})
        if rs.ranges:
            mine[str(p)] = rs.to_json()
        else:
            mine.pop(str(p), None)
    return replace(state, offsets=offsets, ranges=ranges)


def log_ends(catalog: Catalog, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Each source partition's log end now (it only grows, so an offset under it stays valid)."""
    return {key: end for key, (_, end) in log_bounds(catalog, offsets).items()}


def commit_request(catalog: Catalog, group: str, offsets: Mapping[tuple[str, int], int], **fence: Any) -> CommitGroupOffsets:
    """A validated group-offset commit, ready to run alone or inside a transaction
    (``fence``: ``member``, ``generation``, ``fenced``, as :class:`CommitGroupOffsets` takes them)."""

    offsets = {(qualified(t), p): o for (t, p), o in offsets.items()} if offsets else {}
    validate_offsets(group, offsets)
    ensure_system_table(catalog, GROUPS_TABLE)
    return CommitGroupOffsets(group, offsets, log_ends(catalog, offsets), **fence)


def commit_offsets(
    catalog: Catalog,
    group: str,
    offsets: Mapping[tuple[str, int], int],
    *,
    member: str | None = None,
    generation: int | None = None,
    fenced: bool = False,
) -> dict[str, Any]:
    """Commit a group's positions on its own (outside any transaction).

    Raises:
        InvalidOffset: an offset past its partition's log end.
        StaleGeneration: ``fenced``, and the member was removed or acted at an old generation.
    """
    request = commit_request(catalog, group, offsets, member=member, generation=generation, fenced=fenced)
    return commit(catalog, GROUPS_TABLE, request).result


def committed_offsets(catalog: Catalog, group: str, table: str) -> dict[int, int]:
    """A group's committed next-offset-to-read per partition of ``table`` (empty: none)."""

    try:
        metadata = catalog.load_table(GROUPS_TABLE).metadata
    except NoSuchTableError:
        return {}
    return GroupOffsetsState.from_metadata(metadata).committed(group, qualified(table))


# --- individual (range) commits and membership ------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


def _group_copy(state: GroupOffsetsState, group: str) -> dict[str, Any]:
    return copy.deepcopy(dict(state.members.get(group) or membership.empty_group()))


def _with_group(state: GroupOffsetsState, group: str, record: Mapping[str, Any]) -> GroupOffsetsState:
    members = dict(state.members)
    members[group] = record
    return replace(state, members=members)


def _fence(group: str, record: dict[str, Any], member: str | None, generation: int | None, now_ms: int) -> None:
    """Expire lapsed members, then refuse a member that is gone or acts at an old generation."""
    membership.expire(record, now_ms)
    if member is None:
        live = membership.live_members(record, now_ms)
        if live:
            raise StaleGeneration(group=group, member="", generation=-1, current_generation=record["generation"])
        return
    if member not in record["members"] or generation != record["generation"]:
        raise StaleGeneration(
            group=group,
            member=member,
            generation=-1 if generation is None else generation,
            current_generation=record["generation"],
        )
    record["members"][member]["heartbeat_ms"] = now_ms
    membership.acknowledge(record, member)


@dataclass
class CommitRanges(Request):
    """Mark offset ranges done, individually (I10): merged, never applied twice, never past the log end.

    ``member``/``generation`` fence a group member (:class:`StaleGeneration`); ``None`` is a
    manual commit, allowed only while the group has no live member.
    """

    group: str
    ranges: Mapping[tuple[str, int], list[tuple[int, int]]]
    log_bounds: Mapping[tuple[str, int], tuple[int, int]]
    member: str | None = None
    generation: int | None = None
    now_ms: int | None = None
    decided: bool = False  # a transaction's roll-forward: its decision checked the generation already
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table | None) -> Decision:
        now = self.now_ms if self.now_ms is not None else _now_ms()
        record = _group_copy(state, self.group)
        if not self.decided:  # a decided commit lands even after a rebalance: adopters waited for it
            _fence(self.group, record, self.member, self.generation, now)
        updates: dict[tuple[str, int], RangeState] = {}
        for (source, p), ranges in sorted(self.ranges.items()):
            start, end = self.log_bounds[(source, p)]
            rs = state.range_state(self.group, source, p, start)
            for first, last in ranges:
                if first < start:
                    raise InvalidRange(table=source, partition=p, first=first, last=last, reason=f"below the log start {start}")
                if last >= end:
                    raise InvalidRange(table=source, partition=p, first=first, last=last, reason=f"beyond the log end {end}")
                try:
                    rs = commit_range(rs, first, last)
                except RangeError as e:
                    raise InvalidRange(table=source, partition=p, first=first, last=last, reason=str(e)) from e
            if len(rs.ranges) > state.max_ranges:
                raise RangeLimitExceeded(
                    group=self.group, table=source, partition=p, ranges=len(rs.ranges), limit=state.max_ranges
                )
            updates[(source, p)] = rs
        new = _with_group(with_range_states(state, self.group, updates), self.group, record)
        result = {
            "group": self.group,
            "generation": record["generation"],
            "partitions": {
                f"{t}/{p}": {"stable": rs.stable, "committed": rs.committed, "ranges": rs.to_json()}
                for (t, p), rs in updates.items()
            },
        }
        return Decision(state=new, result=result)

    def receipt(self, result: Any) -> Any:
        return result


def check_member(state: GroupOffsetsState, group: str, member: str, generation: int | None, now_ms: int | None = None) -> None:
    """Refuse a member that is not in ``group`` at its current generation, writing nothing.

    Raises:
        UnknownGroup: the group has no membership at all.
        StaleGeneration: the member was removed, or the group rebalanced since ``generation``.
    """
    if group not in state.members:
        raise UnknownGroup(group=group)
    _fence(group, _group_copy(state, group), member, generation, now_ms if now_ms is not None else _now_ms())


def validate_ranges(group: str, ranges: Mapping[tuple[str, int], list[tuple[int, int]]]) -> None:
    """Shape checks before anything is read (I8)."""
    validate_offsets(group, dict.fromkeys(ranges, 0) if ranges else {})
    for (source, p), rs in ranges.items():
        if not rs:
            raise InvalidInput(reason=f"no ranges for {source} partition {p}")
        for r in rs:
            try:
                check_range(*r)
            except (RangeError, TypeError) as e:
                raise InvalidRange(table=source, partition=p, first=r, last=r, reason=str(e)) from e


def log_bounds(catalog: Catalog, keys: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """``(log_start, log_end)`` of each source partition now."""

    bounds: dict[tuple[str, int], tuple[int, int]] = {}
    for source in sorted({t for t, _ in keys}):
        marks = LogTable.open(catalog, source).watermarks()
        for t, p in keys:
            if t == source:
                if p not in marks:
                    raise InvalidOffset(partition=p, offset=None, reason=f"{source} has no partition {p}")
                bounds[(t, p)] = (marks[p].start, marks[p].end)
    return bounds


def ranges_request(
    catalog: Catalog,
    group: str,
    ranges: Mapping[tuple[str, int], list[tuple[int, int]]],
    *,
    member: str | None = None,
    generation: int | None = None,
    decided: bool = False,
) -> CommitRanges:
    """A validated range commit, ready to run alone or in a multi-table commit (``commit_tables``).

    ``decided``: a transaction's roll-forward, not fenced again (see :class:`CommitRanges`)."""

    ranges = {(qualified(t), p): [tuple(r) for r in rs] for (t, p), rs in ranges.items()} if ranges else {}
    validate_ranges(group, ranges)  # type: ignore[arg-type]
    ensure_system_table(catalog, GROUPS_TABLE)
    return CommitRanges(group, ranges, log_bounds(catalog, ranges), member, generation, decided=decided)  # type: ignore[arg-type]


def commit_ranges(
    catalog: Catalog,
    group: str,
    ranges: Mapping[tuple[str, int], list[tuple[int, int]]],
    *,
    member: str | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """Commit offset ranges ``{(table, partition): [(first, last), ...]}`` (inclusive) on their own.

    Raises:
        InvalidRange: malformed, overlapping what is done, below the log start or past the log end.
        RangeLimitExceeded: too many open ranges (close the lowest gap first).
        StaleGeneration: the member was removed, or acted at an old generation.
    """
    return commit(catalog, GROUPS_TABLE, ranges_request(catalog, group, ranges, member=member, generation=generation)).result


@dataclass
class GroupAction(Request):
    """Join, heartbeat (sync) or leave; every action first removes members whose session lapsed."""

    group: str
    member: str
    action: str  # "join" | "heartbeat" | "leave"
    subscription: Mapping[str, list[int]] = field(default_factory=dict)
    session_ms: int = 10_000
    now_ms: int | None = None
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        now = self.now_ms if self.now_ms is not None else _now_ms()
        record = _group_copy(state, self.group)
        membership.expire(record, now)
        if self.action == "join":
            membership.join(record, self.member, self.subscription, self.session_ms, now)
        elif self.action == "leave":
            membership.leave(record, self.member)
        elif self.member not in record["members"]:
            raise StaleGeneration(group=self.group, member=self.member, generation=-1, current_generation=record["generation"])
        else:
            record["members"][self.member]["heartbeat_ms"] = now
            membership.acknowledge(record, self.member)
        return Decision(state=_with_group(state, self.group, record), result=copy.deepcopy(record))

    def receipt(self, result: Any) -> Any:
        return result


def group_action(catalog: Catalog, request: GroupAction) -> dict[str, Any]:
    """Run a membership action; returns the group's membership record after it."""
    validate_group_id(request.group)
    ensure_system_table(catalog, GROUPS_TABLE)
    return commit(catalog, GROUPS_TABLE, request).result


def group_state(catalog: Catalog) -> GroupOffsetsState:
    try:
        metadata = catalog.load_table(GROUPS_TABLE).metadata
    except NoSuchTableError:
        return GroupOffsetsState()
    return GroupOffsetsState.from_metadata(metadata)


def list_groups(catalog: Catalog) -> list[str]:
    state = group_state(catalog)
    return sorted(set(state.offsets) | set(state.ranges) | set(state.members))


def describe_group(catalog: Catalog, group: str, now_ms: int | None = None) -> dict[str, Any]:
    """:func:`storage.groups.group_state.describe` of the catalog's stored state, now."""

    def bounds(source: str) -> dict[int, tuple[int, int]]:
        try:
            return {p: (w.start, w.end) for p, w in LogTable.open(catalog, source).watermarks().items()}
        except IcelogError:
            return {}

    return describe(group_state(catalog), group, bounds, now_ms if now_ms is not None else _now_ms())


@dataclass
class ResetGroup(Request):
    """Set partitions' stable offsets and drop their IC ranges; refused while members are live.

    Either ``positions`` (absolute) or ``shift_by`` (relative to each partition's current
    committed offset, read from the base this commit replaces, clamped to ``bounds``).
    """

    group: str
    positions: Mapping[tuple[str, int], int]  # Kafka committed offset: next to read
    now_ms: int | None = None
    shift_by: int | None = None
    bounds: Mapping[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # log [start, end] per key
    state_type = GroupOffsetsState
    writes_system = True

    def plan(self, state: GroupOffsetsState) -> list[dict[str, Any]]:
        """Per partition: the group's current committed offset (where it resumes) and the new one."""
        rows = []
        for source, p in sorted(self.bounds if self.shift_by is not None else self.positions):
            start, end = self.bounds.get((source, p), (0, 0))
            current = state.range_state(self.group, source, p, start).committed
            new = self.positions[(source, p)] if self.shift_by is None else min(max(current + self.shift_by, start), end)
            rows.append({"table": source, "partition": p, "current": current, "new": new})
        return rows

    def decide(self, state: GroupOffsetsState, table: Table | None) -> Decision:
        record = _group_copy(state, self.group)
        _fence(self.group, record, None, None, self.now_ms if self.now_ms is not None else _now_ms())
        plan = self.plan(state)
        updates = {(r["table"], r["partition"]): RangeState(r["new"] - 1, ()) for r in plan}
        new = _with_group(with_range_states(state, self.group, updates), self.group, record)
        result = {
            "group": self.group,
            "reset": {f"{r['table']}/{r['partition']}": r["new"] for r in plan},
            "partitions": plan,
        }
        return Decision(state=new, result=result)


def reset_group(
    catalog: Catalog,
    group: str,
    table: str,
    to: str | None = None,
    partitions: list[int] | None = None,
    *,
    to_time_us: int | None = None,
    shift_by: int | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Move a group's position on ``table`` (as kafka-consumer-groups ``--reset-offsets``) and
    drop its IC ranges there.

    Exactly one target: ``to`` (``earliest``, ``latest`` or an offset, the next to read),
    ``to_time_us`` (per partition, the first offset stamped at or after it, else the log end:
    :meth:`LogTable.offsets_for_time`) or ``shift_by`` (± from the current committed offset,
    clamped to ``[log_start, log_end]``).

    Args:
        dry_run: Decide on the current state and return the plan; commit nothing, create nothing.

    Returns:
        ``{"group", "reset": {"<table>/<p>": new}, "partitions": [{"table", "partition",
        "current", "new"}], "dry_run"}``.

    Raises:
        StaleGeneration: the group has live members (a dry run too: the reset would be refused).
        InvalidOffset: an offset outside ``[log_start, log_end]``, or a partition the table lacks.
        InvalidInput: not exactly one target, or a malformed ``to``.
    """
    targets = [name for name, given in (("to", to), ("to_time_us", to_time_us), ("shift_by", shift_by)) if given is not None]
    if len(targets) != 1:
        raise InvalidInput(reason=f"reset takes exactly one of to, to_time_us, shift_by; got {targets or 'none'}")
    validate_group_id(group)
    source = qualified(table)
    log_table = LogTable.open(catalog, source)
    marks = log_table.watermarks()
    chosen = sorted(marks) if partitions is None else partitions
    for p in chosen:
        if p not in marks:
            raise InvalidOffset(partition=p, offset=None, reason=f"{source} has no partition {p}")
    if not chosen:
        raise InvalidInput(reason=f"{source} has no partitions to reset")
    positions: dict[tuple[str, int], int] = {}
    if to_time_us is not None:
        positions = {(source, p): e.offset for p, e in log_table.offsets_for_time(to_time_us, chosen).items()}
    elif to is not None:
        for p in chosen:
            if to == "earliest":
                positions[(source, p)] = marks[p].start
            elif to == "latest":
                positions[(source, p)] = marks[p].end
            else:
                try:
                    offset = int(to)
                except ValueError:
                    raise InvalidInput(reason=f"reset to 'earliest', 'latest' or an offset, not {to!r}") from None
                if not marks[p].start <= offset <= marks[p].end:
                    raise InvalidOffset(partition=p, offset=offset, reason=f"outside [{marks[p].start}, {marks[p].end}]")
                positions[(source, p)] = offset
        validate_offsets(group, positions)
    elif not isinstance(shift_by, int) or isinstance(shift_by, bool) or abs(shift_by) >= 2**63:
        raise InvalidInput(reason=f"shift_by is a whole number of offsets, not {shift_by!r}")
    bounds = {(source, p): (marks[p].start, marks[p].end) for p in chosen}
    request = ResetGroup(group, positions, shift_by=shift_by, bounds=bounds)
    if dry_run:
        return {**request.decide(group_state(catalog), None).result, "dry_run": True}
    ensure_system_table(catalog, GROUPS_TABLE)
    return {**commit(catalog, GROUPS_TABLE, request).result, "dry_run": False}


@dataclass
class DeleteGroup(Request):
    """Forget a group: its committed offsets, IC ranges and membership (kafka-consumer-groups
    ``--delete``); refused while members are live, as Kafka refuses a non-empty group."""

    group: str
    now_ms: int | None = None
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table | None) -> Decision:
        if self.group not in set(state.offsets) | set(state.ranges) | set(state.members):
            raise UnknownGroup(group=self.group)
        _fence(self.group, _group_copy(state, self.group), None, None, self.now_ms if self.now_ms is not None else _now_ms())
        offsets = {g: v for g, v in state.offsets.items() if g != self.group}
        ranges = {g: v for g, v in state.ranges.items() if g != self.group}
        members = {g: v for g, v in state.members.items() if g != self.group}
        tables = sorted(set(state.offsets.get(self.group, {})) | set(state.ranges.get(self.group, {})))
        new = replace(state, offsets=offsets, ranges=ranges, members=members)
        return Decision(state=new, result={"group": self.group, "deleted": True, "tables": tables})

    def receipt(self, result: Any) -> Any:
        return result


def delete_group(catalog: Catalog, group: str) -> dict[str, Any]:
    """Delete ``group`` (:class:`DeleteGroup`).

    Raises:
        UnknownGroup: no such group (nothing created); StaleGeneration: it has live members.
    """
    validate_group_id(group)
    if not catalog.table_exists(GROUPS_TABLE):
        raise UnknownGroup(group=group)
    return commit(catalog, GROUPS_TABLE, DeleteGroup(group)).result


def groups_on(catalog: Catalog, table: str) -> list[str]:
    """The groups with committed offsets, IC ranges or an assignment on ``table`` (reads only)."""
    source = qualified(table)
    state = group_state(catalog)
    return sorted(
        g
        for g in set(state.offsets) | set(state.ranges) | set(state.members)
        if source in state.offsets.get(g, {})
        or source in state.ranges.get(g, {})
        or source in (state.members.get(g) or {}).get("assignment", {})
    )


@dataclass
class ForgetTable(Request):
    """Drop a table's committed offsets and IC ranges from every group (Kafka drops a deleted
    topic's offsets too): a table created again under the name starts with no stale positions,
    which could pass its new log end (I10). Members and their assignments are left as they are."""

    table: str
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        def without(by_group: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
            kept = {g: {t: v for t, v in ts.items() if t != self.table} for g, ts in by_group.items()}
            return {g: ts for g, ts in kept.items() if ts}

        groups = sorted({g for g, ts in [*state.offsets.items(), *state.ranges.items()] if self.table in ts})
        offsets, ranges = without(state.offsets), without(state.ranges)
        # A group left with nothing (no offsets, ranges, members or assignment) is gone, as in Kafka.
        members = {
            g: record
            for g, record in state.members.items()
            if g not in groups or g in offsets or g in ranges or any(record.get(k) for k in ("members", "assignment", "draining"))
        }
        new = replace(state, offsets=offsets, ranges=ranges, members=members)
        return Decision(state=new, result={"table": self.table, "groups": groups}, write=bool(groups))

    def receipt(self, result: Any) -> Any:
        return result


def forget_table(catalog: Catalog, table: str) -> list[str]:
    """Drop ``table``'s committed offsets and IC ranges from every group; returns those groups."""
    if not catalog.table_exists(GROUPS_TABLE):
        return []  # no group ever committed: nothing to forget, and nothing created
    return commit(catalog, GROUPS_TABLE, ForgetTable(qualified(table))).result["groups"]

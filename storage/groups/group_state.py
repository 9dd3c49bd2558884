"""Consumer groups' stored state and what ``describe`` shows of one group: pure functions of the
properties of ``icelog_system.group_offsets`` (``storage.groups.offsets`` keeps them) and of the
source tables' watermarks.

Standard library only (with the groups' pure modules), so ``icelog groups describe`` can answer
from metadata read without pyiceberg (``storage.core.pointer``) as well as through the catalog.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from icelog.storage import properties
from icelog.storage.groups import membership
from icelog.storage.groups.ranges import RangeState, normalize, resume_at
from icelog.storage.properties import GROUP_MEMBERS, GROUP_OFFSETS, GROUP_RANGES

GROUPS_TABLE = "icelog_system.group_offsets"


@dataclass(frozen=True)
class GroupOffsetsState:
    offsets: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    snapshot_id: int | None = None
    ranges: Mapping[str, Mapping[str, Mapping[str, list[list[int]]]]] = field(default_factory=dict)
    members: Mapping[str, Any] = field(default_factory=dict)
    max_ranges: int = properties.GROUP_MAX_RANGES.default  # type: ignore[assignment]

    @classmethod
    def from_metadata(cls, metadata: Any) -> GroupOffsetsState:
        """The state a table's metadata holds (pyiceberg's ``TableMetadata``)."""
        return cls.from_properties(metadata.properties, metadata.current_snapshot_id)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], snapshot_id: int | None) -> GroupOffsetsState:
        """The state the properties of ``icelog_system.group_offsets`` hold."""
        return cls(
            json.loads(props.get(GROUP_OFFSETS, "{}")),
            snapshot_id,
            json.loads(props.get(GROUP_RANGES, "{}")),
            json.loads(props.get(GROUP_MEMBERS, "{}")),
            properties.read(props, properties.GROUP_MAX_RANGES, GROUPS_TABLE),
        )

    def to_properties(self) -> dict[str, str]:
        def dump(value: Any) -> str:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))

        return {GROUP_OFFSETS: dump(self.offsets), GROUP_RANGES: dump(self.ranges), GROUP_MEMBERS: dump(self.members)}

    def range_state(self, group: str, table: str, partition: int, log_start: int) -> RangeState:
        """One partition's stable offset and IC ranges, resumed at ``log_start`` after retention."""
        committed = self.offsets.get(group, {}).get(table, {}).get(str(partition))
        ranges = self.ranges.get(group, {}).get(table, {}).get(str(partition), [])
        stable = log_start - 1 if committed is None else committed - 1
        return resume_at(normalize(stable, [tuple(r) for r in ranges]), log_start)  # type: ignore[misc]

    def committed(self, group: str, table: str) -> dict[int, int]:
        return {int(p): o for p, o in self.offsets.get(group, {}).get(table, {}).items()}


def describe(
    state: GroupOffsetsState, group: str, bounds: Callable[[str], Mapping[int, tuple[int, int]]], now: int
) -> dict[str, Any]:
    """Per table and partition: stable offset (last done, inclusive), Kafka committed offset
    (next to read), IC ranges, log bounds, lag; plus members, generation, assignment and
    draining ranges. ``bounds(table)``: each partition's (log start, log end), ``{}`` for a
    table that cannot be read."""
    record = copy.deepcopy(dict(state.members.get(group) or membership.empty_group()))
    tables = sorted(set(state.offsets.get(group, {})) | set(state.ranges.get(group, {})) | set(record["assignment"]))
    partitions: list[dict[str, Any]] = []
    for source in tables:
        marks = bounds(source)
        keys = set(state.offsets.get(group, {}).get(source, {})) | set(state.ranges.get(group, {}).get(source, {}))
        keys |= set(record["assignment"].get(source, {}))
        for p in sorted(int(k) for k in keys):
            start, end = marks.get(p, (0, 0))
            stored = state.offsets.get(group, {}).get(source, {}).get(str(p))
            rs = state.range_state(group, source, p, start)
            entry = {
                "table": source,
                "partition": p,
                "stable_offset": rs.stable,
                "committed_offset": rs.committed,
                "ranges": rs.to_json(),
                "log_start": start,
                "log_end": end,
                "lag": max(0, end - rs.committed) - sum(last - first + 1 for first, last in rs.ranges),
                "owners": record["assignment"].get(source, {}).get(str(p), {}),
                "draining": [d for d in record["draining"] if d["table"] == source and d["partition"] == p],
            }
            if stored is not None and stored < start:
                entry["note"] = (
                    f"retention moved the log start to {start}, past the stored stable offset {stored - 1}: "
                    f"the group resumes from the log start"
                )
            partitions.append(entry)
    members = [
        {
            "member": m,
            "generation": s["generation"],
            "heartbeat_age_ms": now - s["heartbeat_ms"],
            "session_ms": s["session_ms"],
            "live": now - s["heartbeat_ms"] <= s["session_ms"],
            "subscription": s["subscription"],
        }
        for m, s in sorted(record["members"].items())
    ]
    return {
        "group": group,
        "generation": record["generation"],
        "members": members,
        "partitions": partitions,
        "max_ranges": state.max_ranges,
    }

"""Kafka's classic group protocol, recorded in icelog's group state (``icelog.group-members``).

A Kafka coordinator (``icelog serve``) runs the join and sync rounds itself; what it records
here is what icelog's fencing and ``icelog groups describe`` read:

* :class:`NewGeneration` when a join round completes: the group's members become exactly the
  round's (with their session timeouts), the generation goes up by one, and that generation
  is the one the coordinator hands out. Offset commits are then fenced by it
  (``CommitGroupOffsets`` with ``fenced``).
* :class:`AssignPartitions` when the leader's assignment arrives: each member's subscription
  is the partitions it was given, and each of them is the member's whole key-hash space.
  Kafka's assignors give a partition to one member, and the clients revoke before another
  takes it, so nothing is left draining. The generation does not move.

Heartbeats are ``GroupAction(action="heartbeat")``; a member that leaves or lapses leaves with
the next round.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit
from icelog.storage.core.system import ensure_system_table
from icelog.storage.errors import StaleGeneration
from icelog.storage.groups import membership
from icelog.storage.groups.offsets import (
    GROUPS_TABLE,
    GroupOffsetsState,
    _group_copy,
    _now_ms,
    _with_group,
    validate_group_id,
)
from icelog.storage.log.keys import HASH_SPACE


@dataclass
class NewGeneration(Request):
    """The group's members become exactly ``members`` (id -> session timeout, ms), at the next generation."""

    group: str
    members: Mapping[str, int]
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        now = _now_ms()
        record = _group_copy(state, self.group)
        record["members"] = {
            m: {"heartbeat_ms": now, "session_ms": session_ms, "generation": 0, "subscription": {}}
            for m, session_ms in sorted(self.members.items())
        }
        record["assignment"], record["draining"] = {}, []
        membership.rebalance(record)  # the generation goes up; nobody is subscribed yet
        for m in record["members"]:
            membership.acknowledge(record, m)
        return Decision(state=_with_group(state, self.group, record), result=copy.deepcopy(record))

    def receipt(self, result: Any) -> Any:
        return result


@dataclass
class AssignPartitions(Request):
    """Record the leader's assignment of ``generation``: member -> {table: [partitions]}."""

    group: str
    generation: int
    assignment: Mapping[str, Mapping[str, list[int]]]
    state_type = GroupOffsetsState
    writes_system = True

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        record = _group_copy(state, self.group)
        if record["generation"] != self.generation:
            raise StaleGeneration(
                group=self.group, member="", generation=self.generation, current_generation=record["generation"]
            )
        assigned: dict[str, dict[str, dict[str, list[list[int]]]]] = {}
        for m, given in sorted(self.assignment.items()):
            if m not in record["members"]:
                continue  # left since the round: nothing of its is recorded
            record["members"][m]["subscription"] = {t: sorted(set(ps)) for t, ps in given.items()}
            for t, ps in given.items():
                for p in ps:
                    assigned.setdefault(t, {}).setdefault(str(p), {})[m] = [[0, HASH_SPACE - 1]]
        record["assignment"], record["draining"] = assigned, []
        return Decision(state=_with_group(state, self.group, record), result=copy.deepcopy(record))

    def receipt(self, result: Any) -> Any:
        return result


def new_generation(catalog: Catalog, group: str, members: Mapping[str, int]) -> dict[str, Any]:
    """Run :class:`NewGeneration`; the group's membership record after it (``generation`` is the new one)."""
    validate_group_id(group)
    ensure_system_table(catalog, GROUPS_TABLE)
    return commit(catalog, GROUPS_TABLE, NewGeneration(group, dict(members))).result


def assign_partitions(
    catalog: Catalog, group: str, generation: int, assignment: Mapping[str, Mapping[str, list[int]]]
) -> dict[str, Any]:
    """Run :class:`AssignPartitions`.

    Raises:
        StaleGeneration: the group moved past ``generation`` meanwhile (nothing recorded).
    """
    validate_group_id(group)
    ensure_system_table(catalog, GROUPS_TABLE)
    return commit(catalog, GROUPS_TABLE, AssignPartitions(group, generation, assignment)).result

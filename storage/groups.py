"""Consumer-group offsets, kept durably in the catalog (Kafka's ``__consumer_offsets``).

The system table ``icelog_system.group_offsets`` holds, in its properties, every group's
committed position per source (table, partition)::

    {"<group>": {"<table>": {"<partition>": <next offset to read>}}}

The convention is Kafka's: a committed offset is the *next* offset to read. A commit runs
through the commit core, so it can join a transaction's atomic multi-table commit
(exactly-once consume–transform–produce). The consumer-groups work extends this state
(individually committed ranges, members, generations) under the same key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from storage.commit import Decision, Request, commit
from storage.errors import InvalidInput, InvalidOffset
from storage.system import ensure_system_table

GROUPS_TABLE = "icelog_system.group_offsets"
OFFSETS = "icelog.group-offsets"


@dataclass(frozen=True)
class GroupOffsetsState:
    offsets: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    snapshot_id: int | None = None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> GroupOffsetsState:
        return cls(json.loads(metadata.properties.get(OFFSETS, "{}")), metadata.current_snapshot_id)

    def to_properties(self) -> dict[str, str]:
        return {OFFSETS: json.dumps(self.offsets, sort_keys=True, separators=(",", ":"))}

    def committed(self, group: str, table: str) -> dict[int, int]:
        return {int(p): o for p, o in self.offsets.get(group, {}).get(table, {}).items()}


def validate_offsets(group: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Check a group's offsets to commit: ``{(table, partition): next_offset}`` (I8)."""
    if not isinstance(group, str) or not group.strip() or len(group) > 256:
        raise InvalidInput(reason="a group id is a non-empty string of at most 256 characters")
    if not offsets:
        raise InvalidInput(reason="no offsets to commit")
    for key, offset in offsets.items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int)):
            raise InvalidInput(reason=f"offsets are keyed by (table, partition), not {key!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < 2**63:
            raise InvalidOffset(partition=key[1], offset=offset, reason="a committed offset is an integer >= 0")


@dataclass
class CommitGroupOffsets(Request):
    """Set a group's positions. Offsets never pass the source's log end (I10)."""

    group: str
    offsets: Mapping[tuple[str, int], int]
    log_ends: Mapping[tuple[str, int], int]
    commit_id: str = ""
    state_type = GroupOffsetsState

    def decide(self, state: GroupOffsetsState, table: Table) -> Decision:
        groups = {g: {t: dict(ps) for t, ps in ts.items()} for g, ts in state.offsets.items()}
        mine = groups.setdefault(self.group, {})
        for (source, p), offset in sorted(self.offsets.items()):
            end = self.log_ends[(source, p)]
            if offset > end:
                raise InvalidOffset(partition=p, offset=offset, reason=f"beyond the log end {end} of {source}")
            mine.setdefault(source, {})[str(p)] = offset
        return Decision(state=replace(state, offsets=groups), result={"group": self.group, "committed": len(self.offsets)})


def log_ends(catalog: Catalog, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Each source partition's log end now (it only grows, so an offset under it stays valid)."""
    from storage.log import LogTable

    ends: dict[tuple[str, int], int] = {}
    for source in {t for t, _ in offsets}:
        marks = LogTable.open(catalog, source).watermarks()
        for t, p in offsets:
            if t == source:
                if p not in marks:
                    raise InvalidOffset(partition=p, offset=offsets[(t, p)], reason=f"{source} has no partition {p}")
                ends[(t, p)] = marks[p].end
    return ends


def commit_request(catalog: Catalog, group: str, offsets: Mapping[tuple[str, int], int]) -> CommitGroupOffsets:
    """A validated group-offset commit, ready to run alone or inside a transaction."""
    from storage.schema import qualified

    offsets = {(qualified(t), p): o for (t, p), o in offsets.items()} if offsets else {}
    validate_offsets(group, offsets)
    ensure_system_table(catalog, GROUPS_TABLE)
    return CommitGroupOffsets(group, offsets, log_ends(catalog, offsets))


def commit_offsets(catalog: Catalog, group: str, offsets: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """Commit a group's positions on its own (outside any transaction)."""
    return commit(catalog, GROUPS_TABLE, commit_request(catalog, group, offsets)).result


def committed_offsets(catalog: Catalog, group: str, table: str) -> dict[int, int]:
    """A group's committed next-offset-to-read per partition of ``table`` (empty: none)."""
    from storage.schema import qualified

    try:
        metadata = catalog.load_table(GROUPS_TABLE).metadata
    except NoSuchTableError:
        return {}
    return GroupOffsetsState.from_metadata(metadata).committed(group, qualified(table))

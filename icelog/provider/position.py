"""Where a log sensor or trigger stands: per-partition end offsets, and what counts as new.

Pure functions over a log table's watermarks, shared by the sensor's ``poke`` and the trigger.
Offsets cross Airflow's JSON (trigger kwargs, XCom, the asset state store) with partitions as
string keys; here they are ints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icelog.storage.errors import InvalidOffset, UnknownPartition


def as_offsets(value: Mapping[Any, Any] | None) -> dict[int, int] | None:
    """``{partition: offset}`` with int keys and values (JSON gives string keys)."""
    if value is None:
        return None
    return {int(p): int(o) for p, o in value.items()}


def as_json(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in sorted(offsets.items())}


def read_marks(log_table: Any) -> tuple[int | None, dict[int, tuple[int, int]]]:
    """``(snapshot id, {partition: (log start, log end)})`` of the table now (one metadata read).

    Raises:
        UnknownTable: the table does not exist (dropped).
    """
    state = log_table.state()
    return state.snapshot_id, {p: (w.start, w.end) for p, w in state.watermarks.items()}


def _known(table: str, marks: Mapping[int, tuple[int, int]], offsets: Mapping[int, int]) -> None:
    for p in offsets:
        if p not in marks:
            raise UnknownPartition(table=table, partition=p, partitions=len(marks))


def start_position(table: str, marks: Mapping[int, tuple[int, int]], after: Mapping[int, int] | None) -> dict[int, int]:
    """Where to look for new ranges from: ``after`` (a partition it leaves out: its log end
    now), else every partition's log end now.

    Raises:
        InvalidOffset: an offset below the partition's log start (retention removed what comes
            after it: a range would be skipped) or past its log end.
        UnknownPartition: ``after`` names a partition the table does not have.
    """
    after = after or {}
    _known(table, marks, after)
    for p, offset in after.items():
        start, end = marks[p]
        if offset < start:
            raise InvalidOffset(
                partition=p, offset=offset, reason=f"below the log start {start} of {table} (retention removed those offsets)"
            )
        if offset > end:
            raise InvalidOffset(partition=p, offset=offset, reason=f"past the log end {end} of {table}")
    return {p: after.get(p, end) for p, (_, end) in marks.items()}


def check_until(table: str, marks: Mapping[int, tuple[int, int]], until: Mapping[int, int]) -> None:
    """Refuse a target naming an unknown partition or a negative offset."""
    _known(table, marks, until)
    for p, offset in until.items():
        if offset < 0:
            raise InvalidOffset(partition=p, offset=offset, reason="offsets start at 0")


def reached(marks: Mapping[int, tuple[int, int]], until: Mapping[int, int]) -> bool:
    """Every partition in ``until`` has a log end at or past its offset."""
    return all(marks[p][1] >= offset for p, offset in until.items())


def new_ranges(marks: Mapping[int, tuple[int, int]], position: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """The committed offsets past ``position``: ``{partition: (first, end)}``, partitions with none left out.
    Partitions added since ``position`` start at 0."""
    return {p: (position.get(p, 0), end) for p, (_, end) in sorted(marks.items()) if end > position.get(p, 0)}


def event_payload(
    table: str, snapshot_id: int | None, marks: Mapping[int, tuple[int, int]], ranges: Mapping[int, tuple[int, int]]
) -> dict[str, Any]:
    """What a sensor returns and a trigger fires: the table, its snapshot, the new ranges and the ends."""
    return {
        "table": table,
        "snapshot_id": snapshot_id,
        "ranges": {str(p): [first, end] for p, (first, end) in sorted(ranges.items())},
        "ends": as_json({p: end for p, (_, end) in marks.items()}),
        "rows": sum(end - first for first, end in ranges.values()),
    }

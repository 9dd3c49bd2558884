"""I10 check: every consumer group's stored position on a table tells the truth.

Per (group, partition) of this table, from the stored state (not a normalized view):

* the committed offset (next to read) is never beyond the log end;
* IC ranges are well formed, sorted, disjoint and not adjacent (merged), strictly above
  the stable offset (last done = committed - 1), and below the log end;
* no partition holds more ranges than ``icelog.groups.max-ranges``.

Group state is current state (one copy, in ``icelog_system.group_offsets``), so it is checked
against the table's current watermarks whatever snapshot is asked for.
"""

from __future__ import annotations

import time

from pyiceberg.table import Table

from icelog.storage.groups.offsets import group_state
from icelog.storage.log.state import LogState
from icelog.validations.violations import CheckReport, Violation

CHECK = "groups"


def _partition_violations(
    name: str, group: str, p: int, committed: int | None, ranges: list, end: int, limit: int
) -> list[Violation]:
    found: list[Violation] = []

    def bad(kind: str, detail: str, first: int | None = None, last: int | None = None) -> None:
        found.append(Violation(CHECK, name, kind, f"group {group!r}: {detail}", p, first, last, {"group": group}))

    if committed is not None and committed > end:
        bad("group_offset_beyond_log_end", f"committed offset {committed} is beyond the log end {end}")
    stable = -1 if committed is None else committed - 1
    previous: list[int] | None = None
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and r[0] <= r[1]):
            bad("malformed_range", f"range {r!r} is not [first, last] with first <= last")
            continue
        first, last = r
        if first <= stable:
            bad("range_not_above_stable", f"range {first}-{last} is not above the stable offset {stable}", first, last)
        if last >= end:
            bad("range_beyond_log_end", f"range {first}-{last} reaches past the log end {end}", first, last)
        if previous is not None and first <= previous[1] + 1:
            bad("ranges_overlap", f"range {first}-{last} overlaps or touches {previous[0]}-{previous[1]} (unmerged)", first, last)
        previous = r
    if len(ranges) > limit:
        bad("too_many_ranges", f"{len(ranges)} ranges, above the limit {limit}")
    return found


def check_groups(table: Table, snapshot_id: int | None = None) -> CheckReport:
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    marks = LogState.from_metadata(table.metadata).watermarks
    state = group_state(table.catalog)
    violations: list[Violation] = []
    for group in sorted(set(state.offsets) | set(state.ranges)):
        offsets = state.offsets.get(group, {}).get(name, {})
        ranges = state.ranges.get(group, {}).get(name, {})
        for key in sorted(set(offsets) | set(ranges), key=int):
            p = int(key)
            if p not in marks:
                violations.append(
                    Violation(
                        CHECK,
                        name,
                        "unknown_partition",
                        f"group {group!r} has a position on partition {p}, which {name} lacks",
                        p,
                    )
                )
                continue
            violations += _partition_violations(
                name, group, p, offsets.get(key), ranges.get(key, []), marks[p].end, state.max_ranges
            )
    return CheckReport(name, snapshot_id, [CHECK], violations, 0, time.perf_counter() - started)

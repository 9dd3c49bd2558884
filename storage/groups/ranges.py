"""Individually committed (IC) offset ranges of one group partition: pure functions.

The state of one (group, table, partition) is a *stable offset* plus sorted, disjoint IC
ranges above it, range-encoded like Kafka's share-group state (KIP-932):

* ``stable`` is the cooperative-consumption convention: the last offset done, inclusive (``-1`` or
  ``log_start - 1``: nothing done yet). Kafka's committed offset, the next offset to read,
  is ``stable + 1`` (:attr:`RangeState.committed`).
* ``ranges`` are ``(first, last)`` inclusive, each starting at ``stable + 2`` or later,
  sorted, and never adjacent to each other (adjacent ranges are merged).

An offset is *done* when it is ``<= stable`` or inside a range. Committing a range that
closes the gap above ``stable`` advances it and drops the ranges it swallowed. Nothing here
touches a catalog; ``storage.groups.offsets`` stores these states durably.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

OffsetRange = tuple[int, int]  # (first, last) offsets, inclusive


class RangeError(ValueError):
    """A refused range (``storage.groups.offsets`` turns it into :class:`storage.errors.InvalidRange`)."""


@dataclass(frozen=True)
class RangeState:
    stable: int = -1
    ranges: tuple[OffsetRange, ...] = ()

    @property
    def committed(self) -> int:
        """Kafka's committed offset: the next offset to read."""
        return self.stable + 1

    def is_done(self, offset: int) -> bool:
        return offset <= self.stable or any(first <= offset <= last for first, last in self.ranges)

    def to_json(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]


def normalize(stable: int, ranges: Iterable[OffsetRange]) -> RangeState:
    """Merge adjacent or overlapping ranges, advance ``stable`` over the ones it reaches."""
    merged: list[list[int]] = []
    for first, last in sorted(ranges):
        if last <= stable:
            continue
        first = max(first, stable + 1)
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    if merged and merged[0][0] == stable + 1:
        stable = merged.pop(0)[1]
    return RangeState(stable, tuple((first, last) for first, last in merged))


def check_range(first: object, last: object) -> None:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last)):
        raise RangeError("first and last are integers")
    assert isinstance(first, int) and isinstance(last, int)
    if first < 0 or last < first:
        raise RangeError("a range is FIRST-LAST with 0 <= FIRST <= LAST")


def commit_range(state: RangeState, first: int, last: int) -> RangeState:
    """Mark ``[first, last]`` done, in O(log ranges) comparisons plus one tuple copy.

    Raises:
        RangeError: malformed, or overlapping offsets already done (nothing is applied twice).
    """
    check_range(first, last)
    if first <= state.stable:
        raise RangeError(f"overlaps the stable offset {state.stable} (already done)")
    ranges = state.ranges
    i = bisect.bisect_left(ranges, (first, first))  # ranges[i:] start at or after first
    for j in (i - 1, i):
        if 0 <= j < len(ranges) and first <= ranges[j][1] and ranges[j][0] <= last:
            raise RangeError(f"overlaps the committed range {ranges[j][0]}-{ranges[j][1]}")
    lo, hi, start, stop = first, last, i, i
    if i > 0 and ranges[i - 1][1] + 1 == first:
        lo, start = ranges[i - 1][0], i - 1
    if i < len(ranges) and ranges[i][0] == last + 1:
        hi, stop = ranges[i][1], i + 1
    if lo == state.stable + 1:  # the gap above the stable offset closed
        return RangeState(hi, ranges[stop:])
    return RangeState(state.stable, (*ranges[:start], (lo, hi), *ranges[stop:]))


def pending(state: RangeState, first: int, last: int) -> list[OffsetRange]:
    """The sub-ranges of ``[first, last]`` not done yet, in order.

    This is both *fetch* (skip what is committed) and *gap amending*: with stable 40 and IC
    [43-45], [48-49], a processed fetch of [40-50] commits [41-42], [46-47], [50-50].
    """
    out: list[OffsetRange] = []
    cursor = max(first, state.stable + 1)
    for lo, hi in state.ranges:
        if hi < cursor:
            continue
        if lo > last:
            break
        if lo > cursor:
            out.append((cursor, min(lo - 1, last)))
        cursor = hi + 1
    if cursor <= last:
        out.append((cursor, last))
    return out


amend = pending


def to_ranges(offsets: Iterable[int]) -> list[OffsetRange]:
    """Sorted distinct offsets as maximal runs: ``[1, 2, 3, 7] -> [(1, 3), (7, 7)]``."""
    out: list[list[int]] = []
    for o in sorted(set(offsets)):
        if out and o == out[-1][1] + 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return [(first, last) for first, last in out]


def commit_ranges(state: RangeState, ranges: Iterable[OffsetRange]) -> RangeState:
    """Commit several ranges at once (all or nothing)."""
    for first, last in ranges:
        state = commit_range(state, first, last)
    return state


def resume_at(state: RangeState, log_start: int) -> RangeState:
    """After retention moved the log start past ``stable``, the group resumes from the log start."""
    if state.stable >= log_start - 1:
        return state
    return normalize(log_start - 1, state.ranges)

"""Consumer-group membership and assignment: pure functions on one group's state.

A group's membership (kept by ``storage.groups.offsets`` in the catalog) is::

    {"generation": 3,
     "members": {"<member>": {"heartbeat_ms": ..., "session_ms": ..., "generation": 3,
                              "subscription": {"<table>": [partitions]}}},
     "assignment": {"<table>": {"<p>": {"<member>": [[lo, hi], ...]}}},
     "draining": [{"table", "partition", "lo", "hi", "from"}]}

* Every join, leave or expiry bumps the generation and reassigns.
* The assignor splits each partition's hash space ``0..65535`` (Pulsar Key_Shared's) among
  the members subscribed to it, stickily: a member keeps what it had up to its fair share,
  and only the excess moves.
* Unkeyed reads deal *offset chunks* through the same space: chunk ``c`` (offsets
  ``c*size .. c*size+size-1``) lands on slot ``bit_reverse16(c mod 65536)``, so chunks
  0, 1, 2, 3 fall in halves, quarters, ...: round-robin over members, and just as sticky.
* A hash range that moves from a live member is *draining* (Pulsar's PIP-379): nobody
  fetches it until its previous owner has acted at the new generation (so it fetched its
  new assignment, and whatever it fetched before can no longer commit: its commits of the
  old generation are fenced) or its session expired.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from icelog.storage.log.names import HASH_SPACE

HashRange = tuple[int, int]  # (lo, hi) key hashes within 0..HASH_SPACE - 1, inclusive


def empty_group() -> dict[str, Any]:
    return {"generation": 0, "members": {}, "assignment": {}, "draining": []}


def live_members(group: Mapping[str, Any], now_ms: int) -> list[str]:
    return sorted(m for m, s in group["members"].items() if now_ms - s["heartbeat_ms"] <= s["session_ms"])


def expire(group: dict[str, Any], now_ms: int) -> list[str]:
    """Remove members whose heartbeat lapsed past their session timeout; rebalance if any."""
    gone = sorted(set(group["members"]) - set(live_members(group, now_ms)))
    for m in gone:
        del group["members"][m]
    if gone:
        rebalance(group)
    return gone


def join(group: dict[str, Any], member: str, subscription: Mapping[str, list[int]], session_ms: int, now_ms: int) -> None:
    known = group["members"].get(member)
    changed = known is None or known["subscription"] != {t: sorted(ps) for t, ps in subscription.items()}
    group["members"][member] = {
        "heartbeat_ms": now_ms,
        "session_ms": session_ms,
        "generation": group["generation"],
        "subscription": {t: sorted(ps) for t, ps in subscription.items()},
    }
    if changed:
        rebalance(group)
    group["members"][member]["generation"] = group["generation"]
    acknowledge(group, member)


def leave(group: dict[str, Any], member: str) -> bool:
    if member not in group["members"]:
        return False
    del group["members"][member]
    rebalance(group)
    return True


def acknowledge(group: dict[str, Any], member: str) -> None:
    """The member acted at the current generation: ranges draining from it are free."""
    group["members"][member]["generation"] = group["generation"]
    group["draining"] = [d for d in group["draining"] if d["from"] != member]


def rebalance(group: dict[str, Any]) -> None:
    """Bump the generation, assign stickily, and mark ranges that left a live member draining."""
    old = copy.deepcopy(group["assignment"])
    group["generation"] += 1
    members = group["members"]
    subscribed: dict[tuple[str, int], list[str]] = {}
    for m in sorted(members):
        for table, parts in members[m]["subscription"].items():
            for p in parts:
                subscribed.setdefault((table, p), []).append(m)
    assignment: dict[str, dict[str, dict[str, list[list[int]]]]] = {}
    draining = [d for d in group["draining"] if d["from"] in members]
    for (table, p), owners in sorted(subscribed.items()):
        before = {m: [tuple(r) for r in rs] for m, rs in old.get(table, {}).get(str(p), {}).items()}
        after = assign_sticky(before, owners)
        assignment.setdefault(table, {})[str(p)] = {m: [list(r) for r in rs] for m, rs in after.items() if rs}
        for previous, ranges in before.items():
            if previous not in members:
                continue
            for lo, hi in subtract(ranges, after.get(previous, [])):
                draining.append({"table": table, "partition": p, "lo": lo, "hi": hi, "from": previous})
    group["assignment"] = assignment
    group["draining"] = draining


def assign_sticky(before: Mapping[str, list[HashRange]], members: list[str]) -> dict[str, list[HashRange]]:
    """Split ``0..65535`` among ``members``: each keeps what it had up to its share."""
    if not members:
        return {}
    owner: list[str | None] = [None] * HASH_SPACE
    for m, ranges in before.items():
        if m in members:
            for lo, hi in ranges:
                owner[lo : hi + 1] = [m] * (hi - lo + 1)
    base, extra = divmod(HASH_SPACE, len(members))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(sorted(members))}
    count = dict.fromkeys(members, 0)
    for h, m in enumerate(owner):
        if m is None:
            continue
        if count[m] < quota[m]:
            count[m] += 1
        else:
            owner[h] = None
    hungry = [m for m in sorted(members) if count[m] < quota[m]]
    for h in range(HASH_SPACE):
        if owner[h] is None:
            while count[hungry[0]] >= quota[hungry[0]]:
                hungry.pop(0)
            owner[h] = hungry[0]
            count[hungry[0]] += 1
    out: dict[str, list[HashRange]] = {m: [] for m in members}
    start = 0
    for h in range(1, HASH_SPACE + 1):
        if h == HASH_SPACE or owner[h] != owner[start]:
            out[owner[start]].append((start, h - 1))  # type: ignore[index]
            start = h
    return out


def subtract(ranges: list[HashRange], minus: list[HashRange]) -> list[HashRange]:
    """Hash ranges in ``ranges`` and not in ``minus``."""
    taken = set()
    for lo, hi in minus:
        taken.update(range(lo, hi + 1))
    out: list[list[int]] = []
    for lo, hi in ranges:
        for h in range(lo, hi + 1):
            if h in taken:
                continue
            if out and out[-1][1] == h - 1:
                out[-1][1] = h
            else:
                out.append([h, h])
    return [(a, b) for a, b in out]


def fetchable_hashes(group: Mapping[str, Any], member: str, table: str, partition: int) -> list[HashRange]:
    """The member's hash ranges of one partition, minus those still draining to it."""
    mine = [tuple(r) for r in group["assignment"].get(table, {}).get(str(partition), {}).get(member, [])]
    blocked = [(d["lo"], d["hi"]) for d in group["draining"] if d["table"] == table and d["partition"] == partition]
    return subtract(mine, blocked) if blocked else mine  # type: ignore[arg-type]


def chunk_slot(chunk: int) -> int:
    """Where offset chunk ``chunk`` lands in the hash space (16-bit bit reversal: round-robin)."""
    c = chunk % HASH_SPACE
    return int(f"{c:016b}"[::-1], 2)

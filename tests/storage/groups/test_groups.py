"""Consumer groups in the catalog (I10): range commits, fencing, membership, retention."""

from __future__ import annotations

import pytest

from icelog.storage.core.commit import commit, commit_tables
from icelog.storage.errors import InvalidInput, InvalidRange, RangeLimitExceeded, StaleGeneration
from icelog.storage.groups import membership
from icelog.storage.groups.offsets import (
    GROUPS_TABLE,
    GroupAction,
    commit_ranges,
    committed_offsets,
    describe_group,
    group_action,
    group_state,
    list_groups,
    ranges_request,
    reset_group,
)
from icelog.storage.log.maintenance import Retention
from icelog.storage.log.table import AppendRequest, LogTable
from tests.support.groups import keyed_log

_log = keyed_log


def _partition(catalog, group, table="db.events", p=0):
    entry = next(e for e in describe_group(catalog, group)["partitions"] if e["table"] == table and e["partition"] == p)
    return entry["stable_offset"], entry["ranges"]


def test_i10_seed_examples_through_the_catalog(catalog):
    _log(catalog)
    commit_ranges(catalog, "g", {("db.events", 0): [(0, 42)]})
    commit_ranges(catalog, "g", {("db.events", 0): [(45, 47), (50, 50)]})
    commit_ranges(catalog, "g", {("db.events", 0): [(48, 49)]})
    assert _partition(catalog, "g") == (42, [[45, 50]])
    commit_ranges(catalog, "g", {("db.events", 0): [(43, 44)]})
    assert _partition(catalog, "g") == (50, [])
    # Kafka's convention in the stable-offset store: next offset to read
    assert committed_offsets(catalog, "g", "db.events") == {0: 51}


@pytest.mark.parametrize(
    "ranges,error",
    [
        ([(55, 70)], InvalidRange),  # beyond the log end (60)
        ([(10, 12)], InvalidRange),  # overlaps the stable offset
        ([(21, 22)], InvalidRange),  # overlaps a committed range
        ([(30, 29)], InvalidRange),  # malformed
        ([(-1, 3)], InvalidRange),
        ([("a", 3)], InvalidRange),
        ([], InvalidInput),
    ],
)
def test_i8_i10_bad_ranges_refused_nothing_changes(sqlite_catalog, ranges, error):
    _log(sqlite_catalog)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 14), (20, 24)]})
    before = sqlite_catalog.load_table(GROUPS_TABLE).metadata_location
    with pytest.raises(error):
        commit_ranges(sqlite_catalog, "g", {("db.events", 0): ranges})
    assert sqlite_catalog.load_table(GROUPS_TABLE).metadata_location == before
    assert _partition(sqlite_catalog, "g") == (14, [[20, 24]])


def test_i8_range_below_the_log_start_refused_and_group_resumes_there(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.events", 1)
    for _i in range(3):
        t.append({0: [{"key": "k", "value": str(j)} for j in range(10)]})
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 4), (7, 8)]})
    commit(sqlite_catalog, "db.events", Retention("db.events", retention_ms=0, now_ms=2**62))
    start = t.watermarks()[0].start
    assert start == 30  # whole files dropped: every offset
    with pytest.raises(InvalidRange, match="below the log start"):
        commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(12, 12)]})
    entry = describe_group(sqlite_catalog, "g")["partitions"][0]
    assert entry["stable_offset"] == start - 1 and entry["committed_offset"] == start and entry["ranges"] == []
    assert "resumes from the log start" in entry["note"]


def test_i10_range_limit_refuses_and_keeps_state(sqlite_catalog):
    _log(sqlite_catalog)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(2, 2)]})
    with sqlite_catalog.load_table(GROUPS_TABLE).transaction() as txn:  # configure the bound
        txn.set_properties({"icelog.groups.max-ranges": "3"})
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(4, 4), (6, 6)]})
    with pytest.raises(RangeLimitExceeded):
        commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(8, 8)]})
    assert _partition(sqlite_catalog, "g") == (-1, [[2, 2], [4, 4], [6, 6]])
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 1)]})  # closing a gap always works
    assert _partition(sqlite_catalog, "g") == (2, [[4, 4], [6, 6]])


def test_i10_stale_generation_commit_fenced(catalog):
    _log(catalog)
    a = group_action(catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 60_000))
    commit_ranges(catalog, "g", {("db.events", 0): [(0, 3)]}, member="a", generation=a["generation"])
    b = group_action(catalog, GroupAction("g", "b", "join", {"db.events": [0]}, 60_000))
    assert b["generation"] == a["generation"] + 1
    before = group_state(catalog)
    with pytest.raises(StaleGeneration):
        commit_ranges(catalog, "g", {("db.events", 0): [(4, 5)]}, member="a", generation=a["generation"])
    with pytest.raises(StaleGeneration):  # a manual commit while members are live
        commit_ranges(catalog, "g", {("db.events", 0): [(4, 5)]})
    assert group_state(catalog).ranges == before.ranges and group_state(catalog).offsets == before.offsets
    commit_ranges(catalog, "g", {("db.events", 0): [(4, 5)]}, member="a", generation=b["generation"])
    assert _partition(catalog, "g") == (5, [])


def test_i10_fenced_commit_rolls_back_the_output_of_its_transaction(sqlite_catalog):
    _log(sqlite_catalog)
    out = LogTable.create(sqlite_catalog, "db.out", 1)
    g1 = group_action(sqlite_catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 60_000))
    group_action(sqlite_catalog, GroupAction("g", "b", "join", {"db.events": [0]}, 60_000))
    request = ranges_request(sqlite_catalog, "g", {("db.events", 0): [(0, 1)]}, member="a", generation=g1["generation"])
    append = AppendRequest("db.out", out.conform({0: [{"key": "x", "value": "y"}]}), {}, "c1", None)
    with pytest.raises(StaleGeneration):
        commit_tables(sqlite_catalog, [("db.out", append), (GROUPS_TABLE, request)])
    assert out.watermarks()[0].end == 0


def test_i10_session_expiry_removes_member_on_next_action(sqlite_catalog):
    _log(sqlite_catalog)
    group_action(sqlite_catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 1_000, now_ms=1_000))
    b = group_action(sqlite_catalog, GroupAction("g", "b", "join", {"db.events": [0]}, 1_000, now_ms=1_500))
    assert b["assignment"]["db.events"]["0"]["a"] and b["assignment"]["db.events"]["0"]["b"]
    after = group_action(sqlite_catalog, GroupAction("g", "b", "heartbeat", now_ms=2_200))  # a lapsed at 2_000
    assert set(after["members"]) == {"b"} and after["generation"] == b["generation"] + 1
    assert after["assignment"]["db.events"]["0"] == {"b": [[0, 65535]]}
    assert after["draining"] == []  # an expired owner drains nothing
    with pytest.raises(StaleGeneration):
        group_action(sqlite_catalog, GroupAction("g", "a", "heartbeat", now_ms=2_300))


def test_sticky_assignor_moves_only_the_excess():
    before = membership.assign_sticky({}, ["a", "b"])
    assert before == {"a": [(0, 32767)], "b": [(32768, 65535)]}
    after = membership.assign_sticky(before, ["a", "b", "c"])
    moved = sum(hi - lo + 1 for m in ("a", "b") for lo, hi in membership.subtract(before[m], after[m]))
    assert moved == 21845  # exactly the newcomer's share
    assert sum(hi - lo + 1 for rs in after.values() for lo, hi in rs) == 65536
    for m in ("a", "b"):
        kept = sum(hi - lo + 1 for lo, hi in membership.subtract(before[m], membership.subtract(before[m], after[m])))
        assert kept >= 21845


def test_draining_range_waits_for_the_previous_owner():
    group = membership.empty_group()
    membership.join(group, "a", {"t": [0]}, 10_000, 0)
    membership.join(group, "b", {"t": [0]}, 10_000, 0)
    draining = group["draining"]
    assert draining and all(d["from"] == "a" for d in draining)
    assert membership.fetchable_hashes(group, "b", "t", 0) == []  # b's whole range came from a
    membership.acknowledge(group, "a")
    assert membership.fetchable_hashes(group, "b", "t", 0) == [(32768, 65535)]


def test_chunk_slots_deal_round_robin():
    owners = membership.assign_sticky({}, ["a", "b"])

    def owner(chunk):
        slot = membership.chunk_slot(chunk)
        return next(m for m, rs in owners.items() if any(lo <= slot <= hi for lo, hi in rs))

    assert [owner(c) for c in range(6)] == ["a", "b", "a", "b", "a", "b"]


def test_transaction_offsets_still_work_and_drop_swallowed_ranges(sqlite_catalog):
    from icelog.storage.producers.transactional import TransactionalProducer

    _log(sqlite_catalog)
    LogTable.create(sqlite_catalog, "db.out", 1)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(5, 6), (20, 21)]})
    producer = TransactionalProducer(sqlite_catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.out", 0, [{"key": "a", "value": "b"}])
    producer.send_offsets_to_transaction({("db.events", 0): 10}, "g")
    producer.commit_transaction()
    assert _partition(sqlite_catalog, "g") == (9, [[20, 21]])
    assert "g" in list_groups(sqlite_catalog)


def test_reset_refused_while_members_live_then_moves(sqlite_catalog):
    _log(sqlite_catalog)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(5, 6)]})
    group_action(sqlite_catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 60_000))
    with pytest.raises(StaleGeneration):
        reset_group(sqlite_catalog, "g", "db.events", "latest")
    group_action(sqlite_catalog, GroupAction("g", "a", "leave"))
    reset_group(sqlite_catalog, "g", "db.events", "latest")
    assert _partition(sqlite_catalog, "g") == (59, [])
    reset_group(sqlite_catalog, "g", "db.events", "earliest")
    assert _partition(sqlite_catalog, "g") == (-1, [])


def test_i10_groups_check_passes_then_finds_planted_violations(sqlite_catalog):
    import json

    from icelog.validations.checks import run_checks

    t = _log(sqlite_catalog)
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 9), (20, 24), (30, 31)]})
    assert run_checks(t.table(), ["groups"]).ok
    # Plant states the commit path refuses, straight into the properties (as a foreign writer could).
    with sqlite_catalog.load_table(GROUPS_TABLE).transaction() as txn:
        txn.set_properties(
            {
                "icelog.group-offsets": json.dumps({"g": {"db.events": {"0": 70}}, "h": {"db.events": {"0": 10}}}),
                "icelog.group-ranges": json.dumps({"h": {"db.events": {"0": [[5, 6], [12, 14], [14, 15], [50, 65]]}}}),
            }
        )
    kinds = sorted(v.kind for v in run_checks(t.table(), ["groups"]).violations)
    assert kinds == ["group_offset_beyond_log_end", "range_beyond_log_end", "range_not_above_stable", "ranges_overlap"]

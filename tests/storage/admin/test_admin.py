"""The storage side of the admin commands (kafka-topics, kafka-configs), through the Python API: the time lookup
(``LogTable.offsets_for_time``), table knobs (``alter_properties``), group resets and a deleted
table's group offsets (``reset_group``, ``forget_table``), and ``LogTable.drop``."""

from __future__ import annotations

import pytest

from icelog.storage.errors import InvalidIdentifier, InvalidInput, InvalidProperty, UnknownProperty, UnknownTable
from icelog.storage.groups.offsets import commit_ranges, committed_offsets, forget_table, group_state, reset_group
from icelog.storage.log.maintenance import alter_properties
from icelog.storage.log.table import LogTable, OffsetAndTimestamp


@pytest.fixture
def events(sqlite_catalog) -> LogTable:
    t = LogTable.create(sqlite_catalog, "db.events", 2)
    t.append({0: [{"key": "a", "value": str(i)} for i in range(10)], 1: [{"key": "b", "value": "0"}]})
    return t


def test_offsets_for_time_of_an_empty_table_is_each_log_end(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.empty", 3)
    assert t.offsets_for_time(0) == {p: OffsetAndTimestamp(0, None) for p in range(3)}


def test_offsets_for_time_before_every_record_is_the_log_start(events):
    assert {p: e.offset for p, e in events.offsets_for_time(0).items()} == {0: 0, 1: 0}


def test_alteration_is_checked_before_the_table_is_read(sqlite_catalog):
    with pytest.raises(UnknownProperty):  # refused on its keys alone: no table needed to say so
        alter_properties(sqlite_catalog, "db.nope", {"icelog.version": "7"})
    with pytest.raises(UnknownTable):
        alter_properties(sqlite_catalog, "db.nope", {"icelog.retention.ms": "7"})


def test_alter_properties_canonical_values_and_bounds(events, sqlite_catalog, unchanged):
    assert alter_properties(sqlite_catalog, "db.events", {"icelog.groups.max-ranges": " 010 "})["set"] == {
        "icelog.groups.max-ranges": "10"
    }
    with unchanged(events), pytest.raises(InvalidProperty) as caught:
        alter_properties(sqlite_catalog, "db.events", {"icelog.snapshots.keep": "0"})
    assert (caught.value.key, caught.value.reason) == ("icelog.snapshots.keep", "must be 1 or more")


def test_reset_group_takes_exactly_one_target(events, sqlite_catalog):
    for targets in ({}, {"to": "earliest", "shift_by": 1}, {"to_time_us": 0, "shift_by": -1}):
        with pytest.raises(InvalidInput):
            reset_group(sqlite_catalog, "g", "db.events", **targets)
    assert not sqlite_catalog.table_exists("icelog_system.group_offsets")


def test_i10_reset_group_shift_by_and_dry_run(events, sqlite_catalog):
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 4)]})
    plan = reset_group(sqlite_catalog, "g", "db.events", shift_by=-2, dry_run=True)
    assert [(r["partition"], r["current"], r["new"]) for r in plan["partitions"]] == [(0, 5, 3), (1, 0, 0)]
    assert committed_offsets(sqlite_catalog, "g", "db.events") == {0: 5}
    reset_group(sqlite_catalog, "g", "db.events", shift_by=-2, partitions=[0])
    assert committed_offsets(sqlite_catalog, "g", "db.events") == {0: 3}


def test_i10_forget_table_keeps_other_tables_offsets(events, sqlite_catalog):
    other = LogTable.create(sqlite_catalog, "db.other", 1)
    other.append({0: [{"key": "x", "value": "y"}]})
    assert forget_table(sqlite_catalog, "db.events") == []  # nothing committed yet: nothing created
    assert not sqlite_catalog.table_exists("icelog_system.group_offsets")
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 1)], ("db.other", 0): [(0, 0)]})
    commit_ranges(sqlite_catalog, "h", {("db.events", 1): [(0, 0)]})
    assert forget_table(sqlite_catalog, "db.events") == ["g", "h"]
    state = group_state(sqlite_catalog)
    assert state.offsets == {"g": {"db.other": {"0": 1}}}
    assert "h" not in state.members  # left with nothing, the group is gone


def test_drop_refuses_a_system_table_and_keeps_files_unless_purged(events, sqlite_catalog):
    commit_ranges(sqlite_catalog, "g", {("db.events", 0): [(0, 1)]})
    with pytest.raises(InvalidIdentifier):
        LogTable(sqlite_catalog, "icelog_system.group_offsets").drop()
    assert sqlite_catalog.table_exists("icelog_system.group_offsets")
    location = events.drop()
    assert not sqlite_catalog.table_exists("db.events")
    sqlite_catalog.register_table("db.events", location)
    assert events.watermarks()[0].end == 10
    with pytest.raises(UnknownTable):
        LogTable(sqlite_catalog, "db.nope").drop()

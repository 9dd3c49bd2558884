"""Kafka's classic group protocol as recorded in icelog's group state: generations, assignments, fenced commits."""

from __future__ import annotations

import pytest

from icelog.storage.errors import StaleGeneration
from icelog.storage.groups.classic import assign_partitions, new_generation
from icelog.storage.groups.offsets import GROUPS_TABLE, commit_offsets, committed_offsets, describe_group
from tests.support.groups import keyed_log as _log


def _snapshot(catalog):
    return catalog.load_table(GROUPS_TABLE).metadata.current_snapshot_id


def test_a_round_records_its_members_at_the_next_generation_and_fences_older_commits(catalog):
    _log(catalog, partitions=2, rows=10)
    first = new_generation(catalog, "k", {"a": 6000})
    assign_partitions(catalog, "k", first["generation"], {"a": {"db.events": [0, 1]}})
    commit_offsets(catalog, "k", {("db.events", 0): 4}, member="a", generation=first["generation"], fenced=True)
    assert committed_offsets(catalog, "k", "db.events") == {0: 4}

    second = new_generation(catalog, "k", {"a": 6000, "b": 6000})
    assert second["generation"] == first["generation"] + 1
    assert sorted(second["members"]) == ["a", "b"]
    before = _snapshot(catalog)
    with pytest.raises(StaleGeneration):
        commit_offsets(catalog, "k", {("db.events", 0): 6}, member="a", generation=first["generation"], fenced=True)
    with pytest.raises(StaleGeneration):  # a commit outside the group while it has live members
        commit_offsets(catalog, "k", {("db.events", 0): 6}, fenced=True)
    with pytest.raises(StaleGeneration):  # an assignment of a generation gone by
        assign_partitions(catalog, "k", first["generation"], {"a": {"db.events": [0]}})
    assert _snapshot(catalog) == before
    assert committed_offsets(catalog, "k", "db.events") == {0: 4}

    assign_partitions(
        catalog, "k", second["generation"], {"a": {"db.events": [0]}, "b": {"db.events": [1]}, "gone": {"db.events": [1]}}
    )
    owners = {e["partition"]: e["owners"] for e in describe_group(catalog, "k")["partitions"]}
    assert owners == {0: {"a": [[0, 65535]]}, 1: {"b": [[0, 65535]]}}
    commit_offsets(catalog, "k", {("db.events", 1): 10}, member="b", generation=second["generation"], fenced=True)
    assert committed_offsets(catalog, "k", "db.events") == {0: 4, 1: 10}

    empty = new_generation(catalog, "k", {})
    assert (empty["generation"], empty["members"]) == (second["generation"] + 1, {})
    commit_offsets(catalog, "k", {("db.events", 0): 5}, fenced=True)  # no live member: allowed
    assert committed_offsets(catalog, "k", "db.events") == {0: 5, 1: 10}

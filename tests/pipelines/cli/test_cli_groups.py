"""``icelog consume`` and ``icelog groups`` (I10, I8): the range-commit examples of docs/consumer-groups.md through the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from icelog.pipelines.cli import cli
from icelog.storage.groups.consumer import key_hash
from icelog.storage.log.table import LogTable


@pytest.fixture
def run(sqlite_spec):
    runner = CliRunner()
    env = sqlite_spec.env()

    def invoke(*args: str, code: int = 0, text: bool = False) -> dict | str:
        argv = list(args) if text else ["--output", "json", *args]
        result = runner.invoke(cli, argv, env=env, catch_exceptions=False)
        assert result.exit_code == code, result.output
        out = result.stdout.strip()
        if text:
            return out
        return json.loads(out.splitlines()[-1]) if out else ""

    invoke.catalog = sqlite_spec.open()
    return invoke


@pytest.fixture
def events(sqlite_spec):
    t = LogTable.create(sqlite_spec.open(), "db.events", 2)
    t.append({0: [{"key": f"k{i % 5}", "value": str(i)} for i in range(60)], 1: [{"key": "x", "value": "y"}]})
    return t


def _partition(doc, p=0):
    return next(e for e in doc["partitions"] if e["partition"] == p)


def test_i10_seed_examples_via_groups_commit(run, events):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-42")
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "45-47", "--range", "50-50")
    out = run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "48-49")
    assert out["partitions"]["db.events/0"] == {"stable": 42, "committed": 43, "ranges": [[45, 50]]}
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "43-44")
    doc = run("groups", "describe", "g")
    entry = _partition(doc)
    assert (entry["stable_offset"], entry["committed_offset"], entry["ranges"]) == (50, 51, [])
    assert doc["generation"] == 0 and doc["members"] == []
    assert run("groups", "list") == {"groups": ["g"]}
    assert "stable (last done)" in run("groups", "describe", "g", text=True)


@pytest.mark.parametrize("bad", ["5-4", "70-75", "x-3", "3"])
def test_i8_bad_range_exit_2_nothing_changes(run, events, bad):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9")
    before = run("groups", "describe", "g")
    error = run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", bad, code=2)
    assert error["error"] in ("InvalidRange", "InvalidInput")
    assert run("groups", "describe", "g") == before
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "5-12", code=2)  # overlap


def test_consume_prints_json_lines_commits_and_stops_at_the_log_end(run, events):
    out = run("consume", "db.events", "--group", "g", "--partition", "0", "--max-records", "7", "--format", "jsonl", text=True)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in rows] == list(range(7)) and set(rows[0]) == {"partition", "offset", "timestamp", "key", "value"}
    assert _partition(run("groups", "describe", "g"))["stable_offset"] == 6
    rest = run("consume", "db.events", "--group", "g", text=True).splitlines()
    assert len(rest) == 53 + 1  # partition 0 to its end, and partition 1
    assert run("consume", "db.events", "--group", "g", text=True) == ""


def test_consume_key_range_reads_only_its_hashes(run, events):
    lo, hi = 0, 32767
    out = run(
        "consume", "db.events", "--group", "h", "--partition", "0", "--key-range", f"{lo}:{hi}", "--format", "jsonl", text=True
    )
    rows = [json.loads(line) for line in out.splitlines()]
    expected = [i for i in range(60) if lo <= key_hash(f"k{i % 5}") <= hi]
    assert [r["offset"] for r in rows] == expected
    entry = _partition(run("groups", "describe", "h"))
    done = set(expected)
    assert entry["lag"] == 60 - len(done)
    run("consume", "db.events", "--group", "h", "--key-range", "9:3", code=2)


def test_i10_consume_key_range_hashes_the_tables_key_column(run, sqlite_spec):
    payload = [{"name": "tailnum", "type": "string"}, {"name": "dep_delay", "type": "double"}]
    t = LogTable.create(sqlite_spec.open(), "demo.flights", 1, payload=payload, properties={"icelog.key-column": "tailnum"})
    t.append({0: [{"tailnum": f"N{i % 7}", "dep_delay": float(i)} for i in range(40)]})
    halves = ["0:32767", "32768:65535"]
    seen = []
    for half in halves:
        rows = run("consume", "demo.flights", "--group", "g", "--key-range", half)["records"]
        lo, hi = (int(x) for x in half.split(":"))
        assert all(lo <= key_hash(r["key"]) <= hi for r in rows)
        seen += [r["offset"] for r in rows]
    assert sorted(seen) == list(range(40))
    assert _partition(run("groups", "describe", "g"))["committed_offset"] == 40


def test_reset_to_earliest_and_latest(run, events):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "3-4")
    run("groups", "reset", "db.events", "--group", "g", "--to", "latest", "--partition", "0")
    assert _partition(run("groups", "describe", "g"))["committed_offset"] == 60
    run("groups", "reset", "db.events", "--group", "g", "--to", "99", code=2)
    run("groups", "reset", "db.events", "--group", "g", "--to", "earliest")
    assert _partition(run("groups", "describe", "g"))["stable_offset"] == -1


def test_i8_consume_of_a_partition_the_table_lacks_exits_2(run, events):
    before = run("groups", "describe", "g")
    err = run("consume", "db.events", "--group", "g", "--partition", "5", code=2)
    assert (err["error"], err["partition"], err["partitions"]) == ("UnknownPartition", 5, 2)
    assert run("groups", "describe", "g") == before


@pytest.mark.parametrize("group", ["", "   ", "x" * 257])
def test_i10_consume_with_a_bad_group_id_prints_nothing_and_exits_2(run, events, sqlite_spec, group):
    result = CliRunner().invoke(cli, ["--output", "json", "consume", "db.events", "--group", group], env=sqlite_spec.env())
    assert result.exit_code == 2, result.output
    assert [json.loads(line)["error"] for line in result.stdout.strip().splitlines()] == ["InvalidInput"]  # no record printed


# --- groups reset: --dry-run, --to-datetime, --shift-by (as kafka-consumer-groups) ---


def _groups_table_location(catalog) -> str | None:
    """The group-offsets system table's metadata pointer: every commit to it moves it."""
    try:
        return catalog.load_table("icelog_system.group_offsets").metadata_location
    except Exception:  # noqa: BLE001 - no such table yet
        return None


def test_i10_reset_dry_run_prints_the_plan_and_changes_nothing(run, events):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9", "--range", "20-24")
    before, pointer = run("groups", "describe", "--group", "g"), _groups_table_location(run.catalog)
    plan = run("groups", "reset", "db.events", "--group", "g", "--shift-by", "-3", "--dry-run")
    assert plan["dry_run"] is True
    assert [(r["partition"], r["current"], r["new"]) for r in plan["partitions"]] == [(0, 10, 7), (1, 0, 0)]
    assert run("groups", "describe", "--group", "g") == before
    assert _groups_table_location(run.catalog) == pointer
    text = run("groups", "reset", "db.events", "--group", "g", "--to", "latest", "--dry-run", text=True)
    assert "dry run, nothing changed" in text and "60" in text
    assert run("groups", "describe", "--group", "g") == before


def test_reset_dry_run_on_a_catalog_without_groups_creates_nothing(run, events, unchanged):
    with unchanged(catalog=run.catalog):
        plan = run("groups", "reset", "db.events", "--group", "g", "--to", "earliest", "--dry-run")
    assert [(r["partition"], r["current"], r["new"]) for r in plan["partitions"]] == [(0, 0, 0), (1, 0, 0)]


def test_i10_reset_shift_by_moves_from_the_committed_offset_clamped_to_the_log(run, events):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9", "--range", "20-24")
    out = run("groups", "reset", "db.events", "--group", "g", "--shift-by", "5", "--partition", "0")
    assert out["dry_run"] is False and [(r["current"], r["new"]) for r in out["partitions"]] == [(10, 15)]
    entry = _partition(run("groups", "describe", "--group", "g"))
    assert (entry["committed_offset"], entry["ranges"]) == (15, [])  # the IC ranges went with the reset
    run("groups", "reset", "db.events", "--group", "g", "--shift-by", "1000")
    doc = run("groups", "describe", "--group", "g")
    assert [(e["partition"], e["committed_offset"]) for e in doc["partitions"]] == [(0, 60), (1, 1)]
    run("groups", "reset", "db.events", "--group", "g", "--shift-by", "-1000")
    doc = run("groups", "describe", "--group", "g")
    assert [(e["partition"], e["committed_offset"]) for e in doc["partitions"]] == [(0, 0), (1, 0)]


def test_i10_reset_to_datetime_takes_the_first_offset_stamped_at_or_after(run, sqlite_spec):
    import datetime as dt

    t = LogTable.create(sqlite_spec.open(), "db.timed", 2)
    t.append({0: [{"key": "a", "value": str(i)} for i in range(3)], 1: [{"key": "b", "value": "0"}]})
    t.append({0: [{"key": "a", "value": "3"}]})
    first, second = (t.read(0).column("log_timestamp")[i].as_py() for i in (0, 3))
    assert first < second
    out = run("groups", "reset", "db.timed", "--group", "g", "--to-datetime", (first + dt.timedelta(microseconds=1)).isoformat())
    assert [(r["partition"], r["new"]) for r in out["partitions"]] == [(0, 3), (1, 1)]  # partition 1: none that late, its end
    doc = run("groups", "describe", "--group", "g")
    assert [(e["partition"], e["committed_offset"]) for e in doc["partitions"]] == [(0, 3), (1, 1)]
    early = str(int(first.timestamp() * 1000) - 1000)  # epoch ms, a second before the first record
    out = run("groups", "reset", "db.timed", "--group", "g", "--to-datetime", early)
    assert [(r["partition"], r["new"]) for r in out["partitions"]] == [(0, 0), (1, 0)]


@pytest.mark.parametrize(
    "targets",
    [
        [],
        ["--to", "earliest", "--shift-by", "1"],
        ["--to-datetime", "2026-01-01T00:00:00", "--shift-by", "-1"],
        ["--to", "latest", "--to-datetime", "2026-01-01T00:00:00"],
    ],
)
def test_i8_reset_needs_exactly_one_target_usage_error_exit_2(run, events, targets):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9")
    before, pointer = run("groups", "describe", "--group", "g"), _groups_table_location(run.catalog)
    err = run("groups", "reset", "db.events", "--group", "g", *targets, code=2)
    assert err["error"] == "UsageError" and "exactly one of --to, --to-datetime and --shift-by" in err["message"]
    assert run("groups", "describe", "--group", "g") == before and _groups_table_location(run.catalog) == pointer


@pytest.mark.parametrize("bad", [["--shift-by", "x"], ["--to-datetime", "yesterday"], ["--to", "99"], ["--to", "soon"]])
def test_i8_reset_bad_target_value_exit_2_nothing_changes(run, events, bad):
    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9")
    before, pointer = run("groups", "describe", "--group", "g"), _groups_table_location(run.catalog)
    run("groups", "reset", "db.events", "--group", "g", *bad, code=2)
    assert run("groups", "describe", "--group", "g") == before and _groups_table_location(run.catalog) == pointer


def test_i10_reset_dry_run_is_refused_like_the_reset_while_members_are_live(run, events):
    from icelog.storage.groups.offsets import GroupAction, group_action

    run("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-9")
    group_action(run.catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 60_000))
    before = run("groups", "describe", "--group", "g")
    for dry in ([], ["--dry-run"]):
        err = run("groups", "reset", "db.events", "--group", "g", "--shift-by", "-2", *dry, code=3)
        assert err["error"] == "StaleGeneration"
    assert run("groups", "describe", "--group", "g")["partitions"] == before["partitions"]


def test_groups_delete_forgets_an_idle_group_and_refuses_a_live_or_unknown_one(run, events):
    from icelog.storage.groups.offsets import GROUPS_TABLE, GroupAction, group_action

    run("groups", "commit", "db.events", "--group", "idle", "--partition", "0", "--range", "0-9")
    run("groups", "commit", "db.events", "--group", "busy", "--partition", "0", "--range", "0-4")
    group_action(run.catalog, GroupAction("busy", "a", "join", {"db.events": [0]}, 60_000))
    before = run.catalog.load_table(GROUPS_TABLE).metadata_location
    assert run("groups", "delete", "--group", "busy", code=3)["error"] == "StaleGeneration"
    assert run("groups", "delete", "--group", "nope", code=2)["error"] == "UnknownGroup"
    assert run.catalog.load_table(GROUPS_TABLE).metadata_location == before  # nothing written
    assert run("groups", "delete", "--group", "idle") == {"group": "idle", "deleted": True, "tables": ["db.events"]}
    assert "idle" not in run("groups", "list")["groups"] and "busy" in run("groups", "list")["groups"]
    assert run("groups", "delete", "--group", "idle", code=2)["error"] == "UnknownGroup"  # gone, not half-gone


def test_groups_delete_on_a_catalog_without_groups_creates_nothing(run, events, unchanged):
    with unchanged(catalog=run.catalog):
        assert run("groups", "delete", "--group", "g", code=2)["error"] == "UnknownGroup"

"""``icelog consume`` without a group and ``icelog offsets --at``: kafka-console-consumer's
and kafka-get-offsets' reads, which commit nothing."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from icelog.storage.log.table import LogTable
from tests.support.cli import Cli, one_document


@pytest.fixture
def events(sqlite_spec):
    """db.events: partition 0 gets offsets 0-2 in one append and 3-4 in a later one; partition 1
    gets offset 0 with the first append. Returns the two appends' timestamps (UTC)."""
    table = LogTable.create(sqlite_spec.open(), "db.events", 2)
    table.append({0: [{"key": f"k{i}", "value": str(i)} for i in range(3)], 1: [{"key": "x", "value": "y"}]})
    table.append({0: [{"key": "k3", "value": "3"}, {"key": "k4", "value": "4"}]})
    stamps = table.read(0).column("log_timestamp").to_pylist()
    assert stamps[0] == stamps[2] < stamps[3] == stamps[4]
    return stamps[0], stamps[3]


def _records(result) -> list[dict]:
    """The records of ``consume --output json``: one document, ``{"table", "group", "records"}``."""
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return one_document(result.stdout)["records"]


def _catalog_state(spec) -> tuple:
    """Every table of the catalog, and db.events' properties and snapshot: what "commits nothing" compares."""
    catalog = spec.open()
    tables = sorted(".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns))
    metadata = catalog.load_table("db.events").metadata
    return tables, dict(metadata.properties), metadata.current_snapshot_id


def _ms(moment: dt.datetime) -> str:
    return str(int(moment.timestamp() * 1000))


def test_consume_from_beginning_reads_every_partition_and_commits_nothing(icelog: Cli, events, sqlite_spec):
    before = _catalog_state(sqlite_spec)
    rows = _records(icelog.raw("consume", "db.events", "--from-beginning"))
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in rows] == [
        *[(0, i, f"k{i}", str(i)) for i in range(5)],
        (1, 0, "x", "y"),
    ]
    assert set(rows[0]) == {"partition", "offset", "timestamp", "key", "value"}
    assert dt.datetime.fromisoformat(rows[0]["timestamp"]) == events[0]
    assert _catalog_state(sqlite_spec) == before
    assert icelog("groups", "list") == {"groups": []}


def test_consume_from_an_offset_with_max_records(icelog: Cli, events):
    rows = _records(icelog.raw("consume", "db.events", "--partition", "0", "--offset", "1", "--max-records", "3"))
    assert [r["offset"] for r in rows] == [1, 2, 3]
    rows = _records(icelog.raw("consume", "db.events", "--from-beginning", "--max-records", "2", "--batch-size", "1"))
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 0), (0, 1)]


def test_consume_from_time_starts_at_the_first_offset_stamped_at_or_after_it(icelog: Cli, events, sqlite_spec):
    first, second = events
    before = _catalog_state(sqlite_spec)
    rows = _records(icelog.raw("consume", "db.events", "--from-time", second.isoformat()))
    assert [(r["partition"], r["offset"]) for r in rows] == [(0, 3), (0, 4)]  # partition 1 has nothing that late
    rows = _records(icelog.raw("consume", "db.events", "--from-time", _ms(first - dt.timedelta(seconds=1))))
    assert len(rows) == 6
    assert _catalog_state(sqlite_spec) == before


def test_consume_without_a_start_begins_at_the_log_end(icelog: Cli, events):
    result = icelog.raw("consume", "db.events", json_output=False)
    assert result.exit_code == 0 and result.stdout == ""
    assert "log end" in result.stderr


def test_consume_text_is_one_tab_separated_line_per_record(icelog: Cli, events):
    result = icelog.raw("consume", "db.events", "--partition", "1", "--from-beginning", json_output=False)
    assert result.exit_code == 0
    partition, offset, timestamp, key, value = result.stdout.strip().split("\t")
    assert (partition, offset, key, value) == ("1", "0", "x", "y")
    assert dt.datetime.fromisoformat(timestamp) == events[0]


def test_consume_of_a_custom_payload_keys_by_the_key_column(icelog: Cli, sqlite_spec):
    payload = [{"name": "tailnum", "type": "string"}, {"name": "dep_delay", "type": "double"}]
    table = LogTable.create(sqlite_spec.open(), "demo.flights", 1, payload, {"icelog.key-column": "tailnum"})
    table.append({0: [{"tailnum": "N1", "dep_delay": 2.5}]})
    rows = _records(icelog.raw("consume", "demo.flights", "--offset", "0"))  # one partition: no --partition needed
    assert [(r["key"], r["value"]) for r in rows] == [("N1", {"dep_delay": 2.5})]


@pytest.mark.parametrize(
    "args",
    [
        ["--offset", "1", "--from-beginning"],
        ["--partition", "0", "--offset", "1", "--from-time", "0"],
        ["--from-beginning", "--from-time", "0"],
        ["--offset", "1"],  # two partitions: which one?
        ["--from-beginning", "--group", "g"],
        ["--key-range", "0:100", "--from-beginning"],
        ["--from-time", "yesterday"],
    ],
)
def test_conflicting_options_are_usage_errors_that_change_nothing(icelog: Cli, events, sqlite_spec, args):
    before = _catalog_state(sqlite_spec)
    result = icelog.raw("consume", "db.events", *args)
    assert result.exit_code == 2, result.stdout
    assert "error" in one_document(result.stdout)  # the error, and no record
    assert _catalog_state(sqlite_spec) == before
    assert icelog("groups", "list") == {"groups": []}


@pytest.mark.parametrize("offset", ["6", "99"])
def test_an_offset_past_the_log_end_is_invalid(icelog: Cli, events, offset):
    assert icelog("consume", "db.events", "--partition", "0", "--offset", offset, code=2)["error"] == "InvalidOffset"


def test_consume_with_a_group_still_commits(icelog: Cli, events):
    result = icelog.raw("consume", "db.events", "--group", "g", "--partition", "0", "--max-records", "2")
    assert [r["offset"] for r in _records(result)] == [0, 1]
    assert icelog("groups", "describe", "--group", "g")["partitions"][0]["committed_offset"] == 2


def test_consume_output_json_is_one_document_with_or_without_a_group(icelog: Cli, events):
    plain = icelog("consume", "db.events", "--partition", "0", "--from-beginning", "--max-records", "2")
    grouped = icelog("consume", "db.events", "--group", "g", "--partition", "0", "--max-records", "2")
    assert plain["table"] == grouped["table"] == "db.events" and (plain["group"], grouped["group"]) == (None, "g")
    assert plain["records"] == grouped["records"]
    assert [set(r) for r in plain["records"]] == [{"partition", "offset", "timestamp", "key", "value"}] * 2
    # --follow would never end the one document: refused, unless --max-records ends it
    assert icelog("consume", "db.events", "--from-beginning", "--follow", code=2)["error"] == "UsageError"
    followed = icelog("consume", "db.events", "--from-beginning", "--follow", "--max-records", "1")
    assert len(followed["records"]) == 1


def _text(icelog: Cli, *args: str) -> str:
    result = icelog.raw("consume", "db.events", *args, json_output=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_consume_text_with_a_group_prints_the_shape_without_one(icelog: Cli, events):
    plain = _text(icelog, "--partition", "0", "--from-beginning", "--max-records", "3")
    grouped = _text(icelog, "--group", "g", "--partition", "0", "--max-records", "3")
    assert grouped == plain and "log_offset" not in grouped
    assert grouped.splitlines()[1].split("\t")[:2] == ["0", "1"] and grouped.splitlines()[1].endswith("\tk1\t1")


def test_consume_print_chooses_the_fields_as_print_key_and_print_timestamp(icelog: Cli, events):
    assert _text(icelog, "--partition", "0", "--from-beginning", "--print", "value") == "0\n1\n2\n3\n4\n"
    assert _text(icelog, "--partition", "0", "--from-beginning", "--max-records", "2", "--print", "value,key") == "k0\t0\nk1\t1\n"
    assert _text(icelog, "--group", "g", "--partition", "1", "--print", "offset", "--print", "value") == "0\ty\n"
    doc = icelog("consume", "db.events", "--partition", "1", "--from-beginning", "--print", "timestamp,key")
    assert list(doc["records"][0]) == ["timestamp", "key"] and doc["records"][0]["key"] == "x"
    assert dt.datetime.fromisoformat(doc["records"][0]["timestamp"]) == events[0]
    bad = icelog("consume", "db.events", "--from-beginning", "--print", "value,headers", code=2)
    assert bad["error"] == "BadParameter" and "headers" in bad["message"] and "partition, offset" in bad["message"]


def test_consume_format_jsonl_streams_one_record_object_per_line(icelog: Cli, events):
    lines = _text(icelog, "--from-beginning", "--format", "jsonl", "--print", "partition,offset,key").splitlines()
    assert [json.loads(line) for line in lines] == [
        *[{"partition": 0, "offset": i, "key": f"k{i}"} for i in range(5)],
        {"partition": 1, "offset": 0, "key": "x"},
    ]
    grouped = _text(icelog, "--group", "g", "--format", "jsonl").splitlines()
    assert [json.loads(line) for line in grouped] == [
        *[
            {"partition": 0, "offset": i, "timestamp": json.loads(grouped[i])["timestamp"], "key": f"k{i}", "value": str(i)}
            for i in range(5)
        ],
        json.loads(grouped[5]),
    ]
    assert "log_offset" not in grouped[0]


def test_offsets_at_a_time_is_the_first_offset_stamped_at_or_after_it(icelog: Cli, events):
    first, second = events
    early = icelog("offsets", "db.events", "--at", _ms(first - dt.timedelta(seconds=1)))
    assert {p: e["offset"] for p, e in early["partitions"].items()} == {"0": 0, "1": 0}
    assert dt.datetime.fromisoformat(early["partitions"]["0"]["timestamp"]) == first
    between = icelog("offsets", "db.events", "--at", (first + dt.timedelta(microseconds=1)).isoformat())
    assert between["partitions"] == {
        "0": {"offset": 3, "timestamp": second.isoformat()},
        "1": {"offset": 1, "timestamp": None},  # none that late: the log end
    }
    late = icelog("offsets", "db.events", "--at", "2999-01-01T00:00:00")
    assert {p: e["offset"] for p, e in late["partitions"].items()} == {"0": 5, "1": 1}
    text = icelog.raw("offsets", "db.events", "--at", second.isoformat(), json_output=False)
    assert text.exit_code == 0 and "timestamp" in text.stdout
    assert icelog("offsets", "db.events", "--at", "soon", code=2)["param"] == "at_us"

"""Admin as kafka-topics, kafka-configs and kafka-consumer-groups offer it: ``topics
delete`` (guarded), ``topics alter`` and the properties ``topics describe`` shows, the time
lookup ``offsets --at`` / ``consume --from-time`` / ``groups reset --to-datetime`` share, and
``--as-of`` errors that point to ``icelog snapshots``. ``groups reset`` itself: test_cli_groups.py."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest

from icelog.storage.core import faults
from icelog.storage.errors import UnknownTable
from icelog.storage.groups.offsets import group_state
from icelog.storage.log.table import LogTable, OffsetAndTimestamp
from icelog.storage.producers.transactional import TransactionalProducer
from tests.support.cli import Cli, one_document
from tests.support.workers.transactions import prepare_as_before_the_fast_path


@pytest.fixture
def events(icelog: Cli) -> LogTable:
    """db.events, 2 partitions: partition 0 holds offsets 0-2, partition 1 offset 0."""
    table = LogTable.create(icelog.spec.open(), "db.events", 2)
    table.append({0: [{"key": f"k{i}", "value": str(i)} for i in range(3)], 1: [{"key": "x", "value": "y"}]})
    return table


def _tables(catalog) -> list[str]:
    return sorted(".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns))


def _properties(log_table: LogTable) -> dict[str, str]:
    return dict(log_table.table().metadata.properties)


# --- 1: one time lookup: LogTable.offsets_for_time ------------------------------------------


def test_offsets_for_time_is_the_one_lookup_of_the_cli(icelog: Cli, events):
    events.append({0: [{"key": "late", "value": "3"}]})
    first, second = (events.read(0).column("log_timestamp")[i].as_py() for i in (0, 3))
    between = (first + dt.timedelta(microseconds=1)) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    at_us = between // dt.timedelta(microseconds=1)
    found = events.offsets_for_time(at_us)
    assert found == {0: OffsetAndTimestamp(3, second), 1: OffsetAndTimestamp(1, None)}
    assert events.offsets_for_time(at_us, [1]) == {1: OffsetAndTimestamp(1, None)}
    # offsets --at, consume --from-time and groups reset --to-datetime all answer the same
    moment = (first + dt.timedelta(microseconds=1)).isoformat()
    shown = icelog("offsets", "db.events", "--at", moment)["partitions"]
    assert {int(p): e["offset"] for p, e in shown.items()} == {p: e.offset for p, e in found.items()}
    consumed = icelog.raw("consume", "db.events", "--from-time", moment)
    assert [r["offset"] for r in json.loads(consumed.stdout)["records"]] == [3]
    plan = icelog("groups", "reset", "db.events", "--group", "g", "--to-datetime", moment, "--dry-run")
    assert {r["partition"]: r["new"] for r in plan["partitions"]} == {p: e.offset for p, e in found.items()}


def test_offsets_at_by_event_time_answer_by_the_tables_event_time_column(icelog: Cli):
    """Appended today, events of 2013 and of a later, out-of-order day: --at by append time finds
    nothing of 2013, --event-time finds the first offset of an event at or after the time."""
    catalog = icelog.spec.open()
    t = LogTable.create(
        catalog, "db.flights", 2, payload=[{"name": "key", "type": "string"}, {"name": "time_hour", "type": "timestamp"}]
    )
    hours = [dt.datetime(2013, 1, 31, 22), dt.datetime(2013, 2, 1, 1), dt.datetime(2013, 1, 31, 23), dt.datetime(2013, 2, 2)]
    t.append({0: [{"key": str(i), "time_hour": h} for i, h in enumerate(hours)], 1: [{"key": "x", "time_hour": hours[0]}]})
    at_us = (dt.datetime(2013, 2, 1, tzinfo=dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    february = dt.datetime(2013, 2, 1, 1, tzinfo=dt.UTC)
    assert t.offsets_for_time(at_us, event_time=True) == {0: OffsetAndTimestamp(1, february), 1: OffsetAndTimestamp(1, None)}
    by_append = icelog("offsets", "db.flights", "--at", "2013-02-01")
    assert by_append["by"] == "log_timestamp" and {p: e["offset"] for p, e in by_append["partitions"].items()} == {"0": 0, "1": 0}
    by_event = icelog("offsets", "db.flights", "--at", "2013-02-01", "--event-time")
    assert by_event["by"] == "time_hour" and {p: e["offset"] for p, e in by_event["partitions"].items()} == {"0": 1, "1": 1}
    text = icelog.raw("--output", "text", "offsets", "db.flights", "--at", "2013-02-01", "--event-time")
    assert "time_hour" in text.stdout and "2013-02-01" in text.stdout.split("time_hour", 1)[1]


def test_offsets_by_event_time_without_one_event_time_column_is_refused(icelog: Cli, events):
    result = icelog.raw("offsets", "db.events", "--at", "2013-02-01", "--event-time")
    assert result.exit_code == 2 and one_document(result.stdout)["error"] == "InvalidInput"
    assert "no event-time column" in one_document(result.stdout)["message"]
    assert icelog.raw("offsets", "db.events", "--event-time").exit_code == 2  # without --at


def test_offsets_for_time_of_a_partition_the_table_lacks_is_refused(events):
    from icelog.storage.errors import UnknownPartition

    with pytest.raises(UnknownPartition):
        events.offsets_for_time(0, [7])


# --- 2: topics delete, guarded ---------------------------------------------------------------


def test_i8_delete_without_yes_and_without_a_terminal_is_refused_and_changes_nothing(icelog: Cli, events, unchanged):
    catalog = icelog.spec.open()
    with unchanged(events), unchanged(catalog=catalog):
        result = icelog.raw("topics", "delete", "db.events")
    assert result.exit_code == 2
    doc = one_document(result.stdout)
    assert doc["error"] == "ConfirmationRequired" and "--yes" in doc["message"]
    assert catalog.table_exists("db.events")


def test_delete_with_yes_drops_the_table_keeping_its_files_for_re_registration(icelog: Cli, events):
    catalog = icelog.spec.open()
    out = icelog("topics", "delete", "db.events", "--yes")
    assert (out["table"], out["deleted"], out["purged"], out["groups_forgotten"]) == ("db.events", True, False, [])
    assert not catalog.table_exists("db.events") and icelog("topics", "list") == {"tables": []}
    assert os.path.exists(out["metadata_location"].removeprefix("file://"))
    back = LogTable(catalog, "db.events")
    catalog.register_table("db.events", out["metadata_location"])
    assert {p: (w.start, w.end) for p, w in back.watermarks().items()} == {0: (0, 3), 1: (0, 1)}
    assert back.read(0).num_rows == 3


def test_delete_purge_also_deletes_the_files(icelog: Cli, events):
    paths = [t.file.file_path.removeprefix("file://") for t in events.table().scan().plan_files()]
    assert paths and all(os.path.exists(p) for p in paths)
    out = icelog("topics", "delete", "db.events", "--yes", "--purge")
    assert out["purged"] is True and not icelog.spec.open().table_exists("db.events")
    assert not any(os.path.exists(p) for p in paths)
    assert not os.path.exists(out["metadata_location"].removeprefix("file://"))


def test_delete_on_a_terminal_asks_and_a_no_changes_nothing(icelog: Cli, events, unchanged, monkeypatch):
    from icelog.pipelines.cli import topics

    monkeypatch.setattr(topics, "_interactive", lambda: True)
    with unchanged(events):
        result = icelog.raw("topics", "delete", "db.events", input="n\n")
    assert result.exit_code == 2 and one_document(result.stdout)["error"] == "ConfirmationRequired"
    assert "Delete db.events from the catalog" in result.stderr  # asked on stderr: stdout stays one JSON document
    result = icelog.raw("topics", "delete", "db.events", input="")  # end of input at the prompt
    assert result.exit_code == 2 and one_document(result.stdout)["error"] == "ConfirmationRequired"
    result = icelog.raw("topics", "delete", "db.events", input="y\n")
    assert result.exit_code == 0 and one_document(result.stdout)["deleted"] is True
    assert not icelog.spec.open().table_exists("db.events")


@pytest.mark.parametrize("flags", [["--yes"], ["--yes", "--force"], ["--yes", "--force", "--purge"]])
def test_i8_a_system_table_is_never_deleted(icelog: Cli, events, flags):
    icelog("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-1")
    catalog = icelog.spec.open()
    before = catalog.load_table("icelog_system.group_offsets").metadata_location
    err = icelog("topics", "delete", "icelog_system.group_offsets", *flags, code=2)
    assert err["error"] == "InvalidIdentifier" and "never deleted" in err["message"]
    assert catalog.load_table("icelog_system.group_offsets").metadata_location == before


def test_i8_delete_of_an_unknown_table_exits_2(icelog: Cli, events):
    assert icelog("topics", "delete", "db.nope", "--yes", code=2)["error"] == "UnknownTable"


def test_i10_a_table_with_group_offsets_needs_force_which_drops_them(icelog: Cli, events, unchanged):
    icelog("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-2")
    icelog("groups", "commit", "db.events", "--group", "h", "--partition", "1", "--range", "0-0")
    catalog = icelog.spec.open()
    groups_before = catalog.load_table("icelog_system.group_offsets").metadata_location
    with unchanged(events):
        err = icelog("topics", "delete", "db.events", "--yes", code=2)
    assert err["error"] == "TableInUse" and err["users"] == ["consumer groups g, h"] and "--force" in err["message"]
    assert catalog.load_table("icelog_system.group_offsets").metadata_location == groups_before
    out = icelog("topics", "delete", "db.events", "--yes", "--force")
    assert out["groups_forgotten"] == ["g", "h"] and not catalog.table_exists("db.events")
    assert group_state(catalog).offsets == {} and icelog("groups", "list") == {"groups": []}
    # created again under the name, it starts with no stale positions past its new log end
    icelog("topics", "create", "db.events", "--partitions", "2")
    assert icelog("groups", "describe", "--group", "g")["partitions"] == []


def test_i5_a_table_an_ongoing_transaction_the_journal_knows_needs_force(icelog: Cli, events, unchanged):
    catalog = icelog.spec.open()
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.events", 0, [{"key": "open", "value": "1"}])
    # Registered in the journal, as a send of pre-written files (or any send on REST) is.
    producer._register("db.events", [0], record=True)
    with unchanged(events):
        err = icelog("topics", "delete", "db.events", "--yes", code=2)
    assert err["error"] == "TableInUse" and err["users"] == ["ongoing transactions of copier"]
    assert icelog("topics", "delete", "db.events", "--yes", "--force")["deleted"] is True
    assert not catalog.table_exists("db.events")


def test_i5_a_plain_send_on_sql_is_unknown_to_delete_and_its_commit_then_fails_writing_nothing(icelog: Cli, events):
    # On a SQL catalog a transaction of plain sends writes nothing to the journal before its one
    # swap, so `topics delete` cannot see it; its commit then finds the table gone.
    catalog = icelog.spec.open()
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.events", 0, [{"key": "open", "value": "1"}])
    assert icelog("topics", "delete", "db.events", "--yes")["deleted"] is True
    with pytest.raises(UnknownTable):
        producer.commit_transaction()
    assert not catalog.table_exists("db.events")


class _KilledAfterPrepare(Exception):
    pass


def test_i5_a_table_a_prepared_transaction_commits_to_is_refused_even_with_force(icelog: Cli, events, unchanged, monkeypatch):
    catalog = icelog.spec.open()
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.events", 0, [{"key": "prepared", "value": "1"}])

    def die(point: str) -> None:  # the producer stops right after PREPARE_COMMIT is recorded
        if point == faults.AFTER_TXN_PREPARE:
            raise _KilledAfterPrepare

    monkeypatch.setattr(faults, "checkpoint", die)
    with pytest.raises(_KilledAfterPrepare):  # SQL commits without PREPARE_COMMIT: one recorded as before it
        prepare_as_before_the_fast_path(producer)
    monkeypatch.undo()
    with unchanged(events):
        err = icelog("topics", "delete", "db.events", "--yes", "--force", code=2)
    assert err["error"] == "TableInUse" and err["users"] == ["prepared transactions of copier"]
    assert "transactions recover" in err["message"]
    assert icelog("transactions", "recover")["rolled_forward"] == [producer.txn_id]
    assert events.watermarks()[0].end == 4  # the prepared send landed: deleting first would have lost it
    assert icelog("topics", "delete", "db.events", "--yes")["deleted"] is True


def test_delete_text_output(icelog: Cli, events):
    result = icelog.raw("topics", "delete", "db.events", "--yes", json_output=False)
    assert result.exit_code == 0 and result.stdout.startswith("deleted db.events (files kept; re-register with metadata ")


# --- 3: topics alter, and topics describe showing the properties ---------------------------------


def test_alter_sets_known_properties_through_the_commit_core(icelog: Cli, events):
    before = _properties(events)
    out = icelog(
        "topics", "alter", "db.events", "--set", "icelog.retention.ms=0086400000", "--set", "icelog.check-expected-offsets=TRUE"
    )
    assert out == {
        "table": "db.events",
        "set": {"icelog.retention.ms": "86400000", "icelog.check-expected-offsets": "true"},
        "unset": [],
    }
    after = _properties(events)
    assert after["icelog.retention.ms"] == "86400000" and after["icelog.check-expected-offsets"] == "true"
    # one icelog commit: the state version moved by one and the commit-id registry has it
    assert int(after["icelog.version"]) == int(before["icelog.version"]) + 1
    assert len(json.loads(after["icelog.commits"])) == len(json.loads(before["icelog.commits"])) + 1
    assert after["icelog.watermarks"] == before["icelog.watermarks"]
    shown = icelog("topics", "describe", "db.events")["properties"]
    assert shown["icelog.retention.ms"] == {"value": 86400000, "default": None, "set": True}
    assert shown["icelog.check-expected-offsets"] == {"value": "true", "default": "false", "set": True}
    assert shown["icelog.snapshots.keep"] == {"value": 20, "default": 20, "set": False}
    # it takes effect: appends now need expected offsets
    err = icelog("produce", "db.events", "--partition", "0", input='{"key": "a", "value": "b"}\n', code=2)
    assert err["error"] == "ExpectedOffsetRequired"


def test_alter_sets_and_unsets_a_plain_iceberg_property(icelog: Cli, events):
    """The README's advice (a smaller manifest target) and Iceberg's write options: any property
    outside icelog.*, through the commit core, as kafka-configs sets any topic config."""
    done = icelog("topics", "alter", "db.events", "--set", "commit.manifest.target-size-bytes=131072")
    assert done["set"] == {"commit.manifest.target-size-bytes": "131072"}
    assert _properties(events)["commit.manifest.target-size-bytes"] == "131072"
    events.append({0: [{"key": "after", "value": "1"}]})  # icelog's own commits go on
    assert icelog("topics", "alter", "db.events", "--unset", "commit.manifest.target-size-bytes")["unset"] == [
        "commit.manifest.target-size-bytes"
    ]
    assert "commit.manifest.target-size-bytes" not in _properties(events)


def test_alter_unset_goes_back_to_the_default(icelog: Cli, events):
    icelog("topics", "alter", "db.events", "--set", "icelog.retention.bytes=1000")
    out = icelog("topics", "alter", "db.events", "--unset", "icelog.retention.bytes")
    assert out == {"table": "db.events", "set": {}, "unset": ["icelog.retention.bytes"]}
    assert "icelog.retention.bytes" not in _properties(events)
    assert icelog("topics", "describe", "db.events")["properties"]["icelog.retention.bytes"]["set"] is False


def test_alter_to_what_is_already_there_commits_nothing(icelog: Cli, events):
    icelog("topics", "alter", "db.events", "--set", "icelog.snapshots.keep=30")
    pointer = events.table().metadata_location
    out = icelog("topics", "alter", "db.events", "--set", "icelog.snapshots.keep=30", "--unset", "icelog.retention.ms")
    assert out == {"table": "db.events", "set": {}, "unset": []}
    assert events.table().metadata_location == pointer


@pytest.mark.parametrize(
    ("args", "error", "key", "allowed"),
    [
        (["--set", "icelog.retention.ms=0"], "InvalidProperty", "icelog.retention.ms", "1 or more"),
        (["--set", "icelog.snapshots.keep=60s"], "InvalidProperty", "icelog.snapshots.keep", "1 or more"),
        (
            ["--set", "icelog.commit-ids.min-retention-ms=-1"],
            "InvalidProperty",
            "icelog.commit-ids.min-retention-ms",
            "0 or more",
        ),
        (["--set", "icelog.retention.ms="], "InvalidProperty", "icelog.retention.ms", "whole number"),
        (["--set", "icelog.check-expected-offsets=yes"], "InvalidProperty", "icelog.check-expected-offsets", "true or false"),
        (["--set", "icelog.watermarks=0:0:0"], "UnknownProperty", "icelog.watermarks", "icelog.retention.ms"),
        (["--set", "format-version=3"], "UnknownProperty", "format-version", "an Iceberg operation changes"),
        (["--set", "write.parquet.compression-codec= "], "InvalidProperty", "write.parquet.compression-codec", "not be empty"),
        (["--set", "icelog.key-column=value"], "UnknownProperty", "icelog.key-column", "fixed when the table is created"),
        (["--unset", "icelog.format"], "UnknownProperty", "icelog.format", "icelog.retention.ms"),
        # a valid change beside a bad one: neither is applied
        (
            ["--set", "icelog.snapshots.keep=5", "--set", "icelog.retention.bytes=-3"],
            "InvalidProperty",
            "icelog.retention.bytes",
            "1 or more",
        ),
        (
            ["--set", "icelog.snapshots.keep=5", "--unset", "icelog.snapshots.keep"],
            "InvalidProperty",
            "icelog.snapshots.keep",
            "both",
        ),
    ],
)
def test_i8_alter_refuses_naming_the_property_and_what_it_allows_and_changes_nothing(
    icelog: Cli, events, unchanged, args, error, key, allowed
):
    before = _properties(events)
    with unchanged(events):
        err = icelog("topics", "alter", "db.events", *args, code=2)
    assert (err["error"], err["key"], err["table"]) == (error, key, "db.events")
    assert key in err["message"] and allowed in err["message"] and "nothing was written" in err["message"]
    assert _properties(events) == before


@pytest.mark.parametrize("args", [[], ["--set", "icelog.retention.ms"], ["--set", "=5"]])
def test_i8_alter_usage_errors_exit_2(icelog: Cli, events, unchanged, args):
    with unchanged(events):
        err = icelog("topics", "alter", "db.events", *args, code=2)
    assert err["error"] in ("UsageError", "BadParameter")


def test_alter_fixes_a_malformed_value_another_tool_set(icelog: Cli, events):
    """A bad value refuses every commit that reads it; the alter that fixes it runs under the fix."""
    table = events.table()
    with table.transaction() as txn:  # another tool, beside icelog
        txn.set_properties({"icelog.snapshots.keep": "0"})
    shown = icelog("topics", "describe", "db.events")["properties"]["icelog.snapshots.keep"]
    assert shown["value"] == "0" and "1 or more" in shown["invalid"]
    text = icelog.raw("topics", "describe", "db.events", json_output=False).stdout
    assert "invalid" in text and "must be 1 or more" in text
    err = icelog("produce", "db.events", "--partition", "0", input='{"key": "a", "value": "b"}\n', code=2)
    assert err["error"] == "InvalidProperty"
    icelog("topics", "alter", "db.events", "--set", "icelog.snapshots.keep=5")
    assert icelog("produce", "db.events", "--partition", "0", input='{"key": "a", "value": "b"}\n')["rows"] == 1


def test_alter_a_knob_of_a_system_table(icelog: Cli, events):
    icelog("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-0")
    catalog = icelog.spec.open()
    offsets_before = group_state(catalog).offsets
    icelog("topics", "alter", "icelog_system.group_offsets", "--set", "icelog.groups.max-ranges=10")
    assert group_state(catalog).max_ranges == 10 and group_state(catalog).offsets == offsets_before


def test_alter_of_a_table_that_is_not_a_log_table_is_refused(icelog: Cli, events):
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, NestedField

    catalog = icelog.spec.open()
    catalog.create_table("db.plain", schema=Schema(NestedField(1, "x", IntegerType(), required=False)))
    assert icelog("topics", "alter", "db.plain", "--set", "icelog.retention.ms=5", code=2)["error"] == "NotALogTable"
    assert "icelog.retention.ms" not in catalog.load_table("db.plain").metadata.properties


def test_describe_shows_icelog_properties_and_all_on_request(icelog: Cli, events):
    icelog("topics", "alter", "db.events", "--set", "icelog.retention.ms=60000")
    doc = icelog("topics", "describe", "db.events")
    assert "all_properties" not in doc
    assert list(doc["properties"])[:2] == ["icelog.snapshots.keep", "icelog.commit-ids.keep"]
    every = icelog("topics", "describe", "db.events", "--all-properties")["all_properties"]
    assert every["icelog.retention.ms"] == "60000" and "icelog.watermarks" in every and "commit.retry.num-retries" in every
    text = icelog.raw("topics", "describe", "db.events", json_output=False).stdout
    assert "icelog.retention.ms" in text and "60000" in text and "icelog.watermarks" not in text
    text = icelog.raw("topics", "describe", "db.events", "--all-properties", json_output=False).stdout
    assert "icelog.watermarks" in text and "commit.retry.num-retries" in text


# --- 5: --as-of errors point to icelog snapshots -----------------------------------------------


def test_time_travel_errors_point_to_icelog_snapshots(icelog: Cli, events):
    first = events.table().metadata.current_snapshot_id
    err = icelog("sql", "--table", "db.events", "--snapshot", "12345", "select count(*) from db.events", code=2)
    assert err["error"] == "UnknownSnapshot" and "`icelog snapshots db.events`" in err["message"]
    icelog("topics", "alter", "db.events", "--set", "icelog.snapshots.keep=1")
    time.sleep(0.02)
    for value in "vw":  # the first snapshot expires (the current one is never expired)
        events.append({0: [{"key": "k", "value": value}]})
    err = icelog("sql", "--as-of", "2001-01-01T00:00:00", "select count(*) from db.events", code=2)
    assert err["error"] == "HistoryExpired" and "`icelog snapshots db.events`" in err["message"]
    result = icelog.raw("sql", "--as-of", "2001-01-01T00:00:00", "select 1", json_output=False)
    assert result.exit_code == 2 and "icelog snapshots db.events" in result.stderr
    # and that command lists what is there: the first snapshot no longer
    listed = [r["snapshot_id"] for r in icelog("snapshots", "db.events")]
    assert first not in listed and events.table().metadata.current_snapshot_id in listed


def test_two_concurrent_alters_of_different_knobs_both_land(icelog: Cli, events):
    """Property-only commits are conditional (I3): neither overwrites the other's change."""
    import threading

    from icelog.storage.log.maintenance import alter_properties

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def alter(key: str, value: str) -> None:
        catalog = icelog.spec.open()
        barrier.wait()
        try:
            for i in range(5):
                alter_properties(catalog, "db.events", {key: str(int(value) + i)})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=alter, args=a) for a in (("icelog.retention.ms", "1000"), ("icelog.snapshots.keep", "40"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    props = _properties(events)
    assert (props["icelog.retention.ms"], props["icelog.snapshots.keep"]) == ("1004", "44")


def test_describe_shows_location_uuid_spec_format_version_and_refs(icelog: Cli, sqlite_spec):
    from icelog.storage.log.table import LogTable

    table = LogTable.create(sqlite_spec.open(), "db.fresh", 2)
    metadata = table.table().metadata
    doc = icelog("topics", "describe", "db.fresh")
    assert doc["uuid"] == str(metadata.table_uuid) and doc["format_version"] == metadata.format_version
    assert doc["location"] == metadata.location
    assert doc["spec"]["fields"] == [
        {"source": "log_partition", "field_id": 1000, "transform": "identity", "name": "log_partition"}
    ]
    assert doc["refs"] == {} and doc["snapshot_id"] is None  # JSON keeps null for an empty table
    out = icelog.raw("topics", "describe", "db.fresh", json_output=False).stdout
    assert "None" not in out and "refs: none (no snapshot yet)" in out and str(metadata.table_uuid) in out, out
    assert "identity(log_partition)" in out and f"format-version: {metadata.format_version}" in out

    table.append({0: [{"key": "k", "value": "v"}]})
    current = table.table().metadata.current_snapshot_id
    table.table().manage_snapshots().create_tag(current, "audited").commit()
    doc = icelog("topics", "describe", "db.fresh")
    assert doc["refs"] == {
        "audited": {"type": "tag", "snapshot_id": current},
        "main": {"type": "branch", "snapshot_id": current},
    }
    out = icelog.raw("topics", "describe", "db.fresh", json_output=False).stdout
    assert f"main (branch) -> {current}" in out and f"audited (tag) -> {current}" in out, out

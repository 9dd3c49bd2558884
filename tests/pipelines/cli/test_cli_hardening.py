"""The CLI under hostile input (I8): typed errors, exit codes, one JSON document, nothing changed.

Exit codes: 0 ok, 1 violations, 2 bad input or usage, 3 conflict, 4 anything else.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import time
from pathlib import Path

import pytest

from icelog.storage.errors import HistoryExpired, UnknownSnapshot
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from tests.support.cli import Cli, one_document

ROOT = Path(__file__).resolve().parents[3]
INT64_MAX = 2**63 - 1


# --- helpers -------------------------------------------------------------------------------


def lines(*rows: dict) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


@pytest.fixture
def events(icelog) -> Cli:
    """db.events: 2 partitions, 3 rows in partition 0 (3 snapshots), 1 row in partition 1."""
    icelog("topics", "create", "db.events", "--partitions", "2")
    for key in ("a", "b", "c"):
        icelog("produce", "db.events", "--partition", "0", input=lines({"key": key}))
    icelog("produce", "db.events", "--partition", "1", input=lines({"key": "z"}))
    return icelog


# --- 1, 6: every numeric option is bounded by Click (exit 2, JSON error, nothing changed) -----


BAD_NUMBERS = [
    (["maintain", "db.events", "--retention-ms", "-1"], "retention_ms"),
    (["maintain", "db.events", "--retention-ms", "0"], "retention_ms"),
    (["maintain", "db.events", "--retention-bytes", "0"], "retention_bytes"),
    (["maintain", "db.events", "--retention-bytes", "-10"], "retention_bytes"),
    (["maintain", "db.events", "--keep-snapshots", "0"], "keep_snapshots"),
    (["maintain", "db.events", "--keep-snapshots", "-3"], "keep_snapshots"),
    (["maintain", "db.events", "--orphan-age-s", "-1"], "orphan_age_s"),
    (["maintain", "db.events", "--orphan-age-s", "nan"], "orphan_age_s"),
    (["maintain", "db.events", "--orphan-age-s", "inf"], "orphan_age_s"),
    (["topics", "create", "db.other", "--partitions", "0"], "partitions"),
    (["topics", "create", "db.other", "--partitions", "100001"], "partitions"),
    (["topics", "add-partitions", "db.events", "--count", "0"], "count"),
    (["topics", "add-partitions", "db.events", "--count", "100001"], "count"),
    (["topics", "add-partitions", "db.events", "--count", "1000000000"], "count"),
    (["produce", "db.events", "--partition", "-1"], "partition"),
    (["produce", "db.events", "--partition", str(2**64)], "partition"),
    (["produce", "db.events", "--partition", "0", "--expected-offset", "-1"], "expected_offset"),
    (["produce", "db.events", "--partition", "0", "--expected-offset", str(2**63)], "expected_offset"),
    (["produce", "db.events", "--partition", "0", "--producer-id", "-1", "--epoch", "0", "--sequence", "0"], "producer_id"),
    (["produce", "db.events", "--partition", "0", "--producer-id", str(2**63), "--epoch", "0", "--sequence", "0"], "producer_id"),
    (["produce", "db.events", "--partition", "0", "--producer-id", "1", "--epoch", "-1", "--sequence", "0"], "epoch"),
    (["produce", "db.events", "--partition", "0", "--producer-id", "1", "--epoch", str(2**31), "--sequence", "0"], "epoch"),
    (["produce", "db.events", "--partition", "0", "--producer-id", "1", "--epoch", "0", "--sequence", "-1"], "sequence"),
    (["produce", "db.events", "--partition", "0", "--producer-id", "1", "--epoch", "0", "--sequence", str(2**31)], "sequence"),
    (["validate", "db.events", "--snapshot", "0"], "snapshot_id"),
    (["validate", "db.events", "--snapshot", "-5"], "snapshot_id"),
    (["validate", "db.events", "--snapshot", str(2**63)], "snapshot_id"),
    (["sql", "--table", "db.events", "--snapshot", "-1", "select 1"], "snapshot_id"),
    (["duckdb", "--table", "db.events", "--snapshot", "0"], "snapshot_id"),
]


@pytest.mark.parametrize("args, param", BAD_NUMBERS, ids=[" ".join(a[:1] + a[2:]) for a, _ in BAD_NUMBERS])
def test_i8_out_of_range_numbers_exit_2_json_error_table_unchanged(events, args, param):
    before = events.state()
    out = events(*args, input=lines({"key": "x"}), code=2)
    assert out["error"] == "BadParameter" and out["param"] == param and out["message"]
    assert events.state() == before
    assert events("topics", "list") == {"tables": ["db.events"]}


def test_i8_retention_minus_one_keeps_every_row_text_mode(events):
    before = events.state()
    result = events.raw("maintain", "db.events", "--retention-ms", "-1", "--keep-snapshots", "0", json_output=False)
    assert result.exit_code == 2 and result.stdout == ""
    assert "--retention-ms" in result.stderr and "Traceback" not in result.stderr
    assert events.state() == before


def test_add_partitions_bound_has_a_clear_message(events):
    out = events("topics", "add-partitions", "db.events", "--count", "1000000000", code=2)
    assert "100000" in out["message"] and "1000000000" in out["message"]
    assert events.state()[2] == 2


@pytest.mark.parametrize(
    "args, error",
    [
        (["groups", "commit", "db.events", "--group", "g", "--range", "0-0"], "MissingParameter"),  # no --partition
        (["produce", "db.events", "--partition", "zero"], "BadParameter"),
        (["produce", "db.events", "--partition", "0", "--nope"], "NoSuchOption"),
        (["no-such-command"], "NoSuchCommand"),
        (["topics", "create"], "MissingParameter"),
        (["--output", "json"], "UsageError"),
        (["produce", "db.events", "--partition", "0", "--input", "/no/such/file.jsonl"], "BadParameter"),
    ],
)
def test_usage_errors_give_one_json_document_and_exit_2(events, args, error):
    before = events.state()
    result = events.raw(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    out = one_document(result.stdout)
    assert out["error"] == error and out["message"]
    assert events.state() == before


def test_usage_errors_in_text_mode_stay_on_stderr(events):
    result = events.raw("produce", "db.events", "--partition", json_output=False)
    assert result.exit_code == 2 and result.stdout == "" and "--partition" in result.stderr


# --- 2: time travel never answers from history that is gone -------------------------------


def test_i8_unknown_snapshot_is_an_error_not_an_empty_pass(events):
    current = events.state()[0]
    for args in (
        ["validate", "db.events", "--snapshot", "12345"],
        ["validate", "db.events", "--deep", "--snapshot", "12345"],
        ["validate", "db.events", "--check", "producers", "--snapshot", "12345"],
        ["sql", "--table", "db.events", "--snapshot", "12345", "select count(*) from db.events"],
    ):
        out = events(*args, code=2)
        assert out["error"] == "UnknownSnapshot", args
        assert out["table"] == "db.events" and out["snapshot_id"] == 12345
        assert current in out["retained"] and len(out["retained"]) == 4
        assert "12345" in out["message"] and "db.events" in out["message"]
    result = events.raw("validate", "db.events", "--snapshot", "12345", json_output=False)
    assert result.exit_code == 2 and "OK" not in result.stdout and "UnknownSnapshot" in result.stderr


def test_unknown_snapshot_python_api(events):
    from icelog.validations.checks import run_checks
    from icelog.validations.sql import connect, planned_paths

    catalog = events.spec.open()
    table = LogTable.open(catalog, "db.events").table()
    with pytest.raises(UnknownSnapshot):
        run_checks(table, ("contiguity",), 12345)
    with pytest.raises(UnknownSnapshot):
        connect(catalog, only="db.events", snapshot_id=12345)
    with pytest.raises(UnknownSnapshot):
        planned_paths(table, 12345)
    first = table.metadata.snapshots[0].snapshot_id
    assert run_checks(table, ("contiguity",), first).rows == 1


@pytest.fixture
def short_history(catalog_spec):
    """db.events keeping 2 snapshots; 4 appends of one row each: the first two expired."""
    icelog = Cli(catalog_spec)
    LogTable.create(icelog.spec.open(), "db.events", 1, properties={"icelog.snapshots.keep": "2"})
    moments, ids = [], []
    for key in "abcd":
        ids.append(icelog("produce", "db.events", "--partition", "0", input=lines({"key": key}))["snapshot_id"])
        time.sleep(0.02)
        moments.append(dt.datetime.now(dt.UTC).isoformat())
        time.sleep(0.02)
    table = LogTable.open(icelog.spec.open(), "db.events").table()
    assert [s.snapshot_id for s in table.metadata.snapshots] == ids[2:]
    return icelog, ids, moments


def test_i8_time_travel_to_an_expired_snapshot_is_history_expired(short_history):
    icelog, ids, _ = short_history
    for args in (
        ["sql", "--table", "db.events", "--snapshot", str(ids[0]), "select count(*) from db.events"],
        ["validate", "db.events", "--deep", "--snapshot", str(ids[1])],
    ):
        out = icelog(*args, code=2)
        assert out["error"] == "HistoryExpired", out
        assert out["table"] == "db.events" and out["oldest"]
        assert out["oldest"] in out["message"]
    retained = icelog("sql", "--table", "db.events", "--snapshot", str(ids[2]), "select count(*) from db.events")
    assert retained["rows"] == [[3]]


def test_i8_as_of_older_than_retained_history_is_history_expired(short_history):
    icelog, ids, moments = short_history
    for moment in (moments[0], moments[1], "2001-01-01T00:00:00"):
        out = icelog("sql", "--as-of", moment, "select count(*) from db.events", code=2)
        assert out["error"] == "HistoryExpired" and out["table"] == "db.events"
        oldest = dt.datetime.fromisoformat(out["oldest"])
        assert oldest > dt.datetime.fromisoformat(moments[1]) and out["oldest"] in out["message"]
    assert icelog("sql", "--as-of", moments[2], "select count(*) from db.events")["rows"] == [[3]]
    assert icelog("sql", "--as-of", moments[3], "select count(*) from db.events")["rows"] == [[4]]
    assert icelog("sql", "--as-of", "2999-01-01", "select count(*) from db.events")["rows"] == [[4]]


def test_as_of_before_the_first_snapshot_is_the_empty_table(events):
    assert events("sql", "--as-of", "2001-01-01T00:00:00", "select count(*) from db.events")["rows"] == [[0]]
    events("topics", "create", "db.empty", "--partitions", "1")
    assert events("sql", "--as-of", "2999-01-01", "select count(*) from db.empty")["rows"] == [[0]]


def test_snapshot_as_of_sees_an_expired_snapshot_in_the_middle(events):
    """Another tool may expire a middle snapshot; its time is then unanswerable, the rest is not."""
    from pyiceberg.table.update import RemoveSnapshotsUpdate

    from icelog.validations.sql import snapshot_as_of

    catalog = events.spec.open()
    table = LogTable.open(catalog, "db.events").table()
    snaps = table.metadata.snapshots  # 4 snapshots: 1, 2, 3 rows in partition 0, then 1 in partition 1
    catalog.commit_table(table, (), (RemoveSnapshotsUpdate(snapshot_ids=[snaps[1].snapshot_id]),))
    table = LogTable.open(catalog, "db.events").table()
    assert snapshot_as_of(table, snaps[0].timestamp_ms) == snaps[0].snapshot_id
    assert snapshot_as_of(table, snaps[0].timestamp_ms - 10_000) is None
    with pytest.raises(HistoryExpired):
        snapshot_as_of(table, snaps[1].timestamp_ms)
    assert snapshot_as_of(table, snaps[2].timestamp_ms) == snaps[2].snapshot_id
    assert snapshot_as_of(table, snaps[3].timestamp_ms + 10_000) == snaps[3].snapshot_id


@pytest.mark.parametrize("moment", ["yesterday", "2024-13-01", "x" * 10_000])
def test_i8_bad_as_of_exit_2(events, moment):
    out = events("sql", "--as-of", moment, "select 1", code=2)
    assert out["error"] == "InvalidInput" and len(out["message"]) < 200


def test_as_of_at_the_ends_of_time(events):
    assert events("sql", "--as-of", "0001-01-01T00:00:00+01:00", "select count(*) from db.events")["rows"] == [[0]]
    assert events("sql", "--as-of", "9999-12-31T23:59:59-01:00", "select count(*) from db.events")["rows"] == [[4]]


def test_snapshot_and_as_of_together_exit_2(events):
    sid = str(events.state()[0])
    out = events("sql", "--table", "db.events", "--snapshot", sid, "--as-of", "2999-01-01", "select 1", code=2)
    assert out["error"] == "InvalidInput"


# --- 3: malformed JSON Lines on stdin (bytes, real processes) --------------------------------


MALFORMED = [
    (b'{"key": "a"}\n{"key": ' + str(2**64).encode() + b"}\n", 2, "64 bits"),
    (b'{"key": "a"}\n{"key": -' + b"9" * 5000 + b"}\n", 2, "64 bits"),
    (b'{"key": "a"}\n{"key": "\xff\xfe caf\xe9"}\n', 2, "UTF-8"),
    (b'{"key": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", 1, "nested"),
    (b"[" * 100_000 + b"\n", 1, "nested"),
    (b'{"key": "a"}\n\n{"value": 1e999}\n', 3, "overflows"),
    (b'{"key": "\\ud800"}\n', 1, "surrogate"),
]


@pytest.mark.parametrize(
    "data, line, words",
    MALFORMED,
    ids=["int>64bit", "int-5000-digits", "not-utf8", "deep-object", "deep-array", "1e999", "lone-surrogate"],
)
def test_i8_malformed_stdin_is_malformed_input_with_line(events, data, line, words):
    before = events.state()
    done = events.process("--output", "json", "produce", "db.events", "--partition", "0", input=data)
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    out = one_document(done.stdout.decode())
    assert out["error"] == "MalformedInput" and out["line"] == line and words in out["message"]
    assert b"Traceback" not in done.stderr
    assert events.state() == before


def test_i8_malformed_stdin_text_mode_one_line_on_stderr(events):
    done = events.process("produce", "db.events", "--partition", "0", input=b'{"key": "\xff"}\n')
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip().count("\n") == 0 and "line 1" in done.stderr.decode()


def test_produce_accepts_a_utf8_bom_and_crlf(events):
    done = events.process(
        "--output",
        "json",
        "produce",
        "db.events",
        "--partition",
        "1",
        input=b'\xef\xbb\xbf{"key": "caf\xc3\xa9"}\r\n{"key": "b"}\r\n',
    )
    assert done.returncode == 0, done.stderr.decode()
    assert one_document(done.stdout.decode())["next_offset"] == 3
    assert events("sql", "select key from db.events where log_partition = 1 and log_offset = 1")["rows"] == [["café"]]


def test_i8_query_that_is_not_utf8_exit_2(events):
    done = events.process("--output", "json", "sql", b"select '\xff'")
    assert done.returncode == 2 and one_document(done.stdout.decode())["error"] == "InvalidInput"


# --- 4: any unexpected error is exit 4 with a typed document --------------------------------


def _boom(*args, **kwargs):
    raise RuntimeError("boom\nsecond line")


def _describe_fails(monkeypatch) -> None:
    """``topics describe`` fails inside, on the light read and on the full one."""
    monkeypatch.setattr(LogTable, "describe", _boom)
    monkeypatch.setattr("icelog.storage.log.plain_metadata.describe", _boom)


def test_unexpected_error_exit_4_json_document(events, monkeypatch):
    _describe_fails(monkeypatch)
    out = events("topics", "describe", "db.events", code=4)
    assert out == {"error": "RuntimeError", "message": "boom\nsecond line"}


def test_unexpected_error_text_one_line_traceback_only_in_debug(events, monkeypatch):
    _describe_fails(monkeypatch)
    result = events.raw("topics", "describe", "db.events", json_output=False)
    assert result.exit_code == 4 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "RuntimeError: boom second line" in result.stderr
    assert "Traceback" not in result.stderr
    debug = Cli(events.spec, ICELOG_LOG_LEVEL="debug").raw("topics", "describe", "db.events", json_output=False)
    assert debug.exit_code == 4 and "Traceback" in debug.stderr and "_boom" in debug.stderr


def test_unreadable_catalog_exit_4_in_a_real_process(sqlite_spec, tmp_path):
    """A catalog URI naming a directory: SQLAlchemy cannot open it; no traceback, exit 4."""
    from tests.support.catalogs import CatalogSpec

    broken = Cli(CatalogSpec("sqlite", "broken", f"sqlite:///{tmp_path}", sqlite_spec.warehouse))
    done = broken.process("--output", "json", "topics", "list")
    assert done.returncode == 4, done.stderr.decode()[-2000:]
    out = one_document(done.stdout.decode())
    assert out["error"] == "OperationalError" and "unable to open database file" in out["message"]
    assert b"Traceback" not in done.stderr
    text = broken.process("topics", "list")
    assert text.returncode == 4 and text.stdout == b"" and text.stderr.decode().startswith("error: OperationalError")


def _errors():
    from icelog.storage import errors as e

    return [
        (e.OffsetMismatch(table="db.events", partition=0, expected=1, actual=2), 3),
        (e.CommitConflict(table="db.events", attempts=5), 3),
        (e.ForeignCommit(table="db.events", snapshot_id=1, icelog_snapshot_id=2), 3),
        (e.ProducerFenced(table="db.events", producer_id=1, epoch=0, current_epoch=1), 3),
        (e.UnknownProducer(table="db.events", producer_id=1), 2),
        (e.InvalidInput(reason="bad"), 2),
        (e.HistoryExpired(table="db.events", requested="then", oldest=None), 2),
        (e.CatalogUnavailable(table="db.events", reason="busy"), 4),
        (e.CommitOutcomeUnknown(table="db.events", commit_id="c", reason="?"), 4),
        (ValueError("plain"), 4),
        (KeyError("k"), 4),
    ]


@pytest.mark.parametrize("error, code", _errors(), ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
def test_exit_code_follows_the_error_type(events, monkeypatch, error, code):
    def fail(*args, **kwargs):
        raise error

    # The log state is read on both of offsets' paths (the light read on SQLite, and the catalog's).
    monkeypatch.setattr(LogState, "from_properties", fail)
    out = events("offsets", "db.events", code=code)
    assert out["error"] == type(error).__name__ and out["message"]
    if hasattr(error, "fields"):
        assert {k: out[k] for k in error.fields} == json.loads(json.dumps(error.fields))


# --- 5: every column type comes back, from every reader -------------------------------------


TYPES = ["string", "int", "long", "float", "double", "boolean", "date", "timestamp", "timestamptz", "binary"]
ROW = {
    "c_string": "[/x] [bold]not markup[/bold]",
    "c_int": -7,
    "c_long": 2**40,
    "c_float": 1.5,
    "c_double": 2.25,
    "c_boolean": True,
    "c_date": "2024-01-02",
    "c_timestamp": "2024-01-02T03:04:05.123456",
    "c_timestamptz": "2024-01-02T05:04:05+02:00",
    "c_binary": base64.b64encode(b"\x00\xff icelog").decode(),
}
EXPECTED_JSON = {**ROW, "c_timestamptz": "2024-01-02T03:04:05+00:00"}
EXPECTED_PY = {
    "c_string": ROW["c_string"],
    "c_int": -7,
    "c_long": 2**40,
    "c_float": 1.5,
    "c_double": 2.25,
    "c_boolean": True,
    "c_date": dt.date(2024, 1, 2),
    "c_timestamp": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
    "c_timestamptz": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    "c_binary": b"\x00\xff icelog",
}


@pytest.fixture
def typed(icelog, tmp_path):
    schema = tmp_path / "payload.json"
    schema.write_text(json.dumps([{"name": f"c_{t}", "type": t} for t in TYPES]))
    created = icelog("topics", "create", "db.types", "--partitions", "1", "--schema", str(schema))
    assert [(c["name"], c["type"]) for c in created["payload"]] == [(f"c_{t}", t) for t in TYPES]
    icelog("produce", "db.types", "--partition", "0", input=json.dumps(ROW) + "\n" + '{"c_double": NaN, "c_float": -Infinity}\n')
    return icelog


def test_every_type_from_sql_json(typed):
    out = typed("sql", "select * from db.types order by log_offset")
    assert out["columns"][:6] == ["log_partition", "log_offset", "log_timestamp", "producer_id", "producer_epoch", "producer_seq"]
    first, second = (dict(zip(out["columns"], row, strict=False)) for row in out["rows"])
    assert {k: first[k] for k in EXPECTED_JSON} == EXPECTED_JSON
    stamp = dt.datetime.fromisoformat(first["log_timestamp"])
    assert stamp.utcoffset() == dt.timedelta(0) and abs(stamp - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=10)
    assert (first["log_partition"], first["log_offset"], first["producer_id"]) == (0, 0, None)
    assert (second["c_double"], second["c_float"], second["c_string"]) == ("NaN", "-Infinity", None)


def test_every_type_from_sql_text(typed):
    result = typed.raw("sql", "select * from db.types order by log_offset", json_output=False)
    assert result.exit_code == 0, result.stderr
    for column in ["log_timestamp", *(f"c_{t}" for t in TYPES)]:
        assert column in result.stdout
    for value in [
        ROW["c_string"],
        "1099511627776",
        "2024-01-02T03:04:05.123456",
        "2024-01-02T03:04:05+00:00",
        ROW["c_binary"],
        "nan",
        "-inf",
    ]:
        assert value in result.stdout, value


def test_every_type_from_duckdb_and_python_api(typed):
    from icelog.validations.sql import connect

    catalog = typed.spec.open()
    con = connect(catalog)
    cursor = con.execute("select * from db.types order by log_offset")
    names = [d[0] for d in cursor.description]
    first, second = (dict(zip(names, row, strict=False)) for row in cursor.fetchall())
    assert {k: first[k] for k in EXPECTED_PY} == EXPECTED_PY
    assert first["log_timestamp"].utcoffset() == dt.timedelta(0)
    assert math.isnan(second["c_double"]) and second["c_float"] == -math.inf
    rows = LogTable.open(catalog, "db.types").read(0)
    read = rows.to_pylist()[0]
    assert {k: read[k] for k in EXPECTED_PY} == EXPECTED_PY
    assert read["log_offset"] == 0 and read["log_timestamp"].utcoffset() == dt.timedelta(0)


def test_i8_binary_column_takes_base64_only(typed):
    before = typed.state("db.types")
    out = typed("produce", "db.types", "--partition", "0", input=lines({"c_string": "ok"}, {"c_binary": "not base64!"}), code=2)
    assert out["error"] == "MalformedInput" and out["line"] == 2 and "c_binary" in out["message"]
    assert typed.state("db.types") == before


def test_pytz_is_a_declared_dependency_and_pinned_in_the_lock():
    """DuckDB needs pytz to hand back timestamptz values (log_timestamp): the package declares it
    (a range, as every dependency) and the lock pins it."""
    from importlib.metadata import requires

    assert any(r.replace(" ", "").startswith("pytz>=") and "extra" not in r for r in requires("icelog"))
    assert any(line.startswith("pytz==") for line in (ROOT / "requirements.lock").read_text().splitlines())


# --- 7: the README's promises -----------------------------------------------------------------


def test_add_partitions_grows_and_new_partitions_take_rows(events):
    out = events("topics", "add-partitions", "db.events", "--count", "4")
    assert out["partitions"] == 4 and out["offsets"]["3"] == {"start": 0, "end": 0}
    assert (
        events("produce", "db.events", "--partition", "3", "--expected-offset", "0", input=lines({"key": "n"}))["next_offset"]
        == 1
    )
    assert events("offsets", "db.events")["partitions"]["0"] == {"start": 0, "end": 3}
    before = events.state()
    assert events("topics", "add-partitions", "db.events", "--count", "2", code=2)["error"] == "InvalidInput"
    assert events.state() == before
    assert events("topics", "add-partitions", "db.nope", "--count", "2", code=2)["error"] == "UnknownTable"


@pytest.mark.parametrize(
    "content, error",
    [
        (b'[{"name": "n", "type": "long", "required": true}]', None),
        (b'{"fields": [{"name": "n", "type": "double"}]}', None),
        (b"[{not json", "MalformedInput"),
        (b'[{"name": "caf\xe9", "type": "string"}]', "MalformedInput"),
        (b"[" * 100_000, "MalformedInput"),
        (b'[{"name": "n", "type": "decimal"}]', "InvalidInput"),
        (b'[{"name": "n", "type": ["long"]}]', "InvalidInput"),
        (b'[{"name": "log_offset", "type": "long"}]', "InvalidInput"),
        (b"[]", "InvalidInput"),
        (b'"long"', "InvalidInput"),
        (None, "InvalidInput"),
    ],
)
def test_topics_create_with_a_schema_file(icelog, tmp_path, content, error):
    schema = tmp_path / "payload.json"
    if content is not None:
        schema.write_bytes(content)
    out = icelog("topics", "create", "db.typed", "--partitions", "2", "--schema", str(schema), code=2 if error else 0)
    if error:
        assert out["error"] == error
        assert icelog("topics", "list") == {"tables": []}
    else:
        assert [c["name"] for c in out["payload"]] == ["n"] and out["partitions"] == 2


def test_duckdb_shell_reads_stdin(icelog):
    icelog("topics", "create", "t", "--partitions", "1")
    icelog("produce", "t", "--partition", "0", input=lines({"key": "a"}, {"key": "b"}))
    done = icelog.process("duckdb", input=b"select count(*) as n from logs.t;\nselect max(log_offset)\n  as last from logs.t;\n")
    assert done.returncode == 0, done.stderr.decode()
    assert "duckdb>" not in done.stdout.decode() and " 2 " in done.stdout.decode() and " 1 " in done.stdout.decode()
    done = icelog.process(
        "--output", "json", "duckdb", input=b"select count(*) as n from logs.t;\nselect nope from logs.t;\nselect 7 as x"
    )
    assert done.returncode == 2
    out = one_document(done.stdout.decode())["results"]
    assert out[0] == {"statement": "select count(*) as n from logs.t;", "columns": ["n"], "rows": [[2]]}
    assert out[1]["error"] == "BinderException" and "nope" in out[1]["message"]
    assert out[2]["rows"] == [[7]]


def test_maintain_retention_ms_moves_the_log_start(events):
    time.sleep(0.05)
    cut = time.time()  # every row so far is older; "d" is 2 s younger
    time.sleep(2)
    events("produce", "db.events", "--partition", "0", input=lines({"key": "d"}))
    retention_ms = int((time.time() - cut) * 1000)
    report = events("maintain", "db.events", "--retention-ms", str(retention_ms), "--orphan-age-s", "0")
    assert report["retention"]["log_start"] == {"0": 3, "1": 1}
    assert events("offsets", "db.events")["partitions"] == {"0": {"start": 3, "end": 4}, "1": {"start": 1, "end": 1}}
    assert events("sql", "select log_offset, key from db.events")["rows"] == [[3, "d"]]
    assert events("validate", "db.events", "--deep")["ok"] is True
    assert events("produce", "db.events", "--partition", "1", input=lines({"key": "y"}))["base_offset"] == 1


def test_maintain_retention_bytes_moves_the_log_start(events):
    report = events("maintain", "db.events", "--retention-bytes", "1", "--orphan-age-s", "0")
    assert report["retention"]["log_start"] == {"0": 2}
    assert events("offsets", "db.events")["partitions"] == {"0": {"start": 2, "end": 3}, "1": {"start": 0, "end": 1}}
    assert events("validate", "db.events", "--deep")["ok"] is True
    assert (
        events("produce", "db.events", "--partition", "0", "--expected-offset", "3", input=lines({"key": "d"}))["base_offset"]
        == 3
    )


def test_bare_table_names_go_to_namespace_logs(icelog):
    assert icelog("topics", "create", "t", "--partitions", "1")["table"] == "logs.t"
    assert icelog("topics", "list") == {"tables": ["logs.t"]}
    assert icelog("produce", "t", "--partition", "0", input=lines({"key": "a"}))["table"] == "logs.t"
    assert icelog("offsets", "t")["table"] == "logs.t"
    assert icelog("topics", "describe", "t")["table"] == "logs.t"
    assert icelog("sql", "select count(*) from logs.t")["rows"] == [[1]]
    assert icelog("sql", "--table", "t", "select count(*) from logs.t")["rows"] == [[1]]
    assert icelog("validate", "t")["table"] == "logs.t"
    producer = icelog("producers", "init", "t")
    assert icelog("producers", "list", "t")["table"] == "logs.t"
    assert icelog("producers", "rebuild", "t")["table"] == "logs.t"
    assert isinstance(producer["producer_id"], int)
    assert icelog("sql", "--table", "logs.nope", "select 1", code=2)["error"] == "UnknownTable"
    assert icelog("sql", "--table", "a.b.c", "select 1", code=2)["error"] == "InvalidIdentifier"


# --- 8: one JSON document per command, errors included ----------------------------------------


def test_every_command_prints_one_json_document(events, tmp_path):
    sid = str(events.state()[0])
    commands = [
        (["topics", "list"], None, 0),
        (["topics", "describe", "db.events"], None, 0),
        (["topics", "create", "db.second", "--partitions", "1"], None, 0),
        (["topics", "add-partitions", "db.second", "--count", "2"], None, 0),
        (["produce", "db.second", "--partition", "1"], lines({"key": "a"}), 0),
        (["offsets", "db.second"], None, 0),
        (["producers", "init", "db.second", "--client-id", "c"], None, 0),
        (["producers", "list", "db.second"], None, 0),
        (["producers", "rebuild", "db.second"], None, 0),
        (["validate", "db.events", "--deep", "--check", "contiguity-deep", "--check", "producers"], None, 0),
        (["validate", "db.events", "--snapshot", sid], None, 0),
        (["sql", "select * from db.events"], None, 0),
        (["duckdb"], "select 1;\n", 0),
        (["report", "db.events", "--no-gx", "--out", str(tmp_path / "report")], None, 0),
        (["maintain", "db.second", "--orphan-age-s", "0"], None, 0),
        (["offsets", "db.nope"], None, 2),
        (["sql", "select * from db.nope"], None, 2),
        (["produce", "db.events", "--partition", "0", "--expected-offset", "0"], lines({"key": "x"}), 3),
        (["produce", "db.events", "--partition", "0"], "", 2),
        (["validate", "db.events", "--check", "nope"], None, 2),
        (["topics", "nope"], None, 2),
    ]
    for args, stdin, code in commands:
        result = events.raw(*args, input=stdin)
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        doc = one_document(result.stdout)
        assert isinstance(doc, dict), args
        assert ("error" in doc) == (code != 0), (args, doc)


# --- small seams: typed errors before anything is read or written -------------------------------


def test_i8_ingest_of_a_missing_source_exits_2_before_spark(events, tmp_path):
    before = events.state()
    for missing in (tmp_path / "no-such-folder", tmp_path / "landing" / "*.parquet"):
        err = events("ingest", "db.events", str(missing), code=2)
        assert err["error"] == "InvalidInput" and str(missing) in err["message"]
    assert events.state() == before


def _staged_like_spark(spec, table: str) -> None:
    """Commit a data file that sits in a ``p=0`` folder, as the Spark ingest job leaves them."""
    import pyarrow.parquet as pq

    from icelog.storage.log import schema as cols
    from icelog.storage.log.files import local_path, with_key_hash
    from icelog.storage.log.table import with_system_columns

    log_table = LogTable.create(spec.open(), table, 1)
    iceberg = log_table.table()
    rows = with_system_columns(log_table.conform({0: [{"key": "k", "value": "v"}]})[0], 0, 0, 0, None, None)
    rows = with_key_hash(rows, cols.key_column(iceberg.schema(), iceberg.metadata.properties))
    folder = Path(local_path(iceberg.location())) / "data" / "p=0"
    folder.mkdir(parents=True)
    pq.write_table(rows.cast(iceberg.schema().as_arrow()), folder / "part-0.parquet")
    log_table.commit_files({0: [str(folder / "part-0.parquet")]}, {0: 0})


def test_i8_sql_shows_the_tables_columns_not_folder_names(icelog, sqlite_spec):
    _staged_like_spark(sqlite_spec, "db.staged")
    out = icelog("sql", "select * from db.staged")
    assert "p" not in out["columns"]
    assert out["columns"] == [f.name for f in LogTable.open(sqlite_spec.open(), "db.staged").table().schema().fields]


# --- a foreign partition spec: produce refused (exit 3, nothing written), repair sets it back -----


def test_i8_produce_under_a_foreign_partition_spec_exits_3_and_repair_says_what_it_did(events, sqlite_spec):
    from pyiceberg.transforms import BucketTransform

    table = sqlite_spec.open().load_table("db.events")
    with table.update_spec() as update:
        update.add_field("key", BucketTransform(4), "key_bucket")
    before = events.state()
    error = events("produce", "db.events", "--partition", "0", input=lines({"key": "d"}), code=3)
    assert error["error"] == "ForeignPartitionSpec" and error["spec_id"] == 1 and "icelog repair db.events" in error["message"]
    assert events.state() == before
    text = events.raw("repair", "db.events", json_output=False)
    assert text.exit_code == 0 and "default partition spec set back from 1" in text.stdout, text.stdout
    events("produce", "db.events", "--partition", "0", input=lines({"key": "d"}))


# --- times beyond any date, keys that are not text: exit 2, typed, nothing changed -----------

TIME_COMMANDS = [
    ["offsets", "db.events", "--at"],
    ["consume", "db.events", "--max-records", "1", "--from-time"],
    ["groups", "reset", "db.events", "--group", "g", "--to-datetime"],
]
BAD_TIMES = [
    str(10**30),  # epoch ms past year 9999
    "253402300800000",  # the first millisecond of year 10000
    "9" * 5000,
    "1e30",
    "-5",
    "-1",
    "0001-01-01T00:00:00+05:00",  # before year 1 in UTC
]


@pytest.mark.parametrize("time_text", BAD_TIMES, ids=lambda t: t[:24])
@pytest.mark.parametrize("command", TIME_COMMANDS, ids=lambda c: c[0] if c[0] != "groups" else "groups reset")
def test_i8_a_time_beyond_any_date_exits_2_and_changes_nothing(events, command, time_text):
    before, groups = events.state(), events("groups", "list")
    out = events(*command, time_text, code=2)
    assert out["error"] == "BadParameter" and out["param"] in ("at_us", "from_us", "to_time_us"), out
    assert "Traceback" not in out["message"] and len(out["message"]) < 300
    assert events.state() == before and events("groups", "list") == groups


def test_the_last_date_is_a_time_the_offsets_answer_for(events):
    out = events("offsets", "db.events", "--at", "253402300799999")  # 9999-12-31T23:59:59.999Z
    assert out["at"].startswith("9999-12-31T23:59:59.999") and out["partitions"]["0"] == {"offset": 3, "timestamp": None}


@pytest.mark.parametrize("after_text", [False, True], ids=["alone", "after-a-text-key"])
@pytest.mark.parametrize(
    "key",
    [{"a": 1}, {}, [1, 2], [], [{"k": "v"}], {"a": [1]}],
    ids=["object", "empty-object", "list", "empty-list", "list-of-objects", "nested"],
)
def test_i8_a_key_that_is_not_text_exits_2_when_routed_by_key(events, key, after_text):
    before = events.state()
    rows = [{"key": "fine"}, {"key": key}] if after_text else [{"key": key}]
    out = events("produce", "db.events", input=lines(*rows), code=2)
    assert out["error"] == "SchemaMismatch" and "column 'key'" in out["message"], out
    assert events.state() == before  # nothing of the batch is written

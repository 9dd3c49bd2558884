"""The icelog CLI: JSON shapes, exit codes (0 ok, 1 violations, 2 bad input, 3 conflict)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from icelog.pipelines.cli import cli
from icelog.storage.log.table import LogTable
from tests.support.planting import plant


@pytest.fixture
def run(catalog_spec):
    runner = CliRunner()
    env = catalog_spec.env()

    def invoke(*args: str, input: str | None = None, code: int = 0) -> dict | str:
        result = runner.invoke(cli, ["--output", "json", *args], input=input, env=env, catch_exceptions=False)
        assert result.exit_code == code, result.output
        out = result.stdout.strip()
        return json.loads(out.splitlines()[-1]) if out else ""

    return invoke


def lines(*rows: dict) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_topics_produce_offsets_validate_sql(run, tmp_path):
    created = run("topics", "create", "db.events", "--partitions", "3")
    assert created["partitions"] == 3
    assert run("topics", "list") == {"tables": ["db.events"]}
    out = run(
        "produce",
        "db.events",
        "--partition",
        "1",
        "--expected-offset",
        "0",
        input=lines({"key": "a", "value": "1"}, {"key": "b"}),
    )
    assert out == {
        "table": "db.events",
        "partition": 1,
        "base_offset": 0,
        "next_offset": 2,
        "rows": 2,
        "batches": 1,
        "resumed_lines": 0,
        "snapshot_id": out["snapshot_id"],
    }
    assert isinstance(out["snapshot_id"], int)
    file = tmp_path / "rows.jsonl"
    file.write_text(lines({"key": "c"}))
    assert run("produce", "db.events", "--partition", "1", "--input", str(file))["base_offset"] == 2
    assert run("offsets", "db.events") == {
        "table": "db.events",
        "partitions": {"0": {"start": 0, "end": 0}, "1": {"start": 0, "end": 3}, "2": {"start": 0, "end": 0}},
    }
    assert run("validate", "db.events")["ok"] is True
    assert run("validate", "db.events", "--deep")["violations"] == []
    assert run("sql", "select count(*) as n, max(log_offset) from db.events") == {
        "columns": ["n", "max(log_offset)"],
        "rows": [[3, 2]],
    }
    described = run("topics", "describe", "db.events")
    assert described["offsets"]["1"] == {"start": 0, "end": 3}
    assert [c["name"] for c in described["payload"]] == ["key", "value"]


@pytest.mark.parametrize("query", ["show tables", "SHOW TABLES;", "  show   tables ; "])
def test_sql_show_tables_lists_the_log_tables(run, query):
    run("topics", "create", "db.events", "--partitions", "1")
    run("topics", "create", "logs.clicks", "--partitions", "1")
    assert run("sql", query) == {"columns": ["name"], "rows": [["db.events"], ["logs.clicks"]]}


def test_conflict_exit_code_3_with_error_json(run):
    run("topics", "create", "db.events", "--partitions", "1")
    run("produce", "db.events", "--partition", "0", input=lines({"key": "a"}))
    err = run("produce", "db.events", "--partition", "0", "--expected-offset", "0", input=lines({"key": "b"}), code=3)
    assert err["error"] == "OffsetMismatch" and err["expected"] == 0 and err["actual"] == 1 and err["partition"] == 0
    assert run("offsets", "db.events")["partitions"]["0"]["end"] == 1


@pytest.mark.parametrize(
    "args, stdin, error",
    [
        (["--partition", "7"], lines({"key": "a"}), "UnknownPartition"),
        (["--partition", "0", "--expected-offset", "-1"], lines({"key": "a"}), "BadParameter"),  # click.IntRange
        (["--partition", "0"], "", "EmptyBatch"),
        (["--partition", "0"], '{"key": "a"}\n{not json\n', "MalformedInput"),
        (["--partition", "0"], '["a", "b"]\n', "MalformedInput"),
        (["--partition", "0"], lines({"key": 1}), "SchemaMismatch"),
        (["--partition", "0"], lines({"colour": "red"}), "SchemaMismatch"),
        (["--partition", "0", "--producer-id", "1"], lines({"key": "a"}), "InvalidInput"),
    ],
)
def test_i8_bad_produce_input_exit_2_table_unchanged(run, args, stdin, error):
    run("topics", "create", "db.events", "--partitions", "1")
    run("produce", "db.events", "--partition", "0", input=lines({"key": "seed"}))
    before = run("offsets", "db.events")
    out = run("produce", "db.events", *args, input=stdin, code=2)
    assert out["error"] == error and out["message"]
    assert run("offsets", "db.events") == before


@pytest.mark.parametrize("name", ["db.e'v", "db.e;drop table x", "db/evil.t", "a.b.c"])
def test_i8_bad_identifiers_exit_2(run, name):
    out = run("topics", "create", name, "--partitions", "1", code=2)
    assert out["error"] == "InvalidIdentifier"
    assert run("topics", "list") == {"tables": []}


def test_unknown_table_and_bad_sql_exit_2(run):
    assert run("offsets", "db.nope", code=2)["error"] == "UnknownTable"
    run("topics", "create", "db.events", "--partitions", "1")
    assert run("sql", "select * from db.nope", code=2)["error"] == "InvalidInput"


def test_validate_exit_1_on_violation(run, catalog_spec, tmp_path):
    run("topics", "create", "db.events", "--partitions", "1")
    run("produce", "db.events", "--partition", "0", input=lines({"key": "a"}))
    plant(LogTable(catalog_spec.open(), "db.events"), 0, [5])
    report = run("validate", "db.events", "--deep", code=1)
    assert report["ok"] is False
    gap = report["violations"][0]
    assert (gap["kind"], gap["partition"], gap["first"], gap["last"]) == ("gap", 0, 1, 4)
    # `icelog report` gives the same verdict: the gate failed, exit 1, as the Airflow task fails.
    out = run("report", "db.events", "--out", str(tmp_path / "r"), "--no-gx", code=1)
    assert out["ok"] is False


def test_maintain_reports_and_keeps_offsets(run):
    run("topics", "create", "db.events", "--partitions", "1")
    for i in range(10):
        run("produce", "db.events", "--partition", "0", input=lines({"key": str(i)}))
    report = run("maintain", "db.events", "--keep-snapshots", "2", "--orphan-age-s", "0")
    assert report["compaction"]["rewritten_files"] == 10
    assert run("validate", "db.events", "--deep")["ok"] is True
    assert run("sql", "select list(key order by log_offset) from db.events")["rows"] == [[[str(i) for i in range(10)]]]


def test_console_script_text_output_and_usage_error(catalog_spec, tmp_path):
    exe = [sys.executable, "-m", "icelog.pipelines.cli"]
    env = catalog_spec.env()
    done = subprocess.run([*exe, "topics", "create", "db.events", "--partitions", "2"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "created db.events" in done.stdout
    usage = subprocess.run([*exe, "produce", "db.events", "--partition"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "--partition" in usage.stderr


def test_producers_cli_idempotent_produce_and_fencing(run):
    run("topics", "create", "db.events", "--partitions", "2")
    first = run("producers", "init", "db.events", "--client-id", "app")
    assert first == {"producer_id": first["producer_id"], "epoch": 0}
    args = [
        "produce",
        "db.events",
        "--partition",
        "1",
        "--producer-id",
        str(first["producer_id"]),
        "--epoch",
        "0",
        "--sequence",
        "0",
    ]
    out = run(*args, input=lines({"key": "a"}, {"key": "b"}))
    assert (out["base_offset"], out["next_offset"], out["duplicate"]) == (0, 2, False)
    again = run(*args, input=lines({"key": "a"}, {"key": "b"}))
    assert (again["base_offset"], again["next_offset"], again["duplicate"]) == (0, 2, True)
    second = run("producers", "init", "db.events", "--client-id", "app")
    assert second == {"producer_id": first["producer_id"], "epoch": 1}
    fenced = run(*args[:-1], "2", input=lines({"key": "c"}), code=3)
    assert fenced["error"] == "ProducerFenced" and fenced["current_epoch"] == 1
    gap = run(
        "produce",
        "db.events",
        "--partition",
        "1",
        "--producer-id",
        str(first["producer_id"]),
        "--epoch",
        "1",
        "--sequence",
        "4",
        input=lines({"key": "c"}),
        code=2,
    )
    assert gap["error"] == "OutOfOrderSequence" and gap["expected"] == 0
    listed = run("producers", "list", "db.events")["producers"]
    assert listed[str(first["producer_id"])]["epoch"] == 1
    assert run("producers", "rebuild", "db.events")["producers"][str(first["producer_id"])]["client"] == "app"
    assert run("offsets", "db.events")["partitions"]["1"] == {"start": 0, "end": 2}


def test_validate_checks_time_travel_and_report(run, catalog_spec, tmp_path):
    run("topics", "create", "db.events", "--partitions", "1")
    first = run("produce", "db.events", "--partition", "0", input=lines({"key": "a"}))
    run("produce", "db.events", "--partition", "0", input=lines({"key": "b"}, {"key": "c"}))
    both = run("validate", "db.events", "--check", "contiguity-deep", "--check", "producers")
    assert both["ok"] and both["checks"] == ["contiguity-deep", "watermark", "producer-sequences", "producer-state"]
    assert run("validate", "db.events", "--check", "nope", code=2)["error"] == "BadParameter"  # a choice of the registry
    old = run("validate", "db.events", "--deep", "--snapshot", str(first["snapshot_id"]))
    assert old["ok"] and old["rows"] == 1
    assert run("sql", "--table", "db.events", "--snapshot", str(first["snapshot_id"]), "select count(*) from db.events")[
        "rows"
    ] == [[1]]
    assert run("sql", "--as-of", "2001-01-01T00:00:00", "select count(*) from db.events")["rows"] == [[0]]
    assert run("sql", "--as-of", "2999-01-01", "select count(*) from db.events")["rows"] == [[3]]
    assert run("sql", "--as-of", "yesterday", "select 1", code=2)["error"] == "InvalidInput"
    out = run("report", "db.events", "--out", str(tmp_path / "r"), "--no-gx")
    assert out["ok"] and (tmp_path / "r" / "index.html").exists()

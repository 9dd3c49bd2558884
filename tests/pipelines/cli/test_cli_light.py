"""The read-only commands' light path (the catalog's pointer and the metadata JSON, without
pyiceberg's catalogs) answers byte for byte what the full read answers, on SQLite, PostgreSQL
(local and S3 warehouse) and a REST catalog (SeaweedFS), in text and JSON; and where it cannot,
the full read names the error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from icelog.storage.groups.offsets import commit_offsets, commit_ranges
from icelog.storage.log.table import LogTable
from tests.support.cli import Cli

LIGHT_COMMANDS = [
    ("offsets", "db.events"),
    ("offsets", "db.empty"),
    ("snapshots", "db.events"),
    ("snapshots", "db.events", "--limit", "1"),
    ("snapshots", "db.empty"),
    ("topics", "describe", "db.events"),
    ("topics", "describe", "db.events", "--all-properties"),
    ("topics", "describe", "db.empty"),
    ("topics", "list"),
    ("groups", "describe", "--group", "g"),
    ("groups", "describe", "--group", "nobody"),
]


@pytest.fixture(params=["sqlite_spec", "postgres_spec", "rest_spec", "lakehouse"])
def spec(request):
    """SQLite, PostgreSQL and REST (metadata in its answer), and PostgreSQL with its metadata files on S3."""
    return request.getfixturevalue(request.param)


def tables(spec) -> None:
    catalog = spec.open()
    columns = [
        {"name": "key", "type": "string"},
        {"name": "amount", "type": "double", "required": True},
        {"name": "at", "type": "timestamptz"},
    ]
    events = LogTable.create(catalog, "db.events", 3, columns)
    events.append({0: [{"key": "a", "amount": 1.5, "at": None}], 2: [{"key": "b", "amount": 2.0, "at": None}]})
    events.append({1: [{"key": "c", "amount": 3.0, "at": None}]})
    LogTable.create(catalog, "db.empty", 1)
    catalog.create_table("db.plain", schema=events.table().schema())  # not a log table
    commit_offsets(catalog, "g", {("db.events", 0): 1})
    commit_ranges(catalog, "g", {("db.events", 2): [(0, 0)], ("db.events", 1): [(0, 0)]})


def light_only(monkeypatch):
    """The catalog is never opened: the command answered from the light read alone."""

    def refuse(*args, **kwargs):
        raise AssertionError("the full read ran")

    monkeypatch.setattr("icelog.storage.core.catalog.open_catalog", refuse)


def full_only(monkeypatch):
    """The light reads never apply: every command reads through pyiceberg's catalog."""
    monkeypatch.setattr("icelog.storage.core.pointer.current_metadata", lambda *a, **k: None)
    monkeypatch.setattr("icelog.storage.core.pointer.table_names", lambda *a, **k: None)


def outputs(spec, args) -> dict[str, tuple[int, str, str]]:
    cli = Cli(spec, COLUMNS="200")
    found = {}
    for mode in ("text", "json"):
        result = cli.raw("--output", mode, *args, json_output=False)
        found[mode] = (result.exit_code, result.stdout, result.stderr)
    return found


def test_the_light_path_answers_as_the_full_read_does(spec, monkeypatch):
    tables(spec)
    monkeypatch.setattr("time.time", lambda: 1_800_000_000.0)  # groups describe shows ages: one clock for both
    light, full = {}, {}
    with monkeypatch.context() as patch:
        light_only(patch)
        for args in LIGHT_COMMANDS:
            light[args] = outputs(spec, args)
    with monkeypatch.context() as patch:
        full_only(patch)
        for args in LIGHT_COMMANDS:
            full[args] = outputs(spec, args)
    for args in LIGHT_COMMANDS:
        assert light[args] == full[args], args
        assert light[args]["json"][0] == 0 and json.loads(light[args]["json"][1]) is not None, args
    assert json.loads(light[("topics", "list")]["json"][1]) == {"tables": ["db.empty", "db.events"]}
    described = json.loads(light[("topics", "describe", "db.events")]["json"][1])
    assert described["offsets"] == {"0": {"start": 0, "end": 1}, "1": {"start": 0, "end": 1}, "2": {"start": 0, "end": 1}}
    assert [c["type"] for c in described["payload"]] == ["string", "double", "timestamptz"]
    assert len(json.loads(light[("snapshots", "db.events")]["json"][1])) == described["snapshots"] >= 2
    group = json.loads(light[("groups", "describe", "--group", "g")]["json"][1])
    assert [(e["partition"], e["committed_offset"]) for e in group["partitions"]] == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize(
    "args, error",
    [
        (("offsets", "db.missing"), "UnknownTable"),
        (("snapshots", "db.missing"), "UnknownTable"),
        (("topics", "describe", "db.missing"), "UnknownTable"),
        (("offsets", "db.plain"), "NotALogTable"),
        (("topics", "describe", "db.plain"), "NotALogTable"),
        (("snapshots", "bad name!"), "InvalidIdentifier"),
    ],
)
def test_where_the_light_read_finds_no_log_table_the_full_read_names_the_error(spec, args, error):
    tables(spec)
    result = Cli(spec).raw(*args)
    assert result.exit_code == 2 and json.loads(result.stdout)["error"] == error, (result.stdout, result.stderr)


def test_errors_the_light_path_meets_are_the_full_reads(sqlite_spec, monkeypatch):
    """A missing metadata file, a missing table, a catalog name nobody configured: the same
    output and exit code whether the light read is tried first or not."""
    from pathlib import Path
    from urllib.parse import urlsplit

    tables(sqlite_spec)
    broken = LogTable.open(sqlite_spec.open(), "db.empty").table().metadata_location
    Path(urlsplit(broken).path).unlink()
    cases = [
        ("offsets", "db.empty"),
        ("topics", "describe", "db.empty"),
        ("snapshots", "db.missing"),
        ("groups", "describe", "--group", "g"),
        ("--catalog", "nowhere", "offsets", "db.events"),
        ("--catalog", "nowhere", "topics", "list"),
    ]
    tried = {args: outputs(sqlite_spec, args) for args in cases}
    with monkeypatch.context() as patch:
        full_only(patch)
        full = {args: outputs(sqlite_spec, args) for args in cases}
    for args in cases:
        assert tried[args] == full[args], args
    assert tried[cases[0]]["json"][0] != 0 and tried[cases[-1]]["json"][0] == 2
    assert json.loads(tried[cases[-1]]["json"][1])["error"] == "CatalogNotConfigured"
    assert json.loads(tried[cases[3]]["json"][1])["group"] == "g"  # db.empty is none of the group's tables


HEAVY = ("pyarrow", "pandas", "sqlalchemy", "requests", "botocore", "pyiceberg.catalog", "pyiceberg.table", "pyiceberg.io")
CHECK_IMPORTS = f"""
import json, sys
from icelog.pipelines.cli import main
sys.argv = ["icelog"] + sys.argv[1:]
try:
    main()
except SystemExit:
    pass
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)
"""


def test_the_light_commands_import_no_catalog_client_table_layer_or_arrow(spec):
    tables(spec)
    cli = Cli(spec)
    for args in [("offsets", "db.events"), ("topics", "describe", "db.events"), ("groups", "describe", "--group", "g")]:
        for mode in ("text", "json"):
            out = subprocess.run(
                [sys.executable, "-c", CHECK_IMPORTS, "--output", mode, *args],
                env=cli.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, (args, out.stderr)
            assert json.loads(out.stderr.strip().splitlines()[-1]) == [], (args, mode)

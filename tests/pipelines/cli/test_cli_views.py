"""``icelog snapshots``, ``files``, ``schema``, ``catalog`` and ``sql --format``: read-only views,
in text and JSON, on a real SQLite catalog; reads create nothing."""

from __future__ import annotations

import csv
import io
import json
import os
import shlex

import pytest

from icelog.storage.log.schema import SYSTEM_COLUMNS
from tests.support.cli import Cli


def lines(*rows: dict) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


@pytest.fixture
def events(icelog: Cli) -> Cli:
    """db.events with two partitions and three appends: 1 row to p0, 2 rows to p1, 1 more to p0."""
    icelog("topics", "create", "db.events", "--partitions", "2")
    icelog("produce", "db.events", "--partition", "0", input=lines({"key": "a", "value": "1"}))
    icelog("produce", "db.events", "--partition", "1", input=lines({"key": "b"}, {"key": "c", "value": "3"}))
    icelog("produce", "db.events", "--partition", "0", input=lines({"key": "d", "value": "4"}))
    return icelog


def text(cli: Cli, *args: str) -> str:
    result = cli.raw(*args, json_output=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_snapshots_lists_every_append_newest_last_with_its_icelog_commit_id(events):
    snaps = events("snapshots", "db.events")
    assert [s["records_added"] for s in snaps] == [1, 2, 1]
    assert [s["operation"] for s in snaps] == ["append"] * 3
    assert snaps[0]["parent_id"] is None
    assert [s["parent_id"] for s in snaps[1:]] == [s["snapshot_id"] for s in snaps[:-1]]
    assert all(s["commit_id"] for s in snaps) and len({s["commit_id"] for s in snaps}) == 3
    assert all(s["committed_at"].endswith("+00:00") for s in snaps)
    assert [s["committed_at"] for s in snaps] == sorted(s["committed_at"] for s in snaps)
    described = events("topics", "describe", "db.events")
    assert snaps[-1]["snapshot_id"] == described["snapshot_id"]

    assert events("snapshots", "db.events", "--limit", "2") == snaps[-2:]
    out = text(events, "snapshots", "db.events")
    assert "commit id" in out and snaps[-1]["commit_id"] in out and str(snaps[0]["snapshot_id"]) in out


def test_files_gives_each_current_file_its_partition_and_offsets(events):
    files = events("files", "db.events")
    assert [(f["partition"], f["first_offset"], f["last_offset"], f["records"]) for f in files] == [
        (0, 0, 0, 1),
        (0, 1, 1, 1),
        (1, 0, 1, 2),
    ]
    assert all(f["path"].endswith(".parquet") and f["bytes"] > 0 for f in files)
    out = text(events, "files", "db.events")
    assert "first offset" in out and files[-1]["path"] in out


def test_schema_marks_the_system_columns(events):
    fields = events("schema", "db.events")
    by_name = {f["name"]: f for f in fields}
    assert by_name["key"] == {"id": by_name["key"]["id"], "name": "key", "type": "string", "required": False, "system": False}
    assert by_name["log_offset"]["type"] == "long" and by_name["log_offset"]["required"] is True
    assert {f["name"] for f in fields if f["system"]} == set(SYSTEM_COLUMNS) & set(by_name)
    assert len({f["id"] for f in fields}) == len(fields)
    out = text(events, "schema", "db.events")
    assert "log_partition" in out and "system" in out


def test_catalog_names_the_catalog_in_use_without_opening_it(icelog, sqlite_spec):
    doc = icelog("catalog")
    assert doc["name"] == sqlite_spec.name and doc["type"] == "sql"
    assert doc["uri"] == sqlite_spec.uri and doc["warehouse"] == sqlite_spec.warehouse
    assert doc["embedded"] is False and doc["icelog_home"]
    assert f"uri          {sqlite_spec.uri}" in text(icelog, "catalog")


def test_catalog_masks_the_password_and_does_not_connect(sqlite_spec):
    pg = Cli(
        sqlite_spec,
        PYICEBERG_CATALOG__PG__URI="postgresql+psycopg2://icelog:s3cret@db.invalid:5432/catalog",
        PYICEBERG_CATALOG__PG__WAREHOUSE="s3://bucket/wh",
    )
    result = pg.raw("catalog", "--catalog", "pg")
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["uri"] == "postgresql+psycopg2://icelog:****@db.invalid:5432/catalog"
    assert doc["warehouse"] == "s3://bucket/wh" and doc["type"] == "sql"
    assert "s3cret" not in result.stdout


def test_catalog_prints_its_pyiceberg_configuration_to_paste_secrets_masked(sqlite_spec, monkeypatch):
    """``--format yaml`` and ``env`` give what pyiceberg reads back as the same catalog (secrets
    masked: an operator fills them in)."""
    import yaml
    from pyiceberg.utils.config import Config

    config = {
        "PYICEBERG_CATALOG__LAKE__URI": "http://127.0.0.1:8181",
        "PYICEBERG_CATALOG__LAKE__WAREHOUSE": "s3://bucket/wh",
        "PYICEBERG_CATALOG__LAKE__S3__ENDPOINT": "http://127.0.0.1:8333",
        "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": "hunter2",
        "PYICEBERG_CATALOG__LAKE__REST__SIGNING_REGION": "eu-west-1",
    }
    lake = Cli(sqlite_spec, **config)
    doc = lake("catalog", "--catalog", "lake")
    expected = {
        "type": "rest",
        "uri": "http://127.0.0.1:8181",
        "warehouse": "s3://bucket/wh",
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.secret-access-key": "****",
        "rest.signing-region": "eu-west-1",
    }
    assert doc["pyiceberg"] == expected
    pasted = yaml.safe_load(text(lake, "catalog", "--catalog", "lake", "--format", "yaml"))
    assert pasted == {"catalog": {"lake": expected}}
    env_lines = text(lake, "catalog", "--catalog", "lake", "--format", "env").splitlines()
    for key in [k for k in os.environ if k.startswith("PYICEBERG_")]:
        monkeypatch.delenv(key)
    for line in env_lines:  # as a shell would read them
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, shlex.split(value)[0])
    assert Config().get_catalog_config("lake") == expected
    assert "hunter2" not in str(env_lines) + str(doc)


def test_catalog_embedded_creates_nothing_under_icelog_home(sqlite_spec, tmp_path):
    home = tmp_path / "home"
    embedded = Cli(sqlite_spec, ICELOG_HOME=str(home))
    embedded.env["ICELOG_CATALOG"] = None  # CliRunner unsets it
    doc = embedded("catalog")
    assert doc["name"] == "icelog" and doc["embedded"] is True
    assert doc["uri"] == f"sqlite:///{home / 'catalog.db'}" and doc["icelog_home"] == str(home)
    assert not home.exists()


def test_catalog_not_configured_is_a_typed_error(icelog):
    err = icelog("catalog", "--catalog", "nowhere", code=2)
    assert err["error"] == "CatalogNotConfigured"


@pytest.mark.parametrize("command", ["snapshots", "files", "schema"])
def test_an_unknown_table_is_unknown_table_exit_2_and_creates_nothing(events, sqlite_spec, command):
    before = sqlite_spec.open().list_namespaces()
    err = events(command, "nosuch.t", code=2)
    assert err["error"] == "UnknownTable" and err["table"] == "nosuch.t"
    result = events.raw(command, "nosuch.t", json_output=False)
    assert result.exit_code == 2 and "UnknownTable" in result.stderr
    assert sqlite_spec.open().list_namespaces() == before
    assert ("nosuch",) not in before and ("icelog_system",) not in before


def test_sql_format_csv_and_json(events):
    query = "select log_partition, log_offset, key, value from db.events order by 1, 2"
    out = text(events, "sql", "--format", "csv", query)
    assert list(csv.reader(io.StringIO(out))) == [
        ["log_partition", "log_offset", "key", "value"],
        ["0", "0", "a", "1"],
        ["0", "1", "d", "4"],
        ["1", "0", "b", ""],
        ["1", "1", "c", "3"],
    ]
    rows = json.loads(text(events, "sql", "--format", "json", query))
    assert rows[2] == {"log_partition": 1, "log_offset": 0, "key": "b", "value": None} and len(rows) == 4
    assert "┃" in text(events, "sql", query)  # table stays the default
    # --output json keeps its one document whatever --format says
    assert events("sql", "--format", "csv", query)["columns"] == ["log_partition", "log_offset", "key", "value"]

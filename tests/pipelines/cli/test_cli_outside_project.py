"""``icelog`` started outside a project: a read creates nothing, and says which catalog
and home it looked for and how to configure one; a write creates the home, as before.

The real CLI runs in a fresh interpreter, in an empty folder outside the repository, with no
ICELOG_* or PYICEBERG_CATALOG__* variables and the tests' isolated PYICEBERG_HOME (so neither
~/.pyiceberg.yaml nor the repository's configuration can supply a catalog).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from icelog.pipelines.cli import cli
from tests.support.cli import ROOT

# Reads, and a write that needs a table: none may leave anything behind.
READS = [
    (["topics", "list"], None),
    (["topics", "describe", "t"], None),
    (["offsets", "t"], None),
    (["sql", "select 1 as x"], None),
    (["duckdb"], "select 1 as x;\n"),
    (["snapshots", "t"], None),
    (["files", "t"], None),
    (["groups", "list"], None),
    (["transactions", "list"], None),
    (["producers", "list", "t"], None),
    (["report", "--all", "--no-gx"], None),
    (["produce", "t", "--partition", "0"], '{"key": "a"}\n'),
]


@pytest.fixture
def outside(tmp_path: Path, monkeypatch) -> tuple[Path, dict[str, str]]:
    """An empty working folder outside the repository (also this process's, for in-process runs),
    and an environment that configures no catalog."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert ROOT not in cwd.parents
    monkeypatch.chdir(cwd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_") and not k.upper().startswith("PYICEBERG_CATALOG__")}
    return cwd, env  # PYICEBERG_HOME: the isolated one tests/conftest.py set


def icelog(outside: tuple[Path, dict[str, str]], *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """The real ``icelog`` process in the folder (a fresh interpreter: nothing configured in-process helps it)."""
    cwd, env = outside
    return subprocess.run(
        [sys.executable, "-m", "icelog.pipelines.cli", *args],
        input=input or "",
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_catalog_not_found(doc: dict, home: Path) -> None:
    assert doc["error"] == "CatalogNotFound", doc
    assert doc["catalog"] == "icelog" and doc["home"] == str(home) and doc["uri"] == f"sqlite:///{home / 'catalog.db'}"


def test_reads_outside_a_project_create_nothing_and_name_the_home_they_looked_for(outside):
    cwd, _ = outside
    home = cwd / ".icelog"
    # The real process, in text: one line on stderr naming the catalog, the home, and the ways to configure one.
    done = icelog(outside, "topics", "list")
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: CatalogNotFound: no catalog 'icelog' in ICELOG_HOME={home} "), line
    for hint in ("ICELOG_CATALOG", "PYICEBERG_CATALOG__<NAME>__URI", ".pyiceberg.yaml", "icelog topics create"):
        assert hint in line, hint
    for args in (["offsets", "t"], ["sql", "select 1 as x"]):
        done = icelog(outside, "--output", "json", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert_catalog_not_found(json.loads(done.stdout), home)
    assert list(cwd.iterdir()) == []  # no ./.icelog, no SQLite file, nothing

    # Every read command (in-process: the same code, without an interpreter's start-up each).
    runner = CliRunner()
    for args, stdin in READS:
        result = runner.invoke(cli, ["--output", "json", *args], input=stdin)
        assert result.exit_code == 2, (args, result.stdout)
        assert_catalog_not_found(json.loads(result.stdout), home)
        assert list(cwd.iterdir()) == [], args

    # icelog catalog names what a read would open, and opens nothing.
    doc = json.loads(runner.invoke(cli, ["--output", "json", "catalog"]).stdout)
    assert doc["name"] == "icelog" and doc["embedded"] is True and doc["icelog_home"] == str(home)
    assert doc["exists"] is False
    assert list(cwd.iterdir()) == []


def test_a_write_creates_the_home_and_reads_then_find_it(outside):
    cwd, _ = outside
    home = cwd / ".icelog"
    done = icelog(outside, "topics", "create", "t", "--partitions", "1")
    assert done.returncode == 0, done.stderr
    assert (home / "catalog.db").is_file() and (home / "warehouse").is_dir()
    assert json.loads(CliRunner().invoke(cli, ["--output", "json", "catalog"]).stdout)["exists"] is True
    produced = icelog(outside, "--output", "json", "produce", "t", "--partition", "0", input='{"key": "a"}\n')
    assert produced.returncode == 0, produced.stdout
    runner = CliRunner()
    assert json.loads(runner.invoke(cli, ["--output", "json", "topics", "list"]).stdout) == {"tables": ["logs.t"]}
    assert json.loads(runner.invoke(cli, ["--output", "json", "offsets", "t"]).stdout)["partitions"] == {
        "0": {"start": 0, "end": 1}
    }


def test_icelog_home_names_the_home_looked_for(outside, tmp_path):
    home = tmp_path / "nowhere" / "home"
    result = CliRunner().invoke(cli, ["--output", "json", "offsets", "t"], env={"ICELOG_HOME": str(home)})
    assert result.exit_code == 2
    assert_catalog_not_found(json.loads(result.stdout), home)
    assert not (tmp_path / "nowhere").exists() and list(outside[0].iterdir()) == []


def test_open_catalog_for_a_read_creates_nothing(tmp_path, monkeypatch):
    from icelog.storage.core.catalog import CatalogNotFound, LogSqlCatalog, open_catalog
    from icelog.storage.errors import TerminalError

    home = tmp_path / "home"
    monkeypatch.setenv("ICELOG_HOME", str(home))
    with pytest.raises(CatalogNotFound) as e:
        open_catalog(create=False)
    assert isinstance(e.value, TerminalError) and e.value.home == str(home)
    assert not home.exists()
    open_catalog().create_namespace("db")  # a write: the home, its SQLite catalog and warehouse
    assert (home / "catalog.db").is_file()
    (home / "warehouse").rmdir()
    read = open_catalog(create=False)  # an existing home: opened as it is
    assert isinstance(read, LogSqlCatalog) and read.list_namespaces() == [("db",)]
    assert not (home / "warehouse").exists()

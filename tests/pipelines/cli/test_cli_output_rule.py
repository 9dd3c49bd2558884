"""One output rule for every command's text: times ISO 8601 with ``T`` and their offset, numbers
without thousands separators, counts in the right number, an empty list as ``no <things>``."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from icelog.pipelines.cli.app import text_value
from icelog.storage.log.table import LogTable
from tests.support.cli import Cli

CLI_SOURCES = Path(__file__).resolve().parents[3] / "pipelines" / "cli"


def text(icelog: Cli, *args: str, code: int = 0) -> str:
    result = icelog.raw(*args, json_output=False)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


@pytest.fixture
def events(sqlite_spec):
    table = LogTable.create(sqlite_spec.open(), "db.events", 1)
    table.append({0: [{"key": "k", "value": "v"}]})
    return table


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")
SPACED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # str(datetime): the format the rule replaces


def test_times_in_text_tables_are_iso_8601_with_t_and_offset(icelog: Cli, events):
    stamp = events.read(0).column("log_timestamp").to_pylist()[0]
    out = text(icelog, "sql", "select log_timestamp, log_offset from db.events")
    assert stamp.isoformat() in out and not SPACED.search(out), out
    out = text(icelog, "offsets", "db.events", "--at", "0")
    assert ISO.search(out) and not SPACED.search(out), out
    out = text(icelog, "snapshots", "db.events")
    assert ISO.search(out) and not SPACED.search(out), out


def test_values_are_written_one_way():
    moment = dt.datetime(2013, 2, 8, 12, 30, tzinfo=dt.UTC)
    assert text_value(moment) == "2013-02-08T12:30:00+00:00"
    assert text_value(3981) == "3981" and text_value(None) == "null" and text_value(True) == "true"
    assert text_value(b"\x00\x01") == "AAE="


# Every module that prints text for people: the CLI, the flights script and the demo, the
# Airflow tasks, progress lines, verdicts. The HTML report alone groups digits (it is for people
# only, and no script reads it back).
ROOT = CLI_SOURCES.parents[1]
TEXT_SOURCES = ["pipelines", "dags", "infra", "storage", "validations"]
GROUPING_ALLOWED = {ROOT / "validations" / "report.py"}


def test_no_text_output_prints_thousands_separators():
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in TEXT_SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in GROUPING_ALLOWED and "node_modules" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\{[^{}]*:[^{}]*,[^{}]*\}", line) and re.search(r"f['\"]", line) and ":," in line
    ]
    assert found == []


def test_a_verdict_counts_without_thousands_separators():
    from icelog.validations.verdict import Verdict

    assert (
        Verdict(violations=1200, errors=1, warnings=2).describe()
        == "VIOLATIONS: 1200 violations, 1 failed expectation, 2 warnings"
    )

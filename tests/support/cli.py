"""Running the ``icelog`` CLI in a test: in-process (Click's CliRunner) or as a real process,
against one catalog, with ``--output json`` giving exactly one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from icelog.pipelines.cli import cli
from icelog.storage.log.table import LogTable

ROOT = Path(__file__).resolve().parents[2]


class Cli:
    """Runs icelog in-process (CliRunner) or as a real process, against one catalog."""

    def __init__(self, spec, **env: str) -> None:
        self.spec = spec
        self.env = {**spec.env(), **env}
        self.runner = CliRunner()

    def raw(self, *args: str, input: str | bytes | None = None, json_output: bool = True):
        argv = ["--output", "json", *args] if json_output else list(args)
        return self.runner.invoke(cli, argv, input=input, env=self.env)

    def __call__(self, *args: str, input: str | bytes | None = None, code: int = 0) -> dict:
        """Run with ``--output json``; stdout must be exactly one JSON document."""
        result = self.raw(*args, input=input)
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
        return one_document(result.stdout)

    def process(self, *args: str, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "icelog.pipelines.cli", *args],
            input=input or b"",
            env={**self.env, **(env or {})},
            capture_output=True,
            cwd=ROOT,
            timeout=300,
        )

    def state(self, table: str = "db.events") -> tuple:
        """(current snapshot, watermarks, partitions, rows): what "unchanged" compares."""
        log_table = LogTable.open(self.spec.open(), table)
        iceberg = log_table.table()
        rows = sum(t.file.record_count for t in iceberg.scan().plan_files())
        marks = {p: (w.start, w.end) for p, w in log_table.watermarks().items()}
        return iceberg.metadata.current_snapshot_id, marks, len(marks), rows


def one_document(stdout: str) -> dict:
    """Exactly one JSON document (json.loads rejects a second one as extra data)."""
    assert stdout.strip(), "no output"
    return json.loads(stdout)

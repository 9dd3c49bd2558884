"""Long steps where stderr is not a terminal (a log, a pipe, CI): a plain progress line every
ICELOG_PROGRESS_INTERVAL_S seconds instead of nothing; summaries not wrapped at 80 columns."""

from __future__ import annotations

import io
import json
import re
import select
import subprocess
import sys
import time

from icelog.pipelines.progress import console
from tests.support.cli import ROOT, Cli

PROGRESS_LINE = re.compile(r"^producing(: .*)? \(\d+ s\)$")


def test_a_long_produce_prints_progress_lines_to_a_piped_stderr(icelog: Cli):
    icelog("topics", "create", "db.events", "--partitions", "1")
    producer = subprocess.Popen(
        [sys.executable, "-m", "icelog.pipelines.cli", "produce", "db.events", "--partition", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**icelog.env, "ICELOG_PROGRESS_INTERVAL_S": "0.2"},
        cwd=ROOT,
    )
    lines: list[str] = []
    try:
        producer.stdin.write(b'{"key": "a", "value": "1"}\n')
        producer.stdin.flush()
        # The load waits for more input while stdin stays open: a long step, as a big file is.
        deadline = time.monotonic() + 60
        while len(lines) < 3 and time.monotonic() < deadline:
            if select.select([producer.stderr], [], [], deadline - time.monotonic())[0]:
                line = producer.stderr.readline()
                if not line:
                    break
                lines.append(line.decode().rstrip("\n"))
        out, err = producer.communicate(b'{"key": "b", "value": "2"}\n', timeout=120)
    finally:
        producer.kill()
    assert producer.returncode == 0, err
    lines += err.decode().splitlines()
    assert len(lines) >= 3 and all(PROGRESS_LINE.match(line) for line in lines), lines
    assert "offsets [0, 2)" in out.decode()  # the summary on stdout, as before


def test_a_short_step_prints_no_progress_line_and_json_output_none(icelog: Cli):
    icelog("topics", "create", "db.events", "--partitions", "1")
    quick = icelog.raw("produce", "db.events", "--partition", "0", input='{"key": "a"}\n', json_output=False)
    assert quick.exit_code == 0 and quick.stderr == "", quick.stderr  # shorter than the default 10 s
    icelog.env["ICELOG_PROGRESS_INTERVAL_S"] = "0.001"
    slow = icelog.raw("produce", "db.events", "--partition", "0", input='{"key": "a"}\n')
    assert slow.exit_code == 0 and slow.stderr == "" and json.loads(slow.stdout)["partition"] == 0


def test_a_bad_interval_is_an_invalid_setting(icelog: Cli):
    icelog.env["ICELOG_PROGRESS_INTERVAL_S"] = "0"
    assert icelog("topics", "list", code=2)["variable"] == "ICELOG_PROGRESS_INTERVAL_S"


def test_a_console_that_is_not_a_terminal_does_not_wrap():
    log = io.StringIO()
    line = "partition 0: " + "x" * 300
    console(file=log).print(line)
    assert log.getvalue() == line + "\n"

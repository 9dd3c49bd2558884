"""One error style for every error a user can get: Click's usage errors (bad option, missing
argument, bad value, unknown command, a usage rule a command checks) print as icelog's typed
errors do, ``error: <Type>: <message>`` on one line of stderr, a usage error adding
``(see icelog CMD --help)``; under ``--output json`` one document with the same type and message.
Exit codes stay as documented: 2 for usage and bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import ROOT, Cli, one_document

# (arguments, the error's type, the command whose help the hint names; None: a typed icelog error)
ERRORS = [
    (["topics", "list", "--bogus"], "NoSuchOption", "icelog topics list --help"),
    (["topics", "create"], "MissingParameter", "icelog topics create --help"),
    (["topics", "create", "db.x", "--partitions", "0"], "BadParameter", "icelog topics create --help"),
    (["produce", "db.events", "--partition", "zero"], "BadParameter", "icelog produce --help"),
    (["no-such-command"], "NoSuchCommand", "icelog --help"),
    (["topics", "no-such-command"], "NoSuchCommand", "icelog topics --help"),
    (["offsets", "db.events", "--at", "yesterday"], "BadParameter", "icelog offsets --help"),
    (["topics", "alter", "db.events"], "UsageError", "icelog topics alter --help"),  # a rule the command checks
    (["offsets", "db.nope"], "UnknownTable", None),
    (["topics", "alter", "db.events", "--set", "icelog.nope=1"], "UnknownProperty", None),
]
IDS = [" ".join(args) for args, _, _ in ERRORS]


@pytest.fixture
def events(icelog: Cli) -> Cli:
    icelog("topics", "create", "db.events", "--partitions", "1")
    return icelog


@pytest.mark.parametrize("args, kind, help_command", ERRORS, ids=IDS)
def test_text_mode_prints_one_error_line_on_stderr(events, args, kind, help_command):
    result = events.raw(*args, json_output=False)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no "Usage: ..." block, no "Try ..." line
    assert lines[0].startswith(f"error: {kind}: "), lines[0]
    if help_command:
        assert lines[0].endswith(f" (see {help_command})"), lines[0]


@pytest.mark.parametrize("args, kind, help_command", ERRORS, ids=IDS)
def test_json_mode_prints_the_same_error_as_one_document(events, args, kind, help_command):
    result = events.raw(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    doc = one_document(result.stdout)
    assert doc["error"] == kind and doc["message"]
    assert doc.get("help") == help_command
    # The text line carries the same type and message.
    text = events.raw(*args, json_output=False).stderr
    assert text.startswith(f"error: {doc['error']}: {' '.join(doc['message'].split())}"), (text, doc)


def test_a_bad_value_names_its_parameter_in_json(events):
    doc = events("topics", "create", "db.x", "--partitions", "0", code=2)
    assert doc["param"] == "partitions" and "0 is not in the range" in doc["message"]


def test_a_bad_output_format_is_a_text_error(events):
    # --output xml asks for no JSON, so the error prints as text.
    result = events.raw("--output", "xml", "topics", "list", json_output=False)
    assert result.exit_code == 2 and result.stdout == ""
    assert (
        result.stderr
        == "error: BadParameter: Invalid value for '--output': 'xml' is not one of 'text', 'json'. (see icelog --help)\n"
    )


def test_a_group_named_alone_shows_its_help_in_text_and_a_usage_error_in_json(events):
    text = events.raw("topics", json_output=False)
    assert text.exit_code == 2 and "Usage: icelog topics" not in text.stdout
    assert text.stderr.startswith("Usage: ") and "add-partitions" in text.stderr  # the help: what to run next
    doc = events("topics", code=2)
    assert doc == {"error": "UsageError", "message": "Missing command.", "help": "icelog topics --help"}


def test_the_installed_script_prints_the_same_line(events):
    # A real process (prog_name "icelog" from the script, not Click's runner).
    done = events.process("topics", "describe", "db.events", "--bogus")
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode() == "error: NoSuchOption: No such option '--bogus'. (see icelog topics describe --help)\n"


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
def test_ctrl_c_is_an_error_line_and_exit_130_not_clicks_aborted(events, json_output):
    # A real process stopped as a person stops `consume --follow`: SIGINT once its records are out.
    events("produce", "db.events", "--partition", "0", input='{"key": "a", "value": "1"}\n')
    # JSON prints at the end, so that run consumes as a group, whose commit shows it reached the log end.
    output = (
        ["--group", "g", "--output", "json", "--max-records", "1000"]
        if json_output
        else ["--from-beginning", "--format", "jsonl"]
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "icelog.pipelines.cli", "consume", "db.events", "--follow", *output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**events.env, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack
        cwd=ROOT,
        # As in a terminal: a suite started in the background by a non-interactive shell runs with
        # SIGINT ignored, which children inherit, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        if not json_output:
            assert json.loads(proc.stdout.readline())["value"] == "1"  # polling at the log end now
        else:
            deadline = time.monotonic() + 120
            while [p["committed_offset"] for p in events("groups", "describe", "--group", "g")["partitions"]] != [1]:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # where it hangs, for the next reader of this failure
            proc.send_signal(signal.SIGABRT)
            _, stacks = proc.communicate(timeout=60)
            raise AssertionError(f"no exit 120 s after SIGINT; its threads:\n{stacks.decode()}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert b"Aborted!" not in err and b"Traceback" not in err
    if json_output:  # the one document still comes, with what was read
        doc = one_document(out.decode())
        # Every committed record is in the output.
        assert doc["interrupted"] is True and [r["value"] for r in doc["records"]] == ["1"], doc
        assert err == b""
    else:
        assert err.decode().splitlines() == [
            "error: Interrupted: stopped by Ctrl-C; what was committed before it stays, nothing after it was written"
        ]

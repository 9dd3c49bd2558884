"""``icelog duckdb`` as a shell: the real process on a pseudo-terminal (readline editing, history,
continuation prompts, dot commands, Ctrl-C and Ctrl-D), and the same dot commands in a script."""

from __future__ import annotations

import fcntl
import os
import platform
import pty
import re
import select
import struct
import sys
import termios
import time

import pytest

from tests.support.cli import ROOT, one_document

pytestmark = pytest.mark.skipif(not hasattr(pty, "fork"), reason="needs a pseudo-terminal")

PROMPT, CONTINUE = "duckdb> ", "   ...> "
UP = "\x1b[A"  # the up-arrow key: readline's previous-history
# The syscalls a process waiting for a key sits in (select, pselect6, poll, ppoll), by architecture.
WAITING_FOR_INPUT = {"x86_64": {"23", "270", "7", "271"}, "aarch64": {"72", "73"}}.get(platform.machine(), set())
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]|\r")


def lines(*records: str) -> str:
    return "".join(f"{r}\n" for r in records)


class Terminal:
    """A process on a pseudo-terminal (its controlling terminal: Ctrl-C is SIGINT), driven like a person."""

    def __init__(self, argv: list[str], env: dict[str, str], timeout: float = 180) -> None:
        self.timeout = timeout
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a 200-column terminal, then icelog
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
                os.chdir(ROOT)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.screen = ""  # everything shown so far, escape sequences and carriage returns removed
        self.seen = 0  # how far expect() has read

    def _read(self, deadline: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the process closed the terminal
            return False
        self.screen += ESCAPES.sub("", data.decode("utf-8", "replace"))
        return bool(data)

    def expect(self, pattern: str) -> str:
        """Wait for ``pattern`` (a regex) after what was already matched; return the text up to its end."""
        deadline = time.monotonic() + self.timeout
        regex = re.compile(pattern)
        while not (found := regex.search(self.screen, self.seen)):
            if not self._read(deadline) and time.monotonic() >= deadline:
                raise AssertionError(f"no {pattern!r} in {self.screen[self.seen :]!r}; {self.state()}")
        text, self.seen = self.screen[self.seen : found.end()], found.end()
        return text

    def state(self) -> str:
        """Where the process is, for a failure message: its syscall and its signals (pending, caught, ignored)."""
        try:
            with open(f"/proc/{self.pid}/syscall") as f:
                syscall = f.read().split(" ", 1)[0]
            with open(f"/proc/{self.pid}/status") as f:
                signals = [
                    line.strip() for line in f if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
                ]
        except OSError as e:
            return f"no /proc state ({e})"
        return f"syscall {syscall}, " + ", ".join(signals)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def interrupt(self) -> None:
        """Ctrl-C as a person presses it: while the shell waits for a key, not while it draws the prompt.

        CPython's readline checks for signals only when its select() is interrupted: a SIGINT
        that lands after the prompt is drawn but before select() starts waits for the next key
        (a window of microseconds, long only on a loaded machine). Typing Ctrl-C in that window
        would test CPython, not icelog.
        """
        deadline = time.monotonic() + self.timeout
        while WAITING_FOR_INPUT and time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.pid}/syscall") as f:
                    if f.read().split(" ", 1)[0] in WAITING_FOR_INPUT:
                        break
            except OSError:  # no /proc: press it at once
                break
            time.sleep(0.01)
        self.type("\x03")

    def enter(self, line: str, until: str = PROMPT) -> str:
        """Type ``line`` and Enter; return what shows up to the next ``until`` prompt."""
        self.type(line + "\r")
        return self.expect(re.escape(until))

    def exit_code(self) -> int:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self._read(time.monotonic() + 0.2)  # drain, so the child never blocks on a full terminal
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        raise AssertionError(f"still running: {self.screen[self.seen :]!r}")


@pytest.fixture
def events(icelog, tmp_path):
    """db.events with keys a, b in partition 0; the shell's ICELOG_HOME (for its history) exists."""
    icelog("topics", "create", "db.events", "--partitions", "2")
    icelog("produce", "db.events", "--partition", "0", input=lines('{"key": "a", "value": "1"}', '{"key": "b", "value": "2"}'))
    home = tmp_path / "home"
    home.mkdir()
    env = {**icelog.env, "ICELOG_HOME": str(home), "TERM": "xterm", "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return env, home


def shell(env: dict[str, str]) -> Terminal:
    terminal = Terminal([sys.executable, "-m", "icelog.pipelines.cli", "duckdb"], env)
    banner = terminal.expect(re.escape(PROMPT))
    assert "catalog 'testcat'" in banner and "history in" in banner
    return terminal


def test_the_shell_on_a_terminal_edits_continues_recovers_and_keeps_history(events):
    env, home = events
    term = shell(env)
    # A statement over three lines: the continuation prompt until it ends with ';'.
    term.enter("select key,", until=CONTINUE)
    term.enter("  value from db.events", until=CONTINUE)
    out = term.enter("  where log_offset = 1;")
    assert re.search(r"│ b +│ 2 +│", out) and "│ a " not in out, out

    assert re.search(r"│ db\.events +│", out := term.enter(".tables")), out
    out = term.enter(".schema db.events")
    assert re.search(r"│ db\.events +│ log_offset +│ BIGINT +│", out), out
    assert re.search(r"│ db\.events +│ key +│ VARCHAR +│", out), out
    assert "error: no table 'nope' (.tables lists them)" in term.enter(".schema nope")

    # A failed query: one error line, then the next prompt; the shell goes on.
    after = term.enter("select nope from db.events;").split("select nope from db.events;", 1)[1].strip("\n").split("\n")
    assert len(after) == 2 and after[0].startswith("error: Binder Error:") and "nope" in after[0], after
    assert re.search(r"│ 42 +│", term.enter("select 40 + 2 as answer;"))

    # Bytes that are not UTF-8: one error line, the statement dropped, the shell stays.
    os.write(term.fd, b"select '\xff' as x;\r")
    assert "error: not UTF-8 (at 8 in the line); the statement is dropped" in term.expect(re.escape(PROMPT))

    # readline: the up arrow recalls the last statement, and Enter runs it again.
    out = term.enter(UP)
    assert "select 40 + 2 as answer;" in out and re.search(r"│ 42 +│", out), out

    # Ctrl-C drops the statement being typed, and the shell stays.
    term.enter("select 'dropped' as what", until=CONTINUE)
    term.interrupt()
    term.expect(re.escape(PROMPT))
    out = term.enter("select 'kept' as what;")
    assert re.search(r"│ kept +│", out) and "│ dropped" not in out, out

    # Ctrl-C while a query runs interrupts it: one error line, and the shell stays.
    term.type("select count(*) from range(1000000000000) t(a) where a % 7 = 3;\r")
    time.sleep(2)  # the query is running
    term.type("\x03")
    out = term.expect(re.escape(PROMPT))
    assert out.split("= 3;", 1)[1].strip("\n").split("\n") == ["^Cerror: INTERRUPT Error: Interrupted!", PROMPT], out

    term.type("\x04")  # Ctrl-D: leave
    assert term.exit_code() == 2  # a statement failed (as for a script)

    # One history entry per statement (a multi-line one joined), dot commands too, in the icelog home.
    assert (home / "duckdb_history").read_text().splitlines() == [
        "select key, value from db.events where log_offset = 1;",
        ".tables",
        ".schema db.events",
        ".schema nope",
        "select nope from db.events;",
        "select 40 + 2 as answer;",
        "select 40 + 2 as answer;",
        "select 'kept' as what;",
        "select count(*) from range(1000000000000) t(a) where a % 7 = 3;",
    ]

    # A new shell recalls the last session's statements.
    term = shell(env)
    assert re.search(r"│ kept +│", term.enter(UP + UP))
    term.type(".quit\r")
    assert term.exit_code() == 0


def test_dot_commands_in_a_script(icelog):
    icelog("topics", "create", "db.events", "--partitions", "1")
    script = lines(".tables", ".schema events", ".schema nope", ".frobnicate", "select 1 as x;", ".quit", "select 2 as y;")
    result = icelog.raw("duckdb", input=script)
    assert result.exit_code == 2, result.stdout
    out = one_document(result.stdout)["results"]
    assert [r["statement"] for r in out] == [".tables", ".schema events", ".schema nope", ".frobnicate", "select 1 as x;"]
    assert out[0]["rows"] == [["db.events"]]
    assert ["db.events", "log_offset", "BIGINT"] in out[1]["rows"] and ["db.events", "key", "VARCHAR"] in out[1]["rows"]
    assert out[2]["error"] == "NotFound" and out[3]["error"] == "UnknownCommand"
    assert out[4]["rows"] == [[1]]  # and nothing after .quit


def test_a_shell_without_a_home_keeps_no_history_and_creates_none(icelog, tmp_path):
    icelog("topics", "create", "db.events", "--partitions", "1")
    home = tmp_path / "no-home"
    env = {**icelog.env, "ICELOG_HOME": str(home), "TERM": "xterm", "NO_COLOR": "1"}
    term = Terminal([sys.executable, "-m", "icelog.pipelines.cli", "duckdb"], env)
    assert f"no history kept ({home} does not exist)" in term.expect(re.escape(PROMPT))
    term.enter("select 1 as x;")
    term.type("\x04")
    assert term.exit_code() == 0
    assert not home.exists()


def test_mode_output_timer_and_read_dot_commands(icelog, tmp_path):
    icelog("topics", "create", "db.events", "--partitions", "1")
    icelog("produce", "db.events", "--partition", "0", input=lines('{"key": "a", "value": "1"}'))
    queries = tmp_path / "queries.sql"
    queries.write_text("select key from db.events;\n.mode\n")
    saved = tmp_path / "out.csv"
    script = lines(
        ".mode csv",
        "select key, value from db.events;",
        f".output {saved}",
        "select 7 as n;",
        ".output",
        ".timer on",
        ".mode json",
        f".read {queries}",
        ".timer off",
        f".read {tmp_path / 'missing.sql'}",
        ".mode yaml",
    )
    result = icelog.raw("duckdb", input=script, json_output=False)
    assert result.exit_code == 2, (result.stdout, result.stderr)  # the missing file and the unknown mode
    assert result.stdout == 'key,value\na,1\n[{"key": "a"}]\n[{"mode": "json"}]\n', result.stdout
    assert saved.read_text() == "n\n7\n"
    assert len(re.findall(r"^run time: \d+\.\d{3} s$", result.stderr, re.MULTILINE)) == 1, result.stderr  # the one statement
    assert "cannot read" in result.stderr and "unknown command '.mode yaml'" in result.stderr
    doc = one_document(icelog.raw("duckdb", input=lines(f".read {queries}")).stdout)["results"]
    assert doc == [
        {"statement": "select key from db.events;", "columns": ["key"], "rows": [["a"]]},
        {"statement": ".mode", "columns": ["mode"], "rows": [["table"]]},
    ]
    loop = tmp_path / "loop.sql"
    loop.write_text(f".read {loop}\n")
    assert "already being read" in icelog.raw("duckdb", input=lines(f".read {loop}"), json_output=False).stderr

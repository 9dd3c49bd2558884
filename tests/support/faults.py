"""kill -9 of a worker process at a named fault point of the commit path.

A worker started with ``ICELOG_PAUSE_AT=<point>`` writes its pid to ``ICELOG_PAUSE_FILE`` when
it reaches that point (``storage.core.faults``) and waits there; :func:`kill_at` SIGKILLs it
there. Output goes to files, never to a pipe nobody drains; every process is waited for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.support.files import files_on_disk


@dataclass
class Worker:
    proc: subprocess.Popen
    pause_file: Path
    out: Path
    err: Path

    def output(self) -> str:
        return f"stdout: {self.out.read_text()[-2000:]}\nstderr: {self.err.read_text()[-3000:]}"

    def result(self) -> dict:
        lines = [line for line in self.out.read_text().splitlines() if line.strip()]
        assert lines, self.output()
        return json.loads(lines[-1])


@contextlib.contextmanager
def worker(spec, command: str, *args: str, directory: Path, name: str = "victim", pause_at: str | None = None):
    """``python -m tests.support.workers.log_table COMMAND``; output to files (never a pipe nobody drains).

    With ``pause_at``, the worker stops at that fault point and waits for its SIGKILL. On
    leaving, a worker still running is killed, and every worker is waited for.
    """
    pause_file = directory / f"{name}.paused"
    env = dict(os.environ)
    env.pop("ICELOG_PAUSE_AT", None)
    if pause_at:
        env.update(ICELOG_PAUSE_AT=pause_at, ICELOG_PAUSE_FILE=str(pause_file))
    out, err = directory / f"{name}.out", directory / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.workers.log_table", command, json.dumps(asdict(spec)), *map(str, args)],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            yield Worker(proc, pause_file, out, err)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _drain(proc: subprocess.Popen) -> tuple[list[threading.Thread], list]:
    """Read a bare Popen's pipes in the background, so a chatty child never blocks on a full
    pipe before it reaches its fault point."""
    captured: list = []
    threads = []
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            thread = threading.Thread(target=lambda s=stream: captured.extend(s), daemon=True)
            thread.start()
            threads.append(thread)
    return threads, captured


def kill_at(victim: Worker | subprocess.Popen, pause_file: str | Path | None = None, timeout: float = 120) -> None:
    """Wait until the victim pauses at its fault point, then SIGKILL it there.

    ``victim`` is a :class:`Worker`, or a bare ``Popen`` plus its ``pause_file`` (Spark and
    fan-out drivers); a bare ``Popen``'s pipes, if any, are drained while it runs and closed.
    """
    if isinstance(victim, Worker):
        proc, marker, describe = victim.proc, victim.pause_file, victim.output
        threads: list[threading.Thread] = []
    else:
        proc, marker = victim, Path(pause_file)
        threads, captured = _drain(proc)
        describe = lambda: f"exit code {proc.returncode}: {captured[-40:]}"  # noqa: E731
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if proc.poll() is not None:
                for thread in threads:
                    thread.join(timeout=30)
                pytest.fail(f"writer exited before the fault point\n{describe()}")
            assert time.monotonic() < deadline, "writer never reached the fault point"
            time.sleep(0.05)
        assert int(marker.read_text()) == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for thread in threads:
            thread.join(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def run_to_end(spec, command: str, *args: str, directory: Path, name: str) -> dict:
    """Run a worker to completion; it must succeed. Returns its last JSON line."""
    with worker(spec, command, *args, directory=directory, name=name) as w:
        try:
            w.proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after 240 s\n{w.output()}")
        assert w.proc.returncode == 0, w.output()
        return w.result()


def kill_9(spec, point: str, command: str, *args: str, directory: Path, table) -> set[str]:
    """Run ``command`` until it pauses at ``point``, SIGKILL it; return the files it left."""
    before = files_on_disk(table.table())
    with worker(spec, command, *args, directory=directory, pause_at=point) as victim:
        kill_at(victim)
    return files_on_disk(table.table()) - before

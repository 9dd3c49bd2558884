"""Racing worker processes (``tests.support.workers.log_table``): start several, wait for all,
read every JSON line they printed."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.support.catalogs import CatalogSpec


@contextlib.contextmanager
def worker_processes(spec: CatalogSpec, argv_list: list[list[str]], directory: Path, env: dict | None = None):
    """Start ``python -m tests.support.workers.log_table`` processes with stdout and stderr going to files.

    Files, not pipes: a process nobody reads from never blocks on a full pipe. On leaving,
    every process still running is killed and every process is waited for.
    """
    spec_json = json.dumps(asdict(spec))
    procs = []
    with contextlib.ExitStack() as stack:
        try:
            for i, argv in enumerate(argv_list):
                out = stack.enter_context(open(directory / f"worker{i}.out", "w"))
                err = stack.enter_context(open(directory / f"worker{i}.err", "w"))
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests.support.workers.log_table", argv[0], spec_json, *argv[1:]],
                        stdout=out,
                        stderr=err,
                        env=env,
                    )
                )
            yield procs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for proc in procs:
                proc.wait()


def finish(procs: list[subprocess.Popen], directory: Path, timeout: float = 240) -> list[dict]:
    """Wait for every worker; each must succeed. Returns all JSON lines, in worker order."""
    deadline = time.monotonic() + timeout
    lines = []
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {i} still running after {timeout}s: {(directory / f'worker{i}.err').read_text()[-3000:]}")
        assert proc.returncode == 0, (directory / f"worker{i}.err").read_text()[-3000:]
        lines += [json.loads(line) for line in (directory / f"worker{i}.out").read_text().splitlines() if line.strip()]
    return lines


def run_workers(spec: CatalogSpec, argv_list: list[list[str]], timeout: float = 240) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="icelog-workers-") as tmp:
        with worker_processes(spec, argv_list, Path(tmp)) as procs:
            return finish(procs, Path(tmp), timeout)

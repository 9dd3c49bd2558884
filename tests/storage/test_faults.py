"""kill -9 of a real writer process at named points of the commit path (I1, I7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from storage import faults
from storage.log import LogTable
from storage.maintenance import remove_orphan_files
from validations.contiguity import check_contiguity

pytestmark = pytest.mark.fault


def spawn(spec, *args: str, pause_at: str | None = None, pause_file: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if pause_at:
        env.update(ICELOG_PAUSE_AT=pause_at, ICELOG_PAUSE_FILE=pause_file)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers", "append_rows", json.dumps(asdict(spec)), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def kill_at(proc: subprocess.Popen, pause_file: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not os.path.exists(pause_file):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "writer never reached the fault point"
        time.sleep(0.05)
    assert int(Path(pause_file).read_text()) == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("point", faults.POINTS)
def test_i1_i7_kill_9_mid_commit_leaves_a_valid_table_with_every_acknowledged_row(catalog_spec, tmp_path, point):
    t = LogTable.create(catalog_spec.open(), "db.crash", partitions=2)
    acknowledged = t.append({0: [{"key": "ack", "value": str(i)} for i in range(5)]})
    assert acknowledged.ranges == {0: (0, 5)}

    pause_file = str(tmp_path / "paused")
    kill_at(spawn(catalog_spec, "db.crash", "0", "3", "victim", "commit-1", pause_at=point, pause_file=pause_file), pause_file)

    report = check_contiguity(t.table(), deep=True)
    assert report.ok, report.violations
    keys = t.read(0).column("key").to_pylist()
    assert keys[:5] == ["ack"] * 5
    landed = point == faults.AFTER_CATALOG_SWAP
    assert keys[5:] == (["victim"] * 3 if landed else [])

    # Re-sending the same commit after the crash lands it exactly once.
    resend = spawn(catalog_spec, "db.crash", "0", "3", "victim", "commit-1")
    out, err = resend.communicate(timeout=120)
    assert resend.returncode == 0, err
    outcome = json.loads(out.splitlines()[-1])
    assert outcome["range"] == [5, 8]
    assert outcome["duplicate"] == landed
    assert t.read(0).column("key").to_pylist() == ["ack"] * 5 + ["victim"] * 3

    # Whatever the dead writer left behind is unreferenced; cleanup removes it and keeps the table whole.
    remove_orphan_files(catalog_spec.open(), "db.crash", older_than_s=0)
    assert check_contiguity(t.table(), deep=True).ok
    assert t.read(0).num_rows == 8

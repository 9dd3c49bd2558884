"""A local Spark standalone cluster (one master, N workers) from the pyspark installation.

    python -m infra.spark_cluster start DIR [WORKERS]   # prints the master URL
    python -m infra.spark_cluster stop DIR

Point icelog at it with ``ICELOG_SPARK_MASTER=spark://127.0.0.1:PORT``; jobs run unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RUNNING: dict[int, subprocess.Popen] = {}  # reaped by stop() when started in this process


def _spawn(directory: Path, name: str, args: list[str]) -> int:
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    with open(directory / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    _RUNNING[proc.pid] = proc
    (directory / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def _wait_for(path: Path, text: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"Spark did not report {text!r} in {path} within {timeout} s:\n{path.read_text(errors='replace')[-3000:] if path.exists() else ''}"
    )


def start(directory: str | Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> str:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    port, ui = _free_port(), _free_port()
    _spawn(
        directory,
        "master",
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
    )
    url = f"spark://127.0.0.1:{port}"
    _wait_for(directory / "master.log", "I have been elected leader")
    for i in range(workers):
        _spawn(
            directory,
            f"worker{i}",
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(directory / f"work{i}"),
            ],
        )
    for i in range(workers):
        _wait_for(directory / f"worker{i}.log", "Successfully registered with master")
    (directory / "master.url").write_text(url)
    return url


def stop(directory: str | Path) -> None:
    for pid_file in Path(directory).glob("*.pid"):
        pid = int(pid_file.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        if pid in _RUNNING:
            _RUNNING.pop(pid).wait(timeout=60)
        pid_file.unlink()


if __name__ == "__main__":
    if sys.argv[1:2] == ["start"]:
        print(start(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2))
    elif sys.argv[1:2] == ["stop"]:
        stop(sys.argv[2])
    else:
        sys.exit(__doc__)

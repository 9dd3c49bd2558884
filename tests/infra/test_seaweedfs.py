"""infra/seaweedfs.py: a loopback-only SeaweedFS server whose Iceberg REST catalog pyiceberg can use."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from infra import seaweedfs


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _round_trip(config: dict[str, str], namespace: str) -> None:
    catalog = load_catalog("seaweedfs", **config)
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.events", schema=pa.schema([("log_offset", pa.int64()), ("payload", pa.string())]))
    table.append(pa.table({"log_offset": pa.array([0, 1, 2], pa.int64()), "payload": ["a", "b", "c"]}))
    reloaded = load_catalog("again", **config).load_table(f"{namespace}.events")
    assert reloaded.metadata_location.startswith("s3://warehouse/")
    assert sorted(reloaded.scan().to_arrow()["log_offset"].to_pylist()) == [0, 1, 2]


def test_server_listens_on_loopback_only_serves_pyiceberg_and_stops(tmp_path, seaweedfs_server):
    # seaweedfs_server (the session's server) runs meanwhile: two servers coexist on their own ports.
    directory = tmp_path / "sw"
    config = seaweedfs.start(directory)
    pid = seaweedfs.running_pid(directory)
    assert pid is not None
    ports = json.loads((directory / seaweedfs.PORTS_FILE).read_text())
    try:
        assert config["type"] == "rest" and config["rest.sigv4-enabled"] == "true"
        assert config["uri"] == f"http://127.0.0.1:{ports['iceberg']}" != seaweedfs_server["uri"]
        assert config["s3.endpoint"] == f"http://127.0.0.1:{ports['s3']}" != seaweedfs_server["s3.endpoint"]
        keys = directory / seaweedfs.CREDENTIALS_FILE
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600
        assert config["s3.secret-access-key"] == json.loads(keys.read_text())["secret_access_key"]
        assert config["s3.secret-access-key"] != seaweedfs_server["s3.secret-access-key"]

        listening = seaweedfs.listeners(pid)
        assert {port for _, port in listening} >= set(seaweedfs._all_ports(ports))
        assert {address for address, _ in listening} == {"127.0.0.1"}, listening

        assert seaweedfs.start(directory) == config  # already running: same server, same config
        assert seaweedfs.running_pid(directory) == pid
        _round_trip(config, "trial")
        _round_trip(seaweedfs_server, "trial")  # the other server has its own catalog
        tree = seaweedfs.process_tree(pid)
    finally:
        seaweedfs.stop(directory)
    assert seaweedfs.running_pid(directory) is None
    assert not any(seaweedfs._alive(p) for p in tree)
    assert all(_closed(port) for port in seaweedfs._all_ports(ports))
    assert not [s for port in seaweedfs._all_ports(ports) for s in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
    seaweedfs.stop(directory)  # idempotent


def test_wrong_keys_are_refused(seaweedfs_server):
    from pyiceberg.exceptions import ForbiddenError

    wrong = {**seaweedfs_server, "client.secret-access-key": "not-the-secret"}
    with pytest.raises(ForbiddenError):
        load_catalog("wrong", **wrong).list_namespaces()


def test_missing_binary_says_run_make_setup(monkeypatch):
    monkeypatch.setattr(
        seaweedfs.metadata, "distribution", lambda name: (_ for _ in ()).throw(seaweedfs.metadata.PackageNotFoundError(name))
    )
    monkeypatch.setattr(seaweedfs.sys, "prefix", "/nonexistent")
    monkeypatch.setattr(seaweedfs.shutil, "which", lambda name: None)
    with pytest.raises(seaweedfs.SeaweedFSError, match="run `make setup`"):
        seaweedfs.weed_binary()


def test_a_new_server_never_takes_the_ports_a_stopped_one_keeps(tmp_path, monkeypatch):
    """A test kills a server and restarts it on its saved ports; a server another test starts in
    between must choose around them even though they are free then (pure unit: no server runs)."""
    monkeypatch.setattr(seaweedfs.tempfile, "gettempdir", lambda: str(tmp_path))
    stopped, starting = tmp_path / "stopped", tmp_path / "starting"
    stopped.mkdir()
    starting.mkdir()
    names = [*seaweedfs.GRPC_COMPONENTS, "iceberg"]
    saved = {name: 10000 + i for i, name in enumerate(names)}
    (stopped / seaweedfs.PORTS_FILE).write_text(json.dumps(saved))
    picks = iter([10000, 10001, *range(11000, 11100)])  # the stopped server's first, while they are free
    monkeypatch.setattr(seaweedfs.random, "randint", lambda low, high: next(picks))
    chosen = seaweedfs._choose_ports(starting)
    assert not set(seaweedfs._all_ports(chosen)) & set(seaweedfs._all_ports(saved))
    assert seaweedfs._reserved(stopped) == set()  # a server's own saved ports are not reserved against it

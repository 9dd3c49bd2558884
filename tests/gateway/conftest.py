"""``icelog serve`` as a real process on a throwaway SQLite catalog, for unmodified Kafka clients."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from icelog.pipelines.gateway.topics import create_topic
from tests.support.catalogs import CatalogSpec

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "db.events"


class Served:
    """One ``icelog serve`` process; ``restart`` brings it back on the same port."""

    def __init__(self, spec, directory: Path, port: int = 0, linger_ms: float = 5) -> None:
        self.spec = spec
        self.directory = directory
        self.port = port
        self.linger_ms = linger_ms
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, **env: str) -> None:
        self.starts += 1
        with open(self.directory / f"serve-{self.starts}.err", "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "icelog.pipelines.cli", "serve", "--output", "json"]
                + ["--port", str(self.port), "--linger-ms", str(self.linger_ms)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={**self.spec.env(), **env},
                cwd=ROOT,
            )
        line = self.proc.stdout.readline()
        if not line:
            self._reap()
        assert line, f"icelog serve printed nothing: {self.stderr()}"
        self.port = json.loads(line)["port"]

    def stderr(self) -> str:
        return (self.directory / f"serve-{self.starts}.err").read_text(errors="replace")

    def _reap(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self.proc.stdout.close()
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, and the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self._reap(timeout)

    def restart(self, attempts: int = 50) -> None:
        for _ in range(attempts):  # the port may linger a moment after a kill
            try:
                self.start()
                return
            except (AssertionError, json.JSONDecodeError):
                time.sleep(0.2)
        raise AssertionError(f"icelog serve did not come back on port {self.port}: {self.stderr()}")


@pytest.fixture
def served(sqlite_spec, tmp_path):
    """A gateway over a catalog holding ``db.events`` (2 partitions, the Kafka record schema)."""
    create_topic(sqlite_spec.open(), TOPIC, 2)
    server = Served(sqlite_spec, tmp_path)
    server.start()
    yield server
    if not server.proc.stdout.closed:
        server.kill()


@pytest.fixture(scope="session")
def module_spec(tmp_path_factory) -> CatalogSpec:
    """A SQLite catalog shared by the gateway tests (each makes its own topics): one gateway
    process starts in seconds on a busy machine, so the tests share it."""
    directory = tmp_path_factory.mktemp("gateway")
    (directory / "warehouse").mkdir()
    return CatalogSpec("sqlite", "gwcat", f"sqlite:///{directory / 'catalog.db'}", f"file://{directory / 'warehouse'}")


@pytest.fixture(scope="session")
def gateway(module_spec, tmp_path_factory):
    """One gateway for the tests that share ``module_spec``; stopped with SIGTERM at the end, which must exit 0."""
    server = Served(module_spec, tmp_path_factory.mktemp("serve"))
    server.start()
    yield server
    assert server.stop() == 0, server.stderr()


_topics = itertools.count()


@pytest.fixture
def topic(module_spec) -> str:
    """A fresh topic (2 partitions, the Kafka record schema) in the module's catalog."""
    name = f"db.t{next(_topics)}"
    create_topic(module_spec.open(), name, 2)
    return name


def quiet_logs() -> dict:
    """librdkafka client settings that keep its connection chatter out of the test output."""
    return {"log_level": 3 if os.environ.get("ICELOG_KAFKA_DEBUG") else 0}

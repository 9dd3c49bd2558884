"""The server in-process: a handler's unexpected failure closes its own connection and nothing else."""

from __future__ import annotations

import asyncio
import threading

from kio.schema.errors import ErrorCode

from icelog.pipelines.gateway import metadata
from icelog.pipelines.gateway.server import Gateway
from tests.gateway.raw import Connection, frame

API_VERSIONS = {"client_software_name": "raw", "client_software_version": "1"}


def test_a_failing_handler_closes_its_connection_and_the_gateway_serves_on(sqlite_catalog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the catalog went away")

    monkeypatch.setattr(metadata, "metadata", broken)
    loop = asyncio.new_event_loop()
    gateway = Gateway(sqlite_catalog)
    loop.run_until_complete(gateway.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with Connection(f"127.0.0.1:{gateway.port}", timeout=30) as conn:
            conn.send(frame(3, 9, {"topics": None}))
            assert conn.read_frame() is None  # closed, not left waiting
        with Connection(f"127.0.0.1:{gateway.port}", timeout=30) as conn:
            assert conn.call(18, 3, API_VERSIONS).error_code == ErrorCode.none
    finally:
        asyncio.run_coroutine_threadsafe(gateway.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()

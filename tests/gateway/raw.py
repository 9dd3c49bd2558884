"""A raw Kafka-protocol client for the gateway's tests: request frames built with kio, answers parsed."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from icelog.pipelines.gateway.records import encode_batch
from icelog.pipelines.gateway.wire import build


def frame(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 1) -> bytes:
    schema = load_request_schema(api_key, version)
    buffer = io.BytesIO()
    header = {"request_api_key": api_key, "request_api_version": version, "correlation_id": correlation_id, "client_id": "raw"}
    entity_writer(schema.__header_schema__)(buffer, build(schema.__header_schema__, header))
    entity_writer(schema)(buffer, build(schema, body))
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def produce_frame(topic: str, partition: int, values: list[bytes], *, corrupt: bool = False) -> bytes:
    batch = bytearray(encode_batch(0, [(i, 1_000 + i, None, v, ()) for i, v in enumerate(values)]))
    if corrupt:
        batch[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    data = {"name": topic, "partition_data": [{"index": partition, "records": bytes(batch)}]}
    return frame(0, 9, {"acks": -1, "timeout": 5000, "topic_data": [data]})


class Connection:
    def __init__(self, bootstrap: str, timeout: float = 10) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes | None:
        """The next response frame, or None when the server closed the connection."""
        size = self._exactly(4)
        if size is None:
            return None
        return self._exactly(struct.unpack(">i", size)[0])

    def _exactly(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.send(frame(api_key, version, body))
        return parse(api_key, version, self.read_frame())

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def parse(api_key: int, version: int, data: bytes | None) -> Any:
    assert data is not None, "the server closed the connection"
    schema = load_response_schema(api_key, version)
    _, used = entity_reader(schema.__header_schema__)(data, 0)
    return entity_reader(schema)(data, used)[0]

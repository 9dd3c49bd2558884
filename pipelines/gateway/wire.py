"""Kafka's framing and message types, through kio: a request frame in, a response frame out.

Handlers answer with plain dicts; :func:`build` turns one into the response dataclass of the
version the client asked for (each version is its own kio class), filling what a handler
leaves out with the field's default or the zero of its Kafka type. So one handler serves every
version it is advertised for.
"""

from __future__ import annotations

import datetime as dt
import io
import struct
import typing
import uuid
from dataclasses import MISSING, dataclass, fields
from types import NoneType, UnionType
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

# What the gateway serves, and no more: api key -> (min, max version). ApiVersions lists exactly this.
API_KEYS = {
    "produce": 0,
    "fetch": 1,
    "list_offsets": 2,
    "metadata": 3,
    "api_versions": 18,
    "init_producer_id": 22,
}
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 9),  # Produce: record batches v2; v10+ adds fields this gateway has no use for
    1: (4, 12),  # Fetch: isolation level from v4; v13+ names topics by id
    2: (1, 7),  # ListOffsets
    3: (1, 9),  # Metadata
    18: (0, 3),  # ApiVersions
    22: (0, 4),  # InitProducerId
}
API_VERSIONS = 18

# A frame larger than this is refused (the connection closed) before anything is allocated for it.
MAX_FRAME_BYTES = 64 * 1024 * 1024


class FrameError(Exception):
    """A frame that cannot be a Kafka request: the connection is closed (nothing to answer to)."""


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request dataclass


def peek(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the first 8 bytes of every request header version."""
    if len(frame) < 8:
        raise FrameError(f"a request header needs 8 bytes, got {len(frame)}")
    return struct.unpack_from(">hhi", frame, 0)


def supported(api_key: int, api_version: int) -> bool:
    low, high = SUPPORTED.get(api_key, (1, 0))
    return low <= api_version <= high


def parse_request(frame: bytes) -> Request:
    """Decode a request frame (without its size prefix) of a supported (key, version).

    Raises:
        FrameError: anything that does not decode as that request, to its last byte.
    """
    api_key, api_version, correlation_id = peek(frame)
    schema = load_request_schema(api_key, api_version)
    try:
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, size = entity_reader(schema)(frame, used)
    except Exception as e:  # noqa: BLE001 - kio raises many types (buffer underflow, bad utf-8, values out of range)
        raise FrameError(f"{type(e).__name__}: {e}") from e
    if used + size != len(frame):
        raise FrameError(f"{len(frame) - used - size} bytes after the request")
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(api_key: int, api_version: int, correlation_id: int, data: dict[str, Any]) -> bytes:
    """A response frame, size prefix included, for the request (key, version, correlation id)."""
    schema = load_response_schema(api_key, api_version)
    body = build(schema, data)
    buffer = io.BytesIO()
    entity_writer(schema.__header_schema__)(buffer, build(schema.__header_schema__, {"correlation_id": correlation_id}))
    entity_writer(schema)(buffer, body)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def api_versions_error(correlation_id: int) -> bytes:
    """ApiVersions v0 with UNSUPPORTED_VERSION and the served list: what a broker answers a newer
    ApiVersions request, so the client retries with a version both sides know."""
    return encode_response(API_VERSIONS, 0, correlation_id, {"error_code": ErrorCode.unsupported_version, "api_keys": served()})


def served() -> list[dict[str, int]]:
    return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(SUPPORTED.items())]


# --- dicts to kio dataclasses ----------------------------------------------------------------


def build(cls: type, data: dict[str, Any]) -> Any:
    """``cls`` (a kio entity) from ``data``; a missing field takes its default or its type's zero."""
    values = {}
    for f in fields(cls):
        if f.name in data:
            value = data[f.name]
            nested = _entity_of(f.type)
            if nested is not None:
                value = tuple(build(nested, v) for v in value) if _is_tuple(f.type) else build(nested, value)
            elif _is_tuple(f.type):
                value = tuple(value)
            elif f.metadata.get("kafka_type") == "timedelta_i32" and isinstance(value, int):
                value = dt.timedelta(milliseconds=value)
            values[f.name] = value
        elif f.default is not MISSING or f.default_factory is not MISSING:
            continue
        else:
            values[f.name] = _zero(f)
    return cls(**values)


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def _entity_of(tp: Any) -> type | None:
    inner = typing.get_args(tp)[0] if _is_tuple(tp) else tp
    if typing.get_origin(inner) in (UnionType, typing.Union):
        inner = next(a for a in typing.get_args(inner) if a is not NoneType)
    return inner if isinstance(inner, type) and hasattr(inner, "__dataclass_fields__") else None


def _zero(f: Any) -> Any:
    if _is_tuple(f.type):
        return ()
    if _entity_of(f.type) is not None:
        return build(_entity_of(f.type), {})
    kind = f.metadata.get("kafka_type")
    optional = typing.get_origin(f.type) in (UnionType, typing.Union) and NoneType in typing.get_args(f.type)
    if kind == "records":
        return b""  # an empty record set: clients reject a null one (size -1)
    if optional:
        return None
    return {
        "error_code": ErrorCode.none,
        "timedelta_i32": dt.timedelta(0),
        "timedelta_i64": dt.timedelta(0),
        "string": "",
        "bytes": b"",
        "bool": False,
        "uuid": uuid.UUID(int=0),
        "float64": 0.0,
    }.get(kind, 0)

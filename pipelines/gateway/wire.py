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
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 9),  # Produce: record batches v2; v10+ adds fields this gateway has no use for
    1: (4, 12),  # Fetch: isolation level from v4; v13+ names topics by id
    2: (1, 7),  # ListOffsets
    3: (1, 9),  # Metadata
    8: (2, 8),  # OffsetCommit: v9+ is the new (KIP-848) consumer protocol's
    9: (1, 8),  # OffsetFetch: v8 asks for several groups at once
    10: (0, 4),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups: v6 answers an unknown group with an error, not Dead
    16: (0, 4),  # ListGroups: v5 filters by group type
    17: (0, 1),  # SaslHandshake: v0 is followed by raw SASL tokens, v1 by SaslAuthenticate
    18: (0, 3),  # ApiVersions
    19: (2, 5),  # CreateTopics
    20: (1, 5),  # DeleteTopics: v6 names topics by id
    22: (0, 4),  # InitProducerId
    24: (0, 3),  # AddPartitionsToTxn: v4+ is the brokers' batched form (KIP-890)
    25: (0, 3),  # AddOffsetsToTxn: v4 is KIP-890's
    26: (0, 3),  # EndTxn: v4 is KIP-890's
    28: (0, 3),  # TxnOffsetCommit: v4 is KIP-890's
    32: (1, 4),  # DescribeConfigs
    36: (0, 2),  # SaslAuthenticate
    60: (0, 1),  # DescribeCluster
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
        FrameError: anything that does not decode as that request.
    """
    api_key, api_version, correlation_id = peek(frame)
    schema = load_request_schema(api_key, api_version)
    frame = check_sizes(schema, frame)
    try:
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, size = entity_reader(schema)(frame, used)
    except Exception as e:  # noqa: BLE001 - kio raises many types (buffer underflow, bad utf-8, values out of range)
        raise FrameError(f"{type(e).__name__}: {e}") from e
    # Bytes after the request are ignored, as brokers ignore them (librdkafka 2.16's Metadata
    # request for all topics ends with one).
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


# --- sizes before kio reads them ---------------------------------------------------------------

FIXED = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "uuid": 16,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "float64": 8,
}


def check_sizes(schema: type, frame: bytes) -> bytes:
    """Walk a request frame as ``schema`` lays it out, checking every length against the bytes
    left; the frame without the tagged fields ``schema`` does not know.

    kio's native reader sizes an array's memory from its length field before reading a single
    element, and a bogus length (billions) aborts the process on a failed allocation. Walking
    first costs one pass over a frame the gateway reads anyway, and bounds that work by its size.
    kio also refuses a tagged field its schema lacks, where the protocol says to skip it
    (librdkafka's Metadata v9 for all topics carries one): those are dropped here.

    Raises:
        FrameError: a length that runs past the frame, or a type this walk does not know.
    """
    reader = _Walk(frame)
    reader.skip(8)  # api key, api version, correlation id
    reader.legacy_sized(2)  # client id: a legacy nullable string in every header version
    if schema.__flexible__:
        reader.tagged(frozenset())  # RequestHeader v2 declares none
    reader.entity(schema, schema.__flexible__)
    return reader.result()


class _Walk:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.out = bytearray()  # the frame up to ``copied``, unknown tagged fields left out
        self.copied = 0

    def result(self) -> bytes:
        if not self.copied:
            return self.data
        return bytes(self.out + self.data[self.copied :])

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.data):
            raise FrameError(f"{n} bytes at {self.at} run past the frame ({len(self.data)} bytes)")
        self.at += n

    def uvarint(self) -> int:
        result = 0
        for shift in range(0, 35, 7):
            self.skip(1)
            byte = self.data[self.at - 1]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
        raise FrameError("an unsigned varint longer than 5 bytes")

    def legacy_sized(self, width: int) -> None:
        self.skip(width)
        size = int.from_bytes(self.data[self.at - width : self.at], "big", signed=True)
        if size >= 0:
            self.skip(size)

    def length(self, flexible: bool) -> int:
        """An array's element count (0 for null), at most one element per byte left."""
        if flexible:
            n = self.uvarint() - 1
        else:
            self.skip(4)
            n = int.from_bytes(self.data[self.at - 4 : self.at], "big", signed=True)
        if n > len(self.data) - self.at:
            raise FrameError(f"an array of {n} elements in {len(self.data) - self.at} bytes")
        return max(n, 0)

    def tagged(self, known: frozenset[int]) -> None:
        start = self.at
        kept, dropped = [], False
        for _ in range(self.uvarint()):
            begin = self.at
            tag = self.uvarint()
            self.skip(self.uvarint())
            if tag in known:
                kept.append(self.data[begin : self.at])
            else:
                dropped = True
        if dropped:
            self.out += self.data[self.copied : start]
            _put_uvarint(self.out, len(kept))
            for entry in kept:
                self.out += entry
            self.copied = self.at

    def value(self, kind: str, flexible: bool) -> None:
        if kind in FIXED:
            self.skip(FIXED[kind])
        elif kind in ("string", "records", "bytes"):
            if flexible:
                self.skip(max(self.uvarint() - 1, 0))
            else:
                self.legacy_sized(2 if kind == "string" else 4)
        else:
            raise FrameError(f"no size check for the Kafka type {kind!r}")

    def entity(self, cls: type, flexible: bool) -> None:
        for f in fields(cls):
            if "tag" in f.metadata:
                continue  # in the tagged section after the entity's fields
            nested = _entity_of(f.type)
            if _is_tuple(f.type):
                for _ in range(self.length(flexible)):
                    self.entity(nested, flexible) if nested is not None else self.value(f.metadata["kafka_type"], flexible)
            elif nested is not None:
                self.entity(nested, flexible)
            else:
                self.value(f.metadata["kafka_type"], flexible)
        if flexible:
            self.tagged(frozenset(f.metadata["tag"] for f in fields(cls) if "tag" in f.metadata))


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


# --- dicts to kio dataclasses ----------------------------------------------------------------


def build(cls: type, data: dict[str, Any]) -> Any:
    """``cls`` (a kio entity) from ``data``; a missing field takes its default or its type's zero."""
    values = {}
    for f in fields(cls):
        if f.name in data:
            value = data[f.name]
            nested = _entity_of(f.type)
            if value is None:
                if not _optional(f.type):
                    value = _zero(f)  # null where this version has no null (a newer version's nullable field)
            elif nested is not None:
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


def _required(tp: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(tp) in (UnionType, typing.Union):
        return next(a for a in typing.get_args(tp) if a is not NoneType)
    return tp


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (UnionType, typing.Union) and NoneType in typing.get_args(tp)


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(_required(tp)) is tuple


def _entity_of(tp: Any) -> type | None:
    inner = _required(typing.get_args(_required(tp))[0] if _is_tuple(tp) else tp)
    return inner if isinstance(inner, type) and hasattr(inner, "__dataclass_fields__") else None


def _zero(f: Any) -> Any:
    if _is_tuple(f.type):
        return ()
    if _entity_of(f.type) is not None:
        return build(_entity_of(f.type), {})
    kind = f.metadata.get("kafka_type")
    if kind == "records":
        return b""  # an empty record set: clients reject a null one (size -1)
    if _optional(f.type):
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

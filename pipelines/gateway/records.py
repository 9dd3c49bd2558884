"""Kafka record batches (magic v2): decoded with their codecs, encoded uncompressed.

Handled here rather than by kio's record reader: it neither decompresses batches nor keeps a
record's timestamp milliseconds. Layout (Kafka's "Message format" documentation)::

    baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (2),
    crc uint32 (CRC-32C of everything after it), attributes int16, lastOffsetDelta int32,
    baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch int16,
    baseSequence int32, recordCount int32, records (compressed as a whole per attributes)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
from crc32c import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61 bytes before the records
CRC_START = 21  # the CRC covers attributes to the end
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
TRANSACTIONAL, CONTROL = 0x10, 0x20
NO_PRODUCER = -1
XERIAL = b"\x82SNAPPY\x00"  # the Java client's framed snappy


class CorruptRecords(ValueError):
    """Bytes that are not a well-formed v2 batch (a CRC mismatch included): CORRUPT_MESSAGE."""


@dataclass(frozen=True)
class Record:
    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class Batch:
    """One record batch, its records as columns (in offset-delta order 0, 1, 2, ...): a log
    table's rows are built from the columns at once, where an object per record would cost more
    than all the rest of a produce."""

    base_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    keys: pa.Array  # large_binary, null for no key
    values: pa.Array  # large_binary, null for no value
    headers: list[tuple[tuple[str, bytes | None], ...]] | None  # None: no record has headers
    timestamps_ms: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.values)

    @property
    def records(self) -> list[Record]:
        headers = self.headers or [()] * len(self)
        columns = (self.timestamps_ms.tolist(), self.keys.to_pylist(), self.values.to_pylist(), headers)
        return [Record(i, t, k, v, h) for i, (t, k, v, h) in enumerate(zip(*columns, strict=True))]

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER


def decode_batches(data: bytes) -> list[Batch]:
    """Every batch in a produce request's records field.

    Raises:
        CorruptRecords: truncated data, another magic, a CRC mismatch, an unknown codec,
            records that do not parse to the batch's last byte or disagree with its count.
    """
    view = memoryview(data)
    batches, at = [], 0
    while at < len(view):
        if len(view) - at < HEADER.size:
            raise CorruptRecords(f"{len(view) - at} bytes cannot hold a batch header")
        (base, length, _epoch, magic, crc, attributes, _last_delta, base_ts, _max_ts, pid, pepoch, seq, count) = (
            HEADER.unpack_from(view, at)
        )
        end = at + 12 + length
        if magic != 2:
            raise CorruptRecords(f"magic {magic}: only v2 record batches are accepted")
        if length < HEADER.size - 12 or end > len(view):
            raise CorruptRecords(f"batch length {length} runs past the data")
        if crc32c(view[at + CRC_START : end]) != crc:
            raise CorruptRecords("CRC-32C mismatch")
        codec = attributes & 0x07
        if codec not in CODECS:
            raise CorruptRecords(f"unknown compression codec {codec}")
        body = _decompress(codec, bytes(view[at + HEADER.size : end]))
        if count < 0:
            raise CorruptRecords(f"record count {count}")
        batches.append(Batch(base, attributes, pid, pepoch, seq, *_decode_records(body, count, base_ts)))
        at = end
    return batches


def _decompress(codec: int, body: bytes) -> bytes:
    try:
        if codec == 0:
            return body
        if codec == 1:
            return bytes(cramjam.gzip.decompress(body))
        if codec == 2:
            return _snappy(body)
        if codec == 3:
            return bytes(cramjam.lz4.decompress(body))
        return bytes(cramjam.zstd.decompress(body))
    except CorruptRecords:
        raise
    except Exception as e:  # noqa: BLE001 - cramjam's DecompressionError and friends
        raise CorruptRecords(f"{CODECS[codec]}: {e}") from e


def _snappy(body: bytes) -> bytes:
    """Raw snappy (librdkafka) or the Java client's xerial framing: header, then sized raw blocks."""
    if not body.startswith(XERIAL):
        return bytes(cramjam.snappy.decompress_raw(body))
    out, at = bytearray(), 16
    while at < len(body):
        if at + 4 > len(body):
            raise CorruptRecords("snappy: truncated block size")
        (size,) = struct.unpack_from(">i", body, at)
        if size < 0 or at + 4 + size > len(body):
            raise CorruptRecords("snappy: block runs past the data")
        out += bytes(cramjam.snappy.decompress_raw(body[at + 4 : at + 4 + size]))
        at += 4 + size
    return bytes(out)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A zig-zag varint (at most 10 bytes) and the position after it."""
    if at < len(data) and data[at] < 0x80:  # one byte: most lengths and deltas of small records
        byte = data[at]
        return (byte >> 1) ^ -(byte & 1), at + 1
    shift = result = 0
    for i in range(10):
        if at + i >= len(data):
            raise CorruptRecords("truncated varint")
        byte = data[at + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at + i + 1
        shift += 7
    raise CorruptRecords("varint longer than 10 bytes")


def _sized(data: bytes, at: int) -> tuple[bytes | None, int]:
    size, at = _varint(data, at)
    if size == -1:
        return None, at
    if size < 0 or at + size > len(data):
        raise CorruptRecords(f"field of {size} bytes runs past the record")
    return data[at : at + size], at + size


Columns = tuple[pa.Array, pa.Array, list[tuple[tuple[str, bytes | None], ...]] | None, np.ndarray]


def _decode_records(body: bytes, count: int, base_ts: int) -> Columns:
    """Keys, values, headers and timestamps of a batch's ``count`` records.

    Only the records' lengths are read one record at a time (each says where the next begins);
    then each field is read for all records at once, with numpy, and keys and values are
    gathered into Arrow arrays. Headers, rare, are read record by record.
    """
    buf = np.frombuffer(body, dtype=np.uint8)
    starts, ends = _record_bounds(body, buf, count)
    stamps, at = _varints(buf, starts + 1, ends)  # after the record attributes, unused
    deltas, at = _varints(buf, at, ends)
    if not np.array_equal(deltas, np.arange(count)):
        raise CorruptRecords("offset deltas are not 0, 1, 2, ...")
    keys, at = _binaries(buf, at, ends)
    values, at = _binaries(buf, at, ends)
    n_headers, at = _varints(buf, at, ends)
    if (n_headers < 0).any():
        raise CorruptRecords(f"header count {n_headers.min()}")
    headers = None
    if n_headers.any():
        headers = [()] * count
        for i in np.flatnonzero(n_headers).tolist():
            headers[i], at[i] = _headers(body[: ends[i]], int(at[i]), int(n_headers[i]))
    if not np.array_equal(at, ends):
        raise CorruptRecords("record length disagrees with its fields")
    return keys, values, headers, stamps + base_ts


def _record_bounds(body: bytes, buf: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's fields begin and where the record ends.

    Each record's length says where the next begins, so the records are found along that
    chain. A batch's records mostly come in runs of one length (values of one size; a run ends
    where a timestamp or offset delta needs another varint byte): along a run, a record begins
    every so many bytes with the same length bytes, which numpy checks for the whole run at
    once. The records between runs are walked one by one. A length's sign is not looked at on
    the way: the lengths are read again for all records at once and checked against the chain.
    """
    pieces: list[np.ndarray] = []
    heads: list[int] = []  # walked since the last run
    at, left, block = 0, count, WALK
    try:
        while left:
            at = _walk(body, at, min(block, left), heads)
            left -= min(block, left)
            run, step = _run(body, buf, at, left) if left else (0, 0)
            if run:
                pieces += [np.array(heads, dtype=np.int64), at + step * np.arange(run, dtype=np.int64)]
                heads = []
                at, left = at + run * step, left - run
            # Walk longer before looking again where runs are short or none: the looks then cost
            # a few per batch, not one per record.
            block = WALK if run >= LONG_RUN else min(2 * block, count)
    except IndexError:
        raise CorruptRecords("a record runs past the batch") from None
    if at != len(body):
        raise CorruptRecords(
            f"{len(body) - at} bytes after the batch's {count} records" if at < len(body) else "a record runs past the batch"
        )
    starts = np.array(heads, dtype=np.int64)
    if pieces:
        starts = np.concatenate([*pieces, starts])
    ends = np.empty_like(starts)
    ends[:-1], ends[-1:] = starts[1:], at  # records are back to back
    lengths, starts = _varints(buf, starts, ends)
    if not np.array_equal(starts + lengths, ends):  # a negative length
        raise CorruptRecords("a record length is negative")
    return starts, ends


WALK = 32  # records walked one by one before a run of equal lengths is looked for
PROBE = 4  # records of a run seen in Python before numpy measures it
LONG_RUN = 256  # a run at least this long: look for the next one soon


def _walk(body: bytes, at: int, count: int, heads: list[int]) -> int:
    """Where the last of ``count`` records from ``at`` ends; where each begins is added to ``heads``."""
    append = heads.append
    for _ in range(count):
        append(at)
        byte = body[at]
        if byte < 0x80:  # one byte: records of up to 63 bytes
            at += 1 + (byte >> 1)
        elif body[at + 1] < 0x80:  # two bytes: records of 64 to 8,191 bytes
            at += 2 + (((byte & 0x7F) | (body[at + 1] << 7)) >> 1)
        else:
            length, at = _varint(body, at)
            at += max(length, 0)
    return at


def _run(body: bytes, buf: np.ndarray, at: int, most: int) -> tuple[int, int]:
    """How many records from ``at`` on (at most ``most``) begin every ``step`` bytes with the
    same length bytes as the one at ``at`` (records of one to two length bytes), and ``step``;
    (0, 0) for fewer than :data:`PROBE`."""
    width = 1 if body[at] < 0x80 else 2
    if width == 2 and body[at + 1] >= 0x80:
        return 0, 0
    step = _walk(body, at, 1, []) - at
    most = min(most, (len(body) - at) // step)
    length = body[at : at + width]
    if most < PROBE or any(body[at + i * step : at + i * step + width] != length for i in range(1, PROBE)):
        return 0, 0
    n, size = PROBE, 256
    while n < most:
        k = min(size, most - n)
        heads = at + step * np.arange(n, n + k, dtype=np.int64)
        same = buf[heads] == length[0]
        if width == 2:
            same &= buf[heads + 1] == length[1]
        if not same.all():
            return n + int(same.argmin()), step
        n, size = n + k, 2 * size
    return n, step


def _varints(buf: np.ndarray, at: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varint at each position ``at`` (each inside its record, before ``ends``), as
    int64 (a 64-bit varlong wraps as Kafka's does), and the positions after them."""
    value = np.zeros(len(at), dtype=np.uint64)
    size = np.zeros(len(at), dtype=np.int64)
    reading = np.arange(len(at))
    for k in range(10):
        if not reading.size:
            break
        where = at[reading] + k
        if (where >= ends[reading]).any():
            raise CorruptRecords("truncated varint")
        byte = buf[where].astype(np.uint64)
        value[reading] |= (byte & np.uint64(0x7F)) << np.uint64(7 * k)
        last = (byte & np.uint64(0x80)) == 0
        size[reading[last]] = k + 1
        reading = reading[~last]
    if reading.size:
        raise CorruptRecords("varint longer than 10 bytes")
    signed = (value >> np.uint64(1)).view(np.int64) ^ -(value & np.uint64(1)).view(np.int64)
    return signed, at + size


def _binaries(buf: np.ndarray, at: np.ndarray, ends: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The length-prefixed byte strings at ``at`` (length -1: null) as one Arrow array."""
    lengths, at = _varints(buf, at, ends)
    null = lengths == -1
    if (lengths < -1).any() or (at + np.maximum(lengths, 0) > ends).any():
        raise CorruptRecords("a field runs past its record")
    n = len(at)
    if not n or null.all():
        return pa.nulls(n, pa.large_binary()), at
    lengths = np.where(null, 0, lengths)
    # The body read as alternating slices, each field's bytes then the bytes up to the next
    # field; Arrow's take copies every other slice into one array at native speed.
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2], bounds[1::2] = at, at + lengths
    slices = 2 * n - 1
    validity = None
    if null.any():
        valid = np.ones(slices, dtype=bool)
        valid[0::2] = ~null
        validity = pa.array(valid).buffers()[1]
    whole = pa.Array.from_buffers(pa.large_binary(), slices, [validity, pa.py_buffer(bounds), pa.py_buffer(buf)])
    return whole.take(pa.array(np.arange(0, slices, 2))), at + lengths


def _headers(record: bytes, at: int, count: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """``count`` headers from ``at`` in ``record`` (the bytes up to the record's end)."""
    pairs = []
    for _ in range(count):
        name, at = _sized(record, at)
        if name is None:
            raise CorruptRecords("a header without a key")
        value, at = _sized(record, at)
        try:
            pairs.append((name.decode("utf-8"), value))
        except UnicodeDecodeError as e:
            raise CorruptRecords("a header key that is not UTF-8") from e
    return tuple(pairs), at


# --- encoding --------------------------------------------------------------------------------


def _put_varint(out: bytearray, value: int) -> None:
    value = (value << 1) ^ (value >> 63)
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_sized(out: bytearray, value: bytes | None) -> None:
    if value is None:
        _put_varint(out, -1)
    else:
        _put_varint(out, len(value))
        out += value


def encode_batch(
    base_offset: int,
    records: list[tuple[int, int, bytes | None, bytes | None, tuple]],
    producer: tuple[int, int, int] = (NO_PRODUCER, -1, -1),
) -> bytes:
    """An uncompressed batch of ``(offset, timestamp_ms, key, value, headers)`` with offsets from
    ``base_offset``; ``producer`` is (producer id, epoch, base sequence), none by default (fetches)."""
    body = bytearray()
    base_ts = min(r[1] for r in records)
    for offset, ts, key, value, headers in records:
        rec = bytearray(b"\x00")
        _put_varint(rec, ts - base_ts)
        _put_varint(rec, offset - base_offset)
        _put_sized(rec, key)
        _put_sized(rec, value)
        _put_varint(rec, len(headers))
        for name, hvalue in headers:
            _put_sized(rec, name.encode("utf-8"))
            _put_sized(rec, hvalue)
        _put_varint(body, len(rec))
        body += rec
    last_delta = records[-1][0] - base_offset
    max_ts = max(r[1] for r in records)
    after_crc = struct.pack(">hiqqqhii", 0, last_delta, base_ts, max_ts, *producer, len(records)) + bytes(body)
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, then the rest
    return struct.pack(">qiibI", base_offset, length, 0, 2, crc32c(after_crc)) + after_crc

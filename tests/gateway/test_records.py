"""Record batches (v2) as the gateway reads and writes them: codecs, CRC, offsets, timestamps."""

from __future__ import annotations

import struct

import cramjam
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch

from icelog.pipelines.gateway.produce import Pending, commit_groups
from icelog.pipelines.gateway.records import HEADER, XERIAL, Batch, CorruptRecords, decode_batches, encode_batch
from icelog.pipelines.gateway.topics import NO_TIMESTAMP, batch_rows, decode_headers, encode_headers

RECORDS = [
    (10, 1_700_000_000_123, b"k", b"v", (("h", b"x"), ("none", None))),
    (11, 1_700_000_000_999, None, b"", ()),
    (12, 1_699_999_999_001, b"k3", None, ()),
]


def test_an_encoded_batch_reads_back_here_and_in_kio():
    data = encode_batch(10, RECORDS, producer=(7, 2, 40))
    (batch,) = decode_batches(data)
    assert (batch.base_offset, batch.producer_id, batch.producer_epoch, batch.base_sequence) == (10, 7, 2, 40)
    got = [(batch.base_offset + r.offset_delta, r.timestamp_ms, r.key, r.value, r.headers) for r in batch.records]
    assert got == RECORDS  # milliseconds kept, null key and value kept, header with a null value kept
    theirs, size = read_batch(data, 0)  # kio checks the CRC-32C and the layout independently
    assert size == len(data) and [r.offset for r in theirs.records] == [10, 11, 12]


def test_a_batch_becomes_rows_of_the_kafka_schema_column_by_column():
    records = [*RECORDS, (13, NO_TIMESTAMP, b"k4", b"v4", ())]
    (batch,) = decode_batches(encode_batch(10, records))
    rows = batch_rows(batch).to_pylist()
    assert [(r["key"], r["value"], decode_headers(r["headers"])) for r in rows] == [(k, v, h) for _, _, k, v, h in records]
    assert rows[1]["headers"] is None  # no headers: null, as encode_headers says
    stamps = batch_rows(batch).column("record_timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [t * 1000 for _, t, _, _, _ in RECORDS] + [None]  # milliseconds kept; no timestamp is null
    (plain,) = decode_batches(encode_batch(0, [(0, 5, None, b"v", ())]))
    assert batch_rows(plain).column("headers").null_count == 1


def _compressed(codec: int, body: bytes) -> bytes:
    return {
        1: lambda: bytes(cramjam.gzip.compress(body)),
        2: lambda: bytes(cramjam.snappy.compress_raw(body)),
        3: lambda: bytes(cramjam.lz4.compress(body)),
        4: lambda: bytes(cramjam.zstd.compress(body)),
        5: lambda: XERIAL + b"\x00\x00\x00\x01\x00\x00\x00\x01" + _xerial_blocks(body),
    }[codec]()


def _xerial_blocks(body: bytes) -> bytes:
    half = len(body) // 2
    out = b""
    for part in (body[:half], body[half:]):
        block = bytes(cramjam.snappy.compress_raw(part))
        out += struct.pack(">i", len(block)) + block
    return out


def _recompress(data: bytes, codec: int) -> bytes:
    """The same batch with its records compressed by ``codec`` (5: snappy in the Java client's framing)."""
    from crc32c import crc32c

    header = bytearray(data[: HEADER.size])
    body = _compressed(codec, data[HEADER.size :])
    struct.pack_into(">h", header, 21, 2 if codec == 5 else codec)
    out = header + body
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("codec", [1, 2, 3, 4, 5], ids=["gzip", "snappy", "lz4", "zstd", "snappy-xerial"])
def test_compressed_batches_decode(codec):
    data = _recompress(encode_batch(10, RECORDS), codec)
    (batch,) = decode_batches(data)
    assert [r.value for r in batch.records] == [b"v", b"", None]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d[:-1],  # truncated
        lambda d: d[:-1] + bytes([d[-1] ^ 1]),  # CRC mismatch
        lambda d: d[:16] + b"\x01" + d[17:],  # magic 1
        lambda d: d[:21] + b"\x00\x07" + d[23:],  # codec 7
        lambda d: d[:57] + struct.pack(">i", 99) + d[61:],  # more records than the batch holds
        lambda d: d + b"\x00" * 5,  # trailing bytes shorter than a batch
    ],
    ids=["truncated", "crc", "magic", "codec", "count", "trailing"],
)
def test_malformed_batches_are_corrupt(mangle):
    data = encode_batch(0, RECORDS[:2])
    with pytest.raises(CorruptRecords):
        decode_batches(mangle(data))


def test_a_corrupt_compressed_body_is_corrupt_not_a_crash():
    data = bytearray(_recompress(encode_batch(0, RECORDS), 4))
    data[HEADER.size + 5] ^= 0xFF
    from crc32c import crc32c

    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))  # a valid CRC over a broken zstd frame
    with pytest.raises(CorruptRecords):
        decode_batches(bytes(data))


def test_headers_round_trip_through_their_column():
    headers = (("a", b"\x00\xff"), ("b", None), ("a", b""))
    assert decode_headers(encode_headers(headers)) == headers
    assert encode_headers(()) is None and decode_headers(None) == ()


def _pending(partition: int, producer: int | None) -> Pending:
    batch = Batch(0, 0, -1 if producer is None else producer, 0, 0, pa.array([]), pa.array([]), None, np.zeros(0))
    return Pending(partition, batch, None)  # type: ignore[arg-type]


def test_commit_groups_keep_each_producers_partition_order():
    items = [
        _pending(0, None),
        _pending(1, None),
        _pending(0, 5),
        _pending(1, 5),
        _pending(0, 5),
        _pending(0, None),
        _pending(0, 6),
    ]
    groups = commit_groups(items)
    shape = [[(i.partition, i.batch.producer_id) for i in g] for g in groups]
    # plain batches share one append; producer 5's second batch on partition 0 waits for the next append
    assert shape == [[(0, -1), (1, -1), (0, -1)], [(0, 5), (1, 5)], [(0, 5)], [(0, 6)]]


_blobs = st.one_of(st.none(), st.binary(max_size=300))  # over 63 bytes: lengths of two varint bytes
_records = st.lists(
    st.tuples(
        st.integers(-1, 2**41),  # a timestamp, -1 for none
        _blobs,
        _blobs,
        st.lists(st.tuples(st.text(max_size=5), _blobs), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(records=_records, base=st.integers(0, 2**40))
def test_any_batch_reads_back_exactly(records, base):
    """Every field of every record, whatever its size, null or header mix (the columnar reader
    against the byte-by-byte writer)."""
    rows = [(base + i, t, k, v, h) for i, (t, k, v, h) in enumerate(records)]
    (batch,) = decode_batches(encode_batch(base, rows))
    assert [(batch.base_offset + r.offset_delta, r.timestamp_ms, r.key, r.value, r.headers) for r in batch.records] == rows
    assert (batch.headers is None) == all(not h for *_, h in rows)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_mangled_record_body_is_corrupt_or_reads_back_consistently(data):
    """Flipped, cut or inserted bytes inside the records (the CRC recomputed, so only the record
    reader stands between them and the table) give CorruptRecords, never another error."""
    rows = [(i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * (i * 30), ((("h", b"x"),) if i % 2 else ())) for i in range(5)]
    _mangle_and_decode(data, rows)


def _mangle_and_decode(data, rows: list) -> None:
    """One flipped, cut or inserted byte in the records of ``rows`` (the CRC recomputed): the
    batch decodes to CorruptRecords or to as many records as were sent."""
    body = bytearray(encode_batch(0, rows)[HEADER.size :])
    at = data.draw(st.integers(0, len(body) - 1))
    kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if kind == "flip":
        body[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        del body[at]
    else:
        body.insert(at, data.draw(st.integers(0, 255)))
    try:
        (batch,) = decode_batches(_rebatched(bytes(body), len(rows)))
    except CorruptRecords:
        return
    assert len(batch) == len(rows) and len(batch.records) == len(rows)


def _rebatched(body: bytes, count: int) -> bytes:
    """A v2 batch around ``body`` with a correct length and CRC."""
    from crc32c import crc32c

    header = bytearray(encode_batch(0, [(0, 0, None, None, ())])[: HEADER.size])
    struct.pack_into(">i", header, 57, count)
    out = header + body
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def test_a_varint_running_past_the_last_record_is_corrupt():
    body = bytearray(encode_batch(0, [(0, 0, None, None, ())])[HEADER.size :])
    body[-1] |= 0x80  # the header count, the record's last byte, now says "more bytes follow"
    with pytest.raises(CorruptRecords, match="truncated varint"):
        decode_batches(_rebatched(bytes(body), 1))


def test_records_of_three_byte_lengths_read_back():
    """Records of 8 KiB and more have lengths of three varint bytes or more, beside short ones."""
    rows = [(0, 5, None, b"a" * 10_000, ()), (1, 5, b"k", b"b", ()), (2, 6, b"k" * 70_000, b"c" * 300_000, (("h", b"x"),))]
    (batch,) = decode_batches(encode_batch(0, rows))
    assert [(r.offset_delta, r.timestamp_ms, r.key, r.value, r.headers) for r in batch.records] == rows


@pytest.mark.parametrize("prefix", [bytes([2 * 5 - 1]), b"\x81\x01"], ids=["one-byte", "two-byte"])
def test_a_negative_record_length_is_corrupt(prefix):
    """A length of -5 (one varint byte) or -65 (two), followed by as many bytes as its absolute
    value less one would span, then a well-formed record: the lengths chain through the batch,
    and the negative one is still refused."""
    second = encode_batch(0, [(0, 0, None, None, ()), (1, 0, None, b"v", ())])[HEADER.size :]
    second = second[1 + second[0] // 2 :]  # the second record alone (the first is one length byte and its fields)
    span = {1: 5, 2: 66}[len(prefix)]  # how far the record-by-record walk steps over it
    body = prefix + b"\x00" * (span - len(prefix)) + second
    with pytest.raises(CorruptRecords, match="negative"):
        decode_batches(_rebatched(body, 2))


_runs = st.lists(  # runs of records with values of one size: a batch as producers mostly send them
    st.tuples(st.sampled_from([None, 0, 5, 57, 58, 120, 9_000]), st.integers(1, 300)), min_size=1, max_size=5
)


@settings(max_examples=60, deadline=None)
@given(runs=_runs, data=st.data())
def test_records_in_runs_of_one_length_read_back_or_are_corrupt_when_mangled(runs, data):
    """Values of one size make runs of records of one length (broken where the offset delta
    needs a second varint byte, at 64); records inside such runs read back exactly, and a
    flipped, cut or inserted byte among them gives CorruptRecords or a consistent read."""
    values = [None if size is None else bytes([i % 251]) * size for size, repeat in runs for i in range(repeat)]
    rows = [(i, 1_700_000_000_000, None, v, ()) for i, v in enumerate(values)]
    (batch,) = decode_batches(encode_batch(0, rows))
    assert batch.values.to_pylist() == values and len(batch.records) == len(rows)
    _mangle_and_decode(data, rows)


def test_batch_rows_have_the_arrow_types_a_kafka_topic_reads_as():
    """So the append's cast to the table's schema copies nothing (the keys and values above all)."""
    from icelog.pipelines.gateway.topics import KAFKA_PAYLOAD
    from icelog.storage.log import schema as cols

    table = cols.payload_arrow_schema(cols.log_schema(cols.payload_fields(KAFKA_PAYLOAD), key_hash=False))
    (batch,) = decode_batches(encode_batch(10, RECORDS))
    rows = batch_rows(batch).schema
    assert [(f.name, f.type) for f in rows] == [(f.name, f.type) for f in table]

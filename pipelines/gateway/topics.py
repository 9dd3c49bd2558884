"""Kafka topics are log tables: names, the Kafka record schema, and records to rows and back.

A topic ``ns.table`` is the log table ``ns.table``; a topic without a dot is a table in the
default namespace ``logs`` (``events`` is ``logs.events``), as everywhere in icelog. Kafka
partition N is log partition N, a Kafka offset is ``log_offset``. ``icelog_system.*`` tables are
neither listed nor writable.

A topic the gateway writes has the Kafka record schema: ``key`` and ``value`` (binary),
``headers`` (a JSON list of ``[name, base64 value or null]``, null for none) and
``record_timestamp`` (the producer's timestamp, milliseconds). ``log_timestamp`` is icelog's
append time, as on every log table.
"""

from __future__ import annotations

import base64
import json

import pyarrow as pa
from pyiceberg.catalog import Catalog

from icelog.pipelines.cli.app import dumps
from icelog.pipelines.gateway.records import Batch
from icelog.storage.log import schema as cols
from icelog.storage.log.table import LogTable

KAFKA_PAYLOAD = [
    {"name": "key", "type": "binary"},
    {"name": "value", "type": "binary"},
    {"name": "headers", "type": "string"},
    {"name": "record_timestamp", "type": "timestamptz"},
]
SYSTEM_NAMESPACE = "icelog_system"
NO_TIMESTAMP = -1  # Kafka's "no timestamp": stored as null, read back as the append time
MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last time a timestamptz column reads back as


def valid_timestamp(ms: int) -> bool:
    return ms == NO_TIMESTAMP or 0 <= ms <= MAX_TIMESTAMP_MS


def table_name(topic: str) -> str | None:
    """The log table of ``topic``, or None when the name cannot be one (or is a system table)."""
    try:
        namespace, name = cols.parse_identifier(topic)
    except Exception:  # noqa: BLE001 - InvalidIdentifier, or not a string
        return None
    return None if namespace == SYSTEM_NAMESPACE else f"{namespace}.{name}"


def create_topic(catalog: Catalog, topic: str, partitions: int) -> LogTable:
    """Create the log table of ``topic`` with the Kafka record schema (``LogTable.create``'s errors)."""
    return LogTable.create(catalog, topic, partitions, payload=KAFKA_PAYLOAD)


def has_kafka_schema(payload: pa.Schema) -> bool:
    t = pa.types
    wanted = {
        "key": lambda x: t.is_binary(x) or t.is_large_binary(x),
        "value": lambda x: t.is_binary(x) or t.is_large_binary(x),
        "headers": lambda x: t.is_string(x) or t.is_large_string(x),
        "record_timestamp": t.is_timestamp,
    }
    return set(payload.names) == set(wanted) and all(ok(payload.field(n).type) for n, ok in wanted.items())


def encode_headers(headers: tuple[tuple[str, bytes | None], ...]) -> str | None:
    if not headers:
        return None
    return json.dumps([[k, None if v is None else base64.b64encode(v).decode("ascii")] for k, v in headers])


def decode_headers(text: str | None) -> tuple[tuple[str, bytes | None], ...]:
    if not text:
        return ()
    return tuple((k, None if v is None else base64.b64decode(v)) for k, v in json.loads(text))


def batch_rows(batch: Batch) -> pa.Table:
    """A batch's records (timestamps checked by :func:`valid_timestamp`) as rows of the Kafka record schema.

    In the large Arrow types pyiceberg reads a table's ``binary`` and ``string`` columns as, so
    that the append's cast to the table's schema has nothing to copy.
    """
    stamps = batch.timestamps_ms
    headers = [encode_headers(h) for h in batch.headers] if batch.headers is not None else pa.nulls(len(batch))
    return pa.table(
        {
            "key": batch.keys,
            "value": batch.values,
            "headers": pa.array(headers, pa.large_string()),
            "record_timestamp": pa.array(stamps * 1000, pa.int64(), mask=stamps == NO_TIMESTAMP).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


def rows_to_records(rows: pa.Table) -> list[tuple[int, int, bytes | None, bytes | None, tuple]]:
    """Rows of a log table as ``(offset, timestamp_ms, key, value, headers)``.

    Kafka-schema rows come back as they were produced. Rows of any other log table: the key is
    the text of its ``key`` column (if it has one), the value a JSON object of its payload
    columns (as ``icelog consume --output json`` prints them), the timestamp ``log_timestamp``.
    """
    offsets = rows.column(cols.OFFSET).to_pylist()
    payload = rows.drop_columns([c for c in rows.column_names if c in cols.SYSTEM_COLUMNS])
    if has_kafka_schema(payload.schema):
        stamps = rows.column("record_timestamp").cast(pa.int64()).to_pylist()
        appended = _millis(rows)
        return [
            (o, appended[i] if t is None else t // 1000, k, v, decode_headers(h))
            for i, (o, t, k, v, h) in enumerate(
                zip(
                    offsets,
                    stamps,
                    rows.column("key").to_pylist(),
                    rows.column("value").to_pylist(),
                    rows.column("headers").to_pylist(),
                    strict=True,
                )
            )
        ]
    keys = payload.column("key").to_pylist() if "key" in payload.column_names else [None] * rows.num_rows
    appended = _millis(rows)
    out = []
    for i, row in enumerate(payload.to_pylist()):
        key = keys[i]
        key_bytes = None if key is None else (key if isinstance(key, bytes) else str(key).encode("utf-8"))
        out.append((offsets[i], appended[i], key_bytes, dumps(row).encode("utf-8"), ()))
    return out


def _millis(rows: pa.Table) -> list[int]:
    """``log_timestamp`` (icelog's append time) in epoch milliseconds."""
    return [us // 1000 for us in rows.column(cols.TIMESTAMP).cast(pa.int64()).to_pylist()]

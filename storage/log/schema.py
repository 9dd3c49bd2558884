"""Log-table schemas: system columns, payload columns and identifiers.

System columns need no quoting in DuckDB or Spark SQL (so no ``offset`` or ``partition``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from icelog.storage.errors import ForeignPartitionSpec, InvalidIdentifier, InvalidInput, SchemaMismatch
from icelog.storage.log.names import (  # noqa: F401 (re-exported)
    _NAME,
    DEFAULT_NAMESPACE,
    KEY_HASH,
    OFFSET,
    PARTITION,
    PRODUCER_EPOCH,
    PRODUCER_ID,
    PRODUCER_SEQ,
    SYSTEM_COLUMNS,
    TIMESTAMP,
    parse_identifier,
    qualified,
)
from icelog.storage.properties import KEY_COLUMN

DEFAULT_KEY_COLUMN = "key"


PAYLOAD_TYPES: dict[str, IcebergType] = {
    "string": StringType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    "binary": BinaryType(),
}


def payload_fields(spec: list[dict] | None = None) -> list[tuple[str, IcebergType, bool]]:
    """Validate a payload column list ``[{"name", "type", "required"?}]``; default key/value strings."""
    if spec is None:
        return [("key", StringType(), False), ("value", StringType(), False)]
    if not isinstance(spec, list) or not spec:
        raise InvalidInput(reason="a payload schema is a non-empty list of {name, type} objects")
    fields: list[tuple[str, IcebergType, bool]] = []
    for column in spec:
        if not isinstance(column, dict) or "name" not in column or "type" not in column:
            raise InvalidInput(reason=f"payload column {column!r} needs 'name' and 'type'")
        name, type_name = column["name"], column["type"]
        if not isinstance(type_name, str):
            raise InvalidInput(reason=f"column {name!r}: a type is a string, one of {sorted(PAYLOAD_TYPES)}")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidIdentifier(identifier=str(name), reason="column names are letters, digits and _")
        if name in SYSTEM_COLUMNS:
            raise InvalidInput(reason=f"payload column {name!r} collides with a system column")
        if type_name not in PAYLOAD_TYPES:
            raise InvalidInput(reason=f"column {name!r}: unknown type {type_name!r}; one of {sorted(PAYLOAD_TYPES)}")
        fields.append((name, PAYLOAD_TYPES[type_name], bool(column.get("required", False))))
    if len({f[0] for f in fields}) != len(fields):
        raise InvalidInput(reason="payload column names must be unique")
    return fields


def load_payload_spec(path: str | Path) -> list[dict]:
    """Read a payload schema file: JSON, either a list of columns or ``{"fields": [...]}``."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
        raise InvalidInput(reason=f"cannot read schema file {path}: {e}") from e
    return doc["fields"] if isinstance(doc, dict) and "fields" in doc else doc


def log_schema(payload: list[tuple[str, IcebergType, bool]], key_hash: bool = False) -> Schema:
    """System columns, then the payload; with ``key_hash``, ``log_key_hash`` last (a new field id,
    so tables created before it keep theirs)."""
    system = [
        NestedField(1, PARTITION, IntegerType(), required=True),
        NestedField(2, OFFSET, LongType(), required=True),
        NestedField(3, TIMESTAMP, TimestamptzType(), required=True),
        NestedField(4, PRODUCER_ID, LongType(), required=False),
        NestedField(5, PRODUCER_EPOCH, IntegerType(), required=False),
        NestedField(6, PRODUCER_SEQ, IntegerType(), required=False),
    ]
    user = [NestedField(7 + i, name, t, required=req) for i, (name, t, req) in enumerate(payload)]
    extra = [NestedField(7 + len(payload), KEY_HASH, IntegerType(), required=False)] if key_hash else []
    return Schema(*system, *user, *extra)


def key_column(schema: Schema, properties: Mapping[str, str]) -> str | None:
    """The payload column hashed into ``log_key_hash``, or None if the table has no such column
    (created before it, or without a key column)."""
    names = {f.name for f in schema.fields}
    if KEY_HASH not in names:
        return None
    name = declared_key_column(properties)
    return name if name in names else None


def declared_key_column(properties: Mapping[str, str]) -> str:
    """The table's key column as its properties name it (``icelog.key-column``, default ``key``)."""
    return properties.get(KEY_COLUMN, DEFAULT_KEY_COLUMN)


def log_partition_spec(schema: Schema) -> PartitionSpec:
    source = schema.find_field(PARTITION).field_id
    return PartitionSpec(PartitionField(source_id=source, field_id=1000, transform=IdentityTransform(), name=PARTITION))


def log_partition_position(spec: PartitionSpec, schema: Schema) -> int | None:
    """Where ``spec``'s partition tuple holds the log partition (its ``identity(log_partition)``
    field), or None when it has none (a spec another tool made)."""
    source = schema.find_field(PARTITION).field_id
    for i, f in enumerate(spec.fields):
        if f.source_id == source and isinstance(f.transform, IdentityTransform):
            return i
    return None


def is_log_spec(spec: PartitionSpec, schema: Schema) -> bool:
    """``identity(log_partition)`` alone: the spec icelog writes under (one log partition per file)."""
    return len(spec.fields) == 1 and log_partition_position(spec, schema) == 0


def check_log_spec(identifier: str, metadata: TableMetadata) -> None:
    """Raise :class:`ForeignPartitionSpec` unless the table's default spec is a log spec.

    Every writer of log data files calls this before writing one: pyiceberg writes the
    manifests of new files under the default spec, and a file of one log partition has no
    place in another spec's partition tuple.
    """
    spec = metadata.spec()
    if not is_log_spec(spec, metadata.schema()):
        fields = ", ".join(f"{f.name}={f.transform}" for f in spec.fields) or "unpartitioned"
        raise ForeignPartitionSpec(table=identifier, spec_id=spec.spec_id, spec=fields)


def log_spec_id(metadata: TableMetadata) -> int | None:
    """The newest of the table's specs that is a log spec (None: it has none)."""
    schema = metadata.schema()
    found = [s.spec_id for s in metadata.partition_specs if is_log_spec(s, schema)]
    return max(found) if found else None


def log_sort_order(schema: Schema) -> SortOrder:
    return SortOrder(SortField(source_id=schema.find_field(OFFSET).field_id, transform=IdentityTransform()))


def payload_arrow_schema(schema: Schema) -> pa.Schema:
    full = schema.as_arrow()
    return pa.schema([f for f in full if f.name not in SYSTEM_COLUMNS])


def conform_payload(table: str, rows: pa.Table, payload: pa.Schema) -> pa.Table:
    """Cast user rows to the payload schema, or raise :class:`SchemaMismatch` (nothing written).

    Columns are matched by name; a missing optional column becomes nulls, an unknown column
    or a lossy cast is an error.
    """
    names = set(rows.column_names)
    unknown = names - set(payload.names)
    if unknown:
        raise SchemaMismatch(table=table, reason=f"unknown columns {sorted(unknown)}; payload is {payload.names}")
    columns = []
    for field in payload:
        if field.name not in names:
            if not field.nullable:
                raise SchemaMismatch(table=table, reason=f"required column {field.name!r} is missing")
            columns.append(pa.nulls(rows.num_rows, field.type))
            continue
        column = rows.column(field.name)
        if not _castable(column.type, field.type):
            raise SchemaMismatch(table=table, reason=f"column {field.name!r}: {column.type} is not {field.type}")
        try:
            column = column.cast(field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SchemaMismatch(
                table=table, reason=f"column {field.name!r}: cannot cast {column.type} to {field.type} ({e})"
            ) from e
        if not field.nullable and column.null_count:
            raise SchemaMismatch(table=table, reason=f"required column {field.name!r} has nulls")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=payload)


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Casts that keep meaning: widening numerics, and strings parsed as dates/timestamps (JSON)."""
    t = pa.types
    if source == target or t.is_null(source):
        return True
    if t.is_string(source) or t.is_large_string(source):
        return t.is_string(target) or t.is_large_string(target) or t.is_timestamp(target) or t.is_date(target)
    if t.is_integer(source):
        return t.is_integer(target) or t.is_floating(target)
    if t.is_floating(source):
        return t.is_floating(target)
    if t.is_timestamp(source):
        return t.is_timestamp(target)
    if t.is_date(source):
        return t.is_date(target)
    if t.is_binary(source) or t.is_large_binary(source):
        return t.is_binary(target) or t.is_large_binary(target)
    return False


def event_time_column(schema: Schema) -> str | None:
    """The table's event-time column: its one payload column of a timestamp type (the flights'
    ``time_hour``). None when it has none, or several (which one is the event's time is then
    the user's call, not a guess)."""
    stamps = [
        f.name
        for f in schema.fields
        if f.name not in SYSTEM_COLUMNS and isinstance(f.field_type, (TimestampType, TimestamptzType))
    ]
    return stamps[0] if len(stamps) == 1 else None

"""Data files of log tables: each holds one log partition and a contiguous offset range.

That rule lets the manifests alone (bounds plus record counts) prove contiguity, so files
are written here rather than by pyiceberg's bin-packer, which may reorder batches.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Iterable, Mapping
from urllib.parse import urlparse

import pyarrow as pa
from pyiceberg.io.pyarrow import parquet_file_to_data_file, write_file
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table import Table, WriteTask


MAX_ROWS_PER_FILE = 10_000_000


def write_log_files(table: Table, batches: Mapping[int, pa.Table]) -> list[DataFile]:
    """Write Parquet data files for rows already carrying their system columns.

    Args:
        table: The log table (its current metadata gives schema, spec and location).
        batches: Rows per log partition, sorted by offset and contiguous.
    """
    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    arrow_schema = schema.as_arrow()
    field = spec.fields[0]
    write_uuid, counter = uuid.uuid4(), itertools.count()
    tasks = []
    for partition, rows in sorted(batches.items()):
        key = PartitionKey(
            field_values=[PartitionFieldValue(field, partition)], partition_spec=spec, schema=schema
        )
        rows = rows.select(arrow_schema.names).cast(arrow_schema)
        for start in range(0, rows.num_rows, MAX_ROWS_PER_FILE):
            chunk = rows.slice(start, MAX_ROWS_PER_FILE)
            tasks.append(
                WriteTask(
                    write_uuid=write_uuid,
                    task_id=next(counter),
                    schema=schema,
                    record_batches=chunk.to_batches(),
                    partition_key=key,
                )
            )
    return list(write_file(table.io, metadata, iter(tasks)))


def data_files_from_parquet(table: Table, paths: Iterable[str]) -> list[DataFile]:
    """Describe Parquet files written elsewhere (e.g. by Spark executors) as data files."""
    return [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]


def local_path(uri: str) -> str:
    """A ``file://`` URI (or a bare path) as a local path; other schemes are returned as is."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme in ("", "file") else uri


def file_offset_range(data_file: DataFile, offset_field_id: int) -> tuple[int, int]:
    """``(first, next)`` offsets of a data file, from its column bounds."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    low = from_bytes(LongType(), data_file.lower_bounds[offset_field_id])
    high = from_bytes(LongType(), data_file.upper_bounds[offset_field_id])
    return low, high + 1


def file_partition(data_file: DataFile) -> int:
    return data_file.partition[0]



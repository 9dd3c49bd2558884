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
from pyiceberg.io.pyarrow import write_file
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
    """Describe Parquet files written elsewhere (e.g. by Spark executors) as data files.

    Spark's own writer marks every column optional. A table's required column is accepted
    from such a file when the footer proves it holds no null (a null count of 0 in every
    row group); anything else must match the table's schema, as pyiceberg checks it.
    """
    return [_data_file(table, p) for p in paths]


def _data_file(table: Table, path: str) -> DataFile:
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFileContent, FileFormat

    metadata = table.metadata
    input_file = table.io.new_input(path)
    with input_file.open() as stream:
        footer = pq.read_metadata(stream)
    arrow = footer.schema.to_arrow_schema()
    no_nulls = set()
    for i in range(footer.num_columns):
        column = [footer.row_group(g).column(i) for g in range(footer.num_row_groups)]
        if all(c.statistics is not None and c.statistics.has_null_count and c.statistics.null_count == 0 for c in column):
            no_nulls.add(column[0].path_in_schema if column else footer.schema.column(i).path)
    arrow = pa.schema([f.with_nullable(False) if f.name in no_nulls else f for f in arrow])
    schema = metadata.schema()
    _check_pyarrow_schema_compatible(schema, arrow, format_version=metadata.format_version)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), schema),
        file_size_in_bytes=len(input_file),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


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



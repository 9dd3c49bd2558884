"""Data files of log tables: each holds one log partition and a contiguous offset range.

That rule lets the manifests alone (bounds plus record counts) prove contiguity, so files
are written here rather than by pyiceberg's bin-packer, which may reorder batches.

**Key-hash layout.** Where the table has ``log_key_hash``, every writer fills it, and a file
of at least ``2 * MIN_GROUP_ROWS`` rows is written *clustered*: its rows sorted by
(``log_key_hash``, offset) into up to ``GROUPS`` equal row groups, so each row group covers a
narrow slice of the hash space and a key-range read skips the others by their statistics.
Only the order of rows inside the file changes: the file still holds exactly one contiguous
offset range, so its offset bounds and record count (all the manifests prove contiguity
with) are the same. Smaller files stay in offset order (a key-range read opens them whole).
"""

from __future__ import annotations

import itertools
import posixpath
import uuid
from typing import Iterable, Mapping, Sequence
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table import Table, TableProperties, WriteTask

from storage.errors import CorruptBatch, InvalidInput, SchemaMismatch, UnknownPartition
from storage.log import schema as cols
from storage.log.keys import HASH_SPACE, key_hashes

MAX_ROWS_PER_FILE = 10_000_000
GROUPS = 32  # row groups of a clustered file: a quarter of the hash space opens ~9 of 32
MIN_GROUP_ROWS = 1_024  # smaller row groups cost more in footers than they save


def with_key_hash(rows: pa.Table, key_column: str | None) -> pa.Table:
    """``rows`` with ``log_key_hash`` computed from ``key_column`` (unchanged without one)."""

    if key_column is None:
        return rows
    hashes = pa.array(key_hashes(rows.column(key_column)), pa.int32())
    if cols.KEY_HASH in rows.column_names:
        return rows.set_column(rows.column_names.index(cols.KEY_HASH), cols.KEY_HASH, hashes)
    return rows.append_column(cols.KEY_HASH, hashes)


def clustered(rows: pa.Table) -> tuple[pa.Table, int | None]:
    """The key-hash layout of one file's rows: ``(rows, row group size)``; ``None`` keeps the
    rows in offset order with the default row groups."""
    groups = min(GROUPS, rows.num_rows // MIN_GROUP_ROWS)
    if groups < 2 or cols.KEY_HASH not in rows.column_names:
        return rows, None
    return rows.take(_hash_order(rows)), -(-rows.num_rows // groups)


def _hash_order(rows: pa.Table) -> pa.Array | np.ndarray:
    """Row order by (hash, offset). Hashes are 16-bit (``storage.log.keys``): for rows in offset
    order without null hashes, numpy's stable sort of uint16 (a radix sort: 18 ms for a million
    rows where Arrow's two-key sort takes 120 ms) gives that order; otherwise sort on both columns."""
    hashes, offsets = rows.column(cols.KEY_HASH), rows.column(cols.OFFSET)
    if hashes.null_count == 0 and offsets.null_count == 0:
        h, o = hashes.to_numpy(), offsets.to_numpy()
        if (o[1:] > o[:-1]).all() and h.min() >= 0 and h.max() < HASH_SPACE:
            return np.argsort(h.astype(np.uint16), kind="stable")
    return pc.sort_indices(rows, sort_keys=[(cols.KEY_HASH, "ascending"), (cols.OFFSET, "ascending")])


def write_log_files(table: Table, batches: Mapping[int, pa.Table]) -> list[DataFile]:
    """Write Parquet data files for rows already carrying their system columns.

    Args:
        table: The log table (its current metadata gives schema, spec and location).
        batches: Rows per log partition, sorted by offset and contiguous.
    """
    # lazy: pyiceberg.io.pyarrow loads pyarrow.dataset and pandas, which reading offsets never needs (issue 20)
    from pyiceberg.io.pyarrow import write_file

    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    arrow_schema = schema.as_arrow()
    key_column = cols.key_column(schema, metadata.properties)
    field = spec.fields[0]
    write_uuid, counter = uuid.uuid4(), itertools.count()
    jobs: list[tuple[WriteTask, int | None]] = []
    for partition, rows in sorted(batches.items()):
        key = PartitionKey(field_values=[PartitionFieldValue(field, partition)], partition_spec=spec, schema=schema)
        rows = with_key_hash(rows, key_column).select(arrow_schema.names).cast(arrow_schema)
        for start in range(0, rows.num_rows, MAX_ROWS_PER_FILE):
            chunk, group_rows = clustered(rows.slice(start, MAX_ROWS_PER_FILE))
            task = WriteTask(
                write_uuid=write_uuid, task_id=next(counter), schema=schema, record_batches=chunk.to_batches(), partition_key=key
            )
            jobs.append((task, group_rows))
    # Files with the default row groups are written together (pyiceberg writes them in
    # parallel); pyiceberg takes the row-group size from the table properties, so each
    # clustered file is written with its own.
    done = dict(
        zip(
            (t.task_id for t, g in jobs if g is None),
            write_file(table.io, metadata, (t for t, g in jobs if g is None)),
            strict=True,
        )
    )
    for task, group_rows in jobs:
        if group_rows is not None:
            own = metadata.model_copy(
                update={"properties": {**metadata.properties, TableProperties.PARQUET_ROW_GROUP_LIMIT: str(group_rows)}}
            )
            done[task.task_id] = next(iter(write_file(table.io, own, iter([task]))))
    return [done[t.task_id] for t, _ in jobs]


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


def prewritten_files(
    table: Table, identifier: str, partitions: int, files: Mapping[int, Sequence[str]], expected_offsets: Mapping[int, int]
) -> dict[int, list[DataFile]]:
    """Describe Parquet files written elsewhere, checked to extend each partition exactly.

    Per partition, the files must tile ``[expected, expected + rows)``: each holds rows of
    that partition only, with exactly the offsets ``first..first + rows - 1``. Bounds and
    record counts alone would pass ``[0, 0, 2]`` (a duplicate plus a gap), so the offsets
    themselves are read. Files must lie inside the table's location: maintenance and
    aborts clean up only there, and a table must not reference files it does not own.

    Returns:
        The data files per partition, in offset order (empty files left out).

    Raises:
        InvalidInput: no files, an expected offset missing, or a file outside the location.
        UnknownPartition: a partition the table does not have.
        SchemaMismatch: a file does not match the table's schema.
        CorruptBatch: a file's offsets or partition break the rules above.
    """
    if set(expected_offsets) != set(files) or not files:
        raise InvalidInput(reason="pre-written files need an expected offset for each of their partitions")
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    described: dict[int, list[DataFile]] = {}
    for p, paths in sorted(files.items()):
        if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < partitions:
            raise UnknownPartition(table=identifier, partition=p, partitions=partitions)
        for path in paths:
            if not in_location(table.metadata.location, path):
                raise InvalidInput(reason=f"{path} is outside the location of {identifier} ({table.metadata.location})")
        try:
            data_files = data_files_from_parquet(table, paths)
        except (ValueError, TypeError, KeyError) as e:
            raise SchemaMismatch(table=identifier, reason=str(e)) from e
        spans = sorted(((*file_offset_range(f, offset_id), f) for f in data_files if f.record_count), key=lambda s: s[:2])
        cursor = expected_offsets[p]
        for first, nxt, data_file in spans:
            if file_partition(data_file) != p or first != cursor or nxt - first != data_file.record_count:
                raise CorruptBatch(
                    table=identifier,
                    partition=p,
                    reason=f"{data_file.file_path}: not offsets {cursor}.. of partition {p} in consecutive order",
                )
            _check_exact_offsets(table, identifier, p, data_file, first)
            cursor = nxt
        described[p] = [f for *_, f in spans]
    return described


def _check_exact_offsets(table: Table, identifier: str, partition: int, data_file: DataFile, first: int) -> None:
    """Read one file's offsets and partitions: exactly ``first..first + rows - 1`` of ``partition``,
    in any row order (a clustered file is sorted by key hash)."""
    import pyarrow.parquet as pq

    with table.io.new_input(data_file.file_path).open() as stream:
        rows = pq.read_table(stream, columns=[cols.OFFSET, cols.PARTITION])
    offsets, parts = rows.column(cols.OFFSET), rows.column(cols.PARTITION)
    count = data_file.record_count
    if rows.num_rows != count or offsets.null_count or parts.null_count:
        raise CorruptBatch(
            table=identifier,
            partition=partition,
            reason=f"{data_file.file_path}: null offsets or partitions, or not {count} rows",
        )
    if not pc.all(pc.equal(parts, partition)).as_py():
        raise CorruptBatch(table=identifier, partition=partition, reason=f"{data_file.file_path}: rows of another partition")
    index = offsets.to_numpy() - first
    seen = np.zeros(count, dtype=bool)
    inside = (index >= 0) & (index < count)
    seen[index[inside]] = True
    if not inside.all() or not seen.all():  # count values in a range of count, all distinct: exactly the range
        missing = first + int(np.argmin(seen)) if not seen.all() else None
        raise CorruptBatch(
            table=identifier,
            partition=partition,
            reason=f"{data_file.file_path}: offsets are not exactly {first}..{first + count - 1}"
            + (f" (offset {missing} is missing)" if missing is not None else ""),
        )


def in_location(location: str, path: str) -> bool:
    """Whether ``path`` lies under the table ``location`` (``..`` resolved; a bare path is a local file)."""

    def parts(uri: str) -> tuple[str, str, str]:
        parsed = urlparse(uri)
        scheme = "file" if parsed.scheme in ("", "file") else parsed.scheme
        return scheme, parsed.netloc, posixpath.normpath(parsed.path) if parsed.path else ""

    root, target = parts(location), parts(path)
    return root[:2] == target[:2] and target[2].startswith(root[2].rstrip("/") + "/")


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

"""Data files of log tables: each holds one log partition and a contiguous offset range.

That rule lets the manifests alone (bounds plus record counts) prove contiguity, so files
are written here rather than by pyiceberg's bin-packer, which may reorder batches.

**Key-hash layout.** Where the table has ``log_key_hash``, every writer fills it, and a file
of at least ``2 * MIN_GROUP_ROWS`` rows is written *clustered*: its rows sorted by
(``log_key_hash``, offset) into up to ``GROUPS`` row groups, one per equal slice of the hash
space, so a key-range read skips the others by their statistics.
Only the order of rows inside the file changes: the file still holds exactly one contiguous
offset range, so its offset bounds and record count (all the manifests prove contiguity
with) are the same. Smaller files stay in offset order (a key-range read opens them whole).

**Encodings.** Offsets, timestamps and producer sequences are delta-encoded
(:func:`parquet_encodings`), so a clustered file takes no more bytes than the same rows in
offset order. Clustering costs a sort of the 16-bit hashes and a take per row group, made in
a thread while the row group before is written (each stage measured: BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import posixpath
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import Table, TableProperties, WriteTask
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.concurrent import ExecutorFactory
from pyiceberg.utils.properties import property_as_int

from icelog.storage.errors import CorruptBatch, InvalidInput, SchemaMismatch, StorageUnreachable, UnknownPartition
from icelog.storage.log import schema as cols
from icelog.storage.log.keys import HASH_SPACE, encoded_key_hashes

if TYPE_CHECKING:
    from pyiceberg.io.pyarrow import StatisticsCollector

MAX_ROWS_PER_FILE = 10_000_000
PARALLEL_FILE_ROWS = 1_000_000  # a batch is cut into files for parallel writes down to this size
GROUPS = 32  # hash slices of a clustered file, one row group each: a quarter of the hash space opens 8
MIN_GROUP_ROWS = 1_024  # smaller row groups cost more in footers than they save
DELTA_COLUMNS = frozenset((cols.OFFSET, cols.TIMESTAMP, cols.PRODUCER_SEQ))
# Columns whose bounds every data file's manifest entry keeps, whatever the table's
# ``write.metadata.metrics.*`` properties (another tool may set them to ``none``): the offset
# bounds prove I1 from the manifests, and locate a file's offsets for maintenance and mirrors.
BOUNDED_COLUMNS = (cols.PARTITION, cols.OFFSET)


def with_key_hash(rows: pa.Table, key_column: str | None) -> pa.Table:
    """``rows`` with ``log_key_hash`` computed from ``key_column`` (unchanged without one)."""
    return with_encoded_key_hash(rows, key_column)[0]


def with_encoded_key_hash(rows: pa.Table, key_column: str | None) -> tuple[pa.Table, Keys | None]:
    """:func:`with_key_hash`, and the key column's dictionary encoding when it gives the column
    back (text keys without nulls), for a cheap reorder (:func:`row_groups`)."""
    if key_column is None:
        return rows, None
    keys = rows.column(key_column)
    hashes, encoded = encoded_key_hashes(keys)
    column = pa.array(hashes, pa.int32())
    if cols.KEY_HASH in rows.column_names:
        rows = rows.set_column(rows.column_names.index(cols.KEY_HASH), cols.KEY_HASH, column)
    else:
        rows = rows.append_column(cols.KEY_HASH, column)
    text = pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)
    return rows, Keys(key_column, encoded) if encoded is not None and text and not keys.null_count else None


@dataclass(frozen=True)
class Keys:
    """A file's key column, dictionary-encoded (``storage.log.keys.encoded_key_hashes``)."""

    column: str
    encoded: pa.DictionaryArray


def parquet_encodings(names: Sequence[str]) -> dict[str, Any]:
    """``pyarrow.parquet.ParquetWriter`` options for the columns ``names`` of a log data file.

    Offsets, timestamps and producer sequences rise with the offset, in a clustered file inside
    each hash group: delta encoding stores them in a few bits. A dictionary cannot (offsets are
    all distinct), and plain values out of offset order barely compress: clustered files were
    2.5x the bytes of the same rows in offset order.
    """
    delta = [name for name in names if name in DELTA_COLUMNS]
    return {
        "use_dictionary": [name for name in names if name not in DELTA_COLUMNS],
        "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
    }


def row_groups(rows: pa.Table, keys: Keys | None = None) -> Iterator[pa.Table]:
    """One file's rows in the key-hash layout, its row groups in file order (``rows`` alone: offset
    order), each made in a thread while the caller writes the one before."""
    groups = hash_row_groups(rows, keys)
    return iter([rows]) if groups is None else _made_ahead(groups)


def hash_row_groups(rows: pa.Table, keys: Keys | None = None) -> Iterator[pa.Table] | None:
    """One file's rows as its row groups clustered by key hash, each made when asked for; None
    keeps the file in offset order (too few rows, or no hash column).

    Row group ``g`` of ``s`` holds the hashes of slice ``g`` of ``s`` equal slices of the hash
    space (rows in (hash, offset) order): a key range aligned to the slices, such as a quarter,
    opens exactly its share of the file. Reordering copies only what the order changes: a column
    of one value (the partition, one append's timestamp, all-null producer columns) is sliced,
    consecutive offsets are computed, and the keys, given ``keys``, come from their dictionary.
    """
    n = rows.num_rows
    slices = min(GROUPS, n // MIN_GROUP_ROWS)
    if slices < 2 or cols.KEY_HASH not in rows.column_names:
        return None
    offsets = rows.column(cols.OFFSET)
    increasing = _increasing(offsets)
    order = _hash_order(rows, increasing)
    consecutive = increasing and offsets[-1].as_py() - offsets[0].as_py() == n - 1
    movers = [_mover(rows, name, consecutive, keys) for name in rows.column_names]
    bounds = _slice_bounds(rows.column(cols.KEY_HASH), slices)
    return (
        pa.Table.from_arrays([move(order[start:end]) for move in movers], schema=rows.schema)
        for start, end in itertools.pairwise(bounds)
        if end > start
    )


def _slice_bounds(hashes: pa.ChunkedArray, slices: int) -> np.ndarray:
    """Where each hash slice starts in (hash, offset) order, and the row count; rows without a
    hash sort last and join the last slice (never pruned: a key-range read keeps null hashes)."""
    h = pc.drop_null(hashes).to_numpy() if hashes.null_count else hashes.to_numpy()
    slice_of = np.clip(h.astype(np.int64) * slices // HASH_SPACE, 0, slices - 1)
    bounds = np.concatenate(([0], np.cumsum(np.bincount(slice_of, minlength=slices))))
    bounds[-1] = len(hashes)
    return bounds


def _hash_order(rows: pa.Table, increasing: bool | None = None) -> pa.Array | np.ndarray:
    """Row order by (hash, offset). Hashes are 16-bit (``storage.log.keys``): for rows in offset
    order without null hashes, numpy's stable sort of uint16 (a radix sort: 18 ms for a million
    rows where Arrow's two-key sort takes 120 ms) gives that order; otherwise sort on both columns.
    ``increasing``: whether the offsets are known to rise strictly (None: look)."""
    hashes, offsets = rows.column(cols.KEY_HASH), rows.column(cols.OFFSET)
    if hashes.null_count == 0 and (increasing if increasing is not None else _increasing(offsets)):
        h = hashes.to_numpy()
        if h.min() >= 0 and h.max() < HASH_SPACE:
            return np.argsort(h.astype(np.uint16), kind="stable")
    return pc.sort_indices(rows, sort_keys=[(cols.KEY_HASH, "ascending"), (cols.OFFSET, "ascending")])


def _increasing(offsets: pa.ChunkedArray) -> bool:
    if offsets.null_count:
        return False
    o = offsets.to_numpy()
    return bool((o[1:] > o[:-1]).all())


def _mover(rows: pa.Table, name: str, consecutive: bool, keys: Keys | None) -> Callable[[np.ndarray], Any]:
    """How one column of ``rows`` is put in the order of some row indices."""
    column = rows.column(name)
    if _one_value(column):
        return lambda indices: column.slice(0, len(indices))
    if name == cols.OFFSET and consecutive:
        first = column[0].as_py()
        return lambda indices: pa.array(np.asarray(indices) + first, column.type)
    if keys is not None and name == keys.column:
        encoded = keys.encoded
        return lambda indices: encoded.dictionary.take(encoded.indices.take(indices)).cast(column.type)
    return column.take


def _one_value(column: pa.ChunkedArray) -> bool:
    """All null, or one integer or time throughout: the same in any row order."""
    if column.null_count == len(column):
        return True
    if column.null_count or not (pa.types.is_integer(column.type) or pa.types.is_temporal(column.type)):
        return False
    bounds = pc.min_max(column)
    return bounds["min"] == bounds["max"]


def _made_ahead(chunks: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``chunks``, the next made in a thread while the caller writes this one: Arrow's take and the
    Parquet writer release the GIL, so reordering a row group overlaps writing the one before."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, chunks, None)
        while (chunk := pending.result()) is not None:
            pending = pool.submit(next, chunks, None)
            yield chunk


def write_log_files(table: Table, batches: Mapping[int, pa.Table], directory: str | None = None) -> list[DataFile]:
    """Write Parquet data files for rows already carrying their system columns.

    The files are written by icelog's own Parquet writer, not pyiceberg's ``write_file``, for the
    per-column encodings (:func:`parquet_encodings`) and each clustered file's row-group size.
    Files are written in parallel threads (pyiceberg's executor; Arrow releases the GIL), and a
    large batch of few partitions is cut into consecutive offset ranges, one file each, so that
    every processor writes one (:func:`file_slices`).

    Args:
        table: The log table (its current metadata gives schema, spec and location).
        batches: Rows per log partition, sorted by offset and contiguous.
        directory: Write the files here (a transaction's folder) instead of where the table's
            location provider puts data files.
    """
    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    field = spec.fields[0]
    write_uuid, counter = uuid.uuid4(), itertools.count()
    jobs: list[tuple[WriteTask, pa.Table]] = []
    ways = max(1, _processors() // max(1, len(batches)))
    for partition, rows in sorted(batches.items()):
        key = PartitionKey(field_values=[PartitionFieldValue(field, partition)], partition_spec=spec, schema=schema)
        for chunk in file_slices(rows, ways):
            task = WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=schema, record_batches=[], partition_key=key)
            jobs.append((task, chunk))
    writer = _FileWriter(table.io, metadata, directory)
    return list(ExecutorFactory.get_or_create().map(lambda job: writer.write(*job), jobs))


def file_slices(rows: pa.Table, ways: int) -> list[pa.Table]:
    """One partition's rows cut into consecutive offset ranges, one per file: at most
    ``MAX_ROWS_PER_FILE`` rows each, and up to ``ways`` files of at least ``PARALLEL_FILE_ROWS``
    (each file holds one contiguous offset range, as I1's proof from the manifests needs)."""
    n = rows.num_rows
    files = max(-(-n // MAX_ROWS_PER_FILE), min(ways, n // PARALLEL_FILE_ROWS), 1)
    size = -(-n // files)
    return [rows.slice(start, size) for start in range(0, n, size)] or [rows]


def _processors() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _FileWriter:
    """Writes one data file per call, as pyiceberg's ``write_file`` would (its file names, the
    table's location provider and ``write.parquet.*`` properties, its statistics), plus the key
    hash, the encodings and the row groups of the key-hash layout."""

    def __init__(self, io: FileIO, metadata: TableMetadata, directory: str | None = None) -> None:
        # lazy, here and below: pyiceberg.io.pyarrow loads pyarrow.dataset and pandas, which reading
        # offsets never needs (it keeps the CLI's start-up short)
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow

        self.io, self.metadata, self.directory = io, metadata, directory
        self.schema = metadata.schema()
        self.key_column = cols.key_column(self.schema, metadata.properties)
        self.arrow_schema = self.schema.as_arrow()
        # Payload names are plain identifiers (storage.log.schema), so sanitizing renames nothing
        # today; it keeps the files' names what pyiceberg's writer would give them.
        self.file_schema = schema_to_pyarrow(sanitize_column_names(self.schema), include_field_ids=True)
        self.locations = load_location_provider(table_location=metadata.location, table_properties=metadata.properties)
        self.options = {**_get_parquet_writer_kwargs(metadata.properties), **parquet_encodings(self.file_schema.names)}
        self.row_group_limit = property_as_int(
            metadata.properties, TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        )

    def write(self, task: WriteTask, rows: pa.Table) -> DataFile:
        from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping

        name = task.generate_data_file_filename("parquet")
        path = (
            f"{self.directory}/{name}"
            if self.directory is not None
            else self.locations.new_data_location(data_file_name=name, partition_key=task.partition_key)
        )
        output = self.io.new_output(path)
        rows, keys = with_encoded_key_hash(rows, self.key_column)
        rows = rows.select(self.arrow_schema.names).cast(self.arrow_schema)
        rows = pa.Table.from_arrays(rows.columns, schema=self.file_schema)
        with output.create(overwrite=True) as stream, pq.ParquetWriter(stream, self.file_schema, **self.options) as writer:
            for group in row_groups(rows, keys):  # each write starts a row group
                writer.write_table(group, row_group_size=self.row_group_limit)
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=writer.writer.metadata,
            stats_columns=statistics_plan(self.schema, self.metadata.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(self.schema),
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=task.partition_key.partition,
            file_size_in_bytes=len(output),
            sort_order_id=None,
            spec_id=self.metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )


def statistics_plan(schema: Schema, properties: Mapping[str, str]) -> dict[int, StatisticsCollector]:
    """pyiceberg's statistics plan for a data file under the table's ``properties``, with full
    bounds of ``BOUNDED_COLUMNS`` whatever the properties say of them."""
    from pyiceberg.io.pyarrow import compute_statistics_plan

    full = {f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.{name}": "full" for name in BOUNDED_COLUMNS}
    return compute_statistics_plan(schema, {**properties, **full})


def data_files_from_parquet(table: Table, paths: Iterable[str]) -> list[DataFile]:
    """Describe Parquet files written elsewhere (e.g. by Spark executors) as data files.

    Spark's own writer marks every column optional. A table's required column is accepted
    from such a file when the footer proves it holds no null (a null count of 0 in every
    row group); anything else must match the table's schema, as pyiceberg checks it.
    """
    return [_data_file(table, p) for p in paths]


def _data_file(table: Table, path: str) -> DataFile:
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )

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
        stats_columns=statistics_plan(schema, metadata.properties),
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


def is_local(uri: str) -> bool:
    """True for a bare path or a ``file://`` URI: DuckDB's ``read_parquet`` reads it without an extension."""
    return urlparse(uri).scheme in ("", "file")


def arrow_location(io: FileIO, uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that reads ``uri`` with the table's own FileIO settings (endpoint,
    keys, region), and the path of ``uri`` in it.

    DuckDB reads object stores only through its httpfs extension, which may not be installable;
    a pyarrow filesystem needs nothing beyond pyarrow, and DuckDB scans what it reads.

    Raises:
        InvalidInput: no pyarrow filesystem serves ``uri``'s scheme (an unknown or orphan path form).
    """
    from pyiceberg.io.pyarrow import PyArrowFileIO

    arrow_io = io if isinstance(io, PyArrowFileIO) else _arrow_io(tuple(sorted(io.properties.items())))
    scheme, netloc, path = PyArrowFileIO.parse_location(uri, arrow_io.properties)
    try:
        return arrow_io.fs_by_scheme(scheme, netloc), path
    except (ValueError, ImportError) as e:  # "Unrecognized filesystem type in URI", a missing extra
        raise InvalidInput(reason=f"cannot read data file {uri!r}: no pyarrow filesystem for scheme {scheme!r} ({e})") from e


@functools.lru_cache(maxsize=8)
def _arrow_io(properties: tuple[tuple[str, str], ...]) -> FileIO:
    """A PyArrowFileIO with another FileIO's properties (one per configuration: its filesystems are cached)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(dict(properties))


def file_offset_range(data_file: DataFile, offset_field_id: int) -> tuple[int, int]:
    """``(first, next)`` offsets of a data file, from its column bounds."""
    return offset_range(data_file.lower_bounds, data_file.upper_bounds, offset_field_id)


def offset_range(lower: Mapping[int, bytes], upper: Mapping[int, bytes], offset_field_id: int) -> tuple[int, int]:
    """``(first, next)`` from a file's serialized bounds (Iceberg stores a long little-endian)."""
    low = int.from_bytes(lower[offset_field_id], "little", signed=True)
    return low, int.from_bytes(upper[offset_field_id], "little", signed=True) + 1


def file_partition(data_file: DataFile) -> int:
    """The log partition of a file icelog wrote or adopted: always under identity(log_partition)."""
    return data_file.partition[0]


def spec_partitions(metadata: TableMetadata) -> Callable[[int, Sequence[Any]], int | None]:
    """``(spec id, partition tuple) -> log partition`` for a file of any writer: None when its spec
    has no identity(log_partition) field (another tool's spec), so the metadata cannot place it."""
    specs, schema = metadata.specs(), metadata.schema()
    positions = {spec_id: cols.log_partition_position(spec, schema) for spec_id, spec in specs.items()}

    def partition(spec_id: int, values: Sequence[Any]) -> int | None:
        position = positions.get(spec_id)
        return None if position is None else values[position]

    return partition


@contextlib.contextmanager
def store_reachable(table: str) -> Iterator[None]:
    """Reads, listings and copies of ``table``'s files outside a commit: an error of the store
    itself (a network error, an S3 server restarting) becomes :class:`StorageUnreachable`, typed
    and retriable. A missing file or a refused permission is an answer, not an outage: it stays."""
    try:
        yield
    except (FileNotFoundError, PermissionError):
        raise
    except OSError as e:
        raise StorageUnreachable(table=table, reason=repr(e)) from e


def renumbered_file(table: Table, path: str, shift: int, now_us: int) -> DataFile:
    """A copy of the pre-written data file ``path`` with every offset moved by ``shift`` and
    stamped ``now_us`` (its append time: it lands now, after the writer that moved the table).

    A transaction decided in the coordinator journal places pre-written files at the table's
    log end when it rolls forward (``storage.producers.transactional``): if another writer moved
    the table since the files were numbered, each is rewritten here, row group by row group (one
    in memory at a time). The rows, their order (a clustered file's key-hash row groups), the
    payload and the encodings stay as written. The copy lies next to the original under a name of
    its own: another coordinator rolling the same transaction forward never writes, or discards,
    this one.
    """
    target = f"{posixpath.splitext(path)[0]}-moved-{uuid.uuid4().hex[:12]}.parquet"
    output = table.io.new_output(target)
    with table.io.new_input(path).open() as stream:
        source = pq.ParquetFile(stream)
        schema = source.schema_arrow
        offset, stamp = schema.get_field_index(cols.OFFSET), schema.get_field_index(cols.TIMESTAMP)
        options = parquet_encodings(schema.names)
        with output.create(overwrite=False) as out, pq.ParquetWriter(out, schema, compression="zstd", **options) as writer:
            for g in range(source.num_row_groups):  # each write starts a row group
                group = source.read_row_group(g)
                moved = pc.add(group.column(offset), pa.scalar(shift, pa.int64()))
                group = group.set_column(offset, schema.field(offset), moved)
                now = pa.array(np.full(group.num_rows, now_us, dtype=np.int64)).cast(schema.field(stamp).type)
                writer.write_table(group.set_column(stamp, schema.field(stamp), now))
    return _data_file(table, target)

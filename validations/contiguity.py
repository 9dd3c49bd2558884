"""I1 contiguity and watermark checks, metadata-only and deep (DuckDB over data files).

Both reduce the data files of a snapshot to *coverage*: for every offset of a partition,
how many rows hold it. Then, per partition, exactly:

* a ``duplicate`` is reported for each maximal run of offsets held more than once;
* a ``gap`` is reported for each maximal run of offsets in ``[log_start, data_end)`` held by
  no row (``data_end`` is the largest offset in the data plus one; without watermarks, as
  for an old snapshot, ``log_start`` is the smallest offset in the data);
* offsets in ``[data_end, log_end)`` are missing too: the ``watermark`` violation "stored
  log_end is ahead of the data" names exactly them, so each missing offset is reported once.

The two modes differ in how they learn the coverage:

* The metadata check reads only manifests (per-file offset bounds and record counts) and
  takes each file to hold each offset of its bounds once. It cannot see inside a file: a
  file whose record count differs from its bound range is reported as suspect, and a file
  whose count equals its bound range passes.
* The deep check reads the offsets and proves each file, whatever its row order: a file in
  offset order holds exactly ``c..c + n - 1`` when ``log_offset - file_row_number`` is the
  constant ``c`` (a DuckDB scan); a file in any other order (the key-hash layout sorts rows by
  key hash) holds exactly ``lo..hi`` when its ``n = hi - lo + 1`` offsets, all in that range,
  set ``n`` distinct bytes of a bitmap over ``lo..hi`` (numpy, over the two columns read with
  pyarrow a window of row groups at a time). A large file is proven on its own (large files
  side by side, a few at once), by the proof its footer's offset statistics point to; small
  files share one grouped query, and those of them out of offset order then get the bitmap.
  Only a file that fails its proof (a foreign writer's, a bug's) is counted offset by offset,
  in linear time (a count per offset), as runs of offsets with the same count; those counts
  replace the file's bounds. The result is exact whatever the files hold: duplicates, holes
  and row order.

A file must be readable Parquet with integer partition and offset columns, no null partition,
and offsets in ``0..2^63-1``; a file that is not (replaced in place, damaged, gone, offsets as
text or floats, or wrapped past 2^63) is a ``bad_file`` violation naming it and the reason, and
holds no offsets. The footer is checked before any proof for every file on an object store
(read whole anyway), every large local file (its footer chooses the proof) and every small
local file whose size is not the one its metadata says (replaced in place). A small file of
its committed size skips that read, which costs a small file about as much as its query: the
grouped query reads every file as the first one's column types, and a query that fails, or
whose types are not integers, sends every file to the footer check. The one case left: a
committed foreign file of text or floats read after a file of integers is cast (whole values
are the offsets they are, fractions are rounded).

Files on an object store (``s3://…``) are read with pyarrow through the table's FileIO, since
DuckDB reads them only through its httpfs extension: each file's two columns are read once
(several files at a time), and the same proofs run on them in memory (numpy); a file that
fails them is grouped in DuckDB, its rows numbered as ``file_row_number`` would, and counted
as a local one is.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from icelog.storage.errors import InvalidInput
from icelog.storage.log import schema as cols
from icelog.storage.log.files import arrow_location, is_local, local_path, offset_range, spec_partitions, store_reachable
from icelog.storage.log.manifests import live_files
from icelog.storage.log.state import LogState
from icelog.validations.violations import CheckReport, Violation

CHECK = "contiguity"
MAX_PATHS_IN_DETAIL = 4
# Files of at least this many rows get a query of their own: ungrouped aggregates run at scan
# speed, where a GROUP BY file costs each row a hash-table update (measured ~20% of the scan);
# below it, a query per file costs more than the grouping. Rows, not bytes: delta-encoded and
# clustered files hold millions of rows in a few hundred KB.
OWN_QUERY_ROWS = 1_000_000
# Files on an object store read at once: a file's two columns are a few ranged GETs, so the
# latency of one hides behind the others (and behind the proofs of the files already read).
REMOTE_READS = 8
MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True)
class FileSpan:
    path: str
    partition: int
    first: int
    last: int  # inclusive
    rows: int
    exact: bool  # holds each offset of first..last once (the deep check proves it, the metadata check assumes it)


@dataclass(frozen=True)
class OffsetRun:
    """Offsets ``first..last`` (inclusive) each appear exactly ``count`` times in ``path``.

    The deep check describes every file that fails its proof this way.
    """

    path: str
    partition: int
    first: int
    last: int
    count: int


def metadata_spans(table: Table, snapshot_id: int | None = None) -> tuple[list[FileSpan], list[OffsetRun], list[Violation]]:
    """Per-file spans from the manifests alone: each file's offset bounds and row count.

    A file whose manifest entry has no offset bounds (a foreign writer's without statistics, or
    one written under ``write.metadata.metrics.default=none`` by another tool) is read instead,
    as the deep check reads it: its spans, the offset counts of those that fail their proof, and
    the violations of that reading (damaged files, misplaced rows). A file whose partition spec
    does not name its log partition is a violation of its own."""
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    where = spec_partitions(table.metadata)
    spans, unbounded, rows, unplaced = [], {}, {}, []
    for f in live_files(table, [offset_id], snapshot_id):
        partition = where(f.spec_id, f.partition)
        if partition is None:
            unplaced.append(_unplaced(table, f.path, f.spec_id))
        elif offset_id in f.lower and offset_id in f.upper:
            first, nxt = offset_range(f.lower, f.upper, offset_id)
            spans.append(FileSpan(f.path, partition, first, nxt - 1, f.record_count, f.record_count == nxt - first))
        else:
            path = local_path(f.path)
            unbounded[path], rows[path] = partition, f.record_count
    if not unbounded:
        return spans, [], unplaced
    read, runs, violations = scan_files(".".join(table.name()[-2:]), unbounded, rows=rows, io=table.io)
    return spans + read, runs, unplaced + violations


def _planned_files(
    table: Table, snapshot_id: int | None
) -> tuple[dict[str, int], dict[str, int], dict[str, int], list[Violation]]:
    """The deep check's files: partition, record count and size per path (a local path or URI), as
    their metadata says; and a violation per file whose partition spec does not name its log partition."""
    where = spec_partitions(table.metadata)
    paths, rows, sizes, unplaced = {}, {}, {}, []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        f = task.file
        partition = where(f.spec_id, f.partition)
        if partition is None:
            unplaced.append(_unplaced(table, f.file_path, f.spec_id))
            continue
        path = local_path(f.file_path)
        paths[path], rows[path], sizes[path] = partition, f.record_count, f.file_size_in_bytes
    return paths, rows, sizes, unplaced


def _unplaced(table: Table, path: str, spec_id: int) -> Violation:
    name = ".".join(table.name()[-2:])
    return Violation(
        check=CHECK,
        table=name,
        kind="partition_spec",
        detail=(
            f"{path} was written under partition spec {spec_id}, which has no identity(log_partition) field "
            f"(another writer's): its log partition is unknown and its rows are not checked; `icelog repair {name}` "
            "rolls back the foreign snapshots that added such files"
        ),
        extra={"path": path, "spec_id": spec_id},
    )


def deep_spans(
    table: Table, snapshot_id: int | None = None, con: duckdb.DuckDBPyConnection | None = None
) -> tuple[list[FileSpan], list[OffsetRun], list[Violation]]:
    """Per-file spans computed from the offsets themselves, the exact offset counts of the
    files whose proof failed, and misplaced rows (and files whose spec names no log partition)."""
    name = ".".join(table.name()[-2:])
    paths, rows, sizes, unplaced = _planned_files(table, snapshot_id)
    spans, runs, violations = scan_files(name, paths, con, rows, table.io, sizes)
    return spans, runs, unplaced + violations


def scan_files(
    table: str,
    paths: Mapping[str, int],
    con: duckdb.DuckDBPyConnection | None = None,
    rows: Mapping[str, int] | None = None,
    io: FileIO | None = None,
    sizes: Mapping[str, int] | None = None,
) -> tuple[list[FileSpan], list[OffsetRun], list[Violation]]:
    """Deep scan of Parquet files of a log table.

    Args:
        table: Name used in violations.
        paths: Local path (or object-store URI, e.g. ``s3://…``) of each data file -> the log
            partition its metadata says it holds.
        rows: Each file's record count as its metadata says (it only chooses the query; the
            footers are read when it is not given).
        io: The table's FileIO: how to reach files that are not local.
        sizes: Each file's size in bytes as its metadata says: a small local file of that size
            is taken to be the file committed, and its footer is not read (see the module's
            docstring).

    Raises:
        InvalidInput: a path that is not local, without ``io`` or of a scheme no pyarrow
            filesystem serves.
    """
    if not paths:
        return [], [], []
    if con is None:
        with _cursor() as own:
            return scan_files(table, paths, own, rows, io, sizes)
    remote = {p: paths[p] for p in paths if not is_local(p)}
    if remote:
        local = {p: paths[p] for p in paths if p not in remote}
        spans, runs, violations = _scan_remote(table, remote, con, io)
        more = scan_files(table, local, con, rows, sizes=sizes) if local else ([], [], [])
        return spans + more[0], runs + more[1], violations + more[2]
    spans, grouped, unfit, footers, own = [], [], {}, {}, []
    for path in sorted(paths):
        size = rows.get(path) if rows is not None else None
        # A large file's footer chooses its proof. A small one's is read only when the file is not
        # the bytes its metadata describes (another size: replaced in place, or no metadata given),
        # since a footer costs a small file about its whole query.
        if size is None or size >= OWN_QUERY_ROWS or not _committed(path, sizes):
            footer, why = _footer(path)
            if why is not None:
                unfit[path] = why
                continue
            footers[path] = footer
            size = footer.num_rows if size is None else size
        (own if size >= OWN_QUERY_ROWS else grouped).append(path)
    for path, span in zip(own, _proven_files(con, own, paths, footers), strict=True):
        if span is None:
            grouped.append(path)
        else:
            spans.append(span)
    grouped.sort()  # path order, as listed: the grouped query reads every file as the first one's types
    stats, more = _grouped_stats(con, grouped, footers) if grouped else ([], {})
    unfit.update(more)
    violations = _group_spans(table, stats, paths, spans)
    # A small file out of offset order (the key-hash layout) that may still be a permutation of
    # its range gets the bitmap proof, a fraction of counting it offset by offset.
    groups_of = Counter(s.path for s in spans)
    for i, s in enumerate(spans):
        if not s.exact and groups_of[s.path] == 1 and s.partition == paths[s.path] and s.rows == s.last - s.first + 1:
            footer, why = (footers[s.path], None) if s.path in footers else _footer(s.path)
            if why is not None:  # read cast by the grouped query
                unfit[s.path] = why
            else:
                spans[i] = _proven_file(con, s.path, s.partition, footer) or s
    spans, violations = _refuse_bad_values(spans, violations, unfit)
    irregular = {(s.path, s.partition) for s in spans if not s.exact}
    runs = _offset_runs(sorted({path for path, _ in irregular})) if irregular else []
    violations += _bad_files(table, unfit, paths)
    return spans, [r for r in runs if (r.path, r.partition) in irregular], violations


# Per (file, partition): rows, offset bounds, and "offsets consecutive in row order, none null".
_GROUP_STATS = f"""{cols.PARTITION}, count(*), min({cols.OFFSET}), max({cols.OFFSET}),
    count({cols.OFFSET}) = count(*) AND min({cols.OFFSET} - file_row_number) = max({cols.OFFSET} - file_row_number)"""
# The same without overflow: offsets near -2^63 (wrapped past 2^63) overflow ``offset - row
# number`` in BIGINT. Slower than BIGINT, so only files whose first query failed get it.
_WIDE_GROUP_STATS = _GROUP_STATS.replace(f"{cols.OFFSET} - file_row_number", f"{cols.OFFSET}::HUGEINT - file_row_number")
# No Hive partitioning: a data file's folder (``log_partition=0/``) is no column of it; DuckDB
# would otherwise read its partition from the folder instead of from the rows.
_GROUPED_QUERY = (
    "SELECT filename, {stats} FROM read_parquet($paths, filename = true, file_row_number = true, hive_partitioning = false)"
    " GROUP BY ALL"
)
_INTEGER_TYPES = frozenset(
    ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT")
)


def _committed(path: str, sizes: Mapping[str, int] | None) -> bool:
    """Whether a local file is as many bytes as its metadata says (a file replaced in place rarely is)."""
    try:
        return sizes is not None and os.stat(path).st_size == sizes.get(path)
    except OSError:
        return False


def _grouped_stats(
    con: duckdb.DuckDBPyConnection, paths: list[str], footers: Mapping[str, pq.FileMetaData]
) -> tuple[list[tuple], dict[str, str]]:
    """``_GROUP_STATS`` per (file, partition) of local files in one query, and the files that
    cannot be read as offsets, with why (``footers``: the files already checked).

    The query reads every file as the first one's column types. When it fails (a file
    unreadable, of another shape, text or NaN that does not cast, offsets near -2^63 that
    overflow) or its types are not integers, the footers not yet read are checked, and the files
    that pass are read again with overflow-proof stats, together, then one by one when that
    fails too.
    """
    try:
        result = con.execute(_GROUPED_QUERY.format(stats=_GROUP_STATS), {"paths": paths})
        # (filename, partition, count, min offset, ...): the types the first file gave the query
        if {str(result.description[1][1]), str(result.description[3][1])} <= _INTEGER_TYPES:
            return result.fetchall(), {}
    except duckdb.Error:
        pass
    unfit = {path: why for path in paths if path not in footers and (why := _footer(path)[1]) is not None}
    rest = [path for path in paths if path not in unfit]
    wide = _GROUPED_QUERY.format(stats=_WIDE_GROUP_STATS)
    try:
        return (con.execute(wide, {"paths": rest}).fetchall() if rest else []), unfit
    except duckdb.Error:
        pass
    stats = []
    for path in rest:
        try:
            stats += con.execute(wide, {"paths": [path]}).fetchall()
        except duckdb.Error as e:
            unfit[path] = f"cannot be read ({e})"
    return stats, unfit


def _unfit_columns(schema: pa.Schema) -> str | None:
    """Why a file of this schema cannot hold a log's offsets (None: it can): another engine
    would not read the table's long and int columns from it either."""
    for name in (cols.PARTITION, cols.OFFSET):
        if schema.get_field_index(name) < 0:
            return f"no {name} column"
        kind = schema.field(name).type
        if not pa.types.is_integer(kind):
            return f"{name} is {kind}, not an integer column"
    return None


def _unfit_file(path: str, fs: pafs.FileSystem, table: str) -> str | None:
    """Why a file cannot hold a log's offsets, from its footer (None: it can)."""
    try:
        schema = pq.read_schema(path, filesystem=fs)
    except _READ_ERRORS as e:
        return _unreadable(e, path, fs, table)
    return _unfit_columns(schema)


_READ_ERRORS = (OSError, pa.ArrowException)


def _unreadable(error: Exception, path: str, fs: pafs.FileSystem | None, table: str) -> str:
    """Why a file could not be read, the file being to blame: a local file always is; on an
    object store, when the store answers for it (an unreachable store raises
    :class:`StorageUnreachable`: run again)."""
    if fs is not None and isinstance(error, OSError) and not isinstance(error, (FileNotFoundError, PermissionError)):
        with store_reachable(table):
            fs.get_file_info(path)
    return f"cannot be read ({error})"


def _refuse_bad_values(
    spans: list[FileSpan], violations: list[Violation], unfit: dict[str, str]
) -> tuple[list[FileSpan], list[Violation]]:
    """``spans`` and ``violations`` without the files holding a null partition or an offset
    outside ``0..2^63-1`` (a log's offsets never are: int64 arithmetic that wrapped past 2^63, a
    foreign file's), which join ``unfit``."""
    for s in spans:
        if s.partition is None:
            unfit.setdefault(s.path, f"null {cols.PARTITION}")
        elif s.first < 0 or s.last > MAX_OFFSET:
            unfit.setdefault(s.path, f"offset {s.first if s.first < 0 else s.last}, outside 0..2^63-1")
    if not unfit:
        return spans, violations
    kept = [v for v in violations if v.extra.get("path") not in unfit]
    return [s for s in spans if s.path not in unfit], kept


def _bad_files(table: str, unfit: Mapping[str, str], paths: Mapping[str, int]) -> list[Violation]:
    return [
        Violation(CHECK, table, "bad_file", f"{path}: {why}", partition=paths[path], extra={"path": path})
        for path, why in sorted(unfit.items())
    ]


def _group_spans(table: str, rows: Iterable[tuple], paths: Mapping[str, int], spans: list[FileSpan]) -> list[Violation]:
    """Append a span per ``(path, partition, rows, lo, hi, ordered)`` group to ``spans``; the
    rows in a file of another partition are violations."""
    violations = []
    for path, partition, n, lo, hi, ordered in rows:
        if partition != paths[path]:
            violations.append(
                Violation(
                    CHECK,
                    table,
                    "misplaced_row",
                    f"{n} rows of partition {partition} in a file of partition {paths[path]} ({path})",
                    partition=partition,
                    first=lo,
                    last=hi,
                    extra={"path": path},
                )
            )
        if lo is None:  # every offset null: rows that hold no offset
            continue
        spans.append(FileSpan(path, partition, lo, hi, n, bool(ordered) and n == hi - lo + 1))
    return violations


def _scan_remote(
    table: str, paths: Mapping[str, int], con: duckdb.DuckDBPyConnection, io: FileIO | None
) -> tuple[list[FileSpan], list[OffsetRun], list[Violation]]:
    """The deep scan of files on an object store: each file's offsets read once, with pyarrow."""
    if io is None:
        first = min(paths)
        raise InvalidInput(reason=f"cannot read data file {first!r}: a file that is not local needs the table's FileIO")
    located = {uri: arrow_location(io, uri) for uri in sorted(paths)}  # an unknown scheme raises before any read
    spans: list[FileSpan] = []
    runs: list[OffsetRun] = []
    violations: list[Violation] = []
    unfit: dict[str, str] = {}
    for uri, offsets, span, why in _read_offsets(table, located, paths):
        if why is not None:
            unfit[uri] = why
        elif span is not None:
            spans.append(span)
        else:  # failed its proof: the slow path, where overflow-proof stats cost nothing that matters
            stats = _rows_query(con, offsets, f"SELECT $uri, {_WIDE_GROUP_STATS} FROM file_offsets GROUP BY ALL", uri)
            mine, found = _refuse_bad_values(*_spans_of(table, stats, paths), unfit)
            spans += mine
            violations += found
            irregular = {s.partition for s in mine if not s.exact}
            runs += [r for r in _runs_of(uri, offsets) if r.partition in irregular] if irregular else []
    return spans, runs, violations + _bad_files(table, unfit, paths)


def _spans_of(table: str, stats: Iterable[tuple], paths: Mapping[str, int]) -> tuple[list[FileSpan], list[Violation]]:
    """:func:`_group_spans` into a list of its own."""
    spans: list[FileSpan] = []
    return spans, _group_spans(table, stats, paths, spans)


def _read_offsets(
    table: str, located: Mapping[str, tuple[pafs.FileSystem, str]], partitions: Mapping[str, int]
) -> Iterator[tuple[str, pa.Table | None, FileSpan | None, str | None]]:
    """``(uri, partition and offset columns, span, why)`` of each file, in order, ``REMOTE_READS``
    files in flight: each file is proven (:func:`_proven_rows`) by the thread that read it, as
    soon as it is read, so that proofs overlap the reads of the next files and each other (numpy
    releases the GIL). ``span`` is the proven span, and then the columns are None (released at
    once); ``why`` says why a file cannot hold a log's offsets, and then both are None;
    otherwise the columns, for the caller to diagnose."""

    def read(uri: str) -> tuple[pa.Table | None, FileSpan | None, str | None]:
        fs, path = located[uri]
        try:
            offsets = pq.read_table(path, filesystem=fs, columns=[cols.PARTITION, cols.OFFSET])
        except _READ_ERRORS as e:  # a missing column reads as an error too: the footer says which
            return None, None, _unfit_file(path, fs, table) or _unreadable(e, path, fs, table)
        why = _unfit_columns(offsets.schema)
        if why is not None:
            return None, None, why
        span = _proven_rows(uri, partitions[uri], offsets)
        return (None, span, None) if span is not None else (offsets, None, None)

    uris = list(located)
    with ThreadPoolExecutor(REMOTE_READS) as pool:
        pending = [pool.submit(read, uri) for uri in uris[:REMOTE_READS]]
        for i, uri in enumerate(uris):
            offsets, span, why = pending[i].result()
            if i + REMOTE_READS < len(uris):
                pending.append(pool.submit(read, uris[i + REMOTE_READS]))
            pending[i] = None  # the file's columns live only while it is checked
            yield uri, offsets, span, why


def _rows_query(con: duckdb.DuckDBPyConnection, offsets: pa.Table, query: str, uri: str | None = None) -> list[tuple]:
    """Run ``query`` over one file's columns as the view ``file_offsets``, numbered as ``file_row_number``."""
    numbered = offsets.append_column("file_row_number", pa.array(np.arange(offsets.num_rows, dtype=np.int64)))
    con.register("file_offsets", numbered)
    try:
        return con.execute(query, {"uri": uri} if uri is not None else None).fetchall()
    finally:
        con.unregister("file_offsets")


def _proven_rows(uri: str, partition: int, offsets: pa.Table) -> FileSpan | None:
    """The span of one file read into memory, when its offsets are proven exact: the proofs of
    :func:`_proven_file` in numpy (a file's columns are already in memory, and a DuckDB query
    costs ~10 ms more than the proof of a 500k-row file), the bounds from the data itself.

    Both proofs walk the column's chunks (zero-copy views) in blocks of ``PROOF_BLOCK`` rows, so
    that their temporaries stay in cache: a whole-file ``offset - row number`` array costs
    five times as much, a count per offset (``bincount``) four times a byte per offset."""
    n = offsets.num_rows
    chunks = _offset_chunks(offsets, partition)
    if n == 0 or chunks is None:
        return None
    first = int(chunks[0][0])
    # offset - row number constant: exactly first..first + n - 1, unless that passes 2^63 (the
    # offsets wrapped to -2^63 and on, and the difference stays constant across the wrap)
    if first + n - 1 <= MAX_OFFSET and _consecutive(chunks, first):
        return FileSpan(uri, partition, first, first + n - 1, n, True)
    lo = min(int(c.min()) for c in chunks)
    # n offsets in lo..hi that take n distinct values are exactly lo..hi, in any row order.
    if _permutation_of(chunks, lo, n):
        return FileSpan(uri, partition, lo, lo + n - 1, n, True)
    return None


def _offset_chunks(rows: pa.Table, partition: int) -> list[np.ndarray] | None:
    """The offset column of some rows as int64 numpy chunks (zero-copy where the column is int64),
    when every row holds an offset and ``partition``; None otherwise (the exact diagnosis decides)."""
    parts, column = rows.column(cols.PARTITION), rows.column(cols.OFFSET)
    if parts.null_count or column.null_count:
        return None
    if rows.num_rows:
        p = pc.min_max(parts).as_py()
        if not p["min"] == p["max"] == partition:
            return None
    if column.type != pa.int64():  # a foreign file's: integers only, and only those that are int64s
        if not pa.types.is_integer(column.type):
            return None
        try:
            column = column.cast(pa.int64())
        except pa.ArrowInvalid:  # beyond int64: diagnosed exactly
            return None
    return [c.to_numpy() for c in column.chunks if len(c)]


PROOF_BLOCK = 1 << 15
_ROW_NUMBERS = np.arange(PROOF_BLOCK, dtype=np.int64)


def _consecutive(chunks: list[np.ndarray], first: int) -> bool:
    """Whether the offsets ``chunks`` hold, in row order, are ``first, first + 1, …``: in each
    block, ``offset - row number`` is the constant ``first + the block's first row``."""
    shifted = np.empty(PROOF_BLOCK, dtype=np.int64)
    row = 0
    for values in chunks:
        for start in range(0, len(values), PROOF_BLOCK):
            block = values[start : start + PROOF_BLOCK]
            here = np.subtract(block, _ROW_NUMBERS[: len(block)], out=shifted[: len(block)])
            if not int(here.min()) == int(here.max()) == first + row + start:
                return False
        row += len(values)
    return True


def _permutation_of(chunks: Iterable[np.ndarray | None], lo: int, n: int) -> bool:
    """Whether the offsets ``chunks`` hold are exactly ``lo..lo + n - 1``, each once, in any
    order: ``n`` of them, each in that range, setting ``n`` distinct bytes of a byte per offset
    (a None chunk: rows that cannot hold offsets, never proven).

    ``chunks`` may be a stream (a file read a window at a time): only the bytes stay."""
    seen = np.zeros(n, dtype=np.bool_)
    index = np.empty(PROOF_BLOCK, dtype=np.int64)
    hi, rows = lo + n - 1, 0
    for values in chunks:
        if values is None:
            return False
        for start in range(0, len(values), PROOF_BLOCK):
            block = values[start : start + PROOF_BLOCK]
            # bounds checked on the offsets themselves: ``offset - lo`` can wrap past 2^63
            # into the range, and a negative index would silently set a byte from the end
            if not (lo <= int(block.min()) and int(block.max()) <= hi):
                return False
            seen[np.subtract(block, lo, out=index[: len(block)])] = True
        rows += len(values)
    return rows == n and int(np.count_nonzero(seen)) == n


_shared: tuple[int, duckdb.DuckDBPyConnection] | None = None


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor on this process's DuckDB connection: opening a connection costs ~16 ms, a
    quarter of scanning 40M offsets; a forked child opens its own."""
    global _shared
    if _shared is None or _shared[0] != os.getpid():
        _shared = (os.getpid(), duckdb.connect())
    return _shared[1].cursor()


def _footer(path: str) -> tuple[pq.FileMetaData | None, str | None]:
    """A local file's footer, or why the file cannot hold a log's offsets."""
    try:
        footer = pq.read_metadata(path)
    except _READ_ERRORS as e:
        return None, _unreadable(e, path, None, "")
    why = _unfit_columns(footer.schema.to_arrow_schema())
    return (None, why) if why is not None else (footer, None)


# Large files proven at once: a clustered file's bitmap is numpy, which leaves the GIL while it
# sets bytes, so one file a core (two 10M-row bitmaps: 121 ms side by side, 173-229 ms one
# after the other); DuckDB's scans of files in offset order share its threads either way.
PROOF_THREADS = max(2, min(4, os.cpu_count() or 2))


def _proven_files(
    con: duckdb.DuckDBPyConnection, own: list[str], paths: Mapping[str, int], footers: Mapping[str, pq.FileMetaData]
) -> list[FileSpan | None]:
    """:func:`_proven_file` of each of ``own``, side by side, in their order."""
    if len(own) < 2:
        return [_proven_file(con, path, paths[path], footers[path]) for path in own]

    def prove(path: str) -> FileSpan | None:
        with con.cursor() as cursor:  # a DuckDB connection serves one thread at a time
            return _proven_file(cursor, path, paths[path], footers[path])

    with ThreadPoolExecutor(min(len(own), PROOF_THREADS)) as pool:
        return list(pool.map(prove, own))


def _proven_file(con: duckdb.DuckDBPyConnection, path: str, partition: int, footer: pq.FileMetaData) -> FileSpan | None:
    """The span of one file whose offsets are proven exact, in one ungrouped DuckDB scan (offset
    order) or by the bitmap (any other order); None when its proof fails (the caller then
    diagnoses the file exactly).

    The footer's row-group statistics only choose the proof: offsets in row order, or a
    bitmap over the range they give. Either proof reads every offset, so a wrong or
    missing statistic costs speed, never a wrong answer.
    """
    if footer.num_rows == 0:
        return None
    column = footer.schema.names.index(cols.OFFSET)
    groups = [footer.row_group(g) for g in range(footer.num_row_groups)]
    stats = [g.column(column).statistics for g in groups]
    if not all(s is not None and s.has_min_max for s in stats):
        return None
    lo, hi = min(s.min for s in stats), max(s.max for s in stats)
    in_order = all(s.max - s.min + 1 == g.num_rows for s, g in zip(stats, groups, strict=True)) and all(
        b.min == a.max + 1 for a, b in itertools.pairwise(stats)
    )
    if not in_order:
        return _proven_unordered(path, partition, footer, int(lo)) if hi - lo + 1 == footer.num_rows else None
    # A column Parquet stores as required holds no null by construction (it has no definition
    # levels); counting its values would cost the scan ~80% more, so only optional ones are counted.
    counted = [
        c for c in (cols.OFFSET, cols.PARTITION) if footer.schema.column(footer.schema.names.index(c)).max_definition_level
    ]
    nulls = " + ".join(f"(count(*) - count({c}))" for c in counted) or "0"
    # offset - row number is constant exactly when the offsets are consecutive in row order
    query = f"""SELECT count(*), {nulls}, min({cols.PARTITION}), max({cols.PARTITION}),
                       min({cols.OFFSET} - file_row_number), max({cols.OFFSET} - file_row_number)
                FROM read_parquet($path, file_row_number = true, hive_partitioning = false)"""
    try:
        n, nulls, p_min, p_max, least, most = con.execute(query, {"path": path}).fetchone()
    except duckdb.Error:  # an offset overflowing, a damaged page: diagnosed
        return None
    if nulls == 0 and p_min == p_max == partition and least == most:
        return FileSpan(path, partition, least, least + n - 1, n, True)
    return None


def _proven_unordered(path: str, partition: int, footer: pq.FileMetaData, lo: int) -> FileSpan | None:
    """The span of a local file out of offset order (the key-hash layout), proven by the bitmap
    of :func:`_permutation_of` over the footer's range: the proof of a file on an object store,
    its columns read with pyarrow a window of row groups at a time (the next window read while
    this one is proven), so that memory stays a byte per offset whatever the file's size.

    Measured against a DuckDB ``bitstring_agg`` over the range, on the bench's clustered files
    of 10M rows on a quiet machine: 14 % less wall time. Either way the bitmap, a byte set at a
    random place per row, costs more than reading the row: the proof stays ~3 times a bare scan
    of the two columns."""
    n = footer.num_rows
    windows = _row_group_windows(footer)
    with ThreadPoolExecutor(1) as reader:
        try:
            source = pq.ParquetFile(path)
        except _READ_ERRORS:
            return None

        def read(groups: list[int]) -> pa.Table:
            return source.read_row_groups(groups, columns=[cols.PARTITION, cols.OFFSET])

        def chunks() -> Iterator[np.ndarray | None]:
            pending = reader.submit(read, windows[0])
            for i in range(len(windows)):
                rows = pending.result()
                if i + 1 < len(windows):
                    pending = reader.submit(read, windows[i + 1])
                offsets = _offset_chunks(rows, partition)
                yield from offsets if offsets is not None else [None]

        try:
            proven = _permutation_of(chunks(), lo, n)
        except _READ_ERRORS:  # a damaged page: diagnosed
            return None
    return FileSpan(path, partition, lo, lo + n - 1, n, True) if proven else None


# Rows of a clustered file read at once: enough for pyarrow to decode in parallel and for a
# read to overlap the proof of the previous window, few enough that a window is ~12 MB.
PROOF_WINDOW_ROWS = 1 << 20


def _row_group_windows(footer: pq.FileMetaData) -> list[list[int]]:
    """A file's row groups in consecutive runs of about ``PROOF_WINDOW_ROWS`` rows (at least one group each)."""
    windows: list[list[int]] = [[]]
    rows = 0
    for g in range(footer.num_row_groups):
        if windows[-1] and rows + footer.row_group(g).num_rows > PROOF_WINDOW_ROWS:
            windows.append([])
            rows = 0
        windows[-1].append(g)
        rows += footer.row_group(g).num_rows
    return windows


def _offset_runs(paths: list[str]) -> list[OffsetRun]:
    """Exact offset counts of some files, as runs of consecutive offsets with equal counts.

    Linear in the rows whatever their order in the file (a count per offset), but about three
    times the cost of the scan: only files that fail their proof come here."""
    runs: list[OffsetRun] = []
    for path in paths:
        runs += _runs_of(path, pq.read_table(path, columns=[cols.PARTITION, cols.OFFSET]))
    return runs


def _runs_of(path: str, rows: pa.Table) -> list[OffsetRun]:
    """The offset runs of one file's partition and offset columns, per partition."""
    rows = rows.filter(pc.is_valid(rows.column(cols.OFFSET)))
    parts = rows.column(cols.PARTITION).to_numpy(zero_copy_only=False)
    offsets = rows.column(cols.OFFSET).to_numpy(zero_copy_only=False)
    present = np.unique(parts)
    runs: list[OffsetRun] = []
    for p in present:
        mine = offsets if len(present) == 1 else offsets[parts == p]
        runs += [OffsetRun(path, int(p), *run) for run in offset_runs(mine)]
    return runs


def offset_runs(offsets: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first, last, count)``: maximal runs of consecutive offsets held ``count`` (> 0) times."""
    if not len(offsets):
        return []
    lo, hi = int(offsets.min()), int(offsets.max())
    if hi - lo < 4 * len(offsets) + 4096:  # dense (every file icelog writes): a count per offset
        counts = np.bincount(offsets - lo)
        values = np.arange(lo, hi + 1)
    else:  # sparse (a foreign file with far-apart offsets): sort
        values, counts = np.unique(offsets, return_counts=True)
    breaks = np.flatnonzero((np.diff(values) != 1) | (np.diff(counts) != 0)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(values)])) - 1
    return [(int(values[a]), int(values[b]), int(counts[a])) for a, b in zip(starts, ends, strict=True) if counts[a]]


def _coverage(pieces: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(first, last_inclusive, count)`` pieces -> sorted disjoint ``(start, end, count)``
    segments (``end`` exclusive) where the summed count is not zero."""
    delta: dict[int, int] = defaultdict(int)
    for first, last, count in pieces:
        delta[first] += count
        delta[last + 1] -= count
    points = sorted(delta)
    segments, current = [], 0
    for x, nxt in itertools.pairwise(points):
        current += delta[x]
        if current:
            segments.append((x, nxt, current))
    return segments


def _paths_touching(pieces: list[tuple[int, int, int, str]], first: int, last: int) -> str:
    paths = sorted({path for a, b, _, path in pieces if a <= last and b >= first})
    shown = ", ".join(paths[:MAX_PATHS_IN_DETAIL])
    return shown + (f" and {len(paths) - MAX_PATHS_IN_DETAIL} more" if len(paths) > MAX_PATHS_IN_DETAIL else "")


def _gaps_and_duplicates(table: str, p: int, pieces: list[tuple[int, int, int, str]], lo: int, hi: int) -> list[Violation]:
    """Exact gaps in ``[lo, hi)`` and exact duplicates (anywhere), in offset order."""
    found: list[tuple[int, Violation]] = []
    segments = _coverage((a, b, c) for a, b, c, _ in pieces)
    cursor = lo
    for start, end, _ in segments:
        if start > cursor and cursor < hi:
            last = min(start, hi) - 1
            found.append(
                (
                    cursor,
                    Violation(CHECK, table, "gap", f"offsets {cursor}..{last} missing", partition=p, first=cursor, last=last),
                )
            )
        cursor = max(cursor, end)
    if cursor < hi:
        found.append(
            (
                cursor,
                Violation(CHECK, table, "gap", f"offsets {cursor}..{hi - 1} missing", partition=p, first=cursor, last=hi - 1),
            )
        )
    runs: list[list[int]] = []  # [first, last, min_count, max_count]
    for start, end, count in segments:
        if count < 2:
            continue
        if runs and runs[-1][1] + 1 == start:
            runs[-1][1] = end - 1
            runs[-1][2], runs[-1][3] = min(runs[-1][2], count), max(runs[-1][3], count)
        else:
            runs.append([start, end - 1, count, count])
    for first, last, least, most in runs:
        times = f"{least}" if least == most else f"{least} to {most}"
        detail = f"offsets {first}..{last} committed {times} times ({_paths_touching(pieces, first, last)})"
        found.append(
            (first, Violation(CHECK, table, "duplicate", detail, partition=p, first=first, last=last, extra={"copies": most}))
        )
    return [v for _, v in sorted(found, key=lambda item: (item[0], item[1].kind))]


def tile(
    table: str,
    spans: Iterable[FileSpan],
    state: LogState | None,
    trust_files: bool = False,
    runs: Iterable[OffsetRun] = (),
) -> list[Violation]:
    """Check that each partition's data covers ``[log_start, log_end)`` exactly once.

    Args:
        table: Name used in violations.
        spans: Per-file spans.
        state: Watermarks to compare with; ``None`` checks contiguity only (old snapshots).
        trust_files: Metadata mode: every file without ``runs`` counts as holding each offset
            of its bounds once, and one whose record count differs from its bounds is reported
            as suspect. Otherwise (deep mode) files that are not ``exact`` count by ``runs``.
        runs: Exact offset counts of files that are not ``exact`` (every such file in deep
            mode; in metadata mode, the files that were read for want of bounds).
    """
    by_partition: dict[int, list[FileSpan]] = defaultdict(list)
    for span in spans:
        by_partition[span.partition].append(span)
    runs_by_partition: dict[int, list[OffsetRun]] = defaultdict(list)
    for run in runs:
        runs_by_partition[run.partition].append(run)
    counted = {(r.path, r.partition) for r in runs}
    violations: list[Violation] = []
    partitions = set(by_partition) | (set(state.watermarks) if state else set())
    for p in sorted(partitions):
        files = sorted(by_partition.get(p, []), key=lambda s: (s.first, s.last))
        if state is not None and p not in state.watermarks:
            violations.append(
                Violation(
                    CHECK, table, "unknown_partition", f"data files for partition {p}, which the table does not have", partition=p
                )
            )
            continue
        # metadata mode: a file not read is taken on its bounds, and reported when its count disagrees
        suspect = [s for s in files if trust_files and not s.exact and (s.path, p) not in counted]
        for s in suspect:
            kind = "duplicate" if s.rows > s.last - s.first + 1 else "gap"
            detail = f"{s.path} holds {s.rows} rows for offsets {s.first}..{s.last}"
            violations.append(Violation(CHECK, table, kind, detail, partition=p, first=s.first, last=s.last))
        pieces = [(s.first, s.last, 1, s.path) for s in files if s.exact] + [(s.first, s.last, 1, s.path) for s in suspect]
        pieces += [(r.first, r.last, r.count, r.path) for r in runs_by_partition.get(p, [])]
        mark = state.watermarks[p] if state is not None else None
        if files:
            data_first = files[0].first
            data_end = max(s.last for s in files) + 1
            lo = mark.start if mark is not None else data_first
            violations += _gaps_and_duplicates(table, p, pieces, lo, data_end)
        if mark is None:
            continue
        if not files:
            if mark.start != mark.end:
                violations.append(
                    Violation(
                        "watermark",
                        table,
                        "gap",
                        f"no data, but watermarks say [{mark.start}, {mark.end})",
                        partition=p,
                        first=mark.start,
                        last=mark.end - 1,
                    )
                )
            continue
        if data_first < mark.start:
            violations.append(
                Violation(
                    "watermark",
                    table,
                    "watermark",
                    f"log_start is {mark.start} but the data holds offsets from {data_first}",
                    partition=p,
                    first=data_first,
                    last=mark.start - 1,
                )
            )
        if data_end != mark.end:
            violations.append(
                Violation(
                    "watermark",
                    table,
                    "watermark",
                    f"stored log_end is {mark.end} but the data ends at {data_end} (max offset + 1)",
                    partition=p,
                    first=min(mark.end, data_end),
                    last=max(mark.end, data_end) - 1,
                    extra={"stored_start": mark.start, "stored_end": mark.end, "data_end": data_end},
                )
            )
    return violations


def check_files(
    table: str,
    paths: Mapping[str, int],
    state: LogState | None,
    con: duckdb.DuckDBPyConnection | None = None,
    rows: Mapping[str, int] | None = None,
    io: FileIO | None = None,
    sizes: Mapping[str, int] | None = None,
) -> tuple[list[Violation], int]:
    """The deep check over explicit files (local paths, or URIs read through ``io``): ``(violations, rows)``."""
    spans, runs, violations = scan_files(table, paths, con, rows, io, sizes)
    return violations + tile(table, spans, state, runs=runs), sum(s.rows for s in spans)


def check_contiguity(table: Table, *, deep: bool = False, snapshot_id: int | None = None) -> CheckReport:
    """I1 plus "stored watermarks == data" for one snapshot (default: the current one).

    Watermarks are only stored for the current snapshot, so an older snapshot is checked
    for contiguity alone.
    """
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    current = snapshot_id is None or snapshot_id == table.metadata.current_snapshot_id
    state = LogState.from_metadata(table.metadata) if current else None
    if deep:
        paths, counts, sizes, unplaced = _planned_files(table, snapshot_id)
        violations, rows = check_files(name, paths, state, rows=counts, io=table.io, sizes=sizes)
        violations = unplaced + violations
    else:
        spans, runs, violations = metadata_spans(table, snapshot_id)
        violations += tile(name, spans, state, trust_files=True, runs=runs)
        rows = sum(s.rows for s in spans)
    return CheckReport(
        table=name,
        snapshot_id=snapshot_id or table.metadata.current_snapshot_id,
        checks=["contiguity-deep" if deep else "contiguity", "watermark"] if current else ["contiguity"],
        violations=violations,
        rows=rows,
        seconds=time.perf_counter() - started,
    )

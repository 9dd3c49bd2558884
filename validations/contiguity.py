"""I1 contiguity and watermark checks, metadata-only and deep (DuckDB over data files).

Both reduce each data file to a :class:`FileSpan` and then tile the spans of a partition:
spans must follow each other exactly from ``log_start`` to ``log_end``.

* The metadata check reads only manifests (per-file offset bounds and record counts).
  It cannot see inside a file: a file whose count equals its bound range passes.
* The deep check reads the offsets. Per file, ``log_offset - file_row_number`` is constant
  exactly when the file holds consecutive offsets in order, so one grouped scan at
  DuckDB's scan speed proves each file; only a file that fails is analysed row by row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import duckdb
from pyiceberg.table import Table

from storage import schema as cols
from storage.files import file_offset_range, file_partition, local_path
from storage.state import LogState
from validations.violations import CheckReport, Violation

CHECK = "contiguity"


@dataclass(frozen=True)
class FileSpan:
    path: str
    partition: int
    first: int
    last: int  # inclusive
    rows: int
    ordered: bool  # offsets are consecutive in row order (deep check only proves this)


def metadata_spans(table: Table, snapshot_id: int | None = None) -> list[FileSpan]:
    offset_id = table.schema().find_field(cols.OFFSET).field_id
    spans = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        f = task.file
        first, nxt = file_offset_range(f, offset_id)
        spans.append(FileSpan(f.file_path, file_partition(f), first, nxt - 1, f.record_count, f.record_count == nxt - first))
    return spans


def deep_spans(
    table: Table, snapshot_id: int | None = None, con: duckdb.DuckDBPyConnection | None = None
) -> tuple[list[FileSpan], list[Violation]]:
    """Per-file spans computed from the offsets themselves, plus in-file violations."""
    name = str(table.name()[-2] + "." + table.name()[-1])
    paths = {local_path(t.file.file_path): file_partition(t.file) for t in table.scan(snapshot_id=snapshot_id).plan_files()}
    if not paths:
        return [], []
    con = con or duckdb.connect()
    rows = con.execute(
        f"""
        SELECT filename, {cols.PARTITION}, count(*), min({cols.OFFSET}), max({cols.OFFSET}),
               min({cols.OFFSET} - file_row_number) = max({cols.OFFSET} - file_row_number)
        FROM read_parquet($paths, filename = true, file_row_number = true)
        GROUP BY ALL
        """,
        {"paths": sorted(paths)},
    ).fetchall()
    spans, violations = [], []
    for path, partition, n, lo, hi, ordered in rows:
        if partition != paths[path]:
            violations.append(
                Violation(CHECK, name, "misplaced_row", f"{n} rows of partition {partition} in a file of partition {paths[path]} ({path})", partition=partition, first=lo, last=hi)
            )
        ordered = bool(ordered) and n == hi - lo + 1
        spans.append(FileSpan(path, partition, lo, hi, n, ordered))
        if not ordered:
            violations.extend(_inside_file(con, name, path, partition))
    return spans, violations


def _inside_file(con: duckdb.DuckDBPyConnection, table: str, path: str, partition: int) -> list[Violation]:
    """Exact gaps and duplicates within one file (only for files that failed the fast test)."""
    found = []
    dups = con.execute(
        f"SELECT {cols.OFFSET}, count(*) FROM read_parquet($p) WHERE {cols.PARTITION} = $q GROUP BY 1 HAVING count(*) > 1 ORDER BY 1",
        {"p": path, "q": partition},
    ).fetchall()
    for offset, count in dups:
        found.append(Violation(CHECK, table, "duplicate", f"offset {offset} appears {count} times in {path}", partition=partition, first=offset, last=offset))
    gaps = con.execute(
        f"""SELECT prev + 1, o - 1 FROM (
              SELECT {cols.OFFSET} AS o, lag({cols.OFFSET}) OVER (ORDER BY {cols.OFFSET}) AS prev
              FROM (SELECT DISTINCT {cols.OFFSET} FROM read_parquet($p) WHERE {cols.PARTITION} = $q))
            WHERE o - prev > 1 ORDER BY 1""",
        {"p": path, "q": partition},
    ).fetchall()
    for first, last in gaps:
        found.append(Violation(CHECK, table, "gap", f"offsets {first}..{last} missing inside {path}", partition=partition, first=first, last=last))
    if not dups and not gaps:
        found.append(Violation(CHECK, table, "unordered", f"offsets are not in row order in {path}", partition=partition))
    return found


def tile(
    table: str, spans: Iterable[FileSpan], state: LogState | None, trust_files: bool = False
) -> list[Violation]:
    """Check that each partition's spans cover ``[log_start, log_end)`` exactly once.

    Args:
        table: Name used in violations.
        spans: Per-file spans.
        state: Watermarks to compare with; ``None`` checks contiguity only (old snapshots).
        trust_files: Metadata mode: report in-file count mismatches as possible gaps/duplicates.
    """
    by_partition: dict[int, list[FileSpan]] = {}
    for span in spans:
        by_partition.setdefault(span.partition, []).append(span)
    violations: list[Violation] = []
    partitions = set(by_partition) | (set(state.watermarks) if state else set())
    for p in sorted(partitions):
        files = sorted(by_partition.get(p, []), key=lambda s: (s.first, s.last))
        if state is not None and p not in state.watermarks:
            violations.append(Violation(CHECK, table, "unknown_partition", f"data files for partition {p}, which the table does not have", partition=p))
            continue
        for s in files:
            if trust_files and not s.ordered:
                kind = "duplicate" if s.rows > s.last - s.first + 1 else "gap"
                violations.append(Violation(CHECK, table, kind, f"{s.path} holds {s.rows} rows for offsets {s.first}..{s.last}", partition=p, first=s.first, last=s.last))
        for a, b in zip(files, files[1:]):
            if b.first > a.last + 1:
                violations.append(Violation(CHECK, table, "gap", f"offsets {a.last + 1}..{b.first - 1} missing", partition=p, first=a.last + 1, last=b.first - 1))
            elif b.first <= a.last:
                hi = min(a.last, b.last)
                violations.append(Violation(CHECK, table, "duplicate", f"offsets {b.first}..{hi} committed twice ({a.path}, {b.path})", partition=p, first=b.first, last=hi))
        if state is None:
            continue
        mark = state.watermarks[p]
        data_first = files[0].first if files else None
        data_end = max(s.last for s in files) + 1 if files else None
        if files and data_first != mark.start:
            kind = "gap" if data_first > mark.start else "watermark"
            violations.append(Violation("watermark", table, kind, f"log_start is {mark.start} but the first offset in the data is {data_first}", partition=p, first=min(mark.start, data_first), last=max(mark.start, data_first) - 1))
        if files and data_end != mark.end:
            violations.append(Violation("watermark", table, "watermark", f"stored log_end is {mark.end} but the data ends at {data_end} (max offset + 1)", partition=p, first=min(mark.end, data_end), last=max(mark.end, data_end) - 1, extra={"stored_end": mark.end, "data_end": data_end}))
        if not files and mark.start != mark.end:
            violations.append(Violation("watermark", table, "gap", f"no data, but watermarks say [{mark.start}, {mark.end})", partition=p, first=mark.start, last=mark.end - 1))
    return violations


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
        spans, violations = deep_spans(table, snapshot_id)
    else:
        spans, violations = metadata_spans(table, snapshot_id), []
    violations += tile(name, spans, state, trust_files=not deep)
    return CheckReport(
        table=name,
        snapshot_id=snapshot_id or table.metadata.current_snapshot_id,
        checks=["contiguity-deep" if deep else "contiguity", "watermark"] if current else ["contiguity"],
        violations=violations,
        rows=sum(s.rows for s in spans),
        seconds=time.perf_counter() - started,
    )

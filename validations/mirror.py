"""The ``mirror-parity`` check (I6): a mirror target holds the same (partition, offset) with
the same content as its source.

The target records its source (catalog name and table) in ``icelog.mirror``, so the check
needs only the target. Per partition, DuckDB compares the offset ranges, then a content hash
per range of :data:`CHUNK` offsets (the sum of a hash of every column of every row, so a
missing, extra, duplicated or changed row moves it). The first differing range is compared
row by row to report the first differing offset.

A mirror that is up to date (its recorded source snapshot and state version are the
source's) must have exactly the source's ranges. One that lags is compared on the offsets
both hold, and a target that holds offsets its source never had is a violation.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import duckdb
from pyiceberg.table import Table

from icelog.storage.core.catalog import CatalogNotConfigured, open_catalog
from icelog.storage.core.commit import load
from icelog.storage.errors import IcelogError, UnknownTable
from icelog.storage.log.scan import parquet_from
from icelog.storage.log.state import LogState
from icelog.storage.properties import VERSION
from icelog.storage.replication.mirror import mirror_record
from icelog.validations.sql import planned_paths
from icelog.validations.violations import CheckReport, Violation

CHECK = "mirror-parity"
CHUNK = 100_000

E = TypeVar("E", bound=IcelogError)


def with_hint(error: E, hint: str) -> E:
    """``error``, its message followed by ``hint`` (what to pass or set to fix it). The type,
    fields and exit code stay; the hint is for people, so a pickled copy goes without it."""
    error.args = (f"{error}; {hint}",)
    return error


def check_mirror_parity(table: Table, snapshot_id: int | None = None, source: Table | None = None) -> CheckReport:
    """Compare a mirror target (at ``snapshot_id``, default current) with its source now.

    Args:
        table: The mirror target.
        snapshot_id: The target's snapshot to check.
        source: The source table (default: loaded from the catalog the target records).
    """
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    record = mirror_record(table.metadata)
    if record is None:
        violation = Violation(
            CHECK,
            name,
            "not_a_mirror",
            f"{name} records no mirror source (icelog.mirror); the check runs on the copy, in its catalog (--catalog NAME)",
        )
        return CheckReport(
            name, snapshot_id or table.metadata.current_snapshot_id, [CHECK], [violation], 0, time.perf_counter() - started
        )
    if source is None:
        try:
            source = load(open_catalog(record["catalog"]), record["table"])
        except (CatalogNotConfigured, UnknownTable) as e:
            raise with_hint(
                e, f"it is the source of mirror {name}, recorded in its icelog.mirror: configure that catalog here by that name"
            ) from None
    up_to_date = record.get("snapshot") == source.metadata.current_snapshot_id and record.get(
        "version"
    ) == source.metadata.properties.get(VERSION)
    violations: list[Violation] = []
    if str(source.metadata.table_uuid) != record.get("uuid"):
        violations.append(
            Violation(
                CHECK,
                name,
                "source_changed",
                f"source {record['table']} has table UUID {source.metadata.table_uuid}, the mirror copies {record.get('uuid')}",
            )
        )
    mine, theirs = LogState.from_metadata(table.metadata).watermarks, LogState.from_metadata(source.metadata).watermarks
    compare: dict[int, tuple[int, int]] = {}
    for p in sorted(set(mine) | set(theirs)):
        if p not in theirs:
            violations.append(Violation(CHECK, name, "partition", f"partition {p} is not in the source", partition=p))
            continue
        if p not in mine:
            if up_to_date or theirs[p].end > theirs[p].start:
                violations.append(Violation(CHECK, name, "partition", f"source partition {p} is not mirrored", partition=p))
            continue
        a, b = mine[p], theirs[p]
        if (up_to_date and (a.start, a.end) != (b.start, b.end)) or a.end > b.end:
            first = min(a.end, b.end) if a.end != b.end else min(a.start, b.start)
            violations.append(
                Violation(
                    CHECK,
                    name,
                    "range",
                    f"partition {p}: mirror holds [{a.start}, {a.end}), source [{b.start}, {b.end})",
                    partition=p,
                    first=first,
                    extra={"mirror": [a.start, a.end], "source": [b.start, b.end]},
                )
            )
        lo, hi = max(a.start, b.start), min(a.end, b.end)
        if hi > lo:
            compare[p] = (lo, hi)
    rows = 0
    if compare:
        columns = [f.name for f in table.schema().fields if source.schema().find_field(f.name, case_sensitive=True) is not None]
        con = duckdb.connect()
        try:
            sides = [planned_paths(table, snapshot_id), planned_paths(source)]
            mine, theirs = (
                parquet_from(con, paths, t.io) if paths else None for paths, t in zip(sides, (table, source), strict=True)
            )
            found, rows = _content_violations(con, name, columns, mine, theirs, compare)
        finally:
            con.close()
        violations.extend(found)
    return CheckReport(
        name, snapshot_id or table.metadata.current_snapshot_id, [CHECK], violations, rows, time.perf_counter() - started
    )


def _content_violations(
    con: duckdb.DuckDBPyConnection,
    name: str,
    columns: list[str],
    mine: str | None,
    theirs: str | None,
    compare: dict[int, tuple[int, int]],
) -> tuple[list[Violation], int]:
    """``mine``, ``theirs``: FROM items reading each table's files (None: no files)."""
    row_hash = "hash(" + ", ".join(f'"{c}"' for c in columns) + ")"
    bounds = " OR ".join(f"(log_partition = {p} AND log_offset >= {lo} AND log_offset < {hi})" for p, (lo, hi) in compare.items())
    chunked = (
        f"SELECT log_partition, log_offset // {CHUNK} AS chunk, count(*) AS n, sum({row_hash}::HUGEINT) AS h "
        f"FROM {{source}} WHERE {bounds} GROUP BY ALL"
    )
    sides = []
    for source in (mine, theirs):
        sides.append(
            {(p, c): (n, h) for p, c, n, h in con.execute(chunked.replace("{source}", source)).fetchall()} if source else {}
        )
    rows = sum(n for n, _ in sides[0].values())
    violations = []
    for p in sorted(compare):
        chunks = sorted({c for (q, c) in [*sides[0], *sides[1]] if q == p})
        bad = next((c for c in chunks if sides[0].get((p, c)) != sides[1].get((p, c))), None)
        if bad is None:
            continue
        lo, hi = compare[p]
        lo, hi = max(lo, bad * CHUNK), min(hi, (bad + 1) * CHUNK)
        offset = _first_difference(con, row_hash, mine, theirs, p, lo, hi)
        violations.append(
            Violation(
                CHECK,
                name,
                "content",
                f"partition {p}: offset {offset} differs from the source (first difference in [{lo}, {hi}))",
                partition=p,
                first=offset,
                last=offset,
            )
        )
    return violations, rows


def _first_difference(con: Any, row_hash: str, mine: str | None, theirs: str | None, p: int, lo: int, hi: int) -> int:
    query = (
        f"SELECT log_offset, {row_hash} FROM {{source}} "
        f"WHERE log_partition = {p} AND log_offset >= {lo} AND log_offset < {hi} ORDER BY 1, 2"
    )
    a = con.execute(query.replace("{source}", mine)).fetchall() if mine else []
    b = con.execute(query.replace("{source}", theirs)).fetchall() if theirs else []
    for x, y in zip(a, b, strict=False):  # a length difference is judged below
        if x != y:
            return min(x[0], y[0])
    return (a[len(b)][0] if len(a) > len(b) else b[len(a)][0]) if len(a) != len(b) else lo

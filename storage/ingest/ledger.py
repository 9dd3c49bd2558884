"""The ingest ledger: which source files were loaded into which table, at which offsets.

COPY INTO semantics (Snowflake's load metadata, Databricks ``COPY INTO``), without expiry:
a file is loaded into a table once, however long ago that was. The ledger is the system
table ``icelog_system.ingest_ledger``, an Iceberg table with one row per loaded file,
partitioned by target table so a lookup reads only that table's entries. Its rows are
committed in the same atomic multi-table commit as the data they describe
(``storage.core.commit.commit_tables``): either both land or neither does. A catalog
without that commit (REST) has no ledger: :func:`ensure_ledger` refuses it.

A file is identified by its absolute path. For each listed file, :func:`plan` decides:

* never loaded: load it;
* loaded, same size and modification time: skip it ("already loaded"), without reading it;
* loaded, size or modification time differ: compare the content fingerprint (SHA-256).
  The same content (a touched or copied-over file) is skipped; different content is refused
  with :class:`SourceFileChanged`, unless the caller asks to reload changed files, which
  loads the new content as new rows (the old rows stay: a log never rewrites history).

A content change that keeps both the size and the modification time is not detected; pass
``verify=True`` to fingerprint every listed file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.expressions import AlwaysFalse, And, EqualTo, In
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from icelog.storage.core.catalog import ensure_namespace
from icelog.storage.core.commit import Decision, Request
from icelog.storage.core.state import SystemState
from icelog.storage.core.swap import check_atomic
from icelog.storage.core.system import NAMESPACE, PROPERTIES
from icelog.storage.errors import SourceFileChanged

LEDGER_TABLE = f"{NAMESPACE}.ingest_ledger"

SCHEMA = Schema(
    NestedField(1, "table_name", StringType(), required=True),
    NestedField(2, "path", StringType(), required=True),
    NestedField(3, "size", LongType(), required=True),
    NestedField(4, "mtime_ns", LongType(), required=True),
    NestedField(5, "fingerprint", StringType(), required=True),
    # The log partitions this load covered; null: all of them (the usual case).
    NestedField(6, "partitions", ListType(12, IntegerType(), element_required=True), required=False),
    # Offsets the file's rows got: {"partition": [[first, next], ...]}.
    NestedField(7, "ranges", StringType(), required=True),
    NestedField(8, "rows", LongType(), required=True),
    NestedField(9, "run_key", StringType(), required=False),
    NestedField(10, "commit_id", StringType(), required=True),
    NestedField(11, "loaded_at", TimestamptzType(), required=True),
)
# Whole paths as column bounds (the default truncates strings to 16 characters, shorter than
# any landing path's common prefix): a lookup of one day's files then plans only the ledger
# files whose path range holds them, not every file of the table's partition.
# Manifests merged early: a lookup reads a few manifests, not one per load.
LEDGER_PROPERTIES = {"write.metadata.metrics.column.path": "full", "commit.manifest.min-count-to-merge": "8"}
SPEC = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="table_name"))


@dataclass(frozen=True)
class SourceFile:
    """A listed source file: its identity, and (when computed) its content fingerprint."""

    path: str
    size: int
    mtime_ns: int
    fingerprint: str | None = None

    @classmethod
    def stat(cls, path: str) -> SourceFile:
        path = os.path.realpath(path)
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns)

    def with_fingerprint(self) -> SourceFile:
        return SourceFile(self.path, self.size, self.mtime_ns, self.fingerprint or fingerprint(self.path))


@dataclass(frozen=True)
class Entry:
    """One ledger row: a file loaded into a table."""

    path: str
    size: int
    mtime_ns: int
    fingerprint: str
    partitions: tuple[int, ...] | None
    ranges: Mapping[str, list[list[int]]]
    rows: int
    run_key: str | None
    commit_id: str
    loaded_at: dt.datetime


@dataclass
class Plan:
    """What a run loads and what it skips (with the reason), decided from the ledger."""

    load: list[SourceFile] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    # Per file to load: the log partitions still to load.
    partitions: dict[str, set[int]] = field(default_factory=dict)


def fingerprint(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def ensure_ledger(catalog: Catalog) -> None:
    """Create the ledger table unless it exists; safe when processes race.

    Raises:
        AtomicCommitUnsupported: the catalog cannot commit the ledger and the data in one
            step (a REST catalog): refused here, before an ingest reads a file or creates
            anything.
    """
    check_atomic(catalog, 2)  # every ledger entry lands with its data, in one commit
    try:
        catalog.load_table(LEDGER_TABLE)
        return
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, NAMESPACE)
    try:
        catalog.create_table(LEDGER_TABLE, schema=SCHEMA, partition_spec=SPEC, properties={**PROPERTIES, **LEDGER_PROPERTIES})
    except TableAlreadyExistsError:
        pass


def entries(ledger: Table, table: str, paths: Sequence[str] | None = None) -> dict[str, list[Entry]]:
    """The ledger entries of ``table`` (only ``paths`` if given), oldest first per path.

    Reads only the table's partition of the ledger and, for up to 1,000 paths, only the
    ledger files whose path bounds can hold them (pruned by the manifests).
    """
    condition: Any = EqualTo("table_name", table)
    if paths is not None and len(paths) <= 1000:
        condition = And(condition, In("path", set(paths))) if paths else AlwaysFalse()
    rows = ledger.scan(row_filter=condition).to_arrow()
    if paths is not None and rows.num_rows:
        rows = rows.filter(pc.is_in(rows["path"], value_set=pa.array(list(paths), pa.string())))
    found: dict[str, list[Entry]] = {}
    for r in sorted(rows.to_pylist(), key=lambda r: r["loaded_at"]):
        found.setdefault(r["path"], []).append(
            Entry(
                r["path"],
                r["size"],
                r["mtime_ns"],
                r["fingerprint"],
                None if r["partitions"] is None else tuple(r["partitions"]),
                json.loads(r["ranges"]),
                r["rows"],
                r["run_key"],
                r["commit_id"],
                r["loaded_at"],
            )
        )
    return found


def plan(
    table: str,
    files: Iterable[SourceFile],
    loaded: Mapping[str, list[Entry]],
    wanted: set[int],
    *,
    reload_changed: bool = False,
    verify: bool = False,
) -> Plan:
    """Decide, per listed file, to load it, skip it, or refuse it (see the module docstring).

    Args:
        table: The target table (for error messages).
        files: The listed source files.
        loaded: Ledger entries per path (:func:`entries`).
        wanted: The log partitions this run loads.

    Raises:
        SourceFileChanged: a loaded file's content changed, and ``reload_changed`` is False.
    """
    out = Plan()
    for f in files:
        history = loaded.get(f.path, [])
        last = history[-1] if history else None
        if last is not None and (verify or (f.size, f.mtime_ns) != (last.size, last.mtime_ns)):
            f = f.with_fingerprint()
            if f.fingerprint != last.fingerprint:
                if not reload_changed:
                    raise SourceFileChanged(
                        table=table,
                        path=f.path,
                        loaded_fingerprint=last.fingerprint,
                        fingerprint=f.fingerprint or "",
                        loaded_at=last.loaded_at.isoformat(),
                    )
                last, history = None, []  # new content: new rows
        covered: set[int] = set()
        for e in history:
            if e.fingerprint == last.fingerprint:  # type: ignore[union-attr]
                covered |= set(wanted) if e.partitions is None else set(e.partitions)
        rest = set(wanted) - covered
        if last is not None and not rest:
            touched = (f.size, f.mtime_ns) != (last.size, last.mtime_ns)
            out.skipped.append(
                {
                    "path": f.path,
                    "reason": "already loaded (same content, touched since)" if touched else "already loaded",
                    "loaded_at": last.loaded_at.isoformat(),
                    "run_key": last.run_key,
                    "commit_id": last.commit_id,
                }
            )
            continue
        out.load.append(f.with_fingerprint())
        out.partitions[f.path] = rest  # a partial earlier load (some partitions only): the rest
    return out


def ledger_rows(
    table: str,
    files: Sequence[SourceFile],
    ranges: Mapping[str, Mapping[int, list[list[int]]]],
    partitions: Mapping[str, set[int]],
    all_partitions: int,
    run_key: str | None,
    commit_id: str,
    now: dt.datetime | None = None,
) -> pa.Table:
    """The ledger rows recording one load: one per file, with the offsets its rows got."""
    now = now or dt.datetime.now(dt.UTC)
    rows = []
    for f in files:
        spans = ranges.get(f.path, {})
        parts = partitions.get(f.path)
        rows.append(
            {
                "table_name": table,
                "path": f.path,
                "size": f.size,
                "mtime_ns": f.mtime_ns,
                "fingerprint": f.fingerprint,
                "partitions": None if parts == set(range(all_partitions)) else sorted(parts),
                "ranges": json.dumps({str(p): s for p, s in sorted(spans.items())}, separators=(",", ":")),
                "rows": sum(n - first for s in spans.values() for first, n in s),
                "run_key": run_key,
                "commit_id": commit_id,
                "loaded_at": now,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA.as_arrow())


@dataclass
class LedgerAppend(Request):
    """Add pre-written ledger data files; joins the data commit in one atomic multi-table commit."""

    files: tuple[DataFile, ...]
    entries: int
    state_type = SystemState
    writes_system = True

    def decide(self, state: SystemState, table: Table) -> Decision:
        return Decision(state=state, result={"ledger_entries": self.entries}, add_files=self.files)

"""The ingest ledger: which source files were loaded into which table, at which offsets.

COPY INTO semantics (Snowflake's load metadata, Databricks ``COPY INTO``), without expiry:
a file is loaded into a table once, however long ago that was. The ledger is the system
table ``icelog_system.ingest_ledger``, an Iceberg table with one row per loaded file,
partitioned by target table so a lookup reads only that table's entries.

How the ledger rows land with the data they describe depends on the catalog:

* A catalog with atomic multi-table commits (SQL): in the same commit as the data
  (``storage.core.commit.commit_tables``): either both land or neither does.
* Any other catalog (REST): the data table's own commit is the decision. That single-table
  compare-and-swap carries the ledger rows it makes true in its commit-id registry receipt
  (:class:`CarryingAppend`, under :data:`RECEIPT_KEY`); the ledger then rolls forward in a
  commit of its own with the same commit id (:func:`record`), found by that id on a re-run,
  never applied twice. Before an ingest plans, :func:`read_for_plan` rolls forward every
  receipt the ledger lacks (a process killed between the two commits), so the plan sees every
  file the data table's ends include. The receipt lives in a table property, which snapshot
  expiry never touches; it stays for the registry's window (``icelog.commit-ids.keep``
  commits of the data table, and at least ``icelog.commit-ids.min-retention-ms``).

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
from icelog.storage.core.commit import Decision, Request, commit, load, was_committed
from icelog.storage.core.registry import all_commits
from icelog.storage.core.state import SystemState
from icelog.storage.core.swap import is_atomic, load_tables
from icelog.storage.core.system import NAMESPACE, PROPERTIES
from icelog.storage.errors import RegistryFileGone, SourceFileChanged
from icelog.storage.log.files import write_log_files
from icelog.storage.log.table import AppendRequest, AppendResult

LEDGER_TABLE = f"{NAMESPACE}.ingest_ledger"
# In a data commit's registry receipt (a catalog without atomic multi-table commits): the
# ledger rows that commit makes true, one list per row in SCHEMA's column order.
RECEIPT_KEY = "ingest-ledger"

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
COLUMNS = [f.name for f in SCHEMA.fields]  # a receipt's ledger row: its values in this order
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
    """Create the ledger table unless it exists; safe when processes race."""
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


@dataclass
class CarryingAppend(AppendRequest):
    """A data commit that carries its ledger rows in its registry receipt (see the module doc).

    The receipt is the append's own (offsets per partition) plus :data:`RECEIPT_KEY`; the
    registry keeps it with the commit id, in the same single-table compare-and-swap as the rows.
    """

    ledger: list[list[Any]] = field(default_factory=list)

    def receipt(self, result: AppendResult) -> dict[str, Any]:
        return {**super().receipt(result), RECEIPT_KEY: self.ledger}

    def from_receipt(self, receipt: Mapping[str, Any]) -> AppendResult:
        return super().from_receipt({k: v for k, v in receipt.items() if k != RECEIPT_KEY})


def carrying(data: AppendRequest, rows: pa.Table) -> CarryingAppend:
    """``data`` (``LogTable.files_request``), carrying the ledger ``rows`` in its receipt."""
    fields = {name: getattr(data, name) for name in data.__dataclass_fields__}
    return CarryingAppend(**fields, ledger=_to_receipt(rows))


def _to_receipt(rows: pa.Table) -> list[list[Any]]:
    def plain(value: Any) -> Any:
        return int(value.timestamp() * 1_000_000) if isinstance(value, dt.datetime) else value

    return [[plain(r[name]) for name in COLUMNS] for r in rows.to_pylist()]


def _from_receipt(entries: list[list[Any]]) -> pa.Table:
    columns = list(zip(*entries, strict=True)) if entries else [[] for _ in COLUMNS]
    arrays = {name: list(values) for name, values in zip(COLUMNS, columns, strict=True)}
    arrays["loaded_at"] = [dt.datetime.fromtimestamp(us / 1_000_000, dt.UTC) for us in arrays["loaded_at"]]
    return pa.Table.from_pydict(arrays, schema=SCHEMA.as_arrow())


@dataclass
class LedgerRollForward(Request):
    """The ledger's own commit of rows a data commit carried, under that commit's id.

    The core finds the id in the ledger's registry (done before); past the registry's window,
    the decision finds the id in the ledger's rows at the base it swaps from: never twice.
    """

    table: str
    commit_id: str
    rows: pa.Table
    state_type = SystemState
    writes_system = True

    def decide(self, state: SystemState, table: Table) -> Decision:
        if self.commit_id in _recorded(table, self.table, [self.commit_id]):
            return Decision(state=state, result={"ledger_entries": 0}, write=False)
        return Decision(state=state, result={"ledger_entries": self.rows.num_rows}, rows={0: self.rows})

    def write_rows(self, table: Table, rows: Mapping[int, Any]) -> list[DataFile]:
        return write_log_files(table, {self.table: rows[0]})


def _recorded(book: Table, table: str, commit_ids: Sequence[str]) -> set[str]:
    """Those of ``commit_ids`` whose rows ``book`` (the ledger) holds for ``table``."""
    if book.metadata.current_snapshot_id is None:
        return set()
    condition = And(EqualTo("table_name", table), In("commit_id", set(commit_ids)))
    found = book.scan(row_filter=condition, selected_fields=("commit_id",)).to_arrow()
    return set(found["commit_id"].to_pylist())


def record(catalog: Catalog, table: str, commit_id: str, rows: pa.Table) -> int:
    """Roll the ledger forward with the rows of ``table``'s data commit ``commit_id``; returns the rows added."""
    outcome = commit(catalog, LEDGER_TABLE, LedgerRollForward(table, commit_id, rows), commit_id=commit_id, resent=False)
    return 0 if outcome.already_committed else int(outcome.result["ledger_entries"])


def _proven(book: Table, commit_id: str) -> bool:
    """Whether the ledger's registry holds ``commit_id`` (False when a gone registry file might)."""
    try:
        return was_committed(book, commit_id)
    except RegistryFileGone:
        return False  # the ledger's rows decide (_recorded)


def roll_forward(catalog: Catalog, data: Table, table: str) -> dict[str, int]:
    """Roll the ledger forward from every commit in ``data``'s registry that carries ledger rows
    the ledger lacks (a process killed between the data commit and :func:`record`).

    A registry file of either table that an orphan cleanup of another engine deleted does not
    stop ingest: the data table's gone entries are left out (commits old enough to be in such a
    file were recorded right after they landed, unless killed in between), and an id the
    ledger's own registry cannot prove is judged by the ledger's rows, as a forgotten one.

    Returns:
        Rows added per commit id rolled forward now.
    """
    carried = {
        cid: receipt[RECEIPT_KEY]
        for cid, receipt, *_ in all_commits(data, skip_gone=True)
        if isinstance(receipt, dict) and RECEIPT_KEY in receipt
    }
    if not carried:
        return {}
    book = load(catalog, LEDGER_TABLE)
    unproven = [cid for cid in carried if not _proven(book, cid)]
    if not unproven:
        return {}
    done = _recorded(book, table, unproven)  # ids the ledger's own registry has forgotten
    added = {}
    for cid in unproven:
        if cid not in done:
            added[cid] = record(catalog, table, cid, _from_receipt(carried[cid]))
    return {cid: n for cid, n in added.items() if n}


def read_for_plan(catalog: Catalog, table: str) -> dict[str, Table]:
    """The data table and the ledger, the ledger holding every file the data table's ends include.

    On a catalog with atomic multi-table commits, both at one catalog instant. On any other,
    the data table first, then the ledger rolled forward from it (:func:`roll_forward`): a
    data commit after that read moves the ends the plan expects, so the run's conditional
    commit cannot land on top of it.
    """
    if is_atomic(catalog):
        return load_tables(catalog, [table, LEDGER_TABLE])
    data = load(catalog, table)
    roll_forward(catalog, data, table)
    return {table: data, LEDGER_TABLE: load(catalog, LEDGER_TABLE)}

"""Repair a log table that another writer committed to (a *foreign commit*).

Any Iceberg engine can append to a log table; icelog then refuses to build on it
(:class:`storage.errors.ForeignCommit`), because foreign rows may duplicate or skip offsets
(I1). Repair decides on the exact base it replaces, through the commit core:

* **adopt** when the foreign snapshots only *added* files, each file holds one partition
  with consecutive offsets in row order (and ``log_key_hash``, where filled, is its key's
  hash), and per partition they extend the log exactly from its log end: the watermarks move
  to cover them, no data changes;
* otherwise **roll back**: ``main`` points at icelog's last snapshot again (the files stay
  until maintenance removes them). When icelog never committed a snapshot, the rollback is to
  the empty table: the foreign snapshots are expired in the same commit, so ``main`` points
  at none and no time travel shows their rows as current. The report lists the snapshots,
  and the rows by (partition, offset) that the rollback drops and restores: a foreign
  ``delete`` that rewrote a file drops no row, it only restores the deleted ones.

Another tool may also change the table's default partition spec (``update_spec()``), which
icelog refuses to write under (:class:`storage.errors.ForeignPartitionSpec`). Repair sets the
default back to the table's ``identity(log_partition)`` spec, in the same commit: that changes
no data and no file (every file keeps the spec it was written under, and reads plan each by
its own), only what later writers write under; the report names both specs. Files written
under another spec are never adopted (their partition tuples do not name a log partition
first): the foreign snapshots that added them are rolled back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit, icelog_head, is_system_table
from icelog.storage.errors import InvalidInput, TerminalError
from icelog.storage.log import schema as cols
from icelog.storage.log.keys import key_hashes
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.properties import READ_ONLY

Mode = Literal["auto", "adopt", "rollback"]


class RepairImpossible(TerminalError):
    """The table cannot be repaired automatically (e.g. icelog's last snapshot expired)."""

    table: str
    reason: str
    message = "{table}: cannot repair: {reason}"


def _files(table: Table, snapshot_id: int | None) -> dict[str, DataFile]:
    if snapshot_id is None:
        return {}
    return {t.file.file_path: t.file for t in table.scan(snapshot_id=snapshot_id).plan_files()}


def _foreign_chain(table: Table, head: int | None) -> list[int]:
    """Snapshot ids from the current one back to (not including) icelog's head."""
    chain, snapshot = [], table.metadata.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != head:
        chain.append(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    if head is not None and snapshot is None:
        raise RepairImpossible(
            table=".".join(table.name()),
            reason=f"icelog's last snapshot {head} is not an ancestor of the current one (expired or replaced)",
        )
    return chain


def _adoptable(table: Table, state: LogState, added: list[DataFile], removed: int) -> tuple[dict[int, int], str]:
    """New log ends if the added files extend the log exactly, else ``({}, why not)``."""
    if removed:
        return {}, f"the foreign commits removed {removed} files"
    specs, schema = table.metadata.specs(), table.schema()
    for data_file in added:
        if not cols.is_log_spec(specs[data_file.spec_id], schema):
            return {}, f"{data_file.file_path} was written under partition spec {data_file.spec_id}, not identity(log_partition)"
    spans: dict[int, list[tuple[int, int]]] = {}
    key = cols.key_column(table.schema(), table.metadata.properties)
    for data_file in added:
        with table.io.new_input(data_file.file_path).open() as f:
            names = pq.ParquetFile(f).schema_arrow.names
            hashed = key is not None and key in names and cols.KEY_HASH in names
            rows = pq.read_table(f, columns=[cols.PARTITION, cols.OFFSET, *([key, cols.KEY_HASH] if hashed else [])])
        if rows.num_rows == 0:
            continue
        if hashed and _wrong_hashes(rows, key):
            # Key-range reads skip row groups by log_key_hash: a wrong one would hide rows.
            return {}, f"{data_file.file_path}: log_key_hash does not match the hash of {key}"
        parts = pc.unique(rows[cols.PARTITION]).to_pylist()
        offsets = rows[cols.OFFSET].to_numpy()
        if len(parts) != 1 or parts[0] is None or not 0 <= parts[0] < state.partitions:
            return {}, f"{data_file.file_path} holds partitions {parts}"
        if len(offsets) > 1 and not ((offsets[1:] - offsets[:-1]) == 1).all():
            return {}, f"{data_file.file_path}: offsets are not consecutive in row order"
        spans.setdefault(parts[0], []).append((int(offsets[0]), int(offsets[-1]) + 1))
    ends: dict[int, int] = {}
    for p, ranges in spans.items():
        cursor = state.end(p)
        for first, nxt in sorted(ranges):
            if first != cursor:
                return {}, f"partition {p}: foreign rows start at offset {first}, the log ends at {cursor}"
            cursor = nxt
        ends[p] = cursor
    return ends, ""


def _row_changes(table: Table, added: list[DataFile], removed: list[DataFile]) -> tuple[int, int]:
    """``(dropped, restored)``: rows, by (partition, offset), that rolling back removes from the
    current snapshot and brings back. Only the files that differ are read; the others stay."""
    now, then = _row_keys(table, added), _row_keys(table, removed)
    return sum((now - then).values()), sum((then - now).values())


def _row_keys(table: Table, files: Iterable[DataFile]) -> Counter:
    keys: Counter = Counter()
    for data_file in files:
        with table.io.new_input(data_file.file_path).open() as f:
            rows = pq.read_table(f, columns=[cols.PARTITION, cols.OFFSET])
        keys.update(zip(rows[cols.PARTITION].to_pylist(), rows[cols.OFFSET].to_pylist(), strict=True))
    return keys


def _wrong_hashes(rows: Any, key: str) -> bool:

    given = rows.column(cols.KEY_HASH)
    known = pc.is_valid(given).to_numpy(zero_copy_only=False)  # a missing hash is only never skipped
    return bool((given.to_numpy(zero_copy_only=False)[known] != key_hashes(rows.column(key))[known]).any())


@dataclass
class Repair(Request):
    state_type = LogState

    table: str
    mode: Mode = "auto"
    commit_id: str = ""
    allow_foreign = True
    # A foreign commit wedges a system table or a read-only mirror target as well; rolling it
    # back restores icelog's own state there (adopting foreign rows is refused: see decide).
    writes_system = True
    writes_read_only = True

    def decide(self, state: LogState, table: Table) -> Decision:
        head = icelog_head(table.metadata)
        current = table.metadata.current_snapshot_id
        spec = _spec_restore(self.table, table)
        if head == "unknown" or head == current:
            if spec is None:
                return Decision(state=state, result={"table": self.table, "action": "none", "snapshot_id": current}, write=False)
            report = {"table": self.table, "action": "spec_restored", "snapshot_id": current, "partition_spec": spec}
            return Decision(state=state, result=report, default_spec_id=spec["restored"])
        decision = self._foreign_snapshots(state, table, head, current)
        if spec is not None:
            decision.result["partition_spec"] = spec
            decision.default_spec_id = spec["restored"]
        return decision

    def _foreign_snapshots(self, state: LogState, table: Table, head: int | None, current: int | None) -> Decision:
        mode = self.mode
        if is_system_table(self.table) or table.metadata.properties.get(READ_ONLY):
            # icelog_system.* is written only by icelog, a mirror target only by its mirror: a
            # foreign record there is a forgery or a divergence, never adopted.
            if mode == "adopt":
                raise RepairImpossible(
                    table=self.table,
                    reason="foreign rows are never adopted into a system table or a read-only mirror target; use rollback",
                )
            mode = "rollback"
        chain = _foreign_chain(table, head)
        before, after = _files(table, head), _files(table, current)
        added = [f for path, f in after.items() if path not in before]
        removed = [f for path, f in before.items() if path not in after]
        report: dict[str, Any] = {"table": self.table, "foreign_snapshots": chain, "icelog_snapshot_id": head}
        ends, why = _adoptable(table, state, added, len(removed)) if mode != "rollback" else ({}, "rollback requested")
        if ends or (not why and mode != "rollback"):
            report.update(action="adopted", rows={str(p): e - state.end(p) for p, e in ends.items()})
            return Decision(state=state.with_ends(ends), result=report)
        if mode == "adopt":
            raise RepairImpossible(table=self.table, reason=f"foreign rows do not extend the log exactly: {why}")
        dropped, restored = _row_changes(table, added, removed)
        report.update(
            action="rolled_back",
            reason=why,
            dropped_rows=dropped,
            restored_rows=restored,
            dropped_files=len(added),
            restored_files=len(removed),
        )
        if head is None:  # icelog never committed a snapshot: back to the empty table
            return Decision(state=state, result=report, expire=tuple(chain))
        return Decision(state=state, result=report, set_main=head)


def _spec_restore(identifier: str, table: Table) -> dict[str, Any] | None:
    """``{"foreign", "restored"}`` spec ids when the default spec is not the log spec (None: it is).

    Raises:
        RepairImpossible: the table has no ``identity(log_partition)`` spec to go back to.
    """
    metadata = table.metadata
    if cols.is_log_spec(metadata.spec(), metadata.schema()):
        return None
    restored = cols.log_spec_id(metadata)
    if restored is None:
        raise RepairImpossible(
            table=identifier,
            reason=(
                f"its default partition spec {metadata.default_spec_id} is not identity(log_partition) and it has no "
                "such spec to go back to: make one the default (e.g. pyiceberg's update_spec(): remove every field, "
                "then add_identity('log_partition')), then run repair again"
            ),
        )
    return {"foreign": metadata.default_spec_id, "restored": restored}


def repair(catalog: Catalog, identifier: str, mode: Mode = "auto") -> dict[str, Any]:
    """Adopt or roll back foreign commits on a log table (see the module docstring).

    Args:
        catalog: The table's catalog.
        identifier: The log table.
        mode: ``auto`` (adopt if exact, else roll back), ``adopt`` (or fail), ``rollback``.

    Returns:
        What was done: ``action`` is ``none``, ``adopted``, ``rolled_back`` or ``spec_restored``
        (only the default partition spec was set back), with details; ``partition_spec`` names
        the ``foreign`` and ``restored`` spec ids whenever the spec was set back.

    Raises:
        RepairImpossible: icelog's last snapshot is gone, ``adopt`` was impossible, or the table
            has no ``identity(log_partition)`` spec to set back as its default.
    """

    if mode not in ("auto", "adopt", "rollback"):
        raise InvalidInput(reason=f"repair mode is auto, adopt or rollback, not {mode!r}")
    name = LogTable.open(catalog, identifier).identifier
    return commit(catalog, name, Repair(name, mode)).result

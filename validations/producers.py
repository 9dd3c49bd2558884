"""I4 checks: producer sequences in the rows, and stored producer state vs the rows."""

from __future__ import annotations

import time

import duckdb
from pyiceberg.table import Table

from icelog.storage.log.producer_state import PartitionSequences
from icelog.storage.log.scan import parquet_from
from icelog.storage.log.sequences import expiry_ms, live_producers
from icelog.storage.log.state import LogState
from icelog.storage.producers.idempotent import derive_state
from icelog.validations.sql import planned_paths
from icelog.validations.violations import CheckReport, Violation

CHECK = "producers"


def sequence_violations(table: Table, snapshot_id: int | None = None) -> list[Violation]:
    """Per (producer, epoch, partition), sequences rise by exactly 1 with each offset."""
    name = ".".join(table.name()[-2:])
    paths = planned_paths(table, snapshot_id)
    if not paths:
        return []
    con = duckdb.connect()
    rows = con.execute(
        f"""
        SELECT producer_id, producer_epoch, log_partition, log_offset, producer_seq, prev_seq FROM (
          SELECT producer_id, producer_epoch, log_partition, log_offset, producer_seq,
                 lag(producer_seq) OVER (PARTITION BY producer_id, producer_epoch, log_partition ORDER BY log_offset) AS prev_seq
          FROM {parquet_from(con, paths, table.io)} WHERE producer_id IS NOT NULL)
        WHERE prev_seq IS NOT NULL AND producer_seq <> prev_seq + 1
        ORDER BY 1, 2, 3, 4
        """
    ).fetchall()
    return [
        Violation(
            CHECK,
            name,
            "sequence",
            f"producer {pid} epoch {epoch}: offset {offset} has sequence {seq}, expected {prev + 1}",
            partition=p,
            first=offset,
            last=offset,
            extra={"producer_id": pid, "epoch": epoch, "sequence": seq, "expected": prev + 1},
        )
        for pid, epoch, p, offset, seq, prev in rows
    ]


def state_violations(table: Table) -> list[Violation]:
    """Stored producer state must equal the state derived from the rows (ignoring client ids
    and epochs that were bumped but have not written yet)."""
    name = ".".join(table.name()[-2:])
    now = int(time.time() * 1000)
    stored = live_producers(LogState.from_metadata(table.metadata).producers, now, expiry_ms(table.metadata.properties))
    derived = live_producers(derive_state(table), now, expiry_ms(table.metadata.properties))
    found = []
    for pid, rows_entry in derived.items():
        entry = stored.get(pid)
        if entry is None:
            found.append(
                Violation(
                    CHECK,
                    name,
                    "producer_state",
                    f"producer {pid} wrote rows but has no stored state",
                    extra={"producer_id": int(pid)},
                )
            )
            continue
        if entry.epoch < rows_entry.epoch:
            found.append(
                Violation(
                    CHECK,
                    name,
                    "producer_state",
                    f"producer {pid}: stored epoch {entry.epoch} < epoch {rows_entry.epoch} in rows",
                    extra={"producer_id": int(pid)},
                )
            )
        elif entry.epoch == rows_entry.epoch and entry.partitions != rows_entry.partitions:
            for p in sorted(set(entry.partitions) | set(rows_entry.partitions)):
                want, got = rows_entry.partitions.get(p), entry.partitions.get(p)
                if want != got:
                    detail = f"producer {pid} partition {p}: stored {_shown(got)} but rows say {_shown(want)}"
                    found.append(Violation(CHECK, name, "producer_state", detail, partition=p, extra={"producer_id": int(pid)}))
    return found


def _shown(sequences: PartitionSequences | None) -> dict | None:
    """As the violation's detail shows one partition's sequences: their JSON form."""
    return None if sequences is None else sequences.to_dict()


def check_producers(table: Table, snapshot_id: int | None = None) -> CheckReport:
    started = time.perf_counter()
    current = snapshot_id is None or snapshot_id == table.metadata.current_snapshot_id
    violations = sequence_violations(table, snapshot_id) + (state_violations(table) if current else [])
    return CheckReport(
        ".".join(table.name()[-2:]),
        snapshot_id or table.metadata.current_snapshot_id,
        ["producer-sequences", "producer-state"] if current else ["producer-sequences"],
        violations,
        seconds=time.perf_counter() - started,
    )

"""Files written for commits that have not landed yet, and who still needs them.

A transaction (``storage.producers``) stages each send's payload under its table's
``data/staging/<txn id>`` and Spark executors pre-write data files under ``data/txn-<txn id>``;
a prepared transaction rolls forward from them after a crash. The coordinator's state lives in
the journal table's properties (:class:`JournalState`). It is read here, below every writer, so
that orphan cleanup (``storage.log.maintenance``) keeps what open and prepared transactions
still need without importing the transaction layer above it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.table.metadata import TableMetadata

from storage.core.commit import load
from storage.core.state import LogState
from storage.errors import UnknownTable
from storage.properties import TRANSACTIONS

JOURNAL = "icelog_system.transactions"


@dataclass(frozen=True)
class JournalState(LogState):
    """The journal's log state plus the coordinator state kept in its properties::

    {"<transactional id>": {"producer_id": 7, "epoch": 2, "timeout_ms": 60000,
        "txn": null | {"id", "state", "started_ms", "last_ms", "partitions": {"<table>": [p, ...]},
                       "prepared": {"sends": {"<table>": [[p, expected, path, rows], ...]},
                                    "offsets": {"group": g, "offsets": [[table, p, offset], ...]}}},
        "last_committed" | "last_aborted": {"id", "partitions"}}}

    ``last_committed`` and ``last_aborted`` name where the last ended transactions staged
    files, so a process that dies before deleting them leaves them to the next init or recover.
    """

    transactions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> JournalState:
        base = LogState.from_metadata(metadata)
        return cls(base.watermarks, base.producers, base.snapshot_id, json.loads(metadata.properties.get(TRANSACTIONS, "{}")))

    def to_properties(self) -> dict[str, str]:
        return {**super().to_properties(), TRANSACTIONS: json.dumps(self.transactions, sort_keys=True, separators=(",", ":"))}


def staging_dir(table_location: str, txn_id: str) -> str:
    """Payload files of sends: rewritten at commit, then deleted."""
    return f"{table_location}/data/staging/{txn_id}"


def prewritten_dir(table_location: str, txn_id: str) -> str:
    """Data files written by Spark executors for a transaction: committed as they are."""
    return f"{table_location}/data/txn-{txn_id}"


def pending_files(catalog: Catalog, table_location: str) -> tuple[set[str], tuple[str, ...]]:
    """What open and prepared transactions still need under a table: ``(files, folders)``.

    Orphan cleanup keeps them: a prepared transaction rolls forward from its staged files,
    and an open one may still prepare. Folders end with ``/``.
    """
    try:
        transactions = JournalState.from_metadata(load(catalog, JOURNAL).metadata).transactions
    except UnknownTable:
        return set(), ()
    files: set[str] = set()
    folders: list[str] = []
    for entry in transactions.values():
        txn = entry.get("txn")
        if not txn:
            continue
        folders += [staging_dir(table_location, txn["id"]) + "/", prewritten_dir(table_location, txn["id"]) + "/"]
        files.update(path for sends in (txn.get("prepared") or {}).get("sends", {}).values() for _, _, path, *_ in sends)
    return files, tuple(folders)

"""Helpers shared by the consumer-group tests."""

from __future__ import annotations

from icelog.storage.log.table import LogTable


def keyed_log(catalog, name: str = "db.events", partitions: int = 1, rows: int = 60) -> LogTable:
    """A log table of ``rows`` keyed rows (keys k0..k6) in each partition."""
    t = LogTable.create(catalog, name, partitions)
    for p in range(partitions):
        t.append({p: [{"key": f"k{i % 7}", "value": str(i)} for i in range(rows)]})
    return t

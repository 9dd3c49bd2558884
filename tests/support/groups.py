"""Helpers shared by the consumer-group tests."""

from __future__ import annotations

from icelog.storage.log.table import LogTable


def keyed_log(catalog, name: str = "db.events", partitions: int = 1, rows: int = 60) -> LogTable:
    """A log table of ``rows`` keyed rows (keys k0..k6) in each partition."""
    t = LogTable.create(catalog, name, partitions)
    for p in range(partitions):
        t.append({p: [{"key": f"k{i % 7}", "value": str(i)} for i in range(rows)]})
    return t


def output_files_request(out: LogTable, partition: int, rows: list[dict]):
    """``rows`` written as data files of ``out``'s ``partition`` numbered from its log end as it is
    now (as Spark executors write a group job's output), and the append of those files: an ``also``
    part of ``Consumer.commit`` (``LogTable.files_request``)."""
    import time

    from icelog.storage.log.files import write_log_files
    from icelog.storage.log.state import LogState
    from icelog.storage.log.table import with_system_columns

    table = out.table()
    end = LogState.from_metadata(table.metadata).end(partition)
    payload = out.conform({partition: rows}, table)[partition]
    now_us = int(time.time() * 1_000_000)
    written = write_log_files(table, {partition: with_system_columns(payload, partition, end, now_us, None, None)})
    return out.files_request({partition: [f.file_path for f in written]}, {partition: end})

"""Rows planted around icelog: appended straight through pyiceberg with chosen offsets, the way
a foreign writer or a bug would leave a gap, a duplicate or a drifted watermark."""

from __future__ import annotations

import pyarrow as pa

from icelog.storage.log.table import LogTable


def rows_at(table, partition: int, offsets: list[int], key: str = "planted") -> pa.Table:
    """Rows of a log table (system columns filled) with chosen offsets, in the given order."""
    schema = table.schema().as_arrow()
    n = len(offsets)
    columns = {
        "log_partition": [partition] * n,
        "log_offset": offsets,
        "log_timestamp": [0] * n,
        "producer_id": [None] * n,
        "producer_epoch": [None] * n,
        "producer_seq": [None] * n,
        "log_key_hash": [None] * n,
        "key": [key] * n,
        "value": [key] * n,
    }
    return pa.table({f.name: pa.array(columns[f.name]).cast(f.type) for f in schema}, schema=schema)


def plant(log_table: LogTable, partition: int, offsets: list[int]) -> None:
    """Append rows with chosen offsets straight through pyiceberg, bypassing icelog."""
    table = log_table.table()
    table.append(rows_at(table, partition, offsets))

"""Landing files for the ingest job, and a log table's rows to compare two ingests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from icelog.storage.log.table import LogTable


def write_landing(folder: Path, files: int = 3, rows: int = 200) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    all_rows = []
    for f in range(files):
        rows_f = [{"key": f"k{(f * 7 + i) % 23}", "value": f"f{f}-{i}"} for i in range(rows)]
        pq.write_table(pa.Table.from_pylist(rows_f), folder / f"part-{f}.parquet")
        all_rows += rows_f
    return all_rows


def table_rows(t: LogTable) -> dict[int, list[tuple]]:
    return {
        p: list(zip(*[t.read(p).column(c).to_pylist() for c in ("log_offset", "key", "value")], strict=False))
        for p in t.watermarks()
    }

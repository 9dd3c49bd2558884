"""Mirror benchmarks' builders: a source and a target catalog, and a log table of thousands of
files committed a thousand at a time (``tests/storage/replication/test_mirror_bench.py``, ``tests.bench.run``)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from icelog.storage.core.commit import commit
from icelog.storage.log.files import write_log_files
from icelog.storage.log.table import LogTable, with_system_columns
from icelog.storage.replication.acls import add_acl
from icelog.storage.replication.replica import OffsetWriteRequest, batch_spans
from tests.support.catalogs import CatalogSpec

PRINCIPAL = "bench"


def catalogs(tmp_path: Path):
    specs = []
    for name in ("benchsrc", "benchdst"):
        (tmp_path / name).mkdir(parents=True)
        specs.append(CatalogSpec("sqlite", name, f"sqlite:///{tmp_path / name}.db", f"file://{tmp_path / name}"))
    source, target = (s.open() for s in specs)
    add_acl(target, PRINCIPAL, "*")
    return source, target


def hex_strings(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    """``n`` random hex strings of ``width`` characters (incompressible-ish payload), fast."""
    chars = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[rng.integers(0, 16, size=n * width)]
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(chars.tobytes()))


def fill(source, table: str, partitions: int, files_per_partition: int, rows_per_file: int, payload_bytes: int = 16) -> LogTable:
    """A table of ``partitions * files_per_partition`` files, committed 1,000 files at a time."""
    log_table = LogTable.create(source, table, partitions)
    rng = np.random.default_rng(0)
    for start in range(0, files_per_partition, max(1, 1000 // partitions)):
        count = min(max(1, 1000 // partitions), files_per_partition - start)
        iceberg = log_table.table()
        ends = {p: w.end for p, w in log_table.watermarks().items()}
        files: dict[int, list] = {p: [] for p in range(partitions)}
        for _ in range(count):
            for p in range(partitions):
                payload = pa.table(
                    {
                        "key": pa.array([f"k{i % 1000}" for i in range(rows_per_file)]),
                        "value": hex_strings(rng, rows_per_file, payload_bytes),
                    }
                )
                rows = with_system_columns(payload, p, ends[p], int(time.time() * 1e6), None, None)
                files[p].extend(write_log_files(iceberg, {p: rows}))
                ends[p] += rows_per_file
        spans = batch_spans(iceberg, log_table.identifier, {}, files)
        commit(source, log_table.identifier, OffsetWriteRequest(log_table.identifier, spans, files=files))
    return log_table

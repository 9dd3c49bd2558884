"""Checks diagnose damaged data files, never crash on them.

A data file replaced in place (by hand, a foreign tool, a bug) may hold offsets as text or as
floats, miss a column, hold offsets that wrapped past 2^63, or not be Parquet at all; a file
may be gone. The deep check, on local disk and on S3 (a real SeaweedFS server), reports each
such file as a ``bad_file`` violation naming it and the reason, and the CLI exits 1, not 4.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icelog.storage.log import schema as cols
from icelog.storage.log.files import arrow_location, is_local, local_path
from icelog.storage.log.table import LogTable
from icelog.validations import contiguity
from icelog.validations.contiguity import check_contiguity
from tests.support.cli import Cli, one_document

INT64_MAX = 2**63 - 1
ROWS = 5  # rows of the first file of each partition: the one damaged


@pytest.fixture(params=[False, True], ids=["grouped", "own query"])
def own(request, monkeypatch) -> bool:
    """Local files through the grouped query (small files), or each through its own (large files)."""
    monkeypatch.setattr(contiguity, "OWN_QUERY_ROWS", 0 if request.param else 2**62)
    return request.param


def _partition(n: int = ROWS) -> pa.Array:
    return pa.array([0] * n, pa.int32())


# kind -> (content replacing the file: a table, raw bytes or None (deleted), the reason reported)
DAMAGE = {
    "offsets as strings": (
        pa.table({cols.PARTITION: _partition(), cols.OFFSET: pa.array([str(i) for i in range(ROWS)])}),
        "log_offset is string, not an integer",
    ),
    "NaN offsets": (
        pa.table({cols.PARTITION: _partition(), cols.OFFSET: pa.array([0.0, float("nan"), 2.0, 3.0, 4.0])}),
        "log_offset is double, not an integer",
    ),
    "no offset column": (pa.table({cols.PARTITION: _partition(), "key": pa.array(["k"] * ROWS)}), "no log_offset column"),
    "no partition column": (pa.table({cols.OFFSET: pa.array(range(ROWS), pa.int64())}), "no log_partition column"),
    "garbage bytes": (b"this is not a Parquet file" * 20, "cannot be read"),
    "deleted": (None, "cannot be read"),
    # offsets that wrap past 2^63 (int64 arithmetic): MAX - 1, MAX, then -2^63 ...
    "offsets wrapped past 2^63": (
        pa.table(
            {cols.PARTITION: _partition(), cols.OFFSET: pa.array(np.arange(ROWS, dtype=np.int64) + np.int64(INT64_MAX - 1))}
        ),
        "offset -9223372036854775808, outside 0..2^63-1",
    ),
}


def replace_in_place(table, uri: str, content: pa.Table | bytes | None, partition: int) -> None:
    """Overwrite (or delete) one data file at its own path, local or on S3; the metadata is untouched."""
    if is_local(uri):
        fs, path = pa.fs.LocalFileSystem(), local_path(uri)
    else:
        fs, path = arrow_location(table.io, uri)
    if content is None:
        fs.delete_file(path)
    elif isinstance(content, bytes):
        with fs.open_output_stream(path) as out:
            out.write(content)
    else:
        if cols.PARTITION in content.column_names:
            content = content.set_column(0, cols.PARTITION, pa.array([partition] * content.num_rows, pa.int32()))
        pq.write_table(content, path, filesystem=fs)


def damaged_table(catalog, kinds: list[str]) -> tuple[LogTable, dict[int, str]]:
    """A table with a partition per damage kind: files 0..4 and 5..7 each; the first file of
    partition ``p`` damaged by ``kinds[p]``. Returns the table and the damaged file per partition."""
    t = LogTable.create(catalog, "db.damaged", partitions=len(kinds))
    t.append({p: [{"key": str(i)} for i in range(ROWS)] for p in range(len(kinds))})
    first_files = {task.file.partition[0]: task.file.file_path for task in t.table().scan().plan_files()}
    t.append({p: [{"key": str(i)} for i in range(3)] for p in range(len(kinds))})
    for p, kind in enumerate(kinds):
        replace_in_place(t.table(), first_files[p], DAMAGE[kind][0], p)
    return t, first_files


def assert_diagnosed(violations: list, kinds: list[str], damaged: dict[int, str]) -> None:
    """Each damaged file is reported once, by path and reason; its offsets count as missing."""
    bad = {v.partition: v for v in violations if v.kind == "bad_file"}
    assert set(bad) == set(range(len(kinds))), violations
    for p, kind in enumerate(kinds):
        path = local_path(damaged[p])
        assert path in bad[p].detail and DAMAGE[kind][1] in bad[p].detail, (kind, bad[p].detail)
        assert bad[p].extra == {"path": path}
        gaps = [(v.first, v.last) for v in violations if v.kind == "gap" and v.partition == p]
        assert gaps == [(0, ROWS - 1)], (kind, violations)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_local_file_is_a_violation_naming_it(sqlite_catalog, kind, own):
    t, damaged = damaged_table(sqlite_catalog, [kind])
    assert_diagnosed(check_contiguity(t.table(), deep=True).violations, [kind], damaged)


def test_every_damage_at_once_in_local_files_is_diagnosed_file_by_file(sqlite_catalog, own):
    kinds = sorted(DAMAGE)
    t, damaged = damaged_table(sqlite_catalog, kinds)
    report = check_contiguity(t.table(), deep=True)
    assert_diagnosed(report.violations, kinds, damaged)
    assert report.rows == 3 * len(kinds)  # the healthy files' rows


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_file_on_s3_is_a_violation_naming_it(rest_catalog, kind):
    t, damaged = damaged_table(rest_catalog, [kind])
    assert all(uri.startswith("s3://") for uri in damaged.values())
    assert_diagnosed(check_contiguity(t.table(), deep=True).violations, [kind], damaged)


def test_validate_deep_exits_1_naming_every_damaged_file_locally(sqlite_spec):
    kinds = sorted(DAMAGE)
    _, damaged = damaged_table(sqlite_spec.open(), kinds)
    report = Cli(sqlite_spec)("validate", "db.damaged", "--deep", code=1)
    shown = {v["partition"]: v["detail"] for v in report["violations"] if v["kind"] == "bad_file"}
    assert {p: local_path(damaged[p]) in shown.get(p, "") for p in range(len(kinds))} == dict.fromkeys(range(len(kinds)), True)


def test_validate_deep_exits_1_naming_every_damaged_file_on_s3(rest_spec):
    kinds = sorted(DAMAGE)
    _, damaged = damaged_table(rest_spec.open(), kinds)
    done = Cli(rest_spec).process("--output", "json", "validate", "db.damaged", "--deep")
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    report = one_document(done.stdout.decode())
    shown = {v["partition"]: v["detail"] for v in report["violations"] if v["kind"] == "bad_file"}
    assert {p: local_path(damaged[p]) in shown.get(p, "") for p in range(len(kinds))} == dict.fromkeys(range(len(kinds)), True)


def test_i1_rows_of_another_partition_in_a_partition_folder_are_misplaced(sqlite_catalog, own):
    """Files sit in ``log_partition=N/`` folders: the partition is read from the rows, never
    from the folder name (DuckDB's Hive partitioning would take the folder's)."""
    t = LogTable.create(sqlite_catalog, "db.moved", partitions=2)
    t.append({0: [{"key": str(i)} for i in range(ROWS)], 1: [{"key": str(i)} for i in range(ROWS)]})
    uri = next(task.file.file_path for task in t.table().scan().plan_files() if task.file.partition[0] == 0)
    assert "/log_partition=0/" in uri
    replace_in_place(t.table(), uri, pa.table({cols.PARTITION: _partition(), cols.OFFSET: pa.array(range(ROWS), pa.int64())}), 1)
    violations = check_contiguity(t.table(), deep=True).violations
    found = [(v.kind, v.partition, v.first, v.last) for v in violations]
    assert ("misplaced_row", 1, 0, ROWS - 1) in found and ("duplicate", 1, 0, ROWS - 1) in found, violations
    assert ("gap", 0, 0, ROWS - 1) in found, violations  # partition 0 holds no data now


@pytest.mark.parametrize("offsets", [pa.array(["0", "1", "2"]), pa.array([0.0, 1.0, 2.0])], ids=["strings", "floats"])
def test_a_committed_foreign_file_of_text_or_floats_read_first_is_a_violation(tmp_path, offsets):
    """Files of the size their metadata says skip the footer check; DuckDB's grouped query takes
    its types from the first file, and types other than integers there send every file to it."""
    from icelog.storage.log.state import LogState, Watermark
    from icelog.validations.contiguity import check_files

    foreign, healthy = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    pq.write_table(pa.table({cols.PARTITION: _partition(3), cols.OFFSET: offsets}), foreign)
    pq.write_table(pa.table({cols.PARTITION: _partition(3), cols.OFFSET: pa.array([3, 4, 5], pa.int64())}), healthy)
    paths = {foreign: 0, healthy: 0}
    sizes = {p: (tmp_path / p.rsplit("/", 1)[1]).stat().st_size for p in paths}
    violations, rows = check_files(
        "db.t", paths, LogState(watermarks={0: Watermark(0, 6)}), rows=dict.fromkeys(paths, 3), sizes=sizes
    )
    assert [(v.kind, v.extra.get("path"), v.first, v.last) for v in violations] == [
        ("bad_file", foreign, None, None),
        ("gap", None, 0, 2),
    ]
    assert rows == 3

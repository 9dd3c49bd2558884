"""Validations and queries on log tables whose files live on S3 (a real SeaweedFS server).

DuckDB cannot read ``s3://`` here (its httpfs extension cannot be downloaded), so the deep check
and ``icelog sql`` read S3 files through pyarrow with the table's FileIO. These tests show the
answers are the same as on local files: exact proofs, exact diagnoses, the same rows.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from icelog.storage.errors import InvalidInput
from icelog.storage.log.files import arrow_location
from icelog.storage.log.state import LogState, Watermark
from icelog.storage.log.table import LogTable
from icelog.validations import contiguity
from icelog.validations.contiguity import check_contiguity, check_files
from tests.support.cli import Cli, one_document
from tests.support.planting import plant


def records(n: int, prefix: str = "k") -> list[dict]:
    return [{"key": f"{prefix}{i}", "value": str(i)} for i in range(n)]


def s3_files(t: LogTable) -> list[str]:
    return [task.file.file_path for task in t.table().scan().plan_files()]


def clustered(t: LogTable, uri: str) -> bool:
    """Rows in key-hash order, in several row groups (one per hash slice), not in offset order."""
    fs, path = arrow_location(t.table().io, uri)
    parquet = pq.ParquetFile(fs.open_input_file(path))
    offsets = parquet.read(columns=["log_offset"]).column(0).to_pylist()
    return parquet.metadata.num_row_groups > 1 and offsets != sorted(offsets)


def diagnosis(report) -> list[tuple]:
    return sorted((v.check, v.kind, v.partition, v.first, v.last) for v in report.violations)


@pytest.fixture
def events(rest_catalog) -> LogTable:
    """Partition 0: one clustered file (5,000 keys, rows in key-hash order) then two files in
    offset order; partition 1: three small files in offset order."""
    t = LogTable.create(rest_catalog, "db.events", 2)
    t.append({0: records(5000), 1: records(3, "b")})
    t.append({0: records(10, "c"), 1: records(2, "d")})
    t.append({0: records(7, "e"), 1: records(1, "f")})
    return t


def test_i1_deep_check_passes_on_s3_with_clustered_and_ordered_files(events):
    uris = s3_files(events)
    assert uris and all(u.startswith("s3://") for u in uris)
    assert any(clustered(events, u) for u in uris)
    report = check_contiguity(events.table(), deep=True)
    assert report.ok, report.violations
    assert report.rows == 5000 + 10 + 7 + 3 + 2 + 1
    assert "contiguity-deep" in report.checks


def test_i1_deep_check_on_s3_proves_each_file_without_counting(events, monkeypatch):
    """Clean files pass by their proofs (offsets minus row number, the bitmap): none is counted
    offset by offset."""

    def no_counting(*_):
        raise AssertionError("a clean file fell back to counting offsets")

    monkeypatch.setattr(contiguity, "_runs_of", no_counting)
    assert check_contiguity(events.table(), deep=True).ok


@pytest.mark.parametrize(
    "offsets",
    [
        [12, 13],  # a duplicate of offsets 12..13 (in the clustered file)
        [5020, 5021],  # beyond the end: a gap at 5017..5019 and a drifted watermark
        [30, 4, 4, 29],  # a file out of order holding one offset twice
    ],
)
def test_i1_planted_rows_on_s3_are_diagnosed_as_on_local_files(events, sqlite_catalog, offsets):
    """The same table and the same planted rows, on S3 and on local files: the same violations."""
    local = LogTable.create(sqlite_catalog, "db.events", 2)
    local.append({0: records(5000), 1: records(3, "b")})
    local.append({0: records(10, "c"), 1: records(2, "d")})
    local.append({0: records(7, "e"), 1: records(1, "f")})
    for t in (events, local):
        plant(t, 0, offsets)
    on_s3 = check_contiguity(events.table(), deep=True)
    assert not on_s3.ok
    assert diagnosis(on_s3) == diagnosis(check_contiguity(local.table(), deep=True))
    copies = Counter(range(5017)) + Counter(offsets)
    found = {o for v in on_s3.violations if v.kind == "duplicate" for o in range(v.first, v.last + 1)}
    assert found == {o for o, c in copies.items() if c > 1}


def test_i1_deep_check_on_s3_equals_a_counter_over_random_files(events):
    """Random files written straight to S3 (consecutive, permuted, with duplicates and holes):
    the deep check over them reports what the same files report locally, and what a Counter says."""
    io = events.table().io
    fs, root = arrow_location(io, f"{events.table().metadata.location}/data/stray-{uuid.uuid4().hex}")
    rng = random.Random(21)
    for case in range(12):
        files = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(["run", "permuted", "any"])
            a, n = rng.randint(0, 20), rng.randint(1, 8)
            offsets = list(range(a, a + n)) if kind != "any" else [rng.randint(0, 25) for _ in range(n)]
            if kind == "permuted":
                rng.shuffle(offsets)
            files.append(offsets)
        paths = {}
        for i, offsets in enumerate(files):
            path = f"{root}/{case}/{i}.parquet"
            columns = {"log_partition": pa.array([0] * len(offsets), pa.int32()), "log_offset": pa.array(offsets, pa.int64())}
            pq.write_table(pa.table(columns), path, filesystem=fs)
            paths[f"s3://{path}"] = 0
        every = Counter(o for f in files for o in f)
        end = max(every) + 1
        violations, rows = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, end)}), io=io)
        assert rows == sum(every.values())
        dups = {o for o, c in every.items() if c > 1}
        holes = {o for o in range(end) if o not in every}
        found_dups = {o for v in violations if v.kind == "duplicate" for o in range(v.first, v.last + 1)}
        found_holes = {o for v in violations if v.kind == "gap" for o in range(v.first, v.last + 1)}
        assert (found_dups, found_holes) == (dups, holes), files


def test_i1_unknown_path_forms_are_a_clear_error():
    with pytest.raises(InvalidInput, match="no pyarrow filesystem for scheme 'foo'"):
        check_files("db.t", {"foo://bucket/x.parquet": 0}, None, io=PyArrowFileIO())
    with pytest.raises(InvalidInput, match="needs the table's FileIO"):
        check_files("db.t", {"s3://bucket/x.parquet": 0}, None)


def icelog(spec, *args: str, stdin: bytes = b"") -> dict:
    """Run icelog as a real process: pyiceberg reads the catalog's ``PYICEBERG_CATALOG__*``
    environment once, when it is imported."""
    done = Cli(spec).process("--output", "json", *args, input=stdin)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return one_document(done.stdout.decode())


def test_sql_on_s3_returns_the_rows_with_filters_pushed_into_the_scan(events, rest_spec):
    out = icelog(rest_spec, "sql", "select key, value from db.events where log_partition = 1 order by log_offset")
    assert out["rows"] == [["b0", "0"], ["b1", "1"], ["b2", "2"], ["d0", "0"], ["d1", "1"], ["f0", "0"]]
    out = icelog(rest_spec, "sql", "select count(*), count(distinct log_offset) from db.events where log_partition = 0")
    assert out["rows"] == [[5017, 5017]]
    plan = icelog(rest_spec, "sql", "explain select value from db.events where key = 'k7'")
    text = "\n".join(str(cell) for row in plan["rows"] for cell in row)
    assert "ARROW_SCAN" in text and "Filters" in text  # DuckDB reads S3 through pyarrow, filter pushed down


def test_duckdb_shell_on_s3(events, rest_spec):
    out = icelog(rest_spec, "duckdb", stdin=b"select value from db.events where key = 'k4999';\n")
    assert out["results"][0]["rows"] == [["4999"]]


def test_checks_on_s3_read_through_pyarrow(events):
    """Producer sequences and transactions read S3 files the way the deep check does."""
    from icelog.validations.producers import sequence_violations
    from icelog.validations.transactions import check_transactions

    assert sequence_violations(events.table()) == []
    assert check_transactions(events.table()).ok


def test_gx_suite_on_s3_with_pandas(events, tmp_path):
    from icelog.validations.quality import run_suite

    result = run_suite(events.table(), engine="pandas", docs_root=tmp_path, full=True)
    assert result.success


def test_report_on_s3(events, tmp_path):
    from icelog.validations.report import build_report

    build_report(events.table(), tmp_path, gx=False)
    assert json.loads((tmp_path / "report.json").read_text())["ok"]


def test_i1_misplaced_rows_on_s3_are_reported_as_on_local_files(events, tmp_path):
    """A file whose metadata says partition 0 but which holds rows of partition 1 too."""
    io = events.table().io
    fs, root = arrow_location(io, f"{events.table().metadata.location}/data/stray-{uuid.uuid4().hex}")
    rows = pa.table({"log_partition": pa.array([0, 0, 1, 1], pa.int32()), "log_offset": pa.array([0, 1, 2, 3], pa.int64())})
    pq.write_table(rows, f"{root}/mixed.parquet", filesystem=fs)
    pq.write_table(rows, tmp_path / "mixed.parquet")
    state = LogState(watermarks={0: Watermark(0, 2), 1: Watermark(0, 0)})
    on_s3, n = check_files("db.t", {f"s3://{root}/mixed.parquet": 0}, state, io=io)
    local, _ = check_files("db.t", {str(tmp_path / "mixed.parquet"): 0}, state)
    assert n == 4
    shown = [(v.check, v.kind, v.partition, v.first, v.last) for v in on_s3]
    assert ("contiguity", "misplaced_row", 1, 2, 3) in shown
    assert shown == [(v.check, v.kind, v.partition, v.first, v.last) for v in local]

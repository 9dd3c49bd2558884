"""The validators catch gaps, duplicates and watermark drift planted around icelog with pyiceberg."""

from __future__ import annotations

import random
import tempfile
import threading
from collections import Counter
from pathlib import Path
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from icelog.storage.log import schema as cols
from icelog.storage.log.files import GROUPS, MIN_GROUP_ROWS, local_path
from icelog.storage.log.state import LogState, Watermark
from icelog.storage.log.table import LogTable
from icelog.storage.properties import WATERMARKS
from icelog.validations import contiguity
from icelog.validations.contiguity import FileSpan, check_contiguity, check_files, tile
from icelog.validations.violations import Violation
from tests.support.planting import plant


@pytest.fixture
def log_table(sqlite_catalog) -> LogTable:
    t = LogTable.create(sqlite_catalog, "db.v", partitions=2)
    t.append({0: [{"key": "a"}] * 4, 1: [{"key": "b"}] * 2})
    t.append({0: [{"key": "c"}] * 2})
    return t


@pytest.mark.parametrize("deep", [False, True])
def test_i1_clean_table_passes(log_table, deep):
    report = check_contiguity(log_table.table(), deep=deep)
    assert report.ok, report.violations
    assert report.rows == 8


@pytest.mark.parametrize("deep", [False, True])
def test_i1_planted_gap_is_found_with_its_offsets(log_table, deep):
    plant(log_table, 0, [8, 9])  # 6 and 7 are missing
    violations = check_contiguity(log_table.table(), deep=deep).violations
    gaps = [v for v in violations if v.kind == "gap" and v.check == "contiguity"]
    assert [(g.partition, g.first, g.last) for g in gaps] == [(0, 6, 7)]
    assert any(v.kind == "watermark" and v.partition == 0 for v in violations)  # stored end 6 != data end 10


@pytest.mark.parametrize("deep", [False, True])
def test_i1_planted_duplicate_is_found_with_its_offsets(log_table, deep):
    plant(log_table, 1, [1, 2])  # offset 1 again
    violations = check_contiguity(log_table.table(), deep=deep).violations
    dups = [v for v in violations if v.kind == "duplicate"]
    assert [(d.partition, d.first, d.last) for d in dups] == [(1, 1, 1)]


def test_i1_gap_plus_duplicate_inside_one_file_is_caught_by_the_deep_check(log_table):
    plant(log_table, 0, [6, 6, 8])  # count 3 == 8 - 6 + 1: bounds and counts cannot tell
    assert check_contiguity(log_table.table(), deep=False).ok is False  # watermark 6 != data end 9 still shows
    deep = check_contiguity(log_table.table(), deep=True).violations
    kinds = {(v.kind, v.first, v.last) for v in deep if v.check == "contiguity"}
    assert ("duplicate", 6, 6) in kinds and ("gap", 7, 7) in kinds


def test_watermark_off_by_one_is_found(log_table):
    table = log_table.table()
    state = LogState.from_metadata(table.metadata)
    with table.transaction() as txn:
        txn.set_properties({WATERMARKS: state.with_ends({1: state.end(1) + 1}).to_properties()[WATERMARKS]})
    for deep in (False, True):
        violations = check_contiguity(log_table.table(), deep=deep).violations
        assert [(v.kind, v.partition, v.extra) for v in violations] == [
            ("watermark", 1, {"stored_start": 0, "stored_end": 3, "data_end": 2})
        ]


def test_old_snapshot_checked_for_contiguity(log_table):
    first = log_table.table().metadata.snapshots[0].snapshot_id
    report = check_contiguity(log_table.table(), deep=True, snapshot_id=first)
    assert report.ok and report.rows == 6 and report.checks == ["contiguity"]


# --- exact diagnosis: reported gaps and duplicates == a plain Counter over all offsets ---------


def expected_diagnosis(files: list[list[int]], start: int, end: int) -> tuple[set[int], set[int]]:
    """The reference: duplicated offsets, and offsets of [log_start, max(log_end, data_end)) no row holds."""
    counts = Counter(o for offsets in files for o in offsets)
    data_end = max(counts) + 1 if counts else end
    return {o for o, n in counts.items() if n > 1}, set(range(start, max(end, data_end))) - set(counts)


def reported_diagnosis(violations: list[Violation]) -> tuple[set[int], set[int]]:
    """Duplicated and missing offsets as the check reports them; each offset must be reported once.

    Missing offsets at or past the end of the data are reported by the watermark violation
    "stored log_end is ahead of the data" (extra stored_end > data_end), not as a gap.
    """
    duplicated, missing = Counter(), Counter()
    for v in violations:
        assert v.kind in ("duplicate", "gap", "watermark"), v
        if v.kind == "duplicate":
            duplicated.update(range(v.first, v.last + 1))
        elif v.kind == "gap":
            missing.update(range(v.first, v.last + 1))
        elif v.extra.get("stored_end", 0) > v.extra.get("data_end", 0):
            # Offsets below log_start are not missing, even when the data ends below it.
            missing.update(range(max(v.extra["data_end"], v.extra.get("stored_start", 0)), v.extra["stored_end"]))
    assert all(n == 1 for n in duplicated.values()), f"a duplicated offset reported twice: {violations}"
    assert all(n == 1 for n in missing.values()), f"a missing offset reported twice: {violations}"
    return set(duplicated), set(missing)


def offsets_in_table(log_table: LogTable, partition: int) -> list[int]:
    return (
        log_table.table()
        .scan()
        .to_arrow()
        .filter(pa.compute.equal(pa.compute.field("log_partition"), partition))
        .column("log_offset")
        .to_pylist()
    )


@pytest.mark.parametrize(
    "foreign",
    [
        [[5, 6, 7, 8, 9]],  # offsets that exist, in order
        [[8, 9, 10, 11, 12]],  # overlapping the end
        [[9, 5, 8, 6, 7]],  # rows unsorted within the file
        [[5, 7]],  # a hole inside the foreign file, filled by the original file
        [[7, 5, 5]],  # three copies of 5, unsorted
        [[2, 3], [5, 6, 7, 8, 9, 10, 11, 12]],  # a later file reaches back past an earlier one
        [[12, 3]],  # a duplicate, plus a real gap 10..11 past the end
        [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]],  # the whole log twice
    ],
)
def test_i1_deep_check_diagnoses_a_foreign_append_exactly(sqlite_catalog, foreign):
    """A plain pyiceberg append of offsets that already exist: the deep check reports exactly
    the duplicated offsets and exactly the missing ones, never a gap at an offset that is present."""
    t = LogTable.create(sqlite_catalog, "db.foreign", partitions=1)
    t.append({0: [{"key": str(i)} for i in range(10)]})
    for offsets in foreign:
        plant(t, 0, offsets)
    held = offsets_in_table(t, 0)
    assert Counter(held) == Counter(list(range(10)) + [o for f in foreign for o in f])  # planted as meant
    report = check_contiguity(t.table(), deep=True)
    assert reported_diagnosis(report.violations) == expected_diagnosis([list(range(10)), *foreign], 0, 10)
    assert not report.ok


def test_i1_foreign_file_with_a_hole_filled_elsewhere_is_no_gap(sqlite_catalog):
    """The misdiagnosis of the hardening issue, spelt out: [5, 7] on top of 0..9."""
    t = LogTable.create(sqlite_catalog, "db.foreign", partitions=1)
    t.append({0: [{"key": str(i)} for i in range(10)]})
    plant(t, 0, [5, 7])
    found = [(v.kind, v.first, v.last) for v in check_contiguity(t.table(), deep=True).violations]
    assert found == [("duplicate", 5, 5), ("duplicate", 7, 7)]


def test_i1_permuted_files_that_tile_the_log_exactly_are_contiguous(tmp_path):
    """Row order inside a file is not contiguity: files holding each offset once pass."""
    files = [[3, 1, 0, 2], [4], [7, 5, 6], [9, 8]]
    paths = write_files(tmp_path, 0, files)
    violations, rows = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, 10)}))
    assert violations == [] and rows == 10


def write_files(directory: Path, partition: int, files: list[list[int]]) -> dict[str, int]:
    """Minimal log data files (partition and offset columns, rows in the given order)."""
    paths = {}
    for i, offsets in enumerate(files):
        path = str(directory / f"f{i}.parquet")
        pq.write_table(
            pa.table(
                {"log_partition": pa.array([partition] * len(offsets), pa.int32()), "log_offset": pa.array(offsets, pa.int64())}
            ),
            path,
        )
        paths[path] = partition
    return paths


offset_files = st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=12), min_size=1, max_size=6)


def own_queries(every_file: bool):
    """Every file through its own proven query (the path of large files), or none (one grouped query)."""
    return mock.patch.object(contiguity, "OWN_QUERY_ROWS", 0 if every_file else 2**62)


@example(files=[[0]], start_shift=2, end_shift=1, seed=1, own=True)  # data entirely below log_start, end past it
@settings(max_examples=200, deadline=None)
@given(
    files=offset_files,
    start_shift=st.integers(-3, 3),
    end_shift=st.integers(-3, 3),
    seed=st.integers(0, 2**16),
    own=st.booleans(),
)
def test_i1_deep_check_equals_a_counter_over_random_files(files, start_shift, end_shift, seed, own):
    """Random files with random offset multisets in random row order (some files consecutive and
    sorted, as icelog writes them, some a permutation of a range, as the key-hash layout writes
    them), random watermarks around the data, each file proven by its own query or by the
    grouped one: the deep check reports exactly the duplicated and the missing offsets of a
    plain Counter."""
    rng = random.Random(seed)
    files = [sorted(f) if rng.random() < 0.3 else f for f in files]
    files += [list(range(a, a + n)) for a, n in ((rng.randint(0, 30), rng.randint(1, 8)) for _ in range(rng.randint(0, 3)))]
    files += [
        rng.sample(range(a, a + n), n) for a, n in ((rng.randint(0, 30), rng.randint(1, 8)) for _ in range(rng.randint(0, 2)))
    ]
    every = [o for f in files for o in f]
    start, end = max(0, min(every) + start_shift), max(0, max(every) + 1 + end_shift)
    start = min(start, end)
    with tempfile.TemporaryDirectory() as directory, own_queries(own):
        violations, rows = check_files(
            "db.t", write_files(Path(directory), 0, files), LogState(watermarks={0: Watermark(start, end)})
        )
    assert rows == len(every)
    assert reported_diagnosis(violations) == expected_diagnosis(files, start, end)
    watermark = [v for v in violations if v.check == "watermark"]
    assert len(watermark) == (min(every) < start) + (max(every) + 1 != end)


@settings(max_examples=300, deadline=None)
@given(
    ranges=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), min_size=1, max_size=10), start_shift=st.integers(-3, 3)
)
def test_i1_metadata_check_equals_a_counter_when_files_are_consecutive(ranges, start_shift):
    """From manifests alone (bounds plus counts of consecutive files) the tiling is exact too."""
    files = [list(range(a, a + n)) for a, n in ranges]
    every = [o for f in files for o in f]
    start, end = max(0, min(every) + start_shift), max(every) + 1
    spans = [FileSpan(f"f{i}", 0, f[0], f[-1], len(f), True) for i, f in enumerate(files)]
    violations = tile("db.t", spans, LogState(watermarks={0: Watermark(start, end)}), trust_files=True)
    assert reported_diagnosis(violations) == expected_diagnosis(files, start, end)


def test_i1_missing_head_is_one_gap_not_a_gap_plus_a_watermark(tmp_path):
    """Data starting after log_start: the missing head is reported once, as a gap."""
    paths = write_files(tmp_path, 0, [[3, 4, 5]])
    violations, _ = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, 6)}))
    assert [(v.check, v.kind, v.partition, v.first, v.last) for v in violations] == [("contiguity", "gap", 0, 0, 2)]
    spans = [FileSpan("f", 0, 3, 5, 3, True)]
    assert [
        (v.kind, v.first, v.last) for v in tile("db.t", spans, LogState(watermarks={0: Watermark(0, 6)}), trust_files=True)
    ] == [("gap", 0, 2)]


# --- the key-hash layout: files sorted by (key hash, offset), proven without a count per offset ---


@pytest.fixture
def clustered_table(sqlite_catalog) -> LogTable:
    """A keyed table of two clustered files (rows sorted by key hash) and one small one in offset order."""
    t = LogTable.create(sqlite_catalog, "db.keyed", partitions=2)
    n = GROUPS * MIN_GROUP_ROWS
    t.append({p: [{"key": f"k{i % 997}", "value": str(i)} for i in range(n)] for p in (0, 1)})
    t.append({0: [{"key": "tail"}] * 5})
    footers = [pq.read_metadata(local_path(task.file.file_path)) for task in t.table().scan().plan_files()]
    assert sorted(f.num_row_groups for f in footers) == [1, GROUPS, GROUPS]  # two clustered files
    return t


@pytest.mark.parametrize("own", [True, False])
def test_i1_clustered_files_are_proven_without_counting_offsets(clustered_table, own, monkeypatch):
    monkeypatch.setattr(contiguity, "_offset_runs", mock.Mock(side_effect=AssertionError("no proof failed")))
    """A clustered file is proven by the bitmap, in its own scan (a large file) or after the
    grouped query found it out of offset order (a small one): never counted offset by offset."""
    with own_queries(own):
        report = check_contiguity(clustered_table.table(), deep=True)
    assert report.ok and report.rows == 2 * GROUPS * MIN_GROUP_ROWS + 5, report.violations


@pytest.mark.parametrize("own", [True, False])
@pytest.mark.parametrize(
    "planted",
    [
        [100, 101, 102],  # duplicates of rows inside a clustered file
        [GROUPS * MIN_GROUP_ROWS + 7],  # past the end: a gap before it
        [5, GROUPS * MIN_GROUP_ROWS + 3],  # both
    ],
)
def test_i1_planted_rows_around_clustered_files_are_diagnosed_exactly(clustered_table, planted, own):
    plant(clustered_table, 1, planted)
    with own_queries(own):
        report = check_contiguity(clustered_table.table(), deep=True)
    n = GROUPS * MIN_GROUP_ROWS
    assert reported_diagnosis(report.violations) == expected_diagnosis([list(range(n)), planted], 0, n)
    assert sum(v.partition == 0 for v in report.violations) == 0


def clustered_file(directory: Path, offsets: np.ndarray, name: str = "c.parquet") -> str:
    """A file in the key-hash layout's shape: rows in a shuffled order, row groups of 1,024 rows."""
    path = str(directory / name)
    rows = pa.table({cols.PARTITION: pa.array(np.zeros(len(offsets), np.int32)), cols.OFFSET: pa.array(offsets, pa.int64())})
    pq.write_table(rows, path, row_group_size=MIN_GROUP_ROWS)
    return path


@pytest.mark.parametrize("window", [MIN_GROUP_ROWS, contiguity.PROOF_WINDOW_ROWS])
@pytest.mark.parametrize("own", [True, False])
@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.__setitem__(np.flatnonzero(o == 7), 8),  # 7 missing, 8 twice: count == max - min + 1
        lambda o: o.__setitem__(np.flatnonzero(o == 0), 1),  # the smallest offset replaced: bounds move
        lambda o: o.__setitem__(np.flatnonzero(o == 4095), 4094),  # the largest replaced
    ],
)
def test_i1_gap_plus_duplicate_inside_a_shuffled_file_is_caught(tmp_path, change, own, window, monkeypatch):
    """A bitmap over the footer's range must see the hole, whatever the bounds say, and whether
    the file is read at once or a row group at a time (the duplicate in another window)."""
    monkeypatch.setattr(contiguity, "PROOF_WINDOW_ROWS", window)
    offsets = np.random.default_rng(7).permutation(4096)
    change(offsets)
    paths = {clustered_file(tmp_path, offsets): 0}
    with own_queries(own):
        violations, rows = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, 4096)}))
    assert rows == 4096
    assert reported_diagnosis(violations) == expected_diagnosis([offsets.tolist()], 0, 4096)
    assert violations


class RefusingConnection:
    """A DuckDB connection that runs no query: what a proof made without DuckDB still proves."""

    def execute(self, *args, **kwargs):
        raise duckdb.Error("no query here")


def test_a_large_clustered_file_is_proven_without_duckdb_a_window_at_a_time(tmp_path, monkeypatch):
    """A large file out of offset order is proven by the bitmap over pyarrow reads of its row
    groups, a window at a time, never by a DuckDB query nor by counting it offset by offset."""
    monkeypatch.setattr(contiguity, "_offset_runs", mock.Mock(side_effect=AssertionError("no proof failed")))
    monkeypatch.setattr(contiguity, "PROOF_WINDOW_ROWS", 2 * MIN_GROUP_ROWS)
    reads = []
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(
        pq.ParquetFile, "read_row_groups", lambda self, groups, **kw: reads.append(groups) or real(self, groups, **kw)
    )
    path = clustered_file(tmp_path, np.random.default_rng(11).permutation(4 * MIN_GROUP_ROWS) + 100)
    with own_queries(True):
        violations, rows = check_files(
            "db.t", {path: 0}, LogState(watermarks={0: Watermark(100, 100 + 4 * MIN_GROUP_ROWS)}), con=RefusingConnection()
        )
    assert (violations, rows) == ([], 4 * MIN_GROUP_ROWS)
    assert reads == [[0, 1], [2, 3]]


def test_large_files_are_proven_side_by_side(tmp_path, monkeypatch):
    """Two large clustered files: their proofs run at once (each waits here until the other has
    started; one after the other, the first would time out), and both are still proven."""
    started = threading.Barrier(2, timeout=10)
    real = contiguity._proven_unordered

    def meeting(*args, **kwargs):
        started.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(contiguity, "_proven_unordered", meeting)
    rng = np.random.default_rng(5)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = {
        clustered_file(tmp_path / "a", rng.permutation(2 * MIN_GROUP_ROWS)): 0,
        clustered_file(tmp_path / "b", rng.permutation(2 * MIN_GROUP_ROWS) + 2 * MIN_GROUP_ROWS): 0,
    }
    with own_queries(True):
        violations, rows = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, 4 * MIN_GROUP_ROWS)}))
    assert (violations, rows) == ([], 4 * MIN_GROUP_ROWS)


@pytest.mark.parametrize("own", [True, False])
def test_i1_shuffled_file_with_offsets_outside_its_footer_bounds_is_diagnosed(tmp_path, own, monkeypatch):
    """Footer statistics only choose the proof: a footer whose bounds lie (hand-edited here) makes
    the bitmap refuse the offset, and the exact count decides."""
    offsets = np.random.default_rng(3).permutation(4096)
    path = clustered_file(tmp_path, offsets)
    real = pq.read_metadata

    class Lying:
        def __init__(self, footer):
            self._footer = footer

        def __getattr__(self, name):
            return getattr(self._footer, name)

        def row_group(self, g):
            group = self._footer.row_group(g)
            stats = mock.Mock(has_min_max=True, min=1, max=4096)  # one past the real range
            columns = [mock.Mock(statistics=stats) for _ in range(group.num_columns)]
            return mock.Mock(num_rows=group.num_rows, column=lambda i: columns[i])

    monkeypatch.setattr(contiguity.pq, "read_metadata", lambda p: Lying(real(p)))
    with own_queries(own):
        violations, _ = check_files("db.t", {path: 0}, LogState(watermarks={0: Watermark(0, 4096)}))
    assert violations == []


@pytest.mark.parametrize("own", [True, False])
def test_i1_null_offsets_hold_no_offset(tmp_path, own):
    """A null offset is not the offset it sits between: [0, null, 2] misses 1."""
    paths = write_files(tmp_path, 0, [[0, None, 2]])
    with own_queries(own):
        violations, rows = check_files("db.t", paths, LogState(watermarks={0: Watermark(0, 3)}))
    assert rows == 3
    assert [(v.kind, v.first, v.last) for v in violations] == [("gap", 1, 1)]


@pytest.mark.parametrize("own", [True, False])
def test_i1_misplaced_rows_in_a_large_file_are_reported(tmp_path, own):
    offsets = np.random.default_rng(5).permutation(4096)
    path = clustered_file(tmp_path, offsets)
    with own_queries(own):
        violations, _ = check_files("db.t", {path: 1}, LogState(watermarks={0: Watermark(0, 4096), 1: Watermark(0, 0)}))
    assert [(v.kind, v.partition) for v in violations if v.kind == "misplaced_row"] == [("misplaced_row", 0)]

"""Retention moves log_start without reusing offsets (I7); compaction keeps every offset (I1)."""

from __future__ import annotations

import os
import time

from storage.log import LogTable
from storage.maintenance import Retention, files_by_partition, maintain, remove_orphan_files
from storage.commit import commit
from validations.contiguity import check_contiguity


def fill(t: LogTable, partition: int, batches: int, size: int = 3) -> None:
    for b in range(batches):
        t.append({partition: [{"key": f"b{b}", "value": str(i)} for i in range(size)]})


def test_i7_retention_by_bytes_moves_log_start_and_never_reuses_offsets(catalog):
    t = LogTable.create(catalog, "db.r", partitions=2)
    fill(t, 0, 5)
    fill(t, 1, 1)
    one_file = files_by_partition(t.table())[0][0][2].file_size_in_bytes
    commit(catalog, t.identifier, Retention(t.identifier, retention_bytes=2 * one_file))
    marks = t.watermarks()
    assert (marks[0].start, marks[0].end) == (9, 15)
    assert (marks[1].start, marks[1].end) == (0, 3)
    assert t.read(0).column("log_offset").to_pylist() == list(range(9, 15))
    assert check_contiguity(t.table(), deep=True).ok
    assert t.append({0: [{"key": "next"}]}).ranges == {0: (15, 16)}


def test_i7_retention_by_age_can_empty_a_partition_but_keeps_its_end(catalog):
    t = LogTable.create(catalog, "db.r", partitions=1)
    fill(t, 0, 3)
    future = int(time.time() * 1000) + 60_000
    commit(catalog, t.identifier, Retention(t.identifier, retention_ms=1_000, now_ms=future))
    mark = t.watermarks()[0]
    assert (mark.start, mark.end) == (9, 9)
    assert t.read(0).num_rows == 0
    assert check_contiguity(t.table(), deep=True).ok
    assert t.append({0: [{"key": "again"}]}).ranges == {0: (9, 10)}


def test_i1_compaction_expiry_and_orphan_cleanup_keep_every_offset(catalog):
    t = LogTable.create(catalog, "db.r", partitions=2)
    fill(t, 0, 12, size=2)
    fill(t, 1, 9, size=1)
    before = {p: t.read(p).select(["log_offset", "key", "value"]) for p in (0, 1)}
    report = maintain(catalog, t.identifier, keep_snapshots=1, orphan_age_s=0)
    assert report["compaction"] == {"rewritten_files": 21, "new_files": 2}
    assert report["orphans_removed"] > 0
    table = t.table()
    assert len(table.metadata.snapshots) == 1
    assert {p: len(files) for p, files in files_by_partition(table).items()} == {0: 1, 1: 1}
    assert {p: t.read(p).select(["log_offset", "key", "value"]) for p in (0, 1)} == before
    assert check_contiguity(table, deep=True).ok
    # Every file left on disk is still referenced: a fresh reader sees all the rows.
    location = table.metadata.location.removeprefix("file://")
    assert sum(len(names) for _, _, names in os.walk(location)) > 0
    assert LogTable(catalog, t.identifier).read(0).num_rows == 24


def test_orphan_cleanup_spares_young_files(catalog):
    t = LogTable.create(catalog, "db.r", partitions=1)
    fill(t, 0, 2)
    stray = t.table().metadata.location.removeprefix("file://") + "/data/stray.parquet"
    with open(stray, "wb") as f:
        f.write(b"not committed yet")
    assert remove_orphan_files(catalog, t.identifier, older_than_s=3600) == []
    assert remove_orphan_files(catalog, t.identifier, older_than_s=0) == [stray]
    assert t.read(0).num_rows == 6


def test_compaction_never_merges_across_a_gap(catalog):
    from tests.validations.test_contiguity import plant

    t = LogTable.create(catalog, "db.r", partitions=1)
    fill(t, 0, 9, size=1)
    plant(t, 0, [12])  # offsets 9..11 missing
    report = maintain(catalog, t.identifier, keep_snapshots=1, orphan_age_s=0)
    assert report["compaction"] == {"rewritten_files": 9, "new_files": 1}
    gaps = [v for v in check_contiguity(t.table(), deep=True).violations if v.kind == "gap"]
    assert [(g.first, g.last) for g in gaps] == [(9, 11)]


def test_metadata_files_stay_bounded_as_commits_pile_up(catalog):
    t = LogTable.create(catalog, "db.r", partitions=1)
    fill(t, 0, 25, size=1)
    metadata_dir = t.table().metadata.location.removeprefix("file://") + "/metadata"
    json_files = [f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json")]
    assert len(json_files) <= 12  # write.metadata.previous-versions-max=10, plus the current one

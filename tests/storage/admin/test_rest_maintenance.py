"""Maintenance and repair on an Iceberg REST catalog over S3 (a real SeaweedFS server).

Compaction, snapshot expiry, orphan cleanup and the superseded-metadata sweep list and delete
through the table's FileIO (pyarrow's S3 file system), never ``os.*``: the same promises as on a
local warehouse, every offset readable (I1, I7), an orphan gone, metadata bounded.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq

from icelog.storage.admin.maintenance import maintain
from icelog.storage.admin.orphans import referenced_files, remove_orphan_files
from icelog.storage.core.metadata_files import file_system, list_files, version_of
from icelog.storage.log import schema as cols
from icelog.storage.log.repair import repair
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.planting import plant


def fill(t: LogTable, partition: int, batches: int, size: int = 3) -> None:
    for b in range(batches):
        t.append({partition: [{"key": f"b{b}", "value": f"{b}-{i}"} for i in range(size)]})


def stored(t: LogTable, folder: str = "") -> set[str]:
    """The files under the table's location (or one folder of it), as S3 lists them."""
    fs, root = file_system(t.table().io, t.table().metadata.location)
    return {f.path for f in list_files(fs, f"{root}/{folder}".rstrip("/"), recursive=True)}


def metadata_json(t: LogTable) -> list[str]:
    return [p for p in stored(t, "metadata") if version_of(p) is not None]


def plant_orphan(t: LogTable) -> str:
    """A data file no snapshot references (a writer killed before its commit), under data/:
    the SeaweedFS table bucket accepts Iceberg's layout only."""
    table = t.table()
    fs, root = file_system(table.io, table.metadata.location)
    path = f"{root}/data/log_partition=0/orphan-{time.time_ns()}.parquet"
    with fs.open_output_stream(path) as out:
        pq.write_table(pa.table({"x": [1, 2, 3]}), out)
    return path


def test_i1_i7_maintain_compacts_expires_and_removes_orphans_on_s3(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 2)
    fill(t, 0, 12, size=2)
    fill(t, 1, 9, size=1)
    before = {p: t.read(p).select([cols.OFFSET, "key", "value"]) for p in (0, 1)}
    orphan = plant_orphan(t)
    assert orphan in stored(t) and orphan not in referenced_files(t.table())
    time.sleep(1.1)  # S3 keeps whole seconds: a file is old enough once its second is over
    report = maintain(rest_catalog, t.identifier, keep_snapshots=1, orphan_age_s=0)
    assert report["compaction"] == {"rewritten_files": 21, "new_files": 2}
    assert report["expired_snapshots"] > 0 and report["orphans_removed"] > 21  # the sources and their manifests too
    table = t.table()
    assert orphan not in stored(t)
    assert stored(t) == referenced_files(table)  # exactly the unreferenced files went
    assert len(table.metadata.snapshots) <= 2  # the kept one, and the one a tag holds
    assert all(f.file.file_path.startswith("s3://") for f in table.scan().plan_files())
    assert len(list(table.scan().plan_files())) == 2
    for p in (0, 1):
        assert t.read(p).select([cols.OFFSET, "key", "value"]).equals(before[p])
    assert check_contiguity(table).ok
    assert t.append({0: [{"key": "after"}]}).ranges == {0: (24, 25)}


def test_orphan_cleanup_on_s3_keeps_young_files(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1)
    fill(t, 0, 3)
    orphan = plant_orphan(t)
    assert orphan not in remove_orphan_files(rest_catalog, t.identifier, older_than_s=3600)
    assert orphan in stored(t)  # a writer's file not yet committed survives the age limit
    time.sleep(1.1)
    removed = remove_orphan_files(rest_catalog, t.identifier, older_than_s=0)
    assert orphan in removed and not [p for p in removed if p.endswith(".parquet") and p != orphan]
    assert stored(t) == referenced_files(t.table())  # besides it, only merged-away manifests went
    assert t.read(0).num_rows == 9 and check_contiguity(t.table()).ok


def test_i7_retention_on_s3_moves_log_start_and_orphan_cleanup_deletes_the_dropped_files(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1)
    fill(t, 0, 4)
    time.sleep(1.1)
    report = maintain(rest_catalog, t.identifier, retention_ms=1, keep_snapshots=1, orphan_age_s=0, compact=False)
    assert report["retention"]["dropped_files"] == 4
    assert (t.watermarks()[0].start, t.watermarks()[0].end) == (12, 12)
    assert not [p for p in stored(t, "data") if p.endswith(".parquet")]  # the dropped files are gone from S3
    assert t.append({0: [{"key": "next"}]}).ranges == {0: (12, 13)}
    assert check_contiguity(t.table()).ok


def test_superseded_metadata_stays_bounded_on_s3(rest_catalog):
    """Every commit sweeps metadata files superseded past the grace; the REST server names them
    ``vN.metadata.json``, listed and deleted through the S3 file system."""
    keep, commits = 5, 150
    t = LogTable.create(
        rest_catalog,
        "db.events",
        1,
        properties={"write.metadata.previous-versions-max": str(keep), "icelog.metadata.delete-grace-ms": "0"},
    )
    for i in range(commits):
        t.append({0: [{"key": "k", "value": str(i)}]})
        if i % 50 == 49:
            assert len(metadata_json(t)) <= keep + 2  # the log, the current file, one not yet past the grace
    assert t.read(0).column("value").to_pylist() == [str(i) for i in range(commits)]
    # A table no commit sweeps any more: maintain's listing removes the rest.
    report = maintain(rest_catalog, t.identifier, keep_snapshots=1, orphan_age_s=3600, compact=False)
    assert len(metadata_json(t)) <= keep + 1 + report["metadata_files_removed"]
    assert check_contiguity(t.table()).ok


def test_superseded_metadata_waits_for_the_grace_on_s3(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1, properties={"write.metadata.previous-versions-max": "2"})
    fill(t, 0, 10, size=1)
    assert len(metadata_json(t)) == version_of(t.table().metadata_location)  # every version: none past the default 60 s
    time.sleep(1.1)
    remove_orphan_files(rest_catalog, t.identifier, older_than_s=0)  # orphan cleanup takes them at any age
    assert len(metadata_json(t)) == 3
    assert t.read(0).num_rows == 10


def test_i1_repair_adopts_and_rolls_back_foreign_appends_on_s3(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 2)
    t.append({0: [{"key": "a", "value": str(i)} for i in range(4)]})
    plant(t, 0, [4, 5, 6])  # extends the log exactly
    report = repair(rest_catalog, t.identifier)
    assert report["action"] == "adopted" and report["rows"] == {"0": 3}
    assert t.append({0: [{"key": "b"}]}).ranges == {0: (7, 8)}
    mine = t.table().metadata.current_snapshot_id
    plant(t, 0, [5, 6])  # duplicates
    report = repair(rest_catalog, t.identifier)
    assert report["action"] == "rolled_back" and report["dropped_rows"] == 2
    assert t.table().metadata.current_snapshot_id == mine
    assert t.read(0).column(cols.OFFSET).to_pylist() == list(range(8))
    assert check_contiguity(t.table()).ok
    assert repair(rest_catalog, t.identifier)["action"] == "none"
    assert t.append({0: [{"key": "c"}]}).ranges == {0: (8, 9)}
    # The rolled-back foreign file is an orphan now: cleanup removes it from S3.
    time.sleep(1.1)
    maintain(rest_catalog, t.identifier, keep_snapshots=1, orphan_age_s=0, compact=False)
    assert stored(t) == referenced_files(t.table())
    assert t.read(0).column(cols.OFFSET).to_pylist() == list(range(9))

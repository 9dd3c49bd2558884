"""The Spark ingest job: executors write, the driver commits once; exactly once per source file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icelog.pipelines.ingest import ingest
from icelog.pipelines.spark import read_log
from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.errors import InvalidInput, SchemaMismatch
from icelog.storage.log.keys import partition_for_key
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from icelog.validations.producers import check_producers
from tests.support.faults import kill_at
from tests.support.ingest import table_rows, write_landing


def test_ingest_routes_by_key_hash_and_keeps_each_files_order(spark, env_catalog, tmp_path):
    t = LogTable.create(env_catalog.open(), "db.events", partitions=4)
    source = write_landing(tmp_path / "landing")
    result = ingest(spark, "db.events", str(tmp_path / "landing"), "run-1", catalog_name=env_catalog.name)
    assert result.rows == 600 and not result.duplicate
    rows = table_rows(t)
    for p, entries in rows.items():
        assert [o for o, _, _ in entries] == list(range(len(entries)))
        assert all(partition_for_key(k, 4) == p for _, k, _ in entries)
        mine = [(k, v) for _, k, v in entries]
        assert sorted(mine) == sorted((r["key"], r["value"]) for r in source if partition_for_key(r["key"], 4) == p)
        for f in range(3):  # each file's rows keep their file order
            from_file = [v for _, v in mine if v.startswith(f"f{f}-")]
            assert from_file == sorted(from_file, key=lambda v: int(v.split("-")[1]))
    assert check_contiguity(t.table(), deep=True).ok
    assert check_producers(t.table()).ok
    assert read_log(spark, t, 1, 2, 5).count() == 3
    assert read_log(spark, t).count() == 600


def test_i4_rerunning_leaves_the_table_identical_whatever_the_run_key(spark, env_catalog, tmp_path):
    t = LogTable.create(env_catalog.open(), "db.events", partitions=3)
    write_landing(tmp_path / "landing")
    first = ingest(spark, "db.events", str(tmp_path / "landing"), "day-1", catalog_name=env_catalog.name)
    assert len(first.loaded) == 3 and sum(f["rows"] for f in first.loaded) == 600
    before = (t.table().metadata.current_snapshot_id, table_rows(t))
    for key in ("day-1", "another-key"):
        again = ingest(spark, "db.events", str(tmp_path / "landing"), key, catalog_name=env_catalog.name)
        assert again.duplicate and again.rows == 0 and not again.loaded
        assert [s["reason"] for s in again.skipped] == ["already loaded"] * 3
        assert (t.table().metadata.current_snapshot_id, table_rows(t)) == before


def test_partial_partitions_then_the_rest_equals_one_full_run(spark, env_catalog, tmp_path):
    write_landing(tmp_path / "landing")
    full = LogTable.create(env_catalog.open(), "db.full", partitions=4)
    ingest(spark, "db.full", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name)
    split = LogTable.create(env_catalog.open(), "db.split", partitions=4)
    ingest(spark, "db.split", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name, only_partitions=[1, 3])
    assert split.watermarks()[0].end == 0 and split.watermarks()[1].end > 0
    rest = ingest(spark, "db.split", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name)
    assert set(rest.ranges) == {0, 2}
    assert table_rows(split) == table_rows(full)
    assert ingest(spark, "db.split", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name).duplicate
    assert table_rows(split) == table_rows(full)


def test_csv_and_json_lines_sources(spark, env_catalog, tmp_path):
    t = LogTable.create(env_catalog.open(), "db.events", partitions=2)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("key,value\na,1\nb,2\n")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "a.jsonl").write_text('{"key": "c", "value": "3"}\n{"key": "d"}\n')
    assert ingest(spark, "db.events", str(tmp_path / "csv"), "c", fmt="csv", catalog_name=env_catalog.name).rows == 2
    assert ingest(spark, "db.events", str(tmp_path / "json"), "j", fmt="jsonl", catalog_name=env_catalog.name).rows == 2
    values = sorted(v for p in (0, 1) for v in t.read(p).column("value").to_pylist() if v)
    assert values == ["1", "2", "3"]


def test_i8_bad_sources_change_nothing(spark, env_catalog, tmp_path):
    t = LogTable.create(
        env_catalog.open(),
        "db.events",
        partitions=2,
        payload=[{"name": "key", "type": "string"}, {"name": "n", "type": "long", "required": True}],
    )
    write_landing(tmp_path / "landing", files=1, rows=5)  # has no column n
    with pytest.raises(SchemaMismatch):
        ingest(spark, "db.events", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name)
    with pytest.raises(InvalidInput):
        ingest(spark, "db.events", str(tmp_path / "landing"), "r", fmt="xml", catalog_name=env_catalog.name)
    with pytest.raises(InvalidInput):
        ingest(spark, "db.events", str(tmp_path / "landing"), "r", catalog_name=env_catalog.name, only_partitions=[7])
    assert t.table().metadata.current_snapshot_id is None
    assert ingest(spark, "db.events", str(tmp_path / "empty"), "r", catalog_name=env_catalog.name).rows == 0


def test_i7_driver_killed_after_executors_wrote_files_then_rerun_lands_once(env_catalog, tmp_path):
    t = LogTable.create(env_catalog.open(), "db.events", partitions=3)
    write_landing(tmp_path / "landing")
    argv = [
        sys.executable,
        "-m",
        "tests.support.workers.ingest",
        json.dumps(asdict(env_catalog)),
        "db.events",
        str(tmp_path / "landing"),
        "run-k",
    ]
    pause = str(tmp_path / "paused")
    with open(tmp_path / "driver.log", "w") as out:  # a file, not a pipe: a chatty driver never blocks
        driver = subprocess.Popen(
            argv,
            env={
                **os.environ,
                "ICELOG_SPARK_MASTER": "local[2]",
                "ICELOG_PAUSE_AT": "after_ingest_write",
                "ICELOG_PAUSE_FILE": pause,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        kill_at(driver, pause, timeout=300)
    # Files were written but never committed: no reader sees any of them.
    data_dir = Path(t.table().metadata.location.removeprefix("file://")) / "data"
    left_behind = sorted(str(p) for p in data_dir.rglob("*.parquet"))
    assert left_behind
    assert t.table().metadata.current_snapshot_id is None
    assert all(w.end == 0 for w in t.watermarks().values())
    rerun = subprocess.run(
        argv, env={**os.environ, "ICELOG_SPARK_MASTER": "local[2]"}, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout.splitlines()[-1])["duplicate"] is False
    assert sum(w.end for w in t.watermarks().values()) == 600
    assert check_contiguity(t.table(), deep=True).ok
    assert sorted(remove_orphan_files(env_catalog.open(), "db.events", older_than_s=0)) == left_behind
    assert sum(t.read(p).num_rows for p in range(3)) == 600


@pytest.mark.integration
@pytest.mark.slow  # a standalone master and worker: about 100 s on 2 cores
def test_same_table_on_a_standalone_cluster_as_in_local_mode(env_catalog, tmp_path):
    from infra import spark_cluster

    write_landing(tmp_path / "landing", files=4, rows=300)
    cat = env_catalog.open()
    local, cluster = LogTable.create(cat, "db.local", partitions=4), LogTable.create(cat, "db.cluster", partitions=4)
    directory = Path(tempfile.mkdtemp(prefix="icelog-spark-"))
    master = spark_cluster.start(directory, workers=2)
    try:
        for table, spark_master in (("db.cluster", master), ("db.local", "local[2]")):
            argv = [
                sys.executable,
                "-m",
                "tests.support.workers.ingest",
                json.dumps(asdict(env_catalog)),
                table,
                str(tmp_path / "landing"),
                "run",
            ]
            done = subprocess.run(
                argv, env={**os.environ, "ICELOG_SPARK_MASTER": spark_master}, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert any((directory / "work0").iterdir()) or any((directory / "work1").iterdir())  # executors really ran there
    finally:
        spark_cluster.stop(directory)
    assert table_rows(cluster) == table_rows(local)
    assert sum(len(v) for v in table_rows(local).values()) == 1200


def test_slice_bases_follow_split_order_per_partition():
    from icelog.pipelines.ingest import slice_bases

    counts = [(1, 0, 3), (0, 0, 5), (0, 1, 2), (2, 0, 4)]
    assert slice_bases(counts, {0: 10, 1: 7}) == {(0, 0): 10, (1, 0): 15, (2, 0): 18, (0, 1): 7}


@pytest.mark.parametrize("null_every", [50, None], ids=["some-null-keys", "no-null-keys"])
def test_ingest_fills_log_key_hash_on_the_executors_and_clusters_large_files(spark, env_catalog, tmp_path, null_every):
    """Executors hash the keys exactly as the append path does (a null key as the empty one); a
    large file is clustered. Without null keys the clustering reorders the keys through their
    dictionary (``storage.log.files``): the same rows must come out."""
    from icelog.storage.log import schema as cols
    from icelog.storage.log.files import local_path
    from icelog.storage.log.keys import key_hash

    t = LogTable.create(env_catalog.open(), "db.hashed", partitions=1)
    landing = tmp_path / "landing"
    landing.mkdir()
    keys = [None if null_every and i % null_every == 0 else f"user-{i % 997}" for i in range(6_000)]
    pq.write_table(
        pa.table({"key": keys, "value": [str(i) for i in range(6_000)]}),
        landing / "big.parquet",
    )
    ingest(spark, "db.hashed", str(landing), catalog_name=env_catalog.name)
    data = t.read(0)
    assert data.column(cols.KEY_HASH).to_pylist() == [key_hash(k) for k in data.column("key").to_pylist()]
    assert data.column("value").to_pylist() == [str(i) for i in range(6_000)]  # offsets still follow the file
    assert data.column("key").to_pylist() == keys
    (task,) = t.table().scan().plan_files()
    assert pq.ParquetFile(local_path(task.file.file_path)).metadata.num_row_groups > 1
    assert check_contiguity(t.table(), deep=True).ok


def test_i4_ingest_lands_on_a_table_whose_oldest_registry_file_another_engine_deleted(spark, env_catalog, tmp_path, monkeypatch):
    """A foreign orphan cleanup deleted a listed commit-id registry file: the ingest's commit id is a
    first send made now (a UUIDv7), so no gone older file can refuse it, and the table drops the file."""
    from icelog.storage.core import registry
    from icelog.storage.properties import COMMIT_ID

    monkeypatch.setattr(registry, "TAIL_BYTES", 300)
    registry.clear_cache()
    t = LogTable.create(env_catalog.open(), "db.events", partitions=3)
    for i in range(14):
        t.append({0: [{"key": f"k{i}", "value": "v"}]}, commit_id=f"c{i}")
    gone = registry.file_list(t.table().metadata).paths()[0]
    t.table().io.delete(gone)
    registry.clear_cache()
    write_landing(tmp_path / "landing")
    result = ingest(spark, "db.events", str(tmp_path / "landing"), "run-1", catalog_name=env_catalog.name)
    assert result.rows == 600 and not result.duplicate
    snapshot = t.table().metadata.current_snapshot()
    assert registry.commit_id_created_ms(snapshot.summary[COMMIT_ID]) is not None  # a UUIDv7
    assert check_contiguity(t.table(), deep=True).ok
    registry.clear_cache()

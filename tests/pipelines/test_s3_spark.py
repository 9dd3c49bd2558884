"""The Spark jobs on the lakehouse profile: a PostgreSQL catalog whose warehouse is S3 (SeaweedFS).

Spark has no S3 connector here: executors read landing objects and write data files through
pyarrow, with the table's FileIO settings shipped to them; the driver commits data and ledger in
one atomic multi-table commit (on the REST catalog: tests/pipelines/test_spark_ingest_rest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from icelog.pipelines.ingest import ingest
from icelog.storage.log.keys import partition_for_key
from icelog.storage.log.maintenance import live_files
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.ingest import table_rows
from tests.support.lakehouse import BUCKET, land, s3_filesystem
from tests.support.mirror import assert_parity


def test_i9_spark_ingest_reads_s3_landing_and_writes_s3_data_files(spark, lakehouse, s3_landing):
    t = LogTable.create(lakehouse.open(), "db.events", partitions=4)
    source = land(lakehouse, s3_landing)
    result = ingest(spark, "db.events", s3_landing, "run-1", catalog_name=lakehouse.name)
    assert result.rows == 600 and not result.duplicate
    assert sorted(f["path"] for f in result.loaded) == [f"{s3_landing}/part-{f}.parquet" for f in range(3)]
    rows = table_rows(t)
    for p, entries in rows.items():
        assert [o for o, _, _ in entries] == list(range(len(entries)))
        assert all(partition_for_key(k, 4) == p for _, k, _ in entries)
        mine = sorted((k, v) for _, k, v in entries)
        assert mine == sorted((r["key"], r["value"]) for r in source if partition_for_key(r["key"], 4) == p)
    assert {p: w.end for p, w in t.watermarks().items()} == {p: len(e) for p, e in rows.items()}
    assert sum(w.end for w in t.watermarks().values()) == 600
    assert check_contiguity(t.table()).ok
    paths = [f.file_path for f in live_files(t.table())]
    assert paths and all(p.startswith(f"{t.table().metadata.location}/data/") for p in paths)
    assert t.table().metadata.location.startswith(f"s3://{BUCKET}/")

    again = ingest(spark, "db.events", s3_landing, "run-2", catalog_name=lakehouse.name)
    assert again.duplicate and again.rows == 0
    assert [s["reason"] for s in again.skipped] == ["already loaded"] * 3
    land(lakehouse, f"{s3_landing}/late", files=1, rows=10)
    late = ingest(spark, "db.events", s3_landing, "run-3", catalog_name=lakehouse.name)
    assert late.rows == 10 and [f["path"] for f in late.loaded] == [f"{s3_landing}/late/part-0.parquet"]
    assert sum(w.end for w in t.watermarks().values()) == 610
    assert check_contiguity(t.table(), deep=True).ok


def test_csv_and_json_lines_sources_on_s3(spark, lakehouse, s3_landing):
    t = LogTable.create(lakehouse.open(), "db.events", partitions=2)
    filesystem, prefix = s3_filesystem(lakehouse.s3), s3_landing.removeprefix("s3://")
    with filesystem.open_output_stream(f"{prefix}/csv/a.csv") as f:
        f.write(b"key,value\na,1\nb,2\n")
    with filesystem.open_output_stream(f"{prefix}/json/a.jsonl") as f:
        f.write(b'{"key": "c", "value": "3"}\n{"key": "d"}\n')
    assert ingest(spark, "db.events", f"{s3_landing}/csv", "c", fmt="csv", catalog_name=lakehouse.name).rows == 2
    assert ingest(spark, "db.events", f"{s3_landing}/json/*.jsonl", "j", fmt="jsonl", catalog_name=lakehouse.name).rows == 2
    values = sorted(v for p in (0, 1) for v in t.read(p).column("value").to_pylist() if v)
    assert values == ["1", "2", "3"]
    assert check_contiguity(t.table()).ok


def test_spark_ingest_of_an_empty_s3_prefix_loads_nothing(spark, lakehouse, s3_landing):
    t = LogTable.create(lakehouse.open(), "db.events", partitions=2)
    assert ingest(spark, "db.events", f"{s3_landing}/date=2013-01-01", "r", catalog_name=lakehouse.name).rows == 0
    assert t.table().metadata.current_snapshot_id is None


def test_i6_spark_mirror_from_sqlite_to_the_s3_lakehouse(spark, sqlite_spec, lakehouse):
    from icelog.pipelines.mirror import mirror_bulk
    from icelog.storage.replication.acls import add_acl

    source, target = sqlite_spec.open(), lakehouse.open()
    add_acl(target, "bulk", "*")
    src = LogTable.create(source, "orders", 3)
    for i in range(4):
        src.append({p: [{"key": f"k{i}{p}", "value": str(i)}] * (p + 1) for p in range(3)})
    result = mirror_bulk(spark, source, "orders", target, principal="bulk")
    assert result.copied_files == 12 and result.ranges == {0: (0, 4), 1: (0, 8), 2: (0, 12)}
    assert_parity(source, target)
    copied = [f.file_path for f in live_files(LogTable.open(target, "orders").table())]
    assert len(copied) == 12 and all(p.startswith(f"s3://{BUCKET}/") for p in copied)
    src.append({0: [{"key": "late", "value": "x"}]})
    assert mirror_bulk(spark, source, "orders", target, principal="bulk").ranges == {0: (4, 5)}
    assert_parity(source, target)


@pytest.mark.integration
@pytest.mark.slow  # a standalone master and two workers
def test_same_s3_table_on_a_standalone_cluster_as_in_local_mode(lakehouse, s3_landing):
    from infra import spark_cluster

    land(lakehouse, s3_landing, files=4, rows=300)
    cat = lakehouse.open()
    local, cluster = LogTable.create(cat, "db.local", partitions=4), LogTable.create(cat, "db.cluster", partitions=4)
    directory = Path(tempfile.mkdtemp(prefix="icelog-spark-"))
    master = spark_cluster.start(directory, workers=2)
    try:
        for table, spark_master in (("db.cluster", master), ("db.local", "local[2]")):
            argv = [sys.executable, "-m", "tests.support.workers.ingest", json.dumps(asdict(lakehouse)), table, s3_landing, "run"]
            done = subprocess.run(
                argv, env={**os.environ, "ICELOG_SPARK_MASTER": spark_master}, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert any((directory / "work0").iterdir()) or any((directory / "work1").iterdir())  # executors really ran there
    finally:
        spark_cluster.stop(directory)
    assert table_rows(cluster) == table_rows(local)
    assert sum(len(v) for v in table_rows(local).values()) == 1200
    assert all(f.file_path.startswith(f"s3://{BUCKET}/") for f in live_files(cluster.table()))

"""The group consume–transform–produce job (I9, I10): members share a partition, each record lands once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from icelog.pipelines.group_job import _hash_expression, take
from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import faults
from icelog.storage.errors import StaleGeneration
from icelog.storage.groups import membership
from icelog.storage.groups.consumer import key_hash
from icelog.storage.groups.ranges import RangeState
from icelog.storage.log.table import LogTable
from tests.support.faults import kill_at
from tests.support.group_job import LONG, N, assert_each_record_once, join, make_tables, output, run, stable


def staged_files(catalog) -> list[str]:
    location = LogTable.open(catalog, "db.out").table().metadata.location.removeprefix("file://")
    return [os.path.join(d, f) for d, _, fs in os.walk(location + "/data") for f in fs if "_group-job-" in d]


def hashes_of(catalog, offsets: list[tuple[int, int]]) -> set[int]:
    keys = {r["log_offset"]: r["key"] for r in LogTable.open(catalog, "db.src").read(0).to_pylist()}
    return {key_hash(keys[o]) for first, last in offsets for o in range(first, last + 1)}


def inside(values: set[int], ranges: list[tuple[int, int]]) -> bool:
    return all(any(lo <= v <= hi for lo, hi in ranges) for v in values)


def test_take_caps_records_and_open_ranges():
    runs = [(0, 1), (3, 5), (8, 8), (10, 12)]
    assert take(RangeState(), runs, None, 1000) == runs
    assert take(RangeState(), runs, 4, 1000) == [(0, 1), (3, 4)]  # a run is split at the budget
    # Back-pressure at 0.9 of the bound: (0, 1) moves the stable offset, (3, 5) opens range 1,
    # (8, 8) would open range 2 > int(0.9 * 2).
    assert take(RangeState(), runs, None, 2) == [(0, 1), (3, 5)]
    # Past the margin already: a run that closes a gap still goes, one that opens a range not.
    full = RangeState(-1, ((2, 2), (4, 4)))
    assert take(full, [(3, 3), (6, 6)], None, 2) == [(3, 3)]
    assert take(full, [(0, 0), (6, 6)], None, 2) == [(0, 0)]  # extends (one more gap stays) but (6, 6) would not fit


def test_spark_hash_expressions_agree_with_python(spark):
    keys = [f"user-{i}" for i in range(300)] + [None, ""]
    df = spark.createDataFrame([(k, i * 37) for i, k in enumerate(keys)], "key string, log_offset long")
    rows = df.select(
        "key", "log_offset", _hash_expression("key", "key", 1).alias("h"), _hash_expression("chunks", "key", 7).alias("c")
    ).collect()
    assert [r["h"] for r in rows] == [key_hash(k) for k in keys]
    assert [r["c"] for r in rows] == [membership.chunk_slot(r["log_offset"] // 7) for r in rows]


def test_i9_two_members_share_one_partition_by_key_range_each_record_once(env_catalog):
    catalog = env_catalog.open()
    make_tables(catalog)
    join(catalog, "a", "b")
    first = run(env_catalog, "a")
    assert 0 < first.rows < N and stable(catalog).ranges  # out of order: IC ranges above the stable offset
    second = run(env_catalog, "b")
    assert first.rows + second.rows == N
    assert first.generation == second.generation == 2
    for result in (first, second):  # each read only keys of its own hash ranges
        assert inside(hashes_of(catalog, result.consumed[0]), result.hashes[0])
    assert not set(map(tuple, first.hashes[0])) & set(map(tuple, second.hashes[0]))
    assert_each_record_once(catalog)
    before = output(catalog)
    assert run(env_catalog, "a").rows == 0 and run(env_catalog, "b").rows == 0  # re-runs: nothing new
    assert output(catalog) == before


def test_i10_a_rebalance_between_read_and_commit_is_fenced_and_writes_nothing(env_catalog):
    catalog = env_catalog.open()
    make_tables(catalog)
    join(catalog, "a", "b")

    def join_c_meanwhile(df):  # runs on the driver after the read, before the write and commit
        join(catalog, "c")
        return df

    with pytest.raises(StaleGeneration):
        run(env_catalog, "a", transform=join_c_meanwhile)
    assert output(catalog) == [] and LogTable.open(catalog, "db.out").watermarks()[0].end == 0
    assert stable(catalog) == RangeState(-1, ())  # no offset committed
    assert staged_files(catalog) == []  # the written files were deleted
    # Under the new assignment, three runs land every record once.
    rows = [run(env_catalog, m).rows for m in ("a", "b", "c")]
    assert sum(rows) == N and all(rows)
    assert_each_record_once(catalog)


def test_i9_explicit_key_ranges_max_records_and_a_transform(env_catalog):
    from pyspark.sql import functions as F

    catalog = env_catalog.open()
    make_tables(catalog)
    double = lambda df: df.withColumn("id", F.col("id") * 2)  # noqa: E731
    low = run(env_catalog, None, key_range="0:32767", max_records=10, transform=double)
    assert low.member is None and low.rows == 10
    assert inside(hashes_of(catalog, low.consumed[0]), [(0, 32767)])
    rest = [run(env_catalog, None, key_range=r, transform=double).rows for r in ("0:32767", "32768:65535")]
    assert 10 + sum(rest) == N
    assert Counter(r["id"] for r in output(catalog)) == Counter(2 * i for i in range(N))
    assert stable(catalog) == RangeState(N - 1, ())


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.slow  # a second Spark driver starts cold: ~30-50 s here
def test_i9_killed_after_the_executors_wrote_then_rerun_lands_each_record_once(env_catalog, tmp_path):
    catalog = env_catalog.open()
    make_tables(catalog)
    script = (
        "import sys; from pipelines.group_job import group_job; from pipelines.spark import spark_session;"
        "group_job(spark_session('local[2]', 'icelog-group-job-worker'), 'db.src', 'db.out', 'g',"
        f" member_id='solo', session_timeout_ms={LONG}, catalog_name=sys.argv[1])"
    )
    pause = str(tmp_path / "paused")
    env = {**os.environ, **env_catalog.env(), "ICELOG_PAUSE_AT": faults.AFTER_INGEST_WRITE, "ICELOG_PAUSE_FILE": pause}
    argv = [sys.executable, "-c", script, env_catalog.name]
    with (
        open(tmp_path / "worker.log", "w") as out,
        subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT) as worker,
    ):
        try:
            kill_at(worker, pause, timeout=300)  # paused after the executors wrote, before the commit
        except BaseException:
            worker.kill()  # never leave a paused driver behind
            raise
    leftovers = staged_files(catalog)
    assert leftovers  # the executors had written the output
    assert output(catalog) == [] and stable(catalog) == RangeState(-1, ())  # nothing committed
    rerun = run(env_catalog, "solo")  # the same member again: it reads the same offsets
    assert rerun.rows == N and rerun.consumed == {0: [(0, N - 1)]}
    assert_each_record_once(catalog)
    removed = remove_orphan_files(catalog, "db.out", older_than_s=0)
    assert set(leftovers) <= set(removed) and Counter(r["id"] for r in output(catalog)) == Counter(range(N))


def upper_key(df):
    """A transform for the CLI test (``--transform tests.pipelines.test_group_job:upper_key``)."""
    from pyspark.sql import functions as F

    return df.withColumn("key", F.upper("key"))


def test_cli_consume_produce_runs_the_job_and_refuses_a_bad_transform(env_catalog):
    from click.testing import CliRunner

    from icelog.pipelines.cli import cli

    catalog = env_catalog.open()
    make_tables(catalog)
    args = ["consume-produce", "db.src", "db.out", "--group", "g", "--key-range", "0:65535"]
    bad = CliRunner().invoke(cli, ["--output", "json", *args, "--transform", "nowhere:fn"], env=env_catalog.env())
    assert bad.exit_code == 2 and output(catalog) == []
    ok = CliRunner().invoke(
        cli,
        ["--output", "json", *args, "--max-records", "5", "--transform", "tests.pipelines.test_group_job:upper_key"],
        env=env_catalog.env(),
    )
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout.strip().splitlines()[-1])
    assert doc["rows"] == 5 and doc["consumed"] == {"0": [[0, 4]]}
    assert sorted(r["id"] for r in output(catalog)) == [0, 1, 2, 3, 4] and all(r["key"].startswith("K") for r in output(catalog))
    assert stable(catalog) == RangeState(4, ())

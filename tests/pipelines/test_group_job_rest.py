"""The group job on a REST catalog (SeaweedFS REST + S3): output and consumed ranges commit as one
transaction of the member's transactional producer (I5, I9, I10): decided in the coordinator
journal, then the target and the group offsets each roll forward once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from pyarrow import fs as pafs

from icelog.storage.core import faults
from icelog.storage.errors import StaleGeneration
from icelog.storage.groups.ranges import RangeState
from icelog.storage.log.files import arrow_location
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.validations.checks import run_checks
from tests.support.faults import kill_at
from tests.support.group_job import LONG, N, assert_each_record_once, join, make_tables, output, run, stable
from tests.support.transactions import journal

pytestmark = pytest.mark.integration


class Crash(BaseException):
    """The driver dying at a fault point, in-process (the kill -9 versions are ``slow``)."""


def crash_at(monkeypatch, point: str) -> None:
    real = faults.checkpoint

    def checkpoint(at: str) -> None:
        if at == point:
            raise Crash(at)
        real(at)

    monkeypatch.setattr(faults, "checkpoint", checkpoint)


def txn_files(catalog) -> list[str]:
    """Files in the transaction folders of ``db.out`` (``data/txn-<id>/``) that no snapshot references."""
    table = LogTable.open(catalog, "db.out").table()
    filesystem, root = arrow_location(table.io, f"{table.metadata.location}/data")
    found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    referenced = {f.file.file_path.split("://", 1)[-1] for f in table.scan().plan_files()}
    return [f.path for f in found if f.type == pafs.FileType.File and "/txn-" in f.path and f.path not in referenced]


def committed_transactions(catalog) -> list[str]:
    return [r["txn_id"] for r in journal(catalog) if r["txn_state"] == "COMMITTED"]


def test_i5_i9_rest_two_members_land_output_and_offsets_once_in_transactions(rest_env):
    catalog = rest_env.open()
    make_tables(catalog)
    join(catalog, "a", "b")
    first = run(rest_env, "a")
    assert 0 < first.rows < N and stable(catalog).ranges  # out of order: IC ranges above the stable offset
    second = run(rest_env, "b")
    assert first.rows + second.rows == N and first.generation == second.generation == 2
    assert sum(b - a for r in (first, second) for a, b in r.written.values()) == N
    assert_each_record_once(catalog)
    assert len(committed_transactions(catalog)) == 2  # each run one transaction, recorded COMMITTED at its end
    assert txn_files(catalog) == []  # numbered where they landed: committed as written
    before = output(catalog)
    assert run(rest_env, "a").rows == 0 and run(rest_env, "b").rows == 0  # re-runs: nothing new
    assert output(catalog) == before


def test_i10_rest_a_rebalance_between_read_and_commit_is_fenced_and_nothing_is_visible(rest_env):
    catalog = rest_env.open()
    make_tables(catalog)
    join(catalog, "a", "b")

    def join_c_meanwhile(df):  # runs on the driver after the read, before the write and commit
        join(catalog, "c")
        return df

    with pytest.raises(StaleGeneration):
        run(rest_env, "a", transform=join_c_meanwhile)
    assert output(catalog) == [] and LogTable.open(catalog, "db.out").watermarks()[0].end == 0
    assert stable(catalog) == RangeState(-1, ())  # no offset committed
    assert txn_files(catalog) == []  # the aborted transaction's files were deleted
    assert committed_transactions(catalog) == []
    rows = [run(rest_env, m).rows for m in ("a", "b", "c")]
    assert sum(rows) == N and all(rows)
    assert_each_record_once(catalog)


def test_i1_i5_rest_the_target_moved_between_the_write_and_the_roll_forward(rest_env, monkeypatch):
    """Another writer appends after the executors numbered the output: the roll-forward puts the
    output after it, rewriting the files at their new offsets (the originals deleted)."""
    catalog = rest_env.open()
    make_tables(catalog)
    real = faults.checkpoint

    def other_writer(point: str) -> None:
        if point == faults.AFTER_INGEST_WRITE:
            LogTable.open(catalog, "db.out").append({p: [{"key": "other", "id": -1 - p}] * 3 for p in range(2)})
        real(point)

    monkeypatch.setattr(faults, "checkpoint", other_writer)
    result = run(rest_env, None, key_range="0:65535")
    assert result.rows == N and all(first == 3 for first, _ in result.written.values())
    rows = output(catalog)
    for p in range(2):
        mine = sorted((r["log_offset"], r["key"]) for r in rows if r["log_partition"] == p)
        assert [k for _, k in mine[:3]] == ["other"] * 3 and "other" not in {k for _, k in mine[3:]}
    others = [r for r in rows if r["key"] == "other"]
    assert len(others) == 6
    assert Counter(r["id"] for r in rows if r["key"] != "other") == Counter(range(N))
    assert run_checks(catalog.load_table("db.out"), ["contiguity-deep"]).ok
    assert stable(catalog) == RangeState(N - 1, ())
    assert txn_files(catalog) == []


@pytest.mark.parametrize(
    ("point", "finish"),
    [
        (faults.AFTER_TXN_PREPARE, "rerun"),
        (faults.BETWEEN_TABLE_SWAPS, "rerun"),
        (faults.AFTER_TXN_PREPARE, "recover"),
        (faults.BETWEEN_TABLE_SWAPS, "join"),
    ],
)
def test_i5_i9_rest_the_driver_dies_after_the_decision_then_each_record_lands_once(rest_env, monkeypatch, point, finish):
    """Decided, then the driver dies before or between the roll-forwards: the next run of the
    member, ``recover``, or another member's join finishes it; the records are never read again."""
    catalog = rest_env.open()
    make_tables(catalog)
    real = faults.checkpoint
    crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        run(rest_env, "solo")
    monkeypatch.setattr(faults, "checkpoint", real)
    decided = [
        e.txn.id for e in coordinator.transactional_ids(catalog).values() if e.txn is not None and e.txn.prepared is not None
    ]
    assert len(decided) == 1 and committed_transactions(catalog) == []
    if finish == "rerun":
        again = run(rest_env, "solo")  # its producer rolls the decided transaction forward first
        assert again.rows == 0
    elif finish == "recover":
        assert tx.recover(catalog)["rolled_forward"] == decided
    else:
        join(catalog, "other")  # settle_group before adopting the partitions
    assert_each_record_once(catalog)
    assert committed_transactions(catalog) == decided
    assert txn_files(catalog) == []


def test_i1_i5_rest_the_target_moved_after_the_decision_then_recover_places_the_output_after_it(rest_env, monkeypatch):
    """The driver dies right after the decision; another writer appends to the target; ``recover``
    rolls the output forward after those records, renumbered, each source record once."""
    catalog = rest_env.open()
    make_tables(catalog)
    real = faults.checkpoint
    crash_at(monkeypatch, faults.AFTER_TXN_PREPARE)
    with pytest.raises(Crash):
        run(rest_env, None, key_range="0:65535")
    monkeypatch.setattr(faults, "checkpoint", real)
    LogTable.open(catalog, "db.out").append({p: [{"key": "other", "id": -1}] * 2 for p in range(2)})
    assert len(tx.recover(catalog)["rolled_forward"]) == 1
    rows = output(catalog)
    assert Counter(r["id"] for r in rows) == Counter(range(N)) + Counter({-1: 4})
    assert all(r["key"] == "other" for r in rows if r["log_offset"] < 2)  # the other writer's records first
    assert run_checks(catalog.load_table("db.out"), ["contiguity-deep"]).ok
    assert stable(catalog) == RangeState(N - 1, ())
    assert txn_files(catalog) == []  # the originals of the renumbered files deleted


@pytest.mark.fault
@pytest.mark.slow  # a second Spark driver starts cold: ~30-50 s
@pytest.mark.parametrize(("point", "finish"), [(faults.AFTER_TXN_PREPARE, "rerun"), (faults.BETWEEN_TABLE_SWAPS, "recover")])
def test_i5_i9_rest_kill9_after_the_decision_then_each_record_lands_once(rest_env, tmp_path, point, finish):
    catalog = rest_env.open()
    make_tables(catalog)
    script = (
        "import sys; from icelog.pipelines.group_job import group_job; from icelog.pipelines.spark import spark_session;"
        "group_job(spark_session('local[2]', 'icelog-group-job-worker'), 'db.src', 'db.out', 'g',"
        f" member_id='solo', session_timeout_ms={LONG}, catalog_name=sys.argv[1])"
    )
    pause = str(tmp_path / "paused")
    env = {**rest_env.env(), "ICELOG_PAUSE_AT": point, "ICELOG_PAUSE_FILE": pause}
    with (
        open(tmp_path / "worker.log", "w") as out,
        subprocess.Popen([sys.executable, "-c", script, rest_env.name], env=env, stdout=out, stderr=subprocess.STDOUT) as worker,
    ):
        try:
            kill_at(worker, pause, timeout=300)
        except BaseException:
            worker.kill()
            raise
    assert committed_transactions(catalog) == []
    if finish == "rerun":
        assert run(rest_env, "solo").rows == 0
    else:
        assert len(tx.recover(catalog)["rolled_forward"]) == 1
    assert_each_record_once(catalog)
    assert txn_files(catalog) == []


def test_cli_consume_produce_on_rest(rest_env):
    from click.testing import CliRunner

    from icelog.pipelines.cli import cli

    catalog = rest_env.open()
    make_tables(catalog)
    args = ["--output", "json", "consume-produce", "db.src", "db.out", "--group", "g", "--key-range", "0:65535"]
    ok = CliRunner().invoke(cli, [*args, "--max-records", "5"], env=rest_env.env())
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout.strip().splitlines()[-1])
    assert doc["rows"] == 5 and doc["consumed"] == {"0": [[0, 4]]}
    assert sum(b - a for a, b in doc["written"].values()) == 5
    assert sorted(r["id"] for r in output(catalog)) == [0, 1, 2, 3, 4]
    assert stable(catalog) == RangeState(4, ())
    rest = CliRunner().invoke(cli, args, env=rest_env.env())
    assert rest.exit_code == 0, rest.output
    assert_each_record_once(catalog)

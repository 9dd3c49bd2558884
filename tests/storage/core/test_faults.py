"""kill -9 of a real writer process at named points of the commit path (I1, I4, I7).

Appends, producer init, retention and compaction are each killed after writing data files,
after writing new metadata, and after the catalog swap. Afterwards the table is valid, every
acknowledged row is still there (or was removed by retention policy), a re-run converges to
the state a clean run reaches, and orphan cleanup removes exactly what the dead writer left.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import faults
from icelog.storage.log.maintenance import files_by_partition
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from icelog.validations.contiguity import check_contiguity
from icelog.validations.producers import check_producers
from tests.support.faults import kill_9, kill_at, run_to_end
from tests.support.files import files_on_disk, files_referenced

pytestmark = pytest.mark.fault


def assert_cleanup_removes_exactly_the_orphans(
    catalog, log_table: LogTable, left: set[str], point: str, writes_data: bool
) -> None:
    """Orphan cleanup removes exactly the unreferenced files on disk, nothing referenced.

    ``left`` are the files the killed writer wrote under the table. If its commit never
    landed, every one of them is an orphan now, so cleanup must remove each; and there is at
    least one once the writer got past writing data files (if it writes any) or metadata.
    """
    table = log_table.table()
    referenced = files_referenced(table)
    on_disk = files_on_disk(table)
    assert referenced <= on_disk, "a referenced file is missing"
    orphans = on_disk - referenced
    if point != faults.AFTER_CATALOG_SWAP:
        if writes_data or point == faults.AFTER_METADATA_WRITE:
            assert left, "the killed writer left no file at all"
        assert left <= orphans, "a file of the commit that never landed is referenced"
    removed = remove_orphan_files(catalog, log_table.identifier, older_than_s=0)
    assert sorted(removed) == sorted(orphans)
    assert files_on_disk(log_table.table()) == files_referenced(log_table.table()) == referenced


def keys(log_table: LogTable, partition: int) -> list[str]:
    return log_table.read(partition).column("key").to_pylist()


# --- appends ------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", faults.POINTS)
def test_i1_i7_kill_9_mid_commit_leaves_a_valid_table_with_every_acknowledged_row(catalog_spec, tmp_path, point):
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.crash", partitions=2)
    acknowledged = t.append({0: [{"key": "ack", "value": str(i)} for i in range(5)]})
    assert acknowledged.ranges == {0: (0, 5)}

    left = kill_9(catalog_spec, point, "append_rows", "db.crash", 0, 3, "victim", "commit-1", directory=tmp_path, table=t)

    report = check_contiguity(t.table(), deep=True)
    assert report.ok, report.violations
    landed = point == faults.AFTER_CATALOG_SWAP
    assert keys(t, 0) == ["ack"] * 5 + (["victim"] * 3 if landed else [])

    # Re-sending the same commit after the crash lands it exactly once.
    outcome = run_to_end(catalog_spec, "append_rows", "db.crash", 0, 3, "victim", "commit-1", directory=tmp_path, name="resend")
    assert outcome["range"] == [5, 8]
    assert outcome["duplicate"] == landed
    assert keys(t, 0) == ["ack"] * 5 + ["victim"] * 3

    # Whatever the dead writer left behind is unreferenced; cleanup removes it and keeps the table whole.
    assert_cleanup_removes_exactly_the_orphans(catalog, t, left, point, writes_data=True)
    assert check_contiguity(t.table(), deep=True).ok
    assert keys(t, 0) == ["ack"] * 5 + ["victim"] * 3


# --- producer init ---------------------------------------------------------------------------------


@pytest.mark.parametrize("point", faults.POINTS)
def test_i4_i7_kill_9_mid_producer_init_then_init_again_converges(heavy_spec, tmp_path, point):
    catalog_spec = heavy_spec  # PostgreSQL's run in make test-slow: the kill -9 mid-commit test covers its swap
    """Killed in the commit that registers the producer on the log table."""
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.p", partitions=1)
    other = init_producer(catalog, "db.p", "other")
    assert t.append({0: [{"key": "ack"}] * 2}, producer=ProducerBatch(other.producer_id, other.epoch, {0: 0})).ranges == {
        0: (0, 2)
    }

    left = kill_9(catalog_spec, point, "init_producer", "db.p", "app", "register", directory=tmp_path, table=t)

    landed = point == faults.AFTER_CATALOG_SWAP
    state = t.state().producers
    assert sorted(state) == sorted([str(other.producer_id)] + ([str(other.producer_id + 1)] if landed else []))
    assert check_contiguity(t.table(), deep=True).ok and check_producers(t.table()).ok
    # Nothing acknowledged is lost: the rows, and the other producer's memory of its batch.
    assert keys(t, 0) == ["ack", "ack"]
    resent = t.append({0: [{"key": "ack"}] * 2}, producer=ProducerBatch(other.producer_id, other.epoch, {0: 0}))
    assert resent.duplicate and resent.ranges == {0: (0, 2)}

    # Init again (what a client does when its init failed): one producer for the client id,
    # a fresh one if the killed init never landed, the same one at the next epoch if it did.
    again = run_to_end(catalog_spec, "init_producer", "db.p", "app", "register", directory=tmp_path, name="again")
    clients = [pid for pid, entry in t.state().producers.items() if entry.client == "app"]
    assert clients == [str(again["producer_id"])]
    assert again["epoch"] == (1 if landed else 0)
    assert t.append({0: [{"key": "new"}]}, producer=ProducerBatch(again["producer_id"], again["epoch"], {0: 0})).ranges == {
        0: (2, 3)
    }
    assert check_producers(t.table()).ok
    assert_cleanup_removes_exactly_the_orphans(catalog, t, left, point, writes_data=False)


@pytest.mark.parametrize("point", faults.POINTS)
def test_i4_kill_9_mid_producer_id_lease_never_reuses_an_id(sqlite_spec, tmp_path, point):
    """Killed in the commit that leases the id (the catalog-wide counter)."""
    catalog = sqlite_spec.open()
    t = LogTable.create(catalog, "db.p", partitions=1)
    first = init_producer(catalog, "db.p", "first")

    kill_9(sqlite_spec, point, "init_producer", "db.p", "app", "lease", directory=tmp_path, table=t)

    assert list(t.state().producers) == [str(first.producer_id)]  # the register commit never ran
    again = run_to_end(sqlite_spec, "init_producer", "db.p", "app", "lease", directory=tmp_path, name="again")
    leased_by_victim = point == faults.AFTER_CATALOG_SWAP
    assert (again["producer_id"], again["epoch"]) == (first.producer_id + (2 if leased_by_victim else 1), 0)
    assert sorted(t.state().producers) == sorted([str(first.producer_id), str(again["producer_id"])])


# --- retention and compaction ---------------------------------------------------------------------


def fill(t: LogTable, partition: int, batches: int, size: int) -> None:
    for b in range(batches):
        t.append({partition: [{"key": f"b{b}", "value": str(i)} for i in range(size)]})


@pytest.mark.parametrize("point", faults.POINTS)
def test_i1_i7_kill_9_mid_retention_then_a_rerun_converges(heavy_spec, tmp_path, point):
    catalog_spec = heavy_spec  # PostgreSQL's run in make test-slow: the kill -9 mid-commit test covers its swap
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.r", partitions=2)
    fill(t, 0, 5, 3)
    fill(t, 1, 1, 3)
    rows = {p: t.read(p).select(["log_offset", "key", "value"]) for p in (0, 1)}
    one_file = files_by_partition(t.table())[0][0][2].file_size_in_bytes

    left = kill_9(catalog_spec, point, "maintain", "db.r", 2 * one_file, 0, directory=tmp_path, table=t)

    landed = point == faults.AFTER_CATALOG_SWAP
    marks = {p: (w.start, w.end) for p, w in t.watermarks().items()}
    assert marks == ({0: (9, 15), 1: (0, 3)} if landed else {0: (0, 15), 1: (0, 3)})
    assert check_contiguity(t.table(), deep=True).ok
    # Every acknowledged row is there, except those retention dropped by policy (a prefix).
    start = marks[0][0]
    assert t.read(0).select(["log_offset", "key", "value"]) == rows[0].slice(start)
    assert t.read(1).select(["log_offset", "key", "value"]) == rows[1]

    run_to_end(catalog_spec, "maintain", "db.r", 2 * one_file, 0, directory=tmp_path, name="rerun")
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (9, 15), 1: (0, 3)}
    assert t.read(0).select(["log_offset", "key", "value"]) == rows[0].slice(9)
    assert check_contiguity(t.table(), deep=True).ok
    assert t.append({0: [{"key": "next"}]}).ranges == {0: (15, 16)}  # offsets are never reused
    assert_cleanup_removes_exactly_the_orphans(catalog, t, left, point, writes_data=False)


@pytest.mark.parametrize("point", faults.POINTS)
def test_i1_i7_kill_9_mid_compaction_then_a_rerun_converges(heavy_spec, tmp_path, point):
    catalog_spec = heavy_spec  # PostgreSQL's run in make test-slow: the kill -9 mid-commit test covers its swap
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.c", partitions=1)
    fill(t, 0, 9, 2)
    rows = t.read(0).select(["log_offset", "key", "value"])

    left = kill_9(catalog_spec, point, "maintain", "db.c", 0, 1, directory=tmp_path, table=t)

    landed = point == faults.AFTER_CATALOG_SWAP
    assert len(files_by_partition(t.table())[0]) == (1 if landed else 9)
    assert check_contiguity(t.table(), deep=True).ok
    assert t.read(0).select(["log_offset", "key", "value"]) == rows

    run_to_end(catalog_spec, "maintain", "db.c", 0, 1, directory=tmp_path, name="rerun")
    assert len(files_by_partition(t.table())[0]) == 1
    assert t.read(0).select(["log_offset", "key", "value"]) == rows
    assert check_contiguity(t.table(), deep=True).ok
    assert_cleanup_removes_exactly_the_orphans(catalog, t, left, point, writes_data=True)


# --- the harness itself ----------------------------------------------------------------------------


def test_kill_at_drains_a_chatty_childs_pipes_until_its_fault_point(tmp_path):
    """A child that writes more than a pipe holds before its fault point still gets there."""
    pause = tmp_path / "paused"
    code = (
        "import os, sys, time\n"
        "sys.stdout.write('x' * 1_000_000); sys.stdout.flush()\n"
        "sys.stderr.write('y' * 1_000_000); sys.stderr.flush()\n"
        f"open({str(pause)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_at(proc, str(pause), timeout=60)
    assert proc.returncode == -signal.SIGKILL and proc.stdout.closed and proc.stderr.closed

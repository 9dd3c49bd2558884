"""The atomic multi-table commit (I5): several tables' pointers swap in one database transaction."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest

from icelog.storage.core import faults
from icelog.storage.core.commit import commit_tables, was_committed
from icelog.storage.core.swap import load_tables
from icelog.storage.errors import AtomicCommitUnsupported
from icelog.storage.log.state import LogState
from icelog.storage.log.table import AppendRequest, LogTable
from tests.support.catalogs import forwarding_catalog
from tests.support.interleave import Interleaved
from tests.support.workers.multi_table import two_table_append

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def payload(tag: str) -> pa.Table:
    return pa.table({"key": [tag], "value": [tag]})


def fingerprint(t: LogTable) -> tuple:
    table = t.table()
    return table.metadata_location, {p: (w.start, w.end) for p, w in t.watermarks().items()}


def test_i5_two_tables_commit_together_and_record_the_commit_id(catalog):
    a, b = LogTable.create(catalog, "db.a", 1), LogTable.create(catalog, "db.b", 2)
    outcomes = two_table_append(catalog, a.identifier, b.identifier, "t1", commit_id="txn-1")
    assert [o.result.ranges for o in outcomes] == [{0: (0, 1)}, {0: (0, 1)}]
    for t in (a, b):
        metadata = t.table().metadata
        assert was_committed(t.table(), "txn-1")
        assert metadata.current_snapshot().summary.additional_properties["icelog.commit-id"] == "txn-1"
    # Re-sent after an unknown outcome: found in the tables, nothing written twice.
    again = two_table_append(catalog, a.identifier, b.identifier, "t1", commit_id="txn-1")
    assert all(o.already_committed for o in again) and [o.result.ranges for o in again] == [{0: (0, 1)}, {0: (0, 1)}]
    assert a.watermarks()[0].end == b.watermarks()[0].end == 1


def test_i5_a_lost_race_on_one_table_applies_nothing_anywhere(catalog):
    a, b = LogTable.create(catalog, "db.a", 1), LogTable.create(catalog, "db.b", 1)
    version_a = int(a.table().metadata.properties["icelog.version"])

    def competing() -> None:  # moves b after the decision
        b.append({0: [{"key": "rival"}]})

    racing = Interleaved(AppendRequest(a.identifier, {0: payload("x")}, {}, "txn"), competing)
    outcomes = commit_tables(
        catalog,
        [(a.identifier, racing), (b.identifier, AppendRequest(b.identifier, {0: payload("x")}, {}, "txn"))],
        commit_id="txn",
    )
    assert len(racing.decisions) == 2 and outcomes[0].attempts == 2
    # Had the first, lost attempt moved table a, the retry would have found the id there and
    # returned without ever writing b.
    assert int(a.table().metadata.properties["icelog.version"]) == version_a + 1
    assert a.read(0).column("key").to_pylist() == ["x"]
    assert b.read(0).column("key").to_pylist() == ["rival", "x"]


@pytest.mark.fault
def test_i5_kill_between_two_tables_swaps_leaves_neither(catalog_spec):
    catalog = catalog_spec.open()
    a, b = LogTable.create(catalog, "db.a", 1), LogTable.create(catalog, "db.b", 1)
    before = (fingerprint(a), fingerprint(b))
    marker = os.path.join(str(catalog_spec.warehouse).removeprefix("file://"), "paused")
    env = {**os.environ, "ICELOG_PAUSE_AT": faults.BETWEEN_TABLE_SWAPS, "ICELOG_PAUSE_FILE": marker}
    spec = json.dumps(dataclasses.asdict(catalog_spec))
    with open(marker + ".log", "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.workers.multi_table", spec, a.identifier, b.identifier, "killed"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while not os.path.exists(marker) and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.path.exists(marker), open(marker + ".log").read()[-3000:]
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
    # The database transaction died with the process: neither table moved, and nothing is locked.
    assert (fingerprint(a), fingerprint(b)) == before
    outcomes = two_table_append(catalog, a.identifier, b.identifier, "after", commit_id="after")
    assert [o.result.ranges for o in outcomes] == [{0: (0, 1)}, {0: (0, 1)}]
    assert a.read(0).column("key").to_pylist() == b.read(0).column("key").to_pylist() == ["after"]


def test_i5_consistent_reads_never_see_half_a_commit(sqlite_catalog):
    a, b = LogTable.create(sqlite_catalog, "db.a", 1), LogTable.create(sqlite_catalog, "db.b", 1)
    done, seen, errors = threading.Event(), [], []

    def reader() -> None:
        while not done.is_set():
            try:
                tables = load_tables(sqlite_catalog, [a.identifier, b.identifier])
            except Exception as e:  # a reader must never fail because a writer commits
                errors.append(repr(e))
                continue
            ends = [LogState.from_metadata(t.metadata).end(0) for t in tables.values()]
            seen.append(tuple(ends))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            two_table_append(sqlite_catalog, a.identifier, b.identifier, f"t{i}", commit_id=f"t{i}")
    finally:
        done.set()
        thread.join()
    assert not errors
    assert len(seen) > 10 and all(x == y for x, y in seen), [s for s in seen if s[0] != s[1]][:5]


def test_i5_catalog_without_atomic_multi_table_commit_is_refused_and_nothing_changes(sqlite_catalog):
    a, b = LogTable.create(sqlite_catalog, "db.a", 1), LogTable.create(sqlite_catalog, "db.b", 1)
    before = (fingerprint(a), fingerprint(b))
    proxy = forwarding_catalog(sqlite_catalog)
    with pytest.raises(AtomicCommitUnsupported) as caught:
        two_table_append(proxy, a.identifier, b.identifier, "x")
    assert "proxy" in str(caught.value)
    assert (fingerprint(a), fingerprint(b)) == before
    # One table alone is fine on such a catalog.
    assert commit_tables(proxy, [(a.identifier, AppendRequest(a.identifier, {0: payload("y")}, {}, "one"))])[0].result.ranges == {
        0: (0, 1)
    }


def test_i5_every_table_of_one_commit_shares_one_snapshot_timestamp(sqlite_catalog):
    tables = [LogTable.create(sqlite_catalog, f"db.t{i}", 1) for i in range(3)]
    parts = [(t.identifier, AppendRequest(t.identifier, {0: payload("x")}, {}, "txn-ts")) for t in tables]
    outcomes = commit_tables(sqlite_catalog, parts, commit_id="txn-ts")
    stamps = set()
    for t, outcome in zip(tables, outcomes, strict=False):
        metadata = t.table().metadata
        snapshot = metadata.snapshot_by_id(outcome.snapshot_id)
        assert metadata.snapshot_log[-1].snapshot_id == snapshot.snapshot_id
        stamps |= {snapshot.timestamp_ms, metadata.snapshot_log[-1].timestamp_ms}
    assert len(stamps) == 1  # an as-of cut at any millisecond sees all three or none


def test_i1_a_commit_refused_at_sqlites_commit_by_a_reader_is_acknowledged_only_once_durable(sqlite_catalog):
    """A reader holding SQLite's shared lock makes the swap's COMMIT fail ("database is locked").
    The driver kept that transaction open on the pooled connection, so the commit-id lookup read
    its own uncommitted pointer and acknowledged a commit that was then lost. Every acknowledged
    row must be durable: read back through a connection of its own once the reader is gone."""
    import sqlite3

    from icelog.storage.core.catalog import LogSqlCatalog

    t = LogTable.create(sqlite_catalog, "db.e", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    database = sqlite_catalog.properties["uri"].removeprefix("sqlite:///")
    holding = threading.Event()

    def read_slowly() -> None:
        con = sqlite3.connect(database, isolation_level=None)
        con.execute("BEGIN")
        con.execute("SELECT count(*) FROM iceberg_tables").fetchall()  # SHARED: a COMMIT needs EXCLUSIVE
        holding.set()
        time.sleep(7)
        con.execute("ROLLBACK")
        con.close()

    reader = threading.Thread(target=read_slowly)
    reader.start()
    assert holding.wait(10)
    acknowledged = t.append({0: [{"key": "b", "value": "2"}]})
    reader.join()
    fresh = LogSqlCatalog(sqlite_catalog.name, **{k: v for k, v in sqlite_catalog.properties.items() if k != "type"})
    assert acknowledged.ranges == {0: (1, 2)}
    assert LogTable.open(fresh, "db.e").watermarks()[0].end == 2

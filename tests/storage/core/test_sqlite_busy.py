"""SQLite's "database is locked" in a commit's pointer swap is a definite no, never an unknown outcome.

Another process in a read transaction holds SHARED on the catalog database; a writer's COMMIT
needs EXCLUSIVE and fails with SQLITE_BUSY once its busy timeout runs out. Such a COMMIT wrote
nothing (the transaction stays open until the connection closes), so the commit core deletes
what the attempt staged and tries again: no commit-id lookup, no file left in doubt (I2, I4).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys

import pyarrow as pa
import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from icelog.storage.core import faults
from icelog.storage.core.commit import commit, commit_tables, find_commit
from icelog.storage.core.registry import NOT_FOUND
from icelog.storage.core.swap import _locked_out
from icelog.storage.errors import CatalogBusy, CommitOutcomeUnknown, TransientError
from icelog.storage.log.table import AppendRequest, LogTable

BUSY_TIMEOUT_MS = 100  # the driver's default is 5 s: each refused attempt would wait that long

HOLD_SHARED = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN")
con.execute("SELECT count(*) FROM iceberg_tables").fetchall()  # SHARED until the transaction ends
print("holding", flush=True)
sys.stdin.readline()  # until the test closes our stdin
con.execute("ROLLBACK")
"""


class Reader:
    """Another process in a read transaction on the catalog database, until :meth:`release`."""

    def __init__(self, database: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLD_SHARED, database], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline().strip() == "holding"

    def release(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            assert self.process.wait(timeout=30) == 0
            self.process.stdout.close()


@contextlib.contextmanager
def reader(database: str):
    held = Reader(database)
    try:
        yield held
    finally:
        held.release()


def short_busy_timeout(catalog) -> None:
    """The catalog's connections give up on a lock after BUSY_TIMEOUT_MS (new connections only)."""
    event.listen(catalog.engine, "connect", lambda dbapi, _: dbapi.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}"))
    catalog.engine.dispose()


def payload(tag: str) -> pa.Table:
    return pa.table({"key": [tag], "value": [tag]})


def files_under(location: str) -> set[str]:
    root = location.removeprefix("file://")
    return {os.path.join(d, f) for d, _, names in os.walk(root) for f in names}


def pointer(spec, identifier: str) -> str:
    """The table's metadata pointer as a connection of its own reads it: only what is durable."""
    return spec.open().load_table(identifier).metadata_location


def test_i2_a_swap_refused_by_a_readers_lock_until_the_deadline_wrote_nothing_and_is_not_unknown(sqlite_spec):
    catalog = sqlite_spec.open()
    short_busy_timeout(catalog)
    t = LogTable.create(catalog, "db.e", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    location, before = t.table().metadata.location, pointer(sqlite_spec, t.identifier)
    files = files_under(location)
    request = AppendRequest(t.identifier, {0: payload("b")}, {}, "c1")

    with reader(catalog.properties["uri"].removeprefix("sqlite:///")):
        with pytest.raises(TransientError) as refused:
            commit(catalog, t.identifier, request, commit_id="c1", deadline_s=1.0)

    assert not isinstance(refused.value, CommitOutcomeUnknown), refused.value
    assert isinstance(refused.value, CatalogBusy) and "database is locked" in str(refused.value)
    assert pointer(sqlite_spec, t.identifier) == before
    assert files_under(location) == files  # no data, manifest or metadata file left behind
    assert find_commit(catalog.load_table(t.identifier), "c1") is NOT_FOUND

    # The same request again (as the caller of a TransientError does): it lands, once.
    again = commit(catalog, t.identifier, AppendRequest(t.identifier, {0: payload("b")}, {}, "c1"), commit_id="c1")
    assert again.result.ranges == {0: (1, 2)} and not again.result.duplicate
    assert commit(
        catalog, t.identifier, AppendRequest(t.identifier, {0: payload("b")}, {}, "c1"), commit_id="c1"
    ).result.duplicate
    assert LogTable.open(sqlite_spec.open(), t.identifier).read(0).column("key").to_pylist() == ["a", "b"]


def test_i5_a_refused_multi_table_swap_moves_no_table_and_lands_whole_once(sqlite_spec):
    catalog = sqlite_spec.open()
    short_busy_timeout(catalog)
    tables = [LogTable.create(catalog, f"db.t{i}", 1) for i in range(2)]
    before = [pointer(sqlite_spec, t.identifier) for t in tables]

    def parts():
        return [(t.identifier, AppendRequest(t.identifier, {0: payload("x")}, {}, "txn")) for t in tables]

    with reader(catalog.properties["uri"].removeprefix("sqlite:///")):
        with pytest.raises(CatalogBusy) as refused:
            commit_tables(catalog, parts(), commit_id="txn", deadline_s=0.5)
    assert refused.value.table == "db.t0,db.t1"
    assert [pointer(sqlite_spec, t.identifier) for t in tables] == before

    outcomes = commit_tables(catalog, parts(), commit_id="txn")
    assert [o.result.ranges for o in outcomes] == [{0: (0, 1)}, {0: (0, 1)}]
    assert all(o.result.duplicate for o in commit_tables(catalog, parts(), commit_id="txn"))
    assert [LogTable.open(sqlite_spec.open(), t.identifier).watermarks()[0].end for t in tables] == [1, 1]


def test_i4_the_attempt_after_a_refused_swap_lands_exactly_once_and_leaves_no_orphan(sqlite_spec, monkeypatch):
    """Deterministic: the reader holds its lock through the first attempt's swap and lets go
    once the second attempt has written its metadata file, right before its swap."""
    catalog = sqlite_spec.open()
    short_busy_timeout(catalog)
    t = LogTable.create(catalog, "db.e", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    snapshots = len(t.table().metadata.snapshots)
    database = catalog.properties["uri"].removeprefix("sqlite:///")
    swaps_started = []
    checkpoint = faults.checkpoint

    def release_on_second_swap(point: str) -> None:
        checkpoint(point)
        if point == faults.AFTER_METADATA_WRITE:
            swaps_started.append(point)
            if len(swaps_started) == 2:
                held.release()

    monkeypatch.setattr(faults, "checkpoint", release_on_second_swap)
    with reader(database) as held:
        outcome = commit(catalog, t.identifier, AppendRequest(t.identifier, {0: payload("b")}, {}, "c1"), commit_id="c1")
    monkeypatch.undo()

    assert len(swaps_started) == 2 and outcome.attempts == 2
    assert outcome.result.ranges == {0: (1, 2)} and not outcome.result.duplicate
    table = sqlite_spec.open().load_table(t.identifier)
    assert len(table.metadata.snapshots) == snapshots + 1
    assert find_commit(table, "c1") is not NOT_FOUND
    assert LogTable.open(sqlite_spec.open(), t.identifier).read(0).column("key").to_pylist() == ["a", "b"]
    # The refused attempt's files were deleted: every file is one the table's metadata names.
    io = table.io
    named = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    for snapshot in table.metadata.snapshots:
        named.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            named.add(manifest.manifest_path)
            named |= {e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=False)}
    assert files_under(table.metadata.location) == {p.removeprefix("file://") for p in named}


def test_only_sqlites_lock_errors_are_a_definite_no(tmp_path):
    """Any other database error in a swap (a PostgreSQL connection lost during COMMIT, a disk
    I/O error) may have landed: it stays an unknown outcome."""
    database = str(tmp_path / "x.db")
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    writer = sqlite3.connect(database, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as busy:
        writer.execute("INSERT INTO t VALUES (1)")
    holder.execute("ROLLBACK")
    with pytest.raises(sqlite3.OperationalError) as other:
        writer.execute("SELECT * FROM no_such_table")
    assert _locked_out(OperationalError("COMMIT", {}, busy.value))
    assert not _locked_out(OperationalError("SELECT", {}, other.value))
    assert not _locked_out(
        OperationalError("COMMIT", {}, sqlite3.OperationalError("database is locked"))
    )  # no code: not SQLite's
    assert not _locked_out(OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly")))

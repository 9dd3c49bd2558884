"""The ingest ledger's decisions (load, skip with a reason, refuse) and its durable entries."""

from __future__ import annotations

import datetime as dt

import pytest

from icelog.storage.core.commit import commit_tables
from icelog.storage.errors import SourceFileChanged
from icelog.storage.ingest import ledger
from icelog.storage.log.files import write_log_files


def source(tmp_path, name: str, content: bytes) -> ledger.SourceFile:
    path = tmp_path / name
    path.write_bytes(content)
    return ledger.SourceFile.stat(str(path))


def record(catalog, table: str, files, partitions=None, parts_total: int = 2):
    """Commit ledger rows for ``files`` (as an ingest would, without the data table)."""
    ledger.ensure_ledger(catalog)
    book = catalog.load_table(ledger.LEDGER_TABLE)
    loaded = [f.with_fingerprint() for f in files]
    ranges = {f.path: {0: [[i * 10, i * 10 + 10]]} for i, f in enumerate(loaded)}
    parts = {f.path: set(range(parts_total)) if partitions is None else set(partitions) for f in loaded}
    rows = ledger.ledger_rows(table, loaded, ranges, parts, parts_total, "run", "c1", dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    commit_tables(
        catalog, [(ledger.LEDGER_TABLE, ledger.LedgerAppend(tuple(write_log_files(book, {table: rows})), rows.num_rows))]
    )
    return ledger.entries(catalog.load_table(ledger.LEDGER_TABLE), table)


def test_i4_loaded_files_are_skipped_at_any_age_and_new_ones_load(catalog, tmp_path):
    a, b = source(tmp_path, "a.parquet", b"aaaa"), source(tmp_path, "b.parquet", b"bbbb")
    book = record(catalog, "db.t", [a])
    assert book[a.path][0].ranges == {"0": [[0, 10]]} and book[a.path][0].rows == 10
    planned = ledger.plan("db.t", [a, b], book, {0, 1})
    assert [f.path for f in planned.load] == [b.path] and planned.load[0].fingerprint.startswith("sha256:")
    assert [(s["path"], s["reason"], s["run_key"]) for s in planned.skipped] == [(a.path, "already loaded", "run")]
    assert ledger.plan(
        "db.other", [a], ledger.entries(catalog.load_table(ledger.LEDGER_TABLE), "db.other"), {0}
    ).load  # per table


def test_i4_touched_file_is_skipped_changed_file_refused_or_reloaded(catalog, tmp_path):
    import os

    a = source(tmp_path, "a.parquet", b"aaaa")
    book = record(catalog, "db.t", [a])
    os.utime(a.path, ns=(1, 1))
    touched = ledger.plan("db.t", [ledger.SourceFile.stat(a.path)], book, {0, 1})
    assert not touched.load and "touched" in touched.skipped[0]["reason"]
    (tmp_path / "a.parquet").write_bytes(b"AAAA!")
    changed = ledger.SourceFile.stat(a.path)
    with pytest.raises(SourceFileChanged) as refused:
        ledger.plan("db.t", [changed], book, {0, 1})
    assert refused.value.path == a.path and refused.value.loaded_fingerprint != refused.value.fingerprint
    assert [f.path for f in ledger.plan("db.t", [changed], book, {0, 1}, reload_changed=True).load] == [a.path]
    # Same size and time but new content: found only when asked to verify.
    (tmp_path / "a.parquet").write_bytes(b"aaaa")
    os.utime(a.path, ns=(a.mtime_ns, a.mtime_ns))
    book = record(catalog, "db.u", [ledger.SourceFile.stat(a.path)])
    (tmp_path / "a.parquet").write_bytes(b"zzzz")
    os.utime(a.path, ns=(a.mtime_ns, a.mtime_ns))
    same_stat = ledger.SourceFile.stat(a.path)
    assert ledger.plan("db.u", [same_stat], book, {0, 1}).skipped
    with pytest.raises(SourceFileChanged):
        ledger.plan("db.u", [same_stat], book, {0, 1}, verify=True)


def test_partial_load_leaves_the_rest_of_the_file_to_load(catalog, tmp_path):
    a = source(tmp_path, "a.parquet", b"aaaa")
    book = record(catalog, "db.t", [a], partitions=[1], parts_total=3)
    assert book[a.path][0].partitions == (1,)
    rest = ledger.plan("db.t", [a], book, {0, 1, 2})
    assert rest.partitions[a.path] == {0, 2}
    assert not ledger.plan("db.t", [a], book, {1}).load


def test_carried_rows_roll_forward_once_by_commit_id(sqlite_catalog, tmp_path):
    """A data commit carrying its ledger rows in its receipt (the REST path, driven here on
    SQLite): the roll-forward adds them exactly once, the same rows, and the append's own
    receipt and history stay readable beside them."""
    import pyarrow as pa

    from icelog.storage.core.commit import commit, find_commit, load
    from icelog.storage.core.state import SystemState
    from icelog.storage.log.table import AppendRequest, LogTable
    from icelog.validations.history import commit_log

    t = LogTable.create(sqlite_catalog, "db.t", 2)
    ledger.ensure_ledger(sqlite_catalog)
    a, b = (f.with_fingerprint() for f in (source(tmp_path, "a", b"aa"), source(tmp_path, "b", b"bb")))
    ranges = {a.path: {0: [[0, 2]]}, b.path: {1: [[0, 1]]}}
    when = dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    rows = ledger.ledger_rows("db.t", [a, b], ranges, {a.path: {0, 1}, b.path: {1}}, 2, None, "c1", when)
    data = AppendRequest("db.t", t.conform({0: pa.table({"key": ["x", "y"], "value": ["1", "2"]})}), {0: 0}, "c1")
    appended = commit(sqlite_catalog, "db.t", ledger.carrying(data, rows), commit_id="c1")
    assert appended.result.ranges == {0: (0, 2)}
    receipt, _ = find_commit(t.table(), "c1")
    assert ledger.carrying(data, rows).from_receipt(receipt).ranges == {0: (0, 2)}
    assert [e.rows for e in commit_log(t.table()) if e.commit_id == "c1"] == [2]

    assert ledger.entries(load(sqlite_catalog, ledger.LEDGER_TABLE), "db.t") == {}
    assert ledger.roll_forward(sqlite_catalog, t.table(), "db.t") == {"c1": 2}
    book = load(sqlite_catalog, ledger.LEDGER_TABLE)
    assert book.scan().to_arrow().sort_by("path").to_pylist() == rows.sort_by("path").to_pylist()
    assert ledger.roll_forward(sqlite_catalog, t.table(), "db.t") == {}  # found in the ledger's registry
    # Past the ledger registry's window the id is found in the ledger's rows: nothing to write.
    request = ledger.LedgerRollForward("db.t", "c1", rows)
    assert not request.decide(SystemState.from_metadata(book.metadata), book).write
    assert ledger.LedgerRollForward("db.t", "c2", rows).decide(SystemState.from_metadata(book.metadata), book).write


def test_i4_roll_forward_goes_on_when_registry_files_are_gone(sqlite_catalog, tmp_path, monkeypatch):
    """A foreign orphan cleanup deleted a listed registry file of the data table and one of the
    ledger's: rolling the ledger forward (every ingest plan on a non-atomic catalog) neither
    wedges nor records a commit twice. The data table's gone entries are left out, the ledger's
    rows judge an id its registry cannot prove, and the ledger's next commit drops its gone file."""
    import pyarrow as pa

    from icelog.storage.core import registry
    from icelog.storage.core.commit import commit, load
    from icelog.storage.log.table import AppendRequest, LogTable

    monkeypatch.setattr(registry, "TAIL_BYTES", 300)
    registry.clear_cache()
    t = LogTable.create(sqlite_catalog, "db.t", 1)
    ledger.ensure_ledger(sqlite_catalog)
    when = dt.datetime(2020, 1, 2, tzinfo=dt.UTC)

    def data_commit(i: int) -> tuple[str, pa.Table]:
        f = source(tmp_path, f"f{i}", f"file {i}".encode()).with_fingerprint()
        rows = ledger.ledger_rows("db.t", [f], {f.path: {0: [[i, i + 1]]}}, {f.path: {0}}, 1, None, f"c{i}", when)
        data = AppendRequest("db.t", t.conform({0: pa.table({"key": [str(i)], "value": [str(i)]})}), {0: i}, f"c{i}")
        commit(sqlite_catalog, "db.t", ledger.carrying(data, rows), commit_id=f"c{i}", resent=False)  # as ingest sends
        return f"c{i}", rows

    for i in range(10):
        ledger.record(sqlite_catalog, "db.t", *data_commit(i))

    def listed(identifier: str) -> list[str]:
        files = registry.file_list(load(sqlite_catalog, identifier).metadata)
        return files.paths() if files else []

    gone = [listed("db.t")[0], listed(ledger.LEDGER_TABLE)[0]]
    for identifier, path in zip(("db.t", ledger.LEDGER_TABLE), gone, strict=True):
        load(sqlite_catalog, identifier).io.delete(path)
    registry.clear_cache()
    assert ledger.roll_forward(sqlite_catalog, load(sqlite_catalog, "db.t"), "db.t") == {}  # all recorded once

    killed, rows = data_commit(10)  # killed before its ledger commit
    assert ledger.roll_forward(sqlite_catalog, load(sqlite_catalog, "db.t"), "db.t") == {killed: 1}
    assert gone[0] not in listed("db.t") and gone[1] not in listed(ledger.LEDGER_TABLE)  # their next commits dropped them
    book = ledger.entries(load(sqlite_catalog, ledger.LEDGER_TABLE), "db.t")
    assert sorted(len(v) for v in book.values()) == [1] * 11
    registry.clear_cache()

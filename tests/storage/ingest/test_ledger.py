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

"""An append's manifest merge: pyiceberg's bins, without a thread handoff per untouched bin."""

from __future__ import annotations

import pytest
from pyiceberg.utils.concurrent import ExecutorFactory

from icelog.storage.core import commit as commit_module
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity


def rows(i: int) -> list[dict]:
    return [{"key": f"k{i}", "value": "v"}]


def handoffs(monkeypatch, t: LogTable, i: int) -> int:
    """Tasks one append gives pyiceberg's thread pool."""
    pool = ExecutorFactory.get_or_create()
    real, given = pool.submit, []
    monkeypatch.setattr(pool, "submit", lambda *a, **k: given.append(1) or real(*a, **k))
    t.append({0: rows(i)})
    monkeypatch.setattr(pool, "submit", real)
    return len(given)


def test_an_appends_thread_handoffs_do_not_grow_with_its_full_manifests(catalog, monkeypatch):
    """Every manifest is past this target, so each is a bin of its own that no merge touches:
    an append on 40 of them hands the pool no more tasks than one on 2 (pyiceberg gave it one
    per bin: 38 more)."""
    props = {"commit.manifest.target-size-bytes": "1024"}
    short, long = (LogTable.create(catalog, f"db.{n}", 1, properties=props) for n in ("short", "long"))
    short.append({0: rows(0)})
    for i in range(39):
        long.append({0: rows(i)})
    assert len(long.table().current_snapshot().manifests(long.table().io)) == 39
    assert handoffs(monkeypatch, long, 39) == handoffs(monkeypatch, short, 1)
    assert len(long.table().current_snapshot().manifests(long.table().io)) == 40
    assert check_contiguity(long.table()).ok


@pytest.mark.parametrize("target", [12 * 1024, 64 * 1024])
def test_the_merge_keeps_pyicebergs_bins(catalog, monkeypatch, target):
    """The same appends under pyiceberg's own merge and under this one give, snapshot after
    snapshot, the same manifests: how many, and how many files each adds and keeps."""
    props = {"commit.manifest.target-size-bytes": str(target), "commit.manifest.min-count-to-merge": "5"}
    ours = LogTable.create(catalog, "db.ours", 1, properties=props)
    theirs = LogTable.create(catalog, "db.theirs", 1, properties=props)

    def shape(t: LogTable) -> list[tuple[int, int]]:
        table = t.table()
        return [(m.added_files_count, m.existing_files_count) for m in table.current_snapshot().manifests(table.io)]

    merged = 0
    for i in range(60):
        ours.append({0: rows(i)})
        with monkeypatch.context() as m:
            m.setattr(commit_module, "merge_in_caller", lambda producer: None)
            theirs.append({0: rows(i)})
        assert shape(ours) == shape(theirs), i
        merged += any(existing for _, existing in shape(ours))
    assert merged  # merges happened
    assert check_contiguity(ours.table()).ok

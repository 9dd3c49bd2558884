"""Liveness of slow commits (``storage.core.commit`` step 7): an exclusive request (compaction,
retention) that keeps losing to appends takes the table's lease; other commits wait for it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

import pytest
import structlog

import icelog.storage.core.commit as core
from icelog.storage.core.commit import EXCLUSIVE_AFTER, Decision, commit
from icelog.storage.errors import CommitConflict, InvalidInput
from icelog.storage.log.maintenance import Compaction, Retention
from icelog.storage.log.table import LogTable
from icelog.storage.properties import LEASE
from icelog.validations.contiguity import check_contiguity
from tests.support.processes import worker_processes


class Contested:
    """Wraps an exclusive request: every decision is followed by a competing append in a thread.

    Without the lease the competitor is waited for, so the decision's swap is bound to lose.
    With our lease in the base, the competitor is given ``grace`` seconds and then left
    running: ``blocked`` records whether it was still waiting (it must be: the lease is ours).
    """

    def __init__(self, inner: Any, competitor: Callable[[], None], grace: float = 0.5, with_lease: str = "") -> None:
        self.inner, self.competitor, self.grace, self.with_lease = inner, competitor, grace, with_lease
        self.threads: list[threading.Thread] = []
        self.blocked: list[bool] = []

    def decide(self, state, table):
        decision = self.inner.decide(state, table)
        leased = bool(table.metadata.properties.get(LEASE))
        if leased and self.with_lease == "give up":
            raise InvalidInput(reason="the holder gives up")
        if leased and self.with_lease == "nothing to do":
            return Decision(state=state, result=None, write=False)
        thread = threading.Thread(target=self.competitor)
        thread.start()
        self.threads.append(thread)
        thread.join(self.grace if leased else None)
        if leased:
            self.blocked.append(thread.is_alive())
        return decision

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "competitor", "grace", "with_lease", "threads", "blocked"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def small_files(log_table: LogTable, n: int) -> None:
    for i in range(n):
        log_table.append({0: [{"key": f"k{i}", "value": f"v{i}"}]})


def late_appender(log_table: LogTable) -> Callable[[], None]:
    count = iter(range(10**6))
    return lambda: log_table.append({0: [{"key": "late", "value": f"late{next(count)}"}]})


def test_compaction_losing_every_race_takes_the_lease_and_lands(catalog, monkeypatch):
    monkeypatch.setattr(core, "LEASE_TTL_S", 600.0)  # a waiter must go on when the lease ends, not when it expires
    t = LogTable.create(catalog, "db.t", partitions=1)
    small_files(t, 10)
    request = Contested(Compaction("db.t"), late_appender(t))
    outcome = commit(catalog, "db.t", request, max_attempts=EXCLUSIVE_AFTER + 3)
    for thread in request.threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert outcome.attempts == EXCLUSIVE_AFTER + 1
    assert request.blocked == [True]  # while the lease was held, the competing append waited
    assert outcome.result == {"rewritten_files": 10, "new_files": 1}  # the runs fixed at the first decision
    values = t.read(0)["value"].to_pylist()
    assert values[:10] == [f"v{i}" for i in range(10)]
    assert sorted(values[10:]) == sorted(f"late{i}" for i in range(EXCLUSIVE_AFTER + 1))  # each once
    assert t.table().metadata.properties[LEASE] == ""  # the holder's commit ended the lease
    assert check_contiguity(t.table(), deep=True).ok


def test_without_the_lease_an_exclusive_request_starves(catalog, monkeypatch):
    """The same contest with exclusivity off: every race lost (what the lease is for)."""
    monkeypatch.setattr(Compaction, "exclusive", False)
    t = LogTable.create(catalog, "db.t", partitions=1)
    small_files(t, 10)
    request = Contested(Compaction("db.t"), late_appender(t))
    with pytest.raises(CommitConflict):
        commit(catalog, "db.t", request, max_attempts=EXCLUSIVE_AFTER + 3)
    assert len(t.read(0)) == 10 + EXCLUSIVE_AFTER + 3


@pytest.mark.parametrize("ending", ["give up", "nothing to do"])
def test_a_holder_that_ends_without_committing_releases_the_lease(catalog, ending):
    t = LogTable.create(catalog, "db.t", partitions=1)
    small_files(t, 10)
    request = Contested(Retention("db.t", retention_bytes=1), late_appender(t), with_lease=ending)
    if ending == "give up":
        with pytest.raises(InvalidInput):
            commit(catalog, "db.t", request)
    else:
        assert commit(catalog, "db.t", request).already_committed  # nothing written
    assert t.table().metadata.properties[LEASE] == ""
    assert len(t.read(0)) == 10 + EXCLUSIVE_AFTER  # retention changed nothing


def test_a_dead_holders_lease_stalls_writers_until_it_expires(catalog, monkeypatch):
    monkeypatch.setattr(core, "LEASE_TTL_S", 1.5)
    t = LogTable.create(catalog, "db.t", partitions=1)
    assert core._take_lease(catalog, [t.table()], "a-dead-compaction", structlog.get_logger())
    expiry = float(t.table().metadata.properties[LEASE].split()[1]) / 1000
    result = t.append({0: [{"key": "k"}]}, {0: 0})
    assert time.time() >= expiry  # it waited the lease out, then appended where it expected
    assert result.ranges[0] == (0, 1) and t.table().metadata.properties[LEASE] == ""


def test_a_lease_further_ahead_than_the_ttl_is_ignored():
    """A holder's clock far ahead must not stall writers for longer than the TTL."""

    class Meta:
        properties = {LEASE: f"other {int((time.time() + 10 * core.LEASE_TTL_S) * 1000)}"}

    assert core._lease_wait(Meta, "me") == 0.0
    Meta.properties = {LEASE: f"other {int((time.time() + core.LEASE_TTL_S / 2) * 1000)}"}
    assert 0 < core._lease_wait(Meta, "me") <= core.LEASE_TTL_S / 2
    assert core._lease_wait(Meta, "other") == 0.0  # its own lease
    for hostile in ("", "other", "other soon", "other nan", "other inf", "other 1e999", " 123"):  # set by hand: no lease
        Meta.properties = {LEASE: hostile}
        assert core._lease_wait(Meta, "me") == 0.0


def test_compaction_lands_beside_processes_appending_as_fast_as_they_can(heavy_spec, tmp_path):
    """Real processes appending back to back; compaction must not lose every race (before the
    lease and the runs fixed at the first decision, it lost 30 in a row over ~90 s)."""
    t = LogTable.create(heavy_spec.open(), "db.hot", partitions=1)
    small_files(t, 30)
    workers = [["append_loop", "db.hot", "0", "300", f"w{i}"] for i in range(2)]
    with worker_processes(heavy_spec, workers, tmp_path) as procs:
        while t.watermarks()[0].end < 40 and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        outcome = commit(heavy_spec.open(), "db.hot", Compaction("db.hot"), max_attempts=30)
        for proc in procs:
            assert proc.wait(timeout=600) == 0, (tmp_path / "worker0.err").read_text()[-3000:]
    assert outcome.result["rewritten_files"] >= 30
    values = Counter(t.read(0)["value"].to_pylist())
    assert all(values[f"w{i}-{n}"] == 1 for i in range(2) for n in range(300)) and len(values) == 30 + 600
    assert check_contiguity(t.table(), deep=True).ok

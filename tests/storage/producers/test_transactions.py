"""Transactions (I5 atomic transactions; also I1, I2, I7, I8, I9, I10): kill -9 at every named
point, consistent readers, racing transactions, zombies, timeouts, exactly-once copying,
expected offsets, catalogs without atomic commits. The named Kafka and Jepsen cases (a delayed commit
of transaction N, late appends, epochs at their bound, ...) are ``tests/chaos/test_scenarios.py``.

The harness (worker processes killed at a fault point, their events, the all-or-nothing check)
is ``tests/support/transactions.py``; the worker is ``tests/support/workers/transactions.py``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import subprocess
import time
from dataclasses import replace

import pytest

from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import faults
from icelog.storage.core.swap import is_atomic
from icelog.storage.errors import (
    CatalogUnavailable,
    ExpectedOffsetRequired,
    IcelogError,
    InvalidInput,
    InvalidOffset,
    OffsetMismatch,
    PreparedFilesMissing,
    ProducerFenced,
    RecoveryIncomplete,
    StorageUnavailable,
)
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.files import local_path
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.cut import consistent_cut
from icelog.storage.producers.journal import InvalidTxnState, TransactionAborted
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.validations.checks import run_checks
from icelog.validations.sql import connect
from tests.support.catalogs import forwarding_catalog
from tests.support.transactions import (
    BEFORE_PREPARE,
    SMALL,
    check_all_or_nothing,
    commit_balanced,
    contiguous,
    events,
    journal,
    journal_states,
    kill_at,
    kill_one_transaction,
    past_timeout,
    rows,
    run_to_end,
    staged_files,
    two_tables,
    unreferenced_data_files,
    whole_transaction_reads,
    worker,
)

# --- 1. kill -9 at every named point, then recovery: all or nothing ---------------------------------


@pytest.mark.fault
@pytest.mark.timeout(180)  # a broken recovery may loop: fail, do not hang the suite
@pytest.mark.parametrize("point", faults.TXN_POINTS)
def test_i5_kill_at_every_transaction_point_then_init_transactions_finishes_all_or_nothing(heavy_spec, tmp_path, point):
    # PostgreSQL's run in make test-slow: its multi-table swap under kill -9 is the racing and copier tests'
    catalog, a, b, before, txn_id, epoch = kill_one_transaction(heavy_spec, tmp_path, point)
    producer = TransactionalProducer(catalog, "copier-1")  # the restarted instance
    assert producer.init_transactions()["epoch"] == epoch + 1
    assert coordinator.transactional_ids(catalog)["copier-1"].epoch == epoch + 1
    check_all_or_nothing(catalog, a, b, before, txn_id, point)
    # Nothing stays locked or half-done: the new instance commits its own transaction,
    # numbered right after what the log held.
    end = len(rows(a))
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "next", "value": "1"}])
        producer.send("db.b", 0, [{"key": "next", "value": "-1"}])
    assert rows(a)[-1] == (end, "next", "1") and rows(b)[-1] == (end, "next", "-1")


@pytest.mark.fault
@pytest.mark.timeout(180)  # a broken recovery may loop: fail, do not hang the suite
@pytest.mark.parametrize("point", faults.TXN_POINTS)
def test_i5_kill_at_every_transaction_point_then_recover_finishes_all_or_nothing(sqlite_spec, tmp_path, point):
    catalog, a, b, before, txn_id, _ = kill_one_transaction(sqlite_spec, tmp_path, point)
    # The killed producer never comes back. On SQL the journal never heard of a transaction
    # killed before its one swap (nothing to abort), and one killed after it had committed.
    report = tx.recover(catalog, clock=past_timeout())
    if is_atomic(catalog):
        assert report == {"rolled_forward": [], "aborted": []}
    elif point in BEFORE_PREPARE:  # its sends registered nothing
        assert report == {"rolled_forward": [], "aborted": []}
    elif point == faults.AFTER_CATALOG_SWAP:
        assert report == {"rolled_forward": [], "aborted": []}  # it had committed already
    else:
        assert report == {"rolled_forward": [txn_id], "aborted": []}
    check_all_or_nothing(catalog, a, b, before, txn_id, point)


def age(paths: list[str], seconds: float = 7_200) -> None:
    """Make files look ``seconds`` old (an hour passing, for orphan cleanup)."""
    for path in paths:
        then = time.time() - seconds
        os.utime(path, (then, then))


@pytest.mark.fault
@pytest.mark.timeout(180)
def test_i5_i7_orphan_cleanup_keeps_a_prepared_transactions_staged_files(sqlite_spec, tmp_path):
    """Killed after PREPARE_COMMIT (as versions before the SQL fast path recorded it), then an
    hour passes and `maintain` runs: the staged files are still needed (recovery rolls forward
    from them), so they are no orphans."""
    from icelog.storage.admin.maintenance import maintain

    point = faults.AFTER_TXN_PREPARE
    catalog, a, b, before, txn_id, _ = kill_one_transaction(sqlite_spec, tmp_path, point, legacy_prepare=True)
    staged = staged_files(a) + staged_files(b)
    assert len(staged) == 2
    age(staged)
    for t in (a, b):
        maintain(catalog, t.identifier)
    assert staged_files(a) + staged_files(b) == staged, "orphan cleanup deleted a prepared transaction's staged files"
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    check_all_or_nothing(catalog, a, b, before, txn_id, point, prepared=True)


@pytest.mark.fault
@pytest.mark.timeout(180)
def test_i5_i7_sql_transaction_killed_before_its_swap_leaves_only_orphans_that_cleanup_finds(sqlite_spec, tmp_path):
    """On SQL the journal hears of a transaction only in its one swap: killed just before it,
    nothing is visible, the journal holds nothing, and after an hour `maintain` deletes the
    staged files as the orphans they are (nothing will ever commit them)."""
    from icelog.storage.admin.maintenance import maintain

    point = faults.AFTER_TXN_PREPARE
    catalog, a, b, before, txn_id, _ = kill_one_transaction(sqlite_spec, tmp_path, point)
    assert journal_states(catalog, txn_id) == [] and coordinator.transactional_ids(catalog)["copier-1"].txn is None
    staged = staged_files(a) + staged_files(b)
    assert len(staged) == 2
    age(staged)
    for t in (a, b):
        maintain(catalog, t.identifier)
    assert staged_files(a) + staged_files(b) == [], "orphan cleanup missed a dead transaction's staged files"
    assert (rows(a), rows(b)) == before
    check_all_or_nothing(catalog, a, b, before, txn_id, point)


@pytest.mark.fault
@pytest.mark.timeout(180)
def test_i5_prepared_transaction_without_its_files_never_blocks_the_others(sqlite_spec, tmp_path):
    """Two producers killed after PREPARE_COMMIT (recorded as before the SQL fast path); one's staged files are deleted by hand.
    Recovery finishes the other and names the stuck one with a typed error; an operator's
    abort resolves it, and its transactional id works again."""
    catalog = sqlite_spec.open()
    a, b = two_tables(catalog)
    killed = {}
    for tid in ("lost", "intact"):
        args = {"tid": tid, "a": "db.a", "b": "db.b", "k": 5, "pause": faults.AFTER_TXN_PREPARE, "legacy_prepare": True}
        seen = kill_at(sqlite_spec, "one", args, tmp_path, tid)
        killed[tid] = next(e["txn_id"] for e in seen if e.get("event") == "begin")
    lost = [p for p in staged_files(a) + staged_files(b) if killed["lost"] in p]
    assert len(lost) == 2
    with pytest.raises(InvalidTxnState):  # every file there: it will commit, not the operator's to abort
        tx.abort(catalog, "lost", missing_files=True)
    os.remove(lost[0])

    with pytest.raises(RecoveryIncomplete) as caught:
        tx.recover(catalog, clock=past_timeout())
    assert caught.value.rolled_forward == [killed["intact"]]
    [failed] = caught.value.failed
    assert (failed["transactional_id"], failed["txn_id"], failed["error"]) == ("lost", killed["lost"], "PreparedFilesMissing")
    assert [local_path(p) for p in failed["missing"]] == [lost[0]]
    assert [r[1] for r in rows(a)] == [f"{killed['intact']}:a"]
    with pytest.raises(PreparedFilesMissing):
        TransactionalProducer(catalog, "lost").init_transactions()

    with pytest.raises(InvalidTxnState):  # a plain abort still refuses a prepared transaction
        tx.abort(catalog, "lost")
    assert tx.abort(catalog, "lost", missing_files=True) == {"transactional_id": "lost", "aborted": killed["lost"]}
    assert journal_states(catalog, killed["lost"])[-1] == "ABORTED"
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    assert staged_files(a) == staged_files(b) == []
    producer = TransactionalProducer(catalog, "lost")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "again", "value": "1"}])
    assert [r[1] for r in rows(a)] == [f"{killed['intact']}:a", "again"]
    contiguous(a)


@pytest.mark.fault
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cleaner", ["init_transactions", "recover", "recover after one without leftovers"])
def test_i5_producer_killed_right_after_its_own_abort_leaves_no_staged_file(sqlite_spec, tmp_path, cleaner):
    """The ABORTED record landed, the process died before deleting what it staged: the journal
    must remember the files, so the next init or recover deletes them. (On SQL only a transaction
    the journal registered has an ABORTED record: one with pre-written files.)"""
    catalog = sqlite_spec.open()
    a, b = two_tables(catalog)
    args = {"tid": "quitter", "a": "db.a", "b": "db.b", "pause": faults.AFTER_CATALOG_SWAP, "record": True}
    seen = kill_at(sqlite_spec, "abort", args, tmp_path, "abort")
    txn_id = next(e["txn_id"] for e in seen if e.get("event") == "begin")
    assert journal_states(catalog, txn_id)[-1] == "ABORTED" and len(staged_files(a) + staged_files(b)) == 2
    if cleaner == "recover after one without leftovers":  # a gateway's start-up recovery looks for none
        assert tx.recover(catalog, clock=past_timeout(), leftovers=False) == {"rolled_forward": [], "aborted": []}
        assert len(staged_files(a) + staged_files(b)) == 2
    if cleaner.startswith("recover"):
        assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    else:
        TransactionalProducer(catalog, "quitter").init_transactions()
    assert staged_files(a) == staged_files(b) == [], f"{cleaner} left the aborted transaction's staged files"
    assert rows(a) == rows(b) == []


# --- 2. a reader never sees part of a transaction --------------------------------------------------


def check_reader_sees_whole_transactions(catalog_spec, tmp_path, commits: int) -> None:
    catalog = catalog_spec.open()
    two_tables(catalog)
    producer = TransactionalProducer(catalog, "balanced")
    producer.init_transactions()
    stop, out = tmp_path / "stop", tmp_path / "reader.out"
    rng, total = random.Random(5), 0
    with worker("reader", catalog_spec, {"a": "db.a", "b": "db.b", "stop": str(stop), "interval_s": 0.1}, out) as reader:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().strip()) and reader.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # a loaded machine starts the reader slowly: commit once it reads
        for _ in range(commits):
            k = rng.randint(1, 1000)
            commit_balanced(producer, k)
            total += k
        stop.touch()
        assert reader.wait(timeout=120) == 0, out.read_text()[-4000:]
    seen = whole_transaction_reads(out)
    states = {tuple(e["ends"]) for e in seen}
    # The reader really read while transactions committed, not only before and after.
    assert len(states) >= min(10, commits // 10), sorted(states)
    assert seen[-1]["ends"] == [commits, commits] and seen[-1]["sums"] == [total, -total]


@pytest.mark.parametrize("commits", [40, pytest.param(200, marks=pytest.mark.slow)])
def test_i5_reader_never_sees_part_of_a_transaction(heavy_spec, tmp_path, commits):
    check_reader_sees_whole_transactions(heavy_spec, tmp_path, commits)


@pytest.mark.slow  # the issue's >= 1,000 commits
@pytest.mark.timeout(3600)
def test_i5_reader_never_sees_part_of_a_transaction_1000_commits(heavy_spec, tmp_path):
    check_reader_sees_whole_transactions(heavy_spec, tmp_path, 1000)


# --- 3. racing transactions: both land in some order, or one gets a typed conflict -----------------


@pytest.mark.timeout(600)
def test_i5_racing_transactions_on_the_same_tables_never_mix(heavy_spec, tmp_path):
    catalog_spec = heavy_spec
    catalog = catalog_spec.open()
    a, b = two_tables(catalog)
    coordinator.ensure_journal(catalog)
    runs = 10
    outs = [tmp_path / f"racer{i}.out" for i in range(2)]
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    common = {"a": "db.a", "b": "db.b", "n": runs, "expected_every": 2, "barrier": str(barrier), "parties": 2}
    args = [{**common, "tid": f"racer-{i}", "seed": i} for i in range(2)]
    with worker("loop", catalog_spec, args[0], outs[0]) as first, worker("loop", catalog_spec, args[1], outs[1]) as second:
        codes = [first.wait(timeout=600), second.wait(timeout=600)]
    assert codes == [0, 0], [o.read_text()[-3000:] for o in outs]
    outcomes = [e for o in outs for e in events(o)]
    assert len(outcomes) == 2 * runs
    failed = [e for e in outcomes if e["status"] == "failed"]
    committed = {e["txn_id"]: e for e in outcomes if e["status"] == "committed"}
    # Only a typed conflict, and only for a transaction that named an expected offset.
    assert all(e["error"] == "OffsetMismatch" and e["expected"] for e in failed), failed
    # Sends without an expected offset are renumbered after the rival's rows: they always land.
    assert all(e["status"] == "committed" for e in outcomes if not e["expected"])
    assert all(any(e["status"] == "committed" for e in events(o)) for o in outs)

    records = journal(catalog)
    journal_committed = collections.Counter(r["txn_id"] for r in records if r["txn_state"] == "COMMITTED")
    assert set(journal_committed) == set(committed) and set(journal_committed.values()) == {1}
    for e in failed:  # on SQL a refused swap was the transaction's only journal write: none landed
        assert journal_states(catalog, e["txn_id"]) == []
    # Every committed transaction holds exactly the offsets the journal's COMMITTED record
    # names, in both tables; nothing else is in the tables.
    by_offset = {name: {o: (key, value) for o, key, value in rows(t)} for name, t in (("db.a", a), ("db.b", b))}
    owned = {"db.a": set(), "db.b": set()}
    for r in records:
        if r["txn_state"] != "COMMITTED" or r["transactional_id"] not in ("racer-0", "racer-1"):
            continue
        ack = committed[r["txn_id"]]
        ranges = json.loads(r["detail"])["ranges"]
        assert ranges == ack["ranges"]
        for name, sign, side in (("db.a", 1, "a"), ("db.b", -1, "b")):
            first, nxt = ranges[name]["0"]
            assert nxt - first == 1
            assert by_offset[name][first] == (f"{r['txn_id']}:{side}", str(sign * ack["k"]))
            owned[name].add(first)
    for name in owned:
        assert owned[name] == set(by_offset[name]), f"{name} holds rows of no committed transaction"
    assert sum(int(v) for _, v in by_offset["db.a"].values()) + sum(int(v) for _, v in by_offset["db.b"].values()) == 0
    for t in (a, b):
        contiguous(t)
        assert staged_files(t) == []


# --- 4. zombies are fenced; timed-out transactions are aborted -------------------------------------


def test_i5_zombie_fenced_mid_transaction_never_becomes_visible(catalog):
    a, b = two_tables(catalog)
    zombie = TransactionalProducer(catalog, "orders")
    zombie.init_transactions()
    txn_id = zombie.begin_transaction()
    zombie.send("db.a", 0, [{"key": "zombie", "value": "1"}])
    assert staged_files(a)
    successor = TransactionalProducer(catalog, "orders")
    assert successor.init_transactions()["epoch"] == zombie.epoch + 1
    # On SQL the journal hears of a transaction only in its one swap: there is nothing to abort
    # yet, and the swap's epoch check is what fences the zombie.
    assert journal_states(catalog, txn_id) == []
    zombie.send("db.b", 0, [{"key": "zombie", "value": "-1"}])  # staged, never visible
    with pytest.raises(ProducerFenced):
        zombie.commit_transaction()
    assert staged_files(a) == staged_files(b) == [], "the fenced zombie left what it staged"
    assert rows(a) == rows(b) == []
    zombie.abort_transaction()  # its transaction ended with the fenced commit: nothing to abort
    with pytest.raises(ProducerFenced):  # and every later transaction of the zombie is fenced too
        with zombie.transaction():
            zombie.send("db.a", 0, [{"key": "zombie", "value": "again"}])
    with successor.transaction():
        successor.send("db.a", 0, [{"key": "successor", "value": "2"}])
    assert [r[1] for r in rows(a)] == ["successor"] and rows(b) == []
    assert "COMMITTED" not in journal_states(catalog, txn_id)
    assert staged_files(a) == staged_files(b) == []


def test_i5_zombie_send_after_fencing_leaves_no_staged_file(catalog):
    """A fenced zombie's send to a partition it had already registered stages a file that
    nobody ever deletes (the send does not consult the journal; the coordinator already
    aborted the transaction and deleted its folder)."""
    a, _ = two_tables(catalog)
    zombie = TransactionalProducer(catalog, "orders")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("db.a", 0, [{"key": "zombie", "value": "1"}])
    TransactionalProducer(catalog, "orders").init_transactions()
    with contextlib.suppress(ProducerFenced):  # raising here would be fine too
        zombie.send("db.a", 0, [{"key": "late", "value": "1"}])
    with pytest.raises(ProducerFenced):
        zombie.commit_transaction()
    with contextlib.suppress(ProducerFenced):
        zombie.abort_transaction()
    assert rows(a) == []
    assert staged_files(a) == [], "a fenced zombie's staged file was left behind"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000_000

    def __call__(self) -> int:
        return self.ms


def start_timed(catalog, clock: Clock) -> tuple[TransactionalProducer, str]:
    producer = TransactionalProducer(catalog, "slow", timeout_ms=1_000, clock=clock)
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "late", "value": "1"}])
    producer.send("db.b", 0, [{"key": "late", "value": "-1"}])
    producer.send_offsets_to_transaction({("db.a", 0): 0}, "g")
    return producer, txn_id


def assert_timed_out(catalog, producer, txn_id, a, b) -> None:
    with pytest.raises(TransactionAborted) as caught:
        producer.commit_transaction()
    assert caught.value.txn_id == txn_id
    assert rows(a) == [] and rows(b) == [] and committed_offsets(catalog, "g", "db.a") == {}
    # On SQL (every catalog here) the journal never heard of it: its commit refused it, by the
    # journal's clock, writing nothing.
    assert journal_states(catalog, txn_id) == []
    assert staged_files(a) == staged_files(b) == []


def test_i5_transaction_past_its_timeout_is_refused_by_its_commit_not_before(catalog):
    """Judged at the one swap, by the journal's clock, on the time of its last new partition's send."""
    a, b = two_tables(catalog)
    clock = Clock()
    producer, txn_id = start_timed(catalog, clock)
    clock.ms += 999
    assert tx.recover(catalog, clock=clock)["aborted"] == []  # nothing of it in the journal to abort
    producer.send("db.a", 0, [{"key": "again", "value": "1"}])  # a partition it has: no new activity
    clock.ms += 2
    assert_timed_out(catalog, producer, txn_id, a, b)


def test_i5_transaction_within_its_timeout_commits_counted_from_its_last_new_partition(catalog):
    a, b = two_tables(catalog, partitions=2)
    clock = Clock()
    producer, txn_id = start_timed(catalog, clock)
    clock.ms += 999
    producer.send("db.a", 1, [{"key": "x", "value": "1"}])  # a new partition: the transaction is live
    clock.ms += 1_000  # 1 000 ms since then: not past it (1 999 since the first send)
    assert producer.commit_transaction() == {"db.a": {"0": [0, 1], "1": [0, 1]}, "db.b": {"0": [0, 1]}}
    assert journal_states(catalog, txn_id) == ["COMMITTED"]


def test_i5_transaction_past_its_timeout_is_aborted_by_the_next_coordinator_action(catalog):
    """A transaction the journal holds (one that sent pre-written files: on SQL the only kind
    registered before its commit) is aborted by another transactional id's coordinator action."""
    a, b = two_tables(catalog)
    clock = Clock()
    producer, txn_id = start_timed(catalog, clock)
    producer._register("db.a", [0], record=True)  # what send_files does
    clock.ms += 5_000
    other = TransactionalProducer(catalog, "other", clock=clock)
    other.init_transactions()  # any coordinator action of another transactional id
    assert journal_states(catalog, txn_id) == ["BEGIN", "ABORTED"]
    assert staged_files(a) == staged_files(b) == []
    with pytest.raises(TransactionAborted):
        producer.commit_transaction()
    assert rows(a) == [] and rows(b) == [] and committed_offsets(catalog, "g", "db.a") == {}


def test_i5_commit_past_its_timeout_aborts_the_transaction_in_the_journal(catalog):
    """The producer's own late commit is the next coordinator action: it must record the
    abort (and delete the staged files), not only raise, so the producer can go on."""
    a, b = two_tables(catalog)
    clock = Clock()
    producer, txn_id = start_timed(catalog, clock)
    clock.ms += 5_000
    assert_timed_out(catalog, producer, txn_id, a, b)
    producer.begin_transaction()  # not stuck on the aborted transaction


@contextlib.contextmanager
def host_clock_skewed(monkeypatch, seconds: float):
    """This process's clock runs ``seconds`` off (the database's clock does not)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)
    try:
        yield
    finally:
        monkeypatch.setattr(time, "time", real)


@pytest.mark.parametrize("skewed", ["fast other host", "slow own host"])
def test_i5_host_clock_skew_never_times_out_a_live_transaction(catalog, monkeypatch, skewed):
    """Timeouts are judged by one clock (the catalog database's): a host 90 s fast must not
    abort every other producer's open transaction, and a host 90 s slow must still commit."""
    a, b = two_tables(catalog)
    own_skew = -90 if skewed == "slow own host" else 0
    producer = TransactionalProducer(catalog, "live")
    with host_clock_skewed(monkeypatch, own_skew):
        producer.init_transactions()
        txn_id = producer.begin_transaction()
        producer.send("db.a", 0, [{"key": "live", "value": "1"}])
    with host_clock_skewed(monkeypatch, 90 if skewed == "fast other host" else 0):
        other = TransactionalProducer(catalog, "other")
        other.init_transactions()  # a coordinator action on another host
        with other.transaction():
            other.send("db.b", 0, [{"key": "other", "value": "1"}])
    with host_clock_skewed(monkeypatch, own_skew):
        producer.send("db.b", 0, [{"key": "live", "value": "-1"}])
        assert producer.commit_transaction() == {"db.a": {"0": [0, 1]}, "db.b": {"0": [1, 2]}}
    assert "ABORTED" not in journal_states(catalog, txn_id)
    assert [r[1] for r in rows(b)] == ["other", "live"]


# --- 5. consume-transform-produce exactly once across kill -9 ---------------------------------------


@pytest.mark.fault
@pytest.mark.timeout(600)
def test_i9_i10_copier_killed_repeatedly_copies_every_record_exactly_once(heavy_spec, tmp_path):
    catalog_spec = heavy_spec
    catalog = catalog_spec.open()
    records = 36
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": str(i), "value": f"v{i}"} for i in range(records)]})
    out = LogTable.create(catalog, "db.out", 1, properties=SMALL)
    args = {"tid": "copier", "src": "db.src", "out": "db.out", "group": "copy", "batch": 4}
    rng = random.Random(17)
    # Three named points per catalog (the two catalogs cover all five), then a random moment.
    kills = {
        "sqlite": [faults.AFTER_TXN_PREPARE, faults.BETWEEN_TABLE_SWAPS, faults.AFTER_CATALOG_SWAP],
        "postgres": [faults.AFTER_TXN_BEGIN, faults.BETWEEN_TABLE_SWAPS, faults.AFTER_TXN_STAGE],
    }[catalog_spec.kind]
    for n, point in enumerate(kills):
        seen = kill_at(catalog_spec, "copier", {**args, "pause": point, "pause_after": rng.randint(0, 1)}, tmp_path, f"copier{n}")
        assert not any(e.get("event") == "done" for e in seen)
    # One more kill at a random moment, not at a named point.
    with worker("copier", catalog_spec, args, tmp_path / "copier-random.out") as child:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=rng.uniform(3.0, 8.0))
        child.kill()
    seen = run_to_end(catalog_spec, "copier", args, tmp_path / "copier-last.out")
    assert seen[-1] == {"event": "done", "position": records}
    # The group's position, as every run read it, never went back (I10).
    outs = [f"copier{n}.out" for n in range(len(kills))] + ["copier-random.out", "copier-last.out"]
    positions = [e["position"] for name in outs for e in events(tmp_path / name) if e.get("event") == "position"]
    assert positions == sorted(positions) and positions[-1] == records, positions

    copied = rows(out)
    counts = collections.Counter(key for _, key, _ in copied)
    assert counts == collections.Counter(f"src:{i}" for i in range(records)), "a source record was lost or copied twice"
    assert {key: value for _, key, value in copied} == {f"src:{i}": f"V{i}" for i in range(records)}
    assert committed_offsets(catalog, "copy", "db.src") == {0: records}
    contiguous(out)
    assert coordinator.transactional_ids(catalog)["copier"].txn is None
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    # Killed before their swap, transactions left staged files the journal never heard of:
    # orphan cleanup finds every one.
    remove_orphan_files(catalog, out.identifier, older_than_s=0)
    assert staged_files(out) == []


# --- 6. expected offsets inside a transaction -------------------------------------------------------


def test_i2_i5_stale_expected_offset_aborts_the_whole_transaction(catalog):
    a, b = two_tables(catalog)
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": "s", "value": "s"}] * 5})
    producer = TransactionalProducer(catalog, "cond")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "mine", "value": "1"}], expected_offset=0)
    producer.send("db.b", 0, [{"key": "mine", "value": "-1"}], expected_offset=0)
    producer.send_offsets_to_transaction({("db.src", 0): 5}, "g")
    b.append({0: [{"key": "other", "value": "0"}]})  # another writer moves b's log end
    with pytest.raises(OffsetMismatch) as caught:
        producer.commit_transaction()
    assert (caught.value.table, caught.value.expected, caught.value.actual) == ("db.b", 0, 1)
    assert rows(a) == [] and [r[1] for r in rows(b)] == ["other"]
    assert committed_offsets(catalog, "g", "db.src") == {}
    assert journal_states(catalog, txn_id) == []  # on SQL the refused swap was its only journal write
    for t in (a, b):
        assert staged_files(t) == []
        remove_orphan_files(catalog, t.identifier, older_than_s=0)
        assert unreferenced_data_files(t) == []
        contiguous(t)
    # The producer goes on with a new transaction.
    with producer.transaction():
        producer.send("db.b", 0, [{"key": "retry", "value": "-1"}], expected_offset=1)
    assert [r[1] for r in rows(b)] == ["other", "retry"]


def test_i2_i5_send_without_expected_offset_is_renumbered_after_other_writers(catalog):
    a, b = two_tables(catalog)
    producer = TransactionalProducer(catalog, "free")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "mine", "value": "1"}, {"key": "mine", "value": "2"}])
    producer.send("db.b", 0, [{"key": "mine", "value": "-3"}])
    a.append({0: [{"key": "other", "value": "0"}] * 3})  # staged before, committed after these
    ranges = producer.commit_transaction()
    assert ranges == {"db.a": {"0": [3, 5]}, "db.b": {"0": [0, 1]}}
    assert [r[:2] for r in rows(a)] == [(0, "other"), (1, "other"), (2, "other"), (3, "mine"), (4, "mine")]
    assert journal_states(catalog, txn_id).count("COMMITTED") == 1
    contiguous(a)


def test_i5_a_commit_after_its_sends_reads_no_metadata_and_a_stale_base_never_decides(catalog, monkeypatch):
    """A producer's commit starts from the tables as it last saw them (its sends, its last
    journal step), as a single append does: PREPARE and the atomic commit read no metadata.
    Another producer's transactions in between make every such base stale: they are then
    decided again on the tables as they are, never on the stale ones."""
    a, b = two_tables(catalog)
    mine, theirs = TransactionalProducer(catalog, "mine"), TransactionalProducer(catalog, "theirs")
    mine.init_transactions()
    theirs.init_transactions()
    with mine.transaction():
        mine.send("db.a", 0, [{"key": "m", "value": "0"}])
    mine.begin_transaction()
    mine.send("db.a", 0, [{"key": "m", "value": "1"}])
    mine.send("db.b", 0, [{"key": "m", "value": "1"}])
    reads = []
    real = type(catalog).load_table
    monkeypatch.setattr(type(catalog), "load_table", lambda self, ident: reads.append(ident) or real(self, ident))
    from icelog.storage.core import commit as core

    several = core.load_tables
    monkeypatch.setattr(core, "load_tables", lambda cat, idents: reads.extend(idents) or several(cat, idents))
    assert mine.commit_transaction() == {"db.a": {"0": [1, 2]}, "db.b": {"0": [0, 1]}}
    assert reads == []
    for i in range(3):  # the journal and both tables move on between mine's sends and its commit
        mine.begin_transaction()
        mine.send("db.a", 0, [{"key": "m", "value": str(i)}])
        mine.send("db.b", 0, [{"key": "m", "value": str(i)}], expected_offset=2 + 2 * i)
        with theirs.transaction():
            theirs.send("db.a", 0, [{"key": "t", "value": str(i)}])
            theirs.send("db.b", 0, [{"key": "t", "value": str(i)}])
        assert mine.commit_transaction() == {"db.a": {"0": [3 + 2 * i, 4 + 2 * i]}, "db.b": {"0": [2 + 2 * i, 3 + 2 * i]}}
    mine.begin_transaction()
    mine.send("db.b", 0, [{"key": "m", "value": "late"}], expected_offset=7)
    with theirs.transaction():  # after mine staged: mine's expected offset no longer holds
        theirs.send("db.b", 0, [{"key": "t", "value": "late"}])
    with pytest.raises(OffsetMismatch):
        mine.commit_transaction()
    assert [r[1] for r in rows(b)] == ["m", "t", "m", "t", "m", "t", "m", "t"]
    contiguous(a)
    contiguous(b)


def test_i5_journal_records_the_offsets_the_tables_got_when_a_stale_base_loses(catalog):
    """Plain appends move both tables after the sends (the journal stays where PREPARE left it):
    the commit's first attempt decides on the stale bases and loses; the second gets other
    offsets. The journal's COMMITTED record must name those, not the first attempt's (its row
    file was once reused because the journal's own offsets had not moved)."""
    a, b = two_tables(catalog)
    mine = TransactionalProducer(catalog, "mine")
    mine.init_transactions()
    txn_id = mine.begin_transaction()
    mine.send("db.a", 0, [{"key": "m", "value": "1"}])
    mine.send("db.b", 0, [{"key": "m", "value": "-1"}])
    LogTable(catalog, "db.a").append({0: [{"key": "other", "value": "0"}]})
    LogTable(catalog, "db.b").append({0: [{"key": "other", "value": "0"}]})
    acknowledged = mine.commit_transaction()
    assert acknowledged == {"db.a": {"0": [1, 2]}, "db.b": {"0": [1, 2]}}
    committed = next(r for r in journal(catalog) if r["txn_id"] == txn_id and r["txn_state"] == "COMMITTED")
    assert json.loads(committed["detail"])["ranges"] == acknowledged
    assert rows(a)[1] == (1, "m", "1") and rows(b)[1] == (1, "m", "-1")


def sent_to_both(catalog) -> tuple[LogTable, LogTable, TransactionalProducer]:
    """Two tables, and a producer whose open transaction has one row staged for each."""
    a, b = two_tables(catalog)
    mine = TransactionalProducer(catalog, "mine")
    mine.init_transactions()
    mine.begin_transaction()
    mine.send("db.a", 0, [{"key": "m", "value": "1"}])
    mine.send("db.b", 0, [{"key": "m", "value": "1"}])
    return a, b, mine


@pytest.mark.parametrize("coordinator", ["recover", "a new instance"])
def test_i5_a_coordinator_action_just_before_the_swap_never_finishes_or_half_commits_it(catalog, monkeypatch, coordinator):
    """On SQL no coordinator can finish a transaction for its producer (the journal hears of it
    only in its one swap). Between the producer's decision to commit and its swap, ``recover``
    leaves it alone (it then commits whole), and a new instance fences it (nothing visible,
    its staged files deleted by the fenced producer itself)."""
    a, b, mine = sent_to_both(catalog)
    real = faults.checkpoint

    def coordinator_action(point: str) -> None:
        if point == faults.AFTER_TXN_PREPARE:
            monkeypatch.setattr(faults, "checkpoint", real)
            if coordinator == "recover":
                assert tx.recover(catalog) == {"rolled_forward": [], "aborted": []}
            else:
                TransactionalProducer(catalog, "mine").init_transactions()

    monkeypatch.setattr(faults, "checkpoint", coordinator_action)
    if coordinator == "recover":
        assert mine.commit_transaction() == {"db.a": {"0": [0, 1]}, "db.b": {"0": [0, 1]}}
        assert [r[1] for r in rows(a)] == [r[1] for r in rows(b)] == ["m"]
    else:
        with pytest.raises(ProducerFenced):
            mine.commit_transaction()
        assert rows(a) == rows(b) == []
    assert staged_files(a) == staged_files(b) == []


def test_i5_staged_files_removed_by_orphan_cleanup_before_the_swap_abort_it_with_nothing_visible(catalog, monkeypatch):
    """The journal does not protect an SQL transaction's staged payload files before its swap:
    orphan cleanup run with no age limit while the commit writes deletes them. The commit must
    then fail with a typed error, leave nothing visible (its payload files are rewritten, never
    committed as they are), and leave the producer free to go on."""
    a, b, mine = sent_to_both(catalog)
    rewrite = tx.TxnAppend.write_rows  # the commit's write step, after the decision

    def cleaned_up_meanwhile(self, table, placed):
        monkeypatch.setattr(tx.TxnAppend, "write_rows", rewrite)
        for t in ("db.a", "db.b"):
            remove_orphan_files(catalog, t, older_than_s=0)
        return rewrite(self, table, placed)

    monkeypatch.setattr(tx.TxnAppend, "write_rows", cleaned_up_meanwhile)
    txn_id = mine.txn_id
    with pytest.raises(PreparedFilesMissing):
        mine.commit_transaction()
    assert rows(a) == rows(b) == [] and journal_states(catalog, txn_id) == []
    with mine.transaction():
        mine.send("db.a", 0, [{"key": "next", "value": "1"}])
    assert [r[1] for r in rows(a)] == ["next"]


@pytest.mark.parametrize("case", ["group offset beyond the log end", "no expected offset on a strict table"])
def test_i8_i10_bad_transaction_input_never_wedges_recovery(catalog, case):
    """Input the atomic commit refuses for good must be refused before PREPARE_COMMIT (or the
    prepared transaction aborted): otherwise every roll-forward fails again, and both
    ``recover()`` and ``init_transactions()`` raise for ever."""
    a = LogTable.create(catalog, "db.a", 1, properties={"icelog.check-expected-offsets": "true"} if "strict" in case else {})
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": "s", "value": "s"}] * 3})
    producer = TransactionalProducer(catalog, "bad")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    error = InvalidOffset if "group" in case else ExpectedOffsetRequired
    with pytest.raises(error):
        producer.send("db.a", 0, [{"key": "k", "value": "1"}])
        producer.send_offsets_to_transaction({("db.src", 0): 10 if "group" in case else 3}, "g")
        producer.commit_transaction()
    with contextlib.suppress(IcelogError):
        producer.abort_transaction()
    assert tx.recover(catalog, clock=past_timeout())["rolled_forward"] == []  # must not raise
    assert TransactionalProducer(catalog, "bad").init_transactions()["epoch"] == 1
    assert rows(a) == [] and committed_offsets(catalog, "g", "db.src") == {}
    assert "COMMITTED" not in journal_states(catalog, txn_id) and coordinator.transactional_ids(catalog)["bad"].txn is None
    assert staged_files(a) == []


# --- 7. catalogs without an atomic multi-table commit: the journal decides, tables roll forward -------
# ``forwarding_catalog`` commits one table at a time through a SQL catalog, as a REST catalog does
# (its kill -9 and server tests on SeaweedFS are in tests/storage/producers/test_transactions_rest.py).


class Crash(BaseException):
    """A process dying at a fault point (BaseException: nothing on the way handles it)."""


def crash_at(monkeypatch, point: str, times: int = 1, after: str | None = None) -> None:
    """Crash at ``point`` (the next ``times`` passes), counting only passes once ``after`` was passed."""
    original, left, armed = faults.checkpoint, [times], [after is None]

    def checkpoint(name: str) -> None:
        if name == point and left[0] > 0 and armed[0]:
            left[0] -= 1
            raise Crash(point)
        armed[0] = armed[0] or name == after
        original(name)

    monkeypatch.setattr(faults, "checkpoint", checkpoint)


def decided_setup(sqlite_catalog):
    a, b = two_tables(sqlite_catalog)
    src = LogTable.create(sqlite_catalog, "db.src", 1)
    src.append({0: [{"key": str(i), "value": str(i)} for i in range(5)]})
    a.append({0: [{"key": "before", "value": "1"}]})
    proxy = forwarding_catalog(sqlite_catalog)
    producer = TransactionalProducer(proxy, "copier")
    producer.init_transactions()
    return proxy, a, b, producer


def send_both(producer) -> str:
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": txn_id, "value": "5"}])
    producer.send("db.b", 0, [{"key": txn_id, "value": "-5"}, {"key": txn_id, "value": "0"}])
    producer.send_offsets_to_transaction({("db.src", 0): 4}, "g")
    return txn_id


def assert_committed_once(sqlite_catalog, a, b, txn_id) -> None:
    assert rows(a) == [(0, "before", "1"), (1, txn_id, "5")]
    assert rows(b) == [(0, txn_id, "-5"), (1, txn_id, "0")]
    assert committed_offsets(sqlite_catalog, "g", "db.src") == {0: 4}
    states = journal_states(sqlite_catalog, txn_id)
    assert states[-2:] == ["PREPARE_COMMIT", "COMMITTED"] and states.count("COMMITTED") == 1, states
    committed = next(r for r in journal(sqlite_catalog) if r["txn_id"] == txn_id and r["txn_state"] == "COMMITTED")
    assert json.loads(committed["detail"])["ranges"] == {"db.a": {"0": [1, 2]}, "db.b": {"0": [0, 2]}}
    assert coordinator.transactional_ids(sqlite_catalog)["copier"].txn is None
    assert staged_files(a) == staged_files(b) == []
    for t in (a, b):
        assert run_checks(t.table(), ["contiguity-deep", "transactions"]).ok


def test_i5_without_atomic_commits_the_journal_decides_and_each_table_rolls_forward(sqlite_catalog):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    assert producer.commit_transaction() == {"db.a": {"0": [1, 2]}, "db.b": {"0": [0, 2]}}
    # Committed and visible; its COMMITTED record waits for the producer's next journal step.
    assert rows(a)[-1] == (1, txn_id, "5") and journal_states(sqlite_catalog, txn_id)[-1] == "PREPARE_COMMIT"
    for t in (a, b):
        assert run_checks(t.table(), ["contiguity-deep", "transactions"]).ok
    producer.close()
    assert_committed_once(sqlite_catalog, a, b, txn_id)
    (entry,) = [r for r in journal(sqlite_catalog) if r["txn_id"] == txn_id and r["txn_state"] == "PREPARE_COMMIT"]
    # Each table's commit carries the transaction id: found by it, never applied twice.
    for t in (a, b):
        assert any(c[0] == txn_id for c in json.loads(t.table().metadata.properties["icelog.commits"]))
    assert tx.recover(proxy) == {"rolled_forward": [], "aborted": []}
    assert_committed_once(sqlite_catalog, a, b, txn_id)


@pytest.mark.parametrize("point", [faults.AFTER_TXN_PREPARE, faults.BETWEEN_TABLE_SWAPS, faults.AFTER_CATALOG_SWAP])
@pytest.mark.parametrize("finisher", ["recover", "a new instance", "the same producer again"])
def test_i5_a_decided_transaction_stopped_anywhere_rolls_forward_exactly_once(sqlite_catalog, monkeypatch, point, finisher):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    # A swap after the decision's own: a table's, in the roll-forward.
    crash_at(monkeypatch, point, after=None if point == faults.AFTER_TXN_PREPARE else faults.AFTER_TXN_PREPARE)
    with pytest.raises(Crash):
        producer.commit_transaction()
    # Decided: whatever a reader sees now holds no aborted and no undecided transaction.
    for t in (a, b):
        assert run_checks(t.table(), ["transactions"]).ok
    if finisher == "recover":
        assert tx.recover(proxy, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    elif finisher == "a new instance":
        TransactionalProducer(proxy, "copier").init_transactions()
    else:
        assert producer.commit_transaction() == {"db.a": {"0": [1, 2]}, "db.b": {"0": [0, 2]}}
        producer.close()
    assert_committed_once(sqlite_catalog, a, b, txn_id)


def test_i5_sends_write_nothing_to_the_journal_and_the_next_prepare_records_the_last_one_committed(sqlite_catalog):
    """Without atomic commits a send registers nothing in the journal (PREPARE_COMMIT registers
    every partition), and COMMITTED has no journal commit of its own: the next transaction's
    PREPARE_COMMIT writes it, in the same commit. A transaction of plain sends therefore costs the
    decision and one commit per table."""
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    first = send_both(producer)
    producer.commit_transaction()

    def journal_versions() -> int:
        return len(LogTable.open(sqlite_catalog, coordinator.JOURNAL).table().metadata.snapshots)

    versions = journal_versions()
    with producer.transaction():
        second = producer.txn_id
        producer.send("db.a", 0, [{"key": second, "value": "7"}])
        producer.send("db.b", 0, [{"key": second, "value": "-7"}])
        assert journal_versions() == versions, "a send wrote to the journal"
        assert journal_states(sqlite_catalog, first)[-1] == "PREPARE_COMMIT" and journal_states(sqlite_catalog, second) == []
    assert journal_versions() == versions + 1  # the last one's COMMITTED and this one's decision, together
    recorded = [(r["txn_id"], r["txn_state"]) for r in journal(sqlite_catalog)]
    assert recorded[-2:] == [(first, "COMMITTED"), (second, "PREPARE_COMMIT")]
    assert rows(a)[-1] == (2, second, "7") and rows(b)[-1] == (2, second, "-7")
    producer.close()
    assert journal_states(sqlite_catalog, second)[-1] == "COMMITTED"
    ended = coordinator.transactional_ids(sqlite_catalog)["copier"].last_committed
    assert ended.id == second and ended.partitions == {"db.a": (0,), "db.b": (0,)}  # registered by PREPARE_COMMIT


def test_i5_a_decided_transaction_is_never_aborted(sqlite_catalog, monkeypatch):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    crash_at(monkeypatch, faults.BETWEEN_TABLE_SWAPS)
    with pytest.raises(Crash):
        producer.commit_transaction()
    with pytest.raises(InvalidTxnState, match="prepared"):
        producer.abort_transaction()
    with pytest.raises(InvalidTxnState, match="decided"):
        tx.abort(proxy, "copier", missing_files=True)
    tx.recover(proxy, clock=past_timeout())
    assert_committed_once(sqlite_catalog, a, b, txn_id)


def test_i1_i5_an_expected_offset_is_refused_at_the_send_without_atomic_commits(sqlite_catalog, unchanged):
    """Each table takes a decided transaction at its log end when it rolls forward: an expected
    offset could not be kept, so it is refused before anything is staged."""
    from icelog.storage.errors import ExpectedOffsetNeedsAtomicCatalog

    proxy, a, b, producer = decided_setup(sqlite_catalog)
    producer.begin_transaction()
    with unchanged(a), pytest.raises(ExpectedOffsetNeedsAtomicCatalog, match="SQL catalog") as caught:
        producer.send("db.a", 0, [{"key": "k", "value": "1"}], expected_offset=1)
    assert isinstance(caught.value, InvalidInput)  # the CLI's exit 2
    assert staged_files(a) == []
    producer.send("db.b", 0, [{"key": "k", "value": "1"}])  # the transaction goes on
    assert producer.commit_transaction() == {"db.b": {"0": [0, 1]}}


def _numbered_files(producer, log_table: LogTable, first: int, sizes: list[int]) -> list[str]:
    """Data files in the transaction's folder of ``log_table`` (as executors write them for
    ``send_files``), numbered from ``first``, ``sizes`` rows each: keys ``f<offset>``."""
    from icelog.storage.log.files import write_log_files
    from icelog.storage.log.table import with_system_columns

    table = log_table.table()
    paths, cursor = [], first
    for n in sizes:
        payload = log_table.conform({0: [{"key": f"f{cursor + i}", "value": str(i)} for i in range(n)]})[0]
        (written,) = write_log_files(table, {0: with_system_columns(payload, 0, cursor, 0, None, None)})
        path = f"{producer.data_dir(log_table.identifier)}/{len(paths)}.parquet"
        with table.io.new_input(written.file_path).open() as src, table.io.new_output(path).create() as out:
            out.write(src.read())
        table.io.delete(written.file_path)
        paths.append(path)
        cursor += n
    return paths


@pytest.mark.parametrize("moved", [False, True])
def test_i1_i5_prewritten_files_of_a_decided_transaction_land_at_the_log_end(sqlite_catalog, moved):
    """Without atomic multi-table commits, pre-written files go where the roll-forward finds the
    log end: as they are if it is where they were numbered, else rewritten at their new offsets
    (the other writer's records first, each record once, the table deep-checked contiguous) and
    the originals deleted."""
    proxy, a, b, producer = decided_setup(sqlite_catalog)  # db.a holds offset 0
    txn_id = producer.begin_transaction()
    paths = _numbered_files(producer, a, 1, [2, 3])
    assert producer.send_files("db.a", {0: paths}, {0: 1}) == 5
    producer.send_offsets_to_transaction({("db.src", 0): 4}, "g")
    if moved:  # another writer between the files' numbering and the roll-forward
        a.append({0: [{"key": "other", "value": "x"}, {"key": "other", "value": "y"}]})
    first = 3 if moved else 1
    assert producer.commit_transaction() == {"db.a": {"0": [first, first + 5]}}
    producer.close()
    assert [k for _, k, _ in rows(a)] == ["before", *(["other"] * 2 if moved else []), *[f"f{o}" for o in range(1, 6)]]
    assert [o for o, _, _ in rows(a)] == list(range(first + 5))
    stamps = a.read(0).column("log_timestamp").cast("int64").to_pylist()[first:]
    assert all(t > 0 for t in stamps) if moved else stamps == [0] * 5  # rewritten: stamped when it landed
    assert committed_offsets(sqlite_catalog, "g", "db.src") == {0: 4}
    assert run_checks(a.table(), ["contiguity-deep", "transactions"]).ok
    referenced = {f.file_path for f in a.table().scan().plan_files() for f in [f.file]}
    exists = [os.path.exists(local_path(p)) for p in paths]
    assert exists == [not moved, not moved]  # renumbered: the originals are no longer the table's
    assert (set(paths) <= referenced) is not moved
    assert journal_states(sqlite_catalog, txn_id)[-1] == "COMMITTED"


@pytest.mark.parametrize("change", ["dropped", "re-created"])
def test_i5_a_table_changed_between_send_and_commit_aborts_before_the_decision(sqlite_catalog, unchanged, change):
    from icelog.storage.errors import TransactionTableChanged, UnknownTable

    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    sqlite_catalog.drop_table("db.b")
    if change == "re-created":
        LogTable.create(sqlite_catalog, "db.b", 1)
    with unchanged(a), pytest.raises(UnknownTable if change == "dropped" else TransactionTableChanged):
        producer.commit_transaction()
    assert journal_states(sqlite_catalog, txn_id)[-1] == "ABORTED"
    assert committed_offsets(sqlite_catalog, "g", "db.src") == {}
    assert staged_files(a) == []
    with producer.transaction():  # the transactional id goes on
        producer.send("db.a", 0, [{"key": "next", "value": "1"}])
    assert rows(a)[-1] == (1, "next", "1")


def test_i5_a_table_dropped_after_the_decision_is_named_lost_and_the_rest_commits(sqlite_catalog, monkeypatch):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    crash_at(monkeypatch, faults.AFTER_TXN_PREPARE)
    with pytest.raises(Crash):
        producer.commit_transaction()
    sqlite_catalog.drop_table("db.b")
    assert tx.recover(proxy, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    assert rows(a) == [(0, "before", "1"), (1, txn_id, "5")]
    committed = next(r for r in journal(sqlite_catalog) if r["txn_id"] == txn_id and r["txn_state"] == "COMMITTED")
    detail = json.loads(committed["detail"])
    assert detail["ranges"] == {"db.a": {"0": [1, 2]}} and "no log table 'db.b'" in detail["lost"]["db.b"]
    assert committed_offsets(sqlite_catalog, "g", "db.src") == {0: 4}


def test_i5_a_transient_failure_of_the_check_before_the_decision_leaves_the_transaction_to_retry(sqlite_catalog, monkeypatch):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = send_both(producer)
    check, calls = tx._check_tables, []

    def unreachable_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise CatalogUnavailable(table="db.a", reason="the server restarts")
        return check(*args)

    monkeypatch.setattr(tx, "_check_tables", unreachable_once)
    with pytest.raises(CatalogUnavailable):
        producer.commit_transaction()
    # The group of its offsets was registered last (ADD_OFFSETS); nothing was decided.
    assert producer.txn_id == txn_id and journal_states(sqlite_catalog, txn_id)[-1] == "ADD_OFFSETS"
    assert producer.commit_transaction() == {"db.a": {"0": [1, 2]}, "db.b": {"0": [0, 2]}}
    producer.close()
    assert_committed_once(sqlite_catalog, a, b, txn_id)


def test_i5_a_send_whose_staged_file_cannot_be_written_is_storage_unavailable_and_can_be_sent_again(catalog, monkeypatch):
    """A full disk or an S3 server restarting while a send writes its staged file: the typed,
    retriable StorageUnavailable with nothing staged, and the same send again commits once."""
    a, _ = two_tables(catalog)
    producer = TransactionalProducer(catalog, "staging")
    producer.init_transactions()
    write, calls = tx.pq.write_table, []

    def store_down_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return write(*args, **kwargs)

    monkeypatch.setattr(tx.pq, "write_table", store_down_once)
    with producer.transaction():
        with pytest.raises(StorageUnavailable):
            producer.send("db.a", 0, [{"key": "k", "value": "v"}])
        producer.send("db.a", 0, [{"key": "k", "value": "v"}])
    assert rows(a) == [(0, "k", "v")]


def keys_read(con, table: str) -> list[str]:
    return [k for (k,) in con.execute(f"SELECT key FROM {table} ORDER BY log_offset").fetchall()]


def rolled_into_a_only(proxy, sqlite_catalog, producer, monkeypatch) -> str:
    """A decided transaction whose coordinator stopped once db.a had its part and db.b had not."""
    txn_id = send_both(producer)
    crash_at(monkeypatch, faults.AFTER_TXN_PREPARE)
    with pytest.raises(Crash):
        producer.commit_transaction()
    prepared = coordinator.transactional_ids(sqlite_catalog)["copier"].txn.prepared
    tx._roll_forward_tables(proxy, "copier", txn_id, replace(prepared, sends={"db.a": prepared.sends["db.a"]}, offsets=None))
    return txn_id


def test_i5_a_consistent_read_holds_a_transaction_back_until_its_last_table_has_it(sqlite_catalog, monkeypatch):
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = rolled_into_a_only(proxy, sqlite_catalog, producer, monkeypatch)
    a.append({0: [{"key": "after", "value": "x"}]})  # behind the held-back part: hidden with it
    # A plain reader sees db.a with the transaction and db.b without it.
    plain = connect(proxy, consistent=False)
    assert txn_id in keys_read(plain, "db.a") and txn_id not in keys_read(plain, "db.b")
    cut = consistent_cut(proxy, ["db.a", "db.b"])
    assert cut.held_back == {"db.a": (txn_id,), "db.b": ()} and cut.is_current("db.b") and not cut.is_current("db.a")
    con = connect(proxy)
    assert keys_read(con, "db.a") == ["before"] and keys_read(con, "db.b") == []
    # One table alone has nothing to be consistent with: it is read as it is.
    assert keys_read(connect(proxy, only="db.a"), "db.a") == ["before", txn_id, "after"]
    assert tx.recover(proxy, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    con = connect(proxy)
    assert keys_read(con, "db.a") == ["before", txn_id, "after"] and keys_read(con, "db.b") == [txn_id, txn_id]
    assert consistent_cut(proxy, ["db.a", "db.b"]).held_back == {"db.a": (), "db.b": ()}


def test_i5_a_consistent_read_as_of_a_time_between_two_tables_parts_holds_the_transaction_back(sqlite_catalog, monkeypatch):
    """Time travel to a moment when db.a had its part and db.b not yet (after the transaction
    finished): the consistent read is as of that moment, without the transaction in either."""
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    txn_id = rolled_into_a_only(proxy, sqlite_catalog, producer, monkeypatch)
    between_ms = a.table().metadata.current_snapshot().timestamp_ms + 1
    time.sleep(0.05)
    assert tx.recover(proxy, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    plain = connect(proxy, as_of_ms=between_ms, consistent=False)
    assert keys_read(plain, "db.a") == ["before", txn_id] and keys_read(plain, "db.b") == []
    con = connect(proxy, as_of_ms=between_ms)
    assert keys_read(con, "db.a") == ["before"] and keys_read(con, "db.b") == []
    now = connect(proxy, as_of_ms=int(time.time() * 1000) + 1000)
    assert keys_read(now, "db.a") == ["before", txn_id] and keys_read(now, "db.b") == [txn_id, txn_id]


def test_i5_holding_a_transaction_back_holds_back_what_a_later_one_shares_with_it(sqlite_catalog, monkeypatch):
    """db.a is read before x's part, which hides y's part in db.a behind it: y is then hidden in
    db.b too, though y itself is whole (a cut is every transaction whole, or not at all)."""
    proxy, a, b, producer = decided_setup(sqlite_catalog)
    x = rolled_into_a_only(proxy, sqlite_catalog, producer, monkeypatch)
    other = TransactionalProducer(proxy, "other")
    other.init_transactions()
    with other.transaction():
        y = other.txn_id
        other.send("db.a", 0, [{"key": y, "value": "1"}])
        other.send("db.b", 0, [{"key": y, "value": "1"}])
    plain = connect(proxy, consistent=False)
    assert keys_read(plain, "db.a") == ["before", x, y] and keys_read(plain, "db.b") == [y]
    con = connect(proxy)
    assert keys_read(con, "db.a") == ["before"] and keys_read(con, "db.b") == []
    tx.recover(proxy, clock=past_timeout())
    con = connect(proxy)
    assert keys_read(con, "db.a") == ["before", x, y] and keys_read(con, "db.b") == [y, x, x]


def test_i8_system_tables_refuse_every_user_write(catalog, unchanged):
    """The journal_table is believed by the coordinator and the transactions check: a forged record
    (an ABORTED for a committed transaction) must not get in through any user path."""
    from icelog.storage.admin.maintenance import maintain
    from icelog.storage.errors import InvalidIdentifier
    from icelog.storage.producers.idempotent import init_producer
    from icelog.storage.replication.acls import add_acl
    from icelog.storage.replication.replica import write_with_offsets

    LogTable.create(catalog, "db.a", 1)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "x"}])
    journal_table = LogTable.open(catalog, coordinator.JOURNAL)
    end = journal_table.watermarks()[0].end
    record = journal_table.read(0, 0, end).to_pylist()[-1] | {
        "txn_state": coordinator.ABORTED,
        "log_offset": end,
    }  # COMMITTED, forged
    forged = {k: v for k, v in record.items() if k in journal_table.payload_schema().names}
    add_acl(catalog, "replicator", "*")  # a replicator granted every table
    writes = {
        "append": lambda: journal_table.append({0: [forged]}),
        "producers init": lambda: init_producer(catalog, coordinator.JOURNAL, "forger"),
        "add-partitions": lambda: journal_table.add_partitions(2),
        "retention": lambda: maintain(catalog, coordinator.JOURNAL, retention_bytes=1),
        "write with offsets": lambda: write_with_offsets(catalog, coordinator.JOURNAL, {0: [record]}, principal="replicator"),
    }
    for write in writes.values():
        with unchanged(journal_table), pytest.raises(InvalidIdentifier, match="icelog_system"):
            write()
    forger = TransactionalProducer(catalog, "forger")
    forger.init_transactions()
    with unchanged(journal_table):
        forger.begin_transaction()
        with pytest.raises(InvalidIdentifier):
            forger.send(coordinator.JOURNAL, 0, [forged])
        forger.abort_transaction()
    with unchanged(catalog=catalog), pytest.raises(InvalidIdentifier):
        LogTable.create(catalog, "icelog_system.mine", 1)
    assert run_checks(LogTable.open(catalog, "db.a").table(), ["transactions"]).ok


def test_i5_a_transactions_decisions_decide_and_the_write_step_writes(catalog):
    """Deciding a transaction's append writes nothing and changes nothing (it places each send
    at its offsets; the commit's write step rewrites the staged files), and the COMMITTED
    record takes the appends' offsets from their decisions, as data."""
    from icelog.storage.log.state import LogState
    from icelog.storage.producers.journal_state import JOURNAL, JournalState, OpenTxn

    a, _, mine = sent_to_both(catalog)
    mine.send("db.a", 0, [{"key": "n", "value": "2"}, {"key": "o", "value": "3"}])
    a.append({0: [{"key": "x", "value": "x"}]})  # the sends follow it
    table = a.table()
    data = local_path(table.metadata.location) + "/data"
    before = sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs)
    append = tx.TxnAppend("db.a", mine.txn_id, list(mine._sends["db.a"]), mine.txn_id)
    decisions = [append.decide(LogState.from_metadata(table.metadata), table) for _ in range(2)]
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs) == before  # nothing written
    assert decisions[0] == decisions[1] and decisions[0].add_files == ()
    assert decisions[0].ranges == {0: (1, 4)} and [(p.index, p.first) for p in decisions[0].rows[0]] == [(0, 1), (1, 2)]

    journal = LogTable.open(catalog, JOURNAL).table()
    state = JournalState.from_metadata(journal.metadata)
    now = mine.clock()
    held = OpenTxn(mine.txn_id, coordinator.ONGOING, now, now, {"db.a": (0,), "db.b": (0,)})  # not in the journal (SQL)
    step = coordinator.CommitTransaction(
        "mine", mine.producer_id, mine.epoch, mine.txn_id, tables=("db.a", "db.b"), clock=mine.clock, unprepared=held
    )
    b_decision = replace(decisions[0], ranges={0: (0, 1)})
    committed = step.decide_after(state, journal, {"db.a": decisions[0], "db.b": b_decision})
    assert committed.result["ranges"] == {"db.a": {"0": [1, 4]}, "db.b": {"0": [0, 1]}}
    assert step.ranges == {}  # the request itself is unchanged: the offsets went to a copy


# --- 9. the SQL fast path: one swap per transaction ---------------------------------------------------


@contextlib.contextmanager
def pointer_swaps(catalog):
    """Every database transaction of the catalog's engine that moved metadata pointers, as the
    list of tables it moved (counted on the real database connection, not in icelog's code)."""
    from sqlalchemy import event

    engine, swaps, current = catalog.engine, [], []

    def on_execute(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE ICEBERG_TABLES"):
            params = context.compiled_parameters[0]  # by name, whatever the driver's paramstyle
            name = [v for k, v in params.items() if k.startswith(("table_namespace", "table_name"))]
            current.append(".".join(name))

    def on_commit(conn):
        if current:
            swaps.append(sorted(current))
            current.clear()

    event.listen(engine, "before_cursor_execute", on_execute)
    event.listen(engine, "commit", on_commit)
    try:
        yield swaps
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        event.remove(engine, "commit", on_commit)


@pytest.mark.parametrize("width", [2, 10])
def test_i5_sql_transaction_is_one_swap_of_its_tables_offsets_and_journal(catalog, width):
    """begin, sends to ``width`` tables, offsets, commit: exactly one database transaction moves
    pointers, and it moves every data table, the group offsets and the journal together; the
    journal gets one record, COMMITTED, naming the offsets the tables got."""
    tables = [LogTable.create(catalog, f"db.t{i}", 1) for i in range(width)]
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": "s", "value": "s"}] * 3})
    producer = TransactionalProducer(catalog, "fast")
    producer.init_transactions()
    with pointer_swaps(catalog) as swaps:
        txn_id = producer.begin_transaction()
        for t in tables:
            producer.send(t.identifier, 0, [{"key": "k", "value": "1"}])
        producer.send_offsets_to_transaction({("db.src", 0): 2}, "g")
        ranges = producer.commit_transaction()
    assert swaps == [sorted([*(t.identifier for t in tables), "icelog_system.group_offsets", "icelog_system.transactions"])], (
        swaps
    )
    assert ranges == {f"db.t{i}": {"0": [0, 1]} for i in range(width)}
    assert journal_states(catalog, txn_id) == ["COMMITTED"]
    assert committed_offsets(catalog, "g", "db.src") == {0: 2}
    assert all(rows(t) == [(0, "k", "1")] for t in tables)
    assert [staged_files(t) for t in tables] == [[]] * width, "a table's staging folder outlived the commit"
    # and the next one too: nothing left over from the first makes a second journal commit
    with pointer_swaps(catalog) as swaps:
        with producer.transaction():
            producer.send("db.t0", 0, [{"key": "k", "value": "2"}])
    assert len(swaps) == 1, swaps


def test_i5_sql_commit_whose_staged_file_is_gone_leaves_no_data_file_in_any_table(catalog):
    """The commit writes every table's data files side by side: when one table's staged payload
    is gone (orphan cleanup, a finished coordinator), the files written for the other tables are
    deleted with the failed commit, and nothing is visible."""
    tables = [LogTable.create(catalog, f"db.t{i}", 1) for i in range(4)]
    producer = TransactionalProducer(catalog, "gone")
    producer.init_transactions()
    producer.begin_transaction()
    for t in tables:
        producer.send(t.identifier, 0, [{"key": "k", "value": t.identifier}])
    [gone] = staged_files(tables[2])
    os.remove(local_path(gone))
    with pytest.raises(PreparedFilesMissing):
        producer.commit_transaction()
    assert [rows(t) for t in tables] == [[]] * 4
    assert [unreferenced_data_files(t) for t in tables] == [[]] * 4, "a data file of the failed commit was left behind"


def test_i5_sql_abort_of_a_transaction_the_journal_never_heard_of_writes_nothing(catalog):
    a, b = two_tables(catalog)
    producer = TransactionalProducer(catalog, "quitter")
    producer.init_transactions()
    with pointer_swaps(catalog) as swaps:
        txn_id = producer.begin_transaction()
        producer.send("db.a", 0, [{"key": "k", "value": "1"}])
        producer.send("db.b", 0, [{"key": "k", "value": "-1"}])
        producer.abort_transaction()
    assert swaps == [] and journal_states(catalog, txn_id) == []
    assert staged_files(a) == staged_files(b) == [] and rows(a) == rows(b) == []


def test_i5_i10_sql_offsets_and_ranges_sent_by_a_member_are_fenced_by_its_generation_and_land(catalog, unchanged):
    # The SQL fast path commits what send_offsets_to_transaction / send_ranges_to_transaction
    # recorded with their member and generation, as the REST path does: a stale generation is
    # refused with nothing visible, a current one's ranges land with the output.
    from icelog.storage.errors import StaleGeneration
    from icelog.storage.groups.consumer import Consumer
    from icelog.storage.groups.offsets import committed_offsets

    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": "k", "value": str(i)} for i in range(10)]})
    out = LogTable.create(catalog, "db.out", 1)
    first = Consumer(catalog, "g", member_id="first")
    first.subscribe("db.src")
    stale = first.generation
    second = Consumer(catalog, "g", member_id="second")
    second.subscribe("db.src")  # a rebalance: the first member's generation is stale
    first.poll(1)  # the first member learns its new generation
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.out", 0, [{"key": "k", "value": "x"}])
    producer.send_offsets_to_transaction({("db.src", 0): 4}, "g", member="first", generation=stale)
    with unchanged(out), pytest.raises(StaleGeneration):
        producer.commit_transaction()
    assert committed_offsets(catalog, "g", "db.src") == {}

    producer.begin_transaction()
    producer.send("db.out", 0, [{"key": "k", "value": "y"}])
    producer.send_ranges_to_transaction({("db.src", 0): [(0, 3)]}, "g", member="first", generation=first.generation)
    producer.commit_transaction()
    assert [r["value"] for r in out.read(0).to_pylist()] == ["y"]
    assert committed_offsets(catalog, "g", "db.src") == {0: 4}

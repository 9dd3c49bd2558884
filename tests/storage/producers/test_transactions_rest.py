"""Transactions on an Iceberg REST catalog over S3 (a real SeaweedFS server), which cannot commit
several tables in one step: the journal's PREPARE_COMMIT is the decision, and each table then
rolls forward in its own commit, carrying the transaction id (docs/transactions.md).

Worker processes are killed with SIGKILL at every named point; recovery (or a new instance)
finishes what was decided exactly once and aborts what was not. The same path on a local
catalog, stopped at the points in-process, is section 7 of ``test_transactions.py``.
"""

from __future__ import annotations

import json
import random
import threading
import time

import duckdb
import pytest

from icelog.storage.admin.maintenance import maintain
from icelog.storage.admin.orphans import referenced_files
from icelog.storage.core import faults
from icelog.storage.errors import ExpectedOffsetNeedsAtomicCatalog, IcelogError, ProducerFenced, TransientError
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.validations.checks import run_checks
from icelog.validations.sql import connect
from infra import seaweedfs
from tests.support.catalogs import CatalogSpec
from tests.support.transactions import (
    BEFORE_PREPARE,
    check_all_or_nothing,
    journal,
    journal_states,
    kill_one_transaction,
    past_timeout,
    rows,
    staged_files,
    two_tables,
)

pytestmark = [pytest.mark.integration]


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", faults.TXN_POINTS)
def test_i5_rest_kill_at_every_transaction_point_then_recover_finishes_all_or_nothing(rest_spec, tmp_path, point):
    catalog, a, b, before, txn_id, _ = kill_one_transaction(rest_spec, tmp_path, point)
    report = tx.recover(catalog, clock=past_timeout())
    if point in BEFORE_PREPARE:  # its sends registered nothing: only orphan files are left
        assert report == {"rolled_forward": [], "aborted": []}
        if point == faults.AFTER_TXN_STAGE:
            assert len(staged_files(a)) == 1, "a's pre-written file is there for orphan cleanup to find"
    else:  # decided at PREPARE_COMMIT: every later point rolls forward, none was ever atomic
        assert report == {"rolled_forward": [txn_id], "aborted": []}
    check_all_or_nothing(catalog, a, b, before, txn_id, point)


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_i5_rest_kill_between_two_tables_then_a_new_instance_finishes_it(rest_spec, tmp_path):
    point = faults.BETWEEN_TABLE_SWAPS
    catalog, a, b, before, txn_id, epoch = kill_one_transaction(rest_spec, tmp_path, point)
    # One part landed, the others were under way: each table holds the transaction whole or not yet.
    assert rows(a) in (before[0], [*before[0], (1, f"{txn_id}:a", "5")])
    assert rows(b) in (before[1], [*before[1], (1, f"{txn_id}:b", "-5")])
    # Decided, maybe half applied: the transactions check sees it committing, not a violation.
    assert run_checks(a.table(), ["transactions"]).ok and run_checks(b.table(), ["transactions"]).ok
    producer = TransactionalProducer(catalog, "copier-1")
    assert producer.init_transactions()["epoch"] == epoch + 1
    check_all_or_nothing(catalog, a, b, before, txn_id, point)


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_i5_i7_rest_maintenance_between_the_decision_and_the_roll_forward_loses_nothing(rest_spec, tmp_path):
    """Compaction, snapshot expiry and orphan cleanup (of files of any age) run on both tables
    after the decision and before recovery: the staged files the roll-forward needs stay, and the
    transaction lands once, whole."""
    point = faults.AFTER_TXN_PREPARE
    catalog, a, b, before, txn_id, _ = kill_one_transaction(rest_spec, tmp_path, point)
    staged = staged_files(a) + staged_files(b)
    assert len(staged) == 2
    for t in (a, b):
        maintain(catalog, t.identifier, keep_snapshots=1, orphan_age_s=0)
    assert staged_files(a) + staged_files(b) == staged
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [txn_id], "aborted": []}
    check_all_or_nothing(catalog, a, b, before, txn_id, point)


def test_i1_i5_rest_a_send_writes_its_data_file_once_and_a_moved_partition_renumbers_it(rest_catalog):
    """A send writes its data file at the log end it sees; the roll-forward commits that very
    file where no other writer moved the partition, and a renumbered copy where one did."""
    a = LogTable.create(rest_catalog, "db.a", 1)
    b = LogTable.create(rest_catalog, "db.b", 1)
    a.append({0: [{"key": "k", "value": "0"}]})
    producer = TransactionalProducer(rest_catalog, "writer")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "x", "value": "1"}] * 2)
    producer.send("db.b", 0, [{"key": "y", "value": "2"}])
    (written_a,), (written_b,) = staged_files(a), staged_files(b)
    assert "/data/txn-" in written_a and "/data/txn-" in written_b  # data files, in the transaction's folder
    b.append({0: [{"key": "z", "value": "other"}]})  # another writer moves db.b's log end
    assert producer.commit_transaction() == {"db.a": {"0": [1, 3]}, "db.b": {"0": [1, 2]}}
    assert written_a in referenced_files(a.table())  # committed as written: nothing read back or rewritten
    assert written_b not in referenced_files(b.table())  # numbered at 0, placed at 1: a renumbered copy
    assert rows(a) == [(0, "k", "0"), (1, "x", "1"), (2, "x", "1")]
    assert rows(b) == [(0, "z", "other"), (1, "y", "2")]
    for t in (a, b):
        assert run_checks(t.table(), ["contiguity-deep", "transactions"]).ok
        assert staged_files(t) == []


def test_i3_i5_rest_zombie_prepare_after_a_new_instance_is_fenced_and_nothing_of_it_is_visible(rest_catalog):
    """A send registers nothing in the journal (its PREPARE_COMMIT registers every partition): a
    new instance's init finds nothing of the zombie's transaction to abort, and the zombie's
    PREPARE_COMMIT is what the epoch fences. The fenced zombie deletes the data files its sends
    wrote; nothing of it is ever visible, and the new instance goes on."""
    a, b = two_tables(rest_catalog)
    zombie = TransactionalProducer(rest_catalog, "orders")
    zombie.init_transactions()
    txn_id = zombie.begin_transaction()
    zombie.send("db.a", 0, [{"key": "zombie", "value": "1"}])
    zombie.send("db.b", 0, [{"key": "zombie", "value": "-1"}])
    assert journal_states(rest_catalog, txn_id) == [], "a send wrote to the journal"
    assert len(staged_files(a)) == len(staged_files(b)) == 1
    successor = TransactionalProducer(rest_catalog, "orders")
    assert successor.init_transactions()["epoch"] == zombie.epoch + 1
    with pytest.raises(ProducerFenced):
        zombie.commit_transaction()
    assert journal_states(rest_catalog, txn_id) == []
    assert rows(a) == rows(b) == []
    assert staged_files(a) == staged_files(b) == [], "the fenced zombie left its data files"
    with successor.transaction():
        successor.send("db.a", 0, [{"key": "successor", "value": "2"}])
    assert [r[1] for r in rows(a)] == ["successor"] and rows(b) == []


def test_i5_rest_transaction_idle_past_its_timeout_cannot_commit(rest_catalog, unchanged):
    """Nothing of it is in the journal before its decision: PREPARE_COMMIT judges the timeout, by
    the journal's clock, on its last new partition's send, and writes nothing when it refuses."""
    a, b = two_tables(rest_catalog, partitions=2)
    clock = [1_000_000_000]
    producer = TransactionalProducer(rest_catalog, "slow", timeout_ms=1_000, clock=lambda: clock[0])
    producer.init_transactions()
    live = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "live", "value": "1"}])
    clock[0] += 999
    producer.send("db.b", 1, [{"key": "live", "value": "-1"}])  # a new partition: the transaction is live
    clock[0] += 1_000
    assert producer.commit_transaction() == {"db.a": {"0": [0, 1]}, "db.b": {"1": [0, 1]}}
    producer.close()
    assert journal_states(rest_catalog, live) == ["PREPARE_COMMIT", "COMMITTED"]

    idle = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "idle", "value": "1"}])
    producer.send("db.b", 0, [{"key": "idle", "value": "-1"}])
    clock[0] += 999
    producer.send("db.a", 0, [{"key": "idle", "value": "2"}])  # a partition it has: no new activity
    clock[0] += 2
    with unchanged(a), unchanged(b), pytest.raises(coordinator.TransactionAborted) as caught:
        producer.commit_transaction()
    assert caught.value.txn_id == idle and producer.txn_id is None
    assert journal_states(rest_catalog, idle) == []
    assert staged_files(a) == staged_files(b) == []


def test_i5_rest_files_orphan_cleanup_took_before_the_decision_abort_it_with_nothing_visible(rest_catalog, unchanged):
    """The journal knows nothing of a transaction before its decision, so orphan cleanup keeps its
    data files only by its age limit; run with too short a limit (here 0 s), it deletes them. The
    commit finds them gone before it decides: aborted (``SentFilesMissing``), nothing visible,
    nothing in the journal, rather than a decision whose roll-forward could never land."""
    from icelog.storage.admin.orphans import remove_orphan_files
    from icelog.storage.errors import SentFilesMissing

    a, b = two_tables(rest_catalog)
    producer = TransactionalProducer(rest_catalog, "copier")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "k", "value": "1"}])
    producer.send("db.b", 0, [{"key": "k", "value": "-1"}])
    (gone,) = staged_files(a)
    time.sleep(1.5)  # past the limit by the store's clock (whole-second modification times)
    assert gone in remove_orphan_files(rest_catalog, "db.a", older_than_s=0)
    with unchanged(a), unchanged(b), pytest.raises(SentFilesMissing) as caught:
        producer.commit_transaction()
    assert caught.value.table == "db.a" and caught.value.txn_id == txn_id and len(caught.value.missing) == 1
    assert producer.txn_id is None and journal_states(rest_catalog, txn_id) == []
    assert staged_files(b) == [], "the aborted transaction's other files stay behind"
    with producer.transaction():  # the transactional id goes on
        producer.send("db.a", 0, [{"key": "again", "value": "1"}])
    assert [r[1] for r in rows(a)] == ["again"]


def test_i5_rest_abort_before_the_decision_deletes_the_files_executors_wrote_for_it(rest_catalog, unchanged):
    """The journal never heard of a transaction aborted before its decision: its producer alone
    knows its tables, and deletes their transaction folders, with the files executors wrote there
    for ``send_files`` (the journal would otherwise have named them to whoever aborted it)."""
    from icelog.storage.log.files import write_log_files
    from icelog.storage.log.table import with_system_columns

    a, _ = two_tables(rest_catalog)
    producer = TransactionalProducer(rest_catalog, "job")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    table = a.table()
    payload = a.conform({0: [{"key": "k", "value": "1"}]})[0]
    (written,) = write_log_files(
        table, {0: with_system_columns(payload, 0, 0, 0, None, None)}, directory=producer.data_dir("db.a")
    )
    assert producer.send_files("db.a", {0: [written.file_path]}, {0: 0}) == 1
    assert staged_files(a) and journal_states(rest_catalog, txn_id) == []
    with unchanged(a):
        producer.abort_transaction()
    assert staged_files(a) == [], "the executors' files of an aborted transaction stay behind"


def test_i5_rest_transaction_with_offsets_commits_once_and_reads_whole(rest_catalog, unchanged):
    a = LogTable.create(rest_catalog, "db.a", 2)
    b = LogTable.create(rest_catalog, "db.b", 1)
    src = LogTable.create(rest_catalog, "db.src", 1)
    src.append({0: [{"key": str(i), "value": str(i)} for i in range(4)]})
    producer = TransactionalProducer(rest_catalog, "copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.a", 1, [{"key": "x", "value": "1"}] * 3)
        producer.send("db.b", 0, [{"key": "y", "value": "2"}])
        producer.send_offsets_to_transaction({("db.src", 0): 4}, "copier-group")
        txn_id = producer.txn_id
    assert producer.last_commit == {"db.a": {"1": [0, 3]}, "db.b": {"0": [0, 1]}}
    producer.close()  # its COMMITTED record (else written by the next transaction's first step)
    assert committed_offsets(rest_catalog, "copier-group", "db.src") == {0: 4}
    assert [r["txn_state"] for r in journal(rest_catalog) if r["txn_id"] == txn_id] == [
        "ADD_OFFSETS",  # the group, registered before the decision (a rebalance fence); the sends registered nothing
        "PREPARE_COMMIT",
        "COMMITTED",
    ]
    committed = next(r for r in journal(rest_catalog) if r["txn_id"] == txn_id and r["txn_state"] == "COMMITTED")
    assert json.loads(committed["detail"])["ranges"] == producer.last_commit
    for t in (a, b):
        assert run_checks(t.table(), ["contiguity-deep", "transactions"]).ok
    assert staged_files(a) == staged_files(b) == []
    assert coordinator.transactional_ids(rest_catalog)["copier"].txn is None

    producer.begin_transaction()
    with unchanged(a), pytest.raises(ExpectedOffsetNeedsAtomicCatalog):
        producer.send("db.a", 1, [{"key": "x", "value": "1"}], expected_offset=3)
    producer.abort_transaction()


def _own_spec(directory) -> CatalogSpec:
    config = seaweedfs.catalog_config(directory)
    return CatalogSpec("rest", "ten", config.pop("uri"), config.pop("warehouse"), tuple(sorted(config.items())))


def _keys(con, name: str) -> set[str]:
    return {k for (k,) in con.execute(f"SELECT key FROM {name}").fetchall()}


def _parts(con, names: list[str]) -> tuple[set[str], set[str]]:
    """Every transaction a read saw, and those it saw in some tables but not all."""
    seen = [_keys(con, name) for name in names]
    union = set().union(*seen)
    return union, {k for k in union if not all(k in s for s in seen)}


@pytest.mark.fault
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kills", [4, pytest.param(16, marks=pytest.mark.slow)])
def test_i5_rest_consistent_reads_racing_ten_table_transactions_across_server_kills_see_each_whole(
    own_seaweedfs, monkeypatch, kills
):
    """A writer commits transactions over 10 tables (one in three aborted) while the server is
    killed with SIGKILL and restarted; a reader reads all 10 tables over and over. No consistent
    read ever sees a transaction in some tables and not others, and no table ever holds an aborted
    one. Every other kill lands inside a roll-forward, once its first table has its part: then,
    before the writer may retry, the tables are read both ways, and the plain read must find the
    transaction half applied (so the consistent one had something to hold back)."""
    catalog = _own_spec(own_seaweedfs).open()
    names = [f"db.t{i}" for i in range(10)]
    for name in names:
        LogTable.create(catalog, name, 1)
    stop, rng = threading.Event(), random.Random(32)
    armed, killed, gate = threading.Event(), threading.Event(), threading.Event()
    gate.set()  # closed while the test reads a roll-forward cut short
    committed: list[str] = []
    aborted: list[str] = []
    torn: list[tuple[str, set[str]]] = []
    reads, halves_held_back = [0], [0]
    checkpoint = faults.checkpoint

    def kill_inside_a_roll_forward(name: str) -> None:
        if name == faults.BETWEEN_TABLE_SWAPS and armed.is_set():
            armed.clear()
            seaweedfs.stop(own_seaweedfs, grace=0)
            killed.set()
        checkpoint(name)

    monkeypatch.setattr(faults, "checkpoint", kill_inside_a_roll_forward)

    def until_done(step):
        deadline = time.monotonic() + 120
        while True:
            try:
                return step()
            except TransientError:
                if time.monotonic() > deadline:
                    raise
                gate.wait(120)
                time.sleep(0.2)

    def write() -> None:
        producer, n = TransactionalProducer(catalog, "ten"), 0
        until_done(producer.init_transactions)
        while not stop.is_set():
            n, txn_id = n + 1, None
            try:
                txn_id = producer.begin_transaction()
                for name in names:
                    producer.send(name, 0, [{"key": txn_id, "value": str(n)}])
                if n % 3 == 2:
                    producer.abort_transaction()
                    aborted.append(txn_id)
                    continue
            except IcelogError:  # never decided: a new instance aborts it
                aborted.extend([txn_id] if txn_id else [])
                producer = TransactionalProducer(catalog, "ten")
                until_done(producer.init_transactions)
                continue
            until_done(producer.commit_transaction)  # decided or not, a retry finds out and finishes it
            committed.append(txn_id)

    def read(who: str) -> None:
        _, half = _parts(connect(catalog), names)
        if half:
            torn.append((who, half))
        reads[0] += 1

    def keep_reading() -> None:
        while not stop.is_set():
            try:
                read("reader")
            except (IcelogError, OSError, duckdb.Error):
                time.sleep(0.1)  # the server is down: no read, not a wrong one

    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=keep_reading, daemon=True)]
    for thread in threads:
        thread.start()
    for kill in range(kills):
        time.sleep(rng.uniform(1.0, 3.0))
        if kill % 2:  # at any moment
            seaweedfs.stop(own_seaweedfs, grace=0)
            time.sleep(rng.uniform(0.2, 1.0))
            seaweedfs.start(own_seaweedfs)
            continue
        gate.clear()
        armed.set()
        assert killed.wait(120), "no roll-forward reached its second table"
        killed.clear()
        seaweedfs.start(own_seaweedfs)
        halves_held_back[0] += bool(until_done(lambda: _parts(connect(catalog, consistent=False), names))[1])
        until_done(lambda: read("after a kill inside a roll-forward"))
        gate.set()
    time.sleep(2)
    stop.set()
    for thread in threads:
        thread.join(timeout=180)
        assert not thread.is_alive()
    assert not torn, torn[:3]
    assert halves_held_back[0] >= 1 and reads[0] >= 5 and len(committed) >= 2 and aborted
    tx.recover(catalog, clock=past_timeout())
    every, half = _parts(connect(catalog), names)
    assert not half and set(committed) <= every and not every & set(aborted)
    for name in names:
        assert run_checks(LogTable.open(catalog, name).table(), ["contiguity-deep", "transactions"]).ok

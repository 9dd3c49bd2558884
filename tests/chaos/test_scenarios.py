"""Named chaos scenarios: Kafka's own transaction bugs and Jepsen's findings, each replayed
against icelog with real processes.

=====  ==========================================  ===========================================================  ==========================================
 #     case (source)                               test                                                         icelog's mechanism
=====  ==========================================  ===========================================================  ==========================================
 1     delayed commit/abort of txn N vs N+1        test_kafka_17754_delayed_commit_or_abort_of_txn_n_does_not_  journal steps name their transaction id;
       (KAFKA-17754, fixed by KIP-890)             touch_txn_n_plus_1                                           the commit id is the transaction id
 2     late append to an unregistered partition    test_kip_890_late_append_to_a_partition_never_registered_   prepare refuses partitions the journal never
       (KIP-890 part 1, hanging transactions)      is_refused                                                   registered; an ended transaction never begins
                                                                                                                again; late staged files are deleted
 3     old epoch fenced, at the upper bound too    test_kafka_19367_old_epoch_is_fenced_at_the_epoch_upper_     epoch checked at every journal step; at the
       (KAFKA-19367, KAFKA-20090)                  bound                                                        bound a fresh producer id, older ids fenced
 4     unknown commit outcome: look up, never      test_jepsen_unknown_commit_outcome_is_resolved_by_look_up_  commit ids in every table's registry; a
       retry blind (Jepsen: indeterminate)         never_by_blind_retry                                         retried commit_transaction looks its id up
 5     new coordinator finishes a prepared txn     test_kafka_new_coordinator_finishes_a_prepared_transaction_  PREPARE_COMMIT holds the staged files;
       (Kafka PREPARE_COMMIT semantics)            never_aborts_it                                              recovery and init roll it forward
 6     readers never see aborted or half-applied   test_jepsen_reader_never_sees_an_aborted_or_half_applied_   one atomic multi-table swap; staged files
       transactions (Jepsen: aborted/G1a reads)    transaction                                                  are invisible until it
 7     offsets never restart at 0 after a crash    test_jepsen_offsets_never_restart_at_zero_after_a_crash     watermarks live in table properties, moved
       (Jepsen: offset reuse)                                                                                   in the same commit as the data
=====  ==========================================  ===========================================================  ==========================================

Delayed processes are *held* at a fault point (``tests/chaos/scenario_worker.py``) and released
when the live ones have moved on; crashed ones are killed with SIGKILL at a named point. Each
runs on SQLite and PostgreSQL; the longest ones run on PostgreSQL under ``slow`` only.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import commit as core
from icelog.storage.core import faults
from icelog.storage.core.commit import KEEP_COMMIT_IDS, commit
from icelog.storage.errors import CommitOutcomeUnknown, OffsetMismatch, ProducerFenced
from icelog.storage.groups.offsets import GROUPS_TABLE, commit_offsets, committed_offsets
from icelog.storage.log.maintenance import Retention, expire_snapshots
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.journal import InvalidTxnState
from icelog.storage.producers.journal_state import Prepared, StagedSend, encode_transactions
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.properties import TRANSACTIONS
from tests.support.faults import kill_9
from tests.support.faults import run_to_end as run_append_worker
from tests.support.transactions import (
    SMALL,
    check_all_or_nothing,
    commit_balanced,
    contiguous,
    events,
    journal_states,
    kill_at,
    kill_one_transaction,
    metadata_locations,
    past_timeout,
    rows,
    staged_files,
    two_tables,
    wait_for_pause,
    whole_transaction_reads,
    worker,
)
from tests.support.workers.transactions import registering

SCENARIOS = "tests.chaos.scenario_worker"
pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]


@dataclass
class Held:
    child: subprocess.Popen
    release_file: Path
    out: Path

    def release(self, timeout: float = 180) -> list[dict]:
        """Let the delayed process go on; it must finish cleanly. Returns its events."""
        self.release_file.touch()
        code = self.child.wait(timeout=timeout)
        assert code == 0, self.out.read_text()[-4000:]
        return events(self.out)


@contextlib.contextmanager
def held(spec, mode: str, args: dict, tmp: Path, tag: str, point: str, hit: int = 1):
    """A scenario worker held at the ``hit``-th pass of ``point`` until released."""
    marker, release, out = tmp / f"{tag}.held", tmp / f"{tag}.release", tmp / f"{tag}.out"
    args = {**args, "hold": point, "hit": hit, "held": str(marker), "release": str(release)}
    with worker(mode, spec, args, out, module=SCENARIOS) as child:
        wait_for_pause(child, str(marker), out)
        yield Held(child, release, out)


def set_properties(catalog, identifier: str, properties: dict[str, str]) -> None:
    """Test set-up only: a plain property commit (no icelog state changes)."""
    with catalog.load_table(identifier).transaction() as txn:
        txn.set_properties(properties)


def begin_one(producer: TransactionalProducer, key: str, k: int, position: int) -> str:
    """Open a transaction of +k to db.a, -k to db.b and the group g's position on db.src."""
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": key, "value": str(k)}])
    producer.send("db.b", 0, [{"key": key, "value": str(-k)}])
    producer.send_offsets_to_transaction({("db.src", 0): position}, "g")
    return txn_id


def source(catalog, records: int = 10) -> LogTable:
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": str(i), "value": str(i)} for i in range(records)]})
    return src


# --- 1. KAFKA-17754 ---------------------------------------------------------------------------------


def test_kafka_17754_delayed_commit_or_abort_of_txn_n_does_not_touch_txn_n_plus_1(heavy_spec, tmp_path, monkeypatch):
    """KAFKA-17754 (fixed by KIP-890 part 2): a delayed EndTxn of transaction N, carrying the
    same producer id and epoch, completed transaction N+1. icelog: every journal step names its
    transaction id, and the commit id of a transaction is its id.

    On SQL a transaction commits in its producer's one swap (no coordinator rolls it forward):
    an operator's abort of N decides while N is open and acts once N committed, other writers
    pushed N's id out of every registry, and N+1 is open; a recovery runs then too. N+1 is left
    exactly as it was, then commits with the offsets it would have had anyway. (Recoverers that
    roll a decided N forward late: tests/storage/producers/test_transactions.py, section 7.)
    """
    catalog = heavy_spec.open()
    forgetful = {
        KEEP_COMMIT_IDS: "2",
        "icelog.commit-ids.min-retention-ms": "0",
    }  # a registry that forgets fast, as after 1,000 commits
    a, b = (LogTable.create(catalog, name, 1, properties={**SMALL, **forgetful}) for name in ("db.a", "db.b"))
    source(catalog)
    commit_offsets(catalog, "other", {("db.src", 0): 1})
    journal.ensure_journal(catalog)
    for name in (journal.JOURNAL, GROUPS_TABLE):
        set_properties(catalog, name, forgetful)
    # Registered in the journal (as pre-written sends do on SQL), so an operator's abort can read
    # N open. On SQL only the producer's own swap can commit N: no recoverer ever decides on it.
    producer = registering(TransactionalProducer(catalog, "seq"))
    producer.init_transactions()
    first = begin_one(producer, "n", 1, 4)

    with contextlib.ExitStack() as stack:
        late_abort = stack.enter_context(held(heavy_spec, "abort", {"tid": "seq"}, tmp_path, "abort", faults.AFTER_DATA_FILES))
        assert producer.commit_transaction() == {"db.a": {"0": [0, 1]}, "db.b": {"0": [0, 1]}}

        second = begin_one(producer, "n+1", 2, 7)
        for t in (a, b):  # other writers: N's commit id leaves every table's registry
            for i in range(2):
                t.append({0: [{"key": f"other{i}", "value": "0"}]})
        for position in (2, 3):
            commit_offsets(catalog, "other", {("db.src", 0): position})
        ongoing = journal.transactional_ids(catalog)["seq"].txn
        assert ongoing.id == second and ongoing.state == "ONGOING"
        data, staged = metadata_locations(catalog, "db.a", "db.b"), staged_files(a) + staged_files(b)

        assert late_abort.release()[-1] == {"event": "report", "transactional_id": "seq", "aborted": None}
        assert tx.recover(catalog) == {"rolled_forward": [], "aborted": []}

    assert journal.transactional_ids(catalog)["seq"].txn == ongoing, "transaction N+1 was touched"
    assert metadata_locations(catalog, "db.a", "db.b") == data, "a delayed step of N committed"
    assert staged_files(a) + staged_files(b) == staged
    assert journal_states(catalog, first).count("COMMITTED") == 1 and "ABORTED" not in journal_states(catalog, first)

    assert producer.commit_transaction() == {"db.a": {"0": [3, 4]}, "db.b": {"0": [3, 4]}}
    assert [r[1] for r in rows(a)] == [r[1] for r in rows(b)] == ["n", "other0", "other1", "n+1"]
    assert committed_offsets(catalog, "g", "db.src") == {0: 7}
    assert journal_states(catalog, second).count("COMMITTED") == 1
    for t in (a, b):
        contiguous(t)


# --- 2. KIP-890 part 1: late appends ----------------------------------------------------------------


def test_kip_890_late_append_to_a_partition_never_registered_is_refused(heavy_spec, tmp_path):
    """KIP-890 part 1 (hanging transactions): a produce request that reached a partition the
    coordinator never added to the transaction, or after the transaction ended, was written
    anyway. icelog: PREPARE_COMMIT refuses any partition the journal never registered for that
    transaction, a transaction that ended never begins again under the same id, and a file
    staged after the coordinator cleaned up is deleted by the producer.

    A producer is held inside its first send (partition registered, file not yet staged) while
    recovery aborts the transaction past its timeout; released, it stages its file late and
    sends to a new partition: refused, nothing visible, nothing left. Then a client that skips
    registration (a lost AddPartitionsToTxn) tries to prepare: refused, the journal unchanged.
    Both producers register their partitions in the journal, as sends of pre-written files do on
    SQL (plain sends there register nothing: the commit's one swap is the journal's only record).
    """
    catalog = heavy_spec.open()
    a, b = two_tables(catalog)
    journal.ensure_journal(catalog)
    with held(heavy_spec, "late", {"tid": "late", "a": "db.a", "b": "db.b"}, tmp_path, "late", faults.AFTER_TXN_BEGIN) as late:
        txn_id = journal.transactional_ids(catalog)["late"].txn.id
        assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": [txn_id]}
        seen = late.release()
    assert seen[-1]["event"] == "refused" and seen[-1]["error"] == "TransactionAborted", seen
    assert journal_states(catalog, txn_id) == ["BEGIN", "ABORTED"], "an ended transaction began again"
    assert rows(a) == rows(b) == []
    assert staged_files(a) == staged_files(b) == [], "a late send's staged file was left behind"
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}

    # A client that never registered (b, 0) asks to prepare it (its partitions registered in the
    # journal as pre-written sends do on SQL: plain sends there register nothing before the commit).
    producer = registering(TransactionalProducer(catalog, "skips"))
    producer.init_transactions()
    skipped = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "registered", "value": "1"}])
    journal_before = catalog.load_table(journal.JOURNAL).metadata_location
    prepared = Prepared(sends={"db.a": (StagedSend(0, None, "a.parquet", 1),), "db.b": (StagedSend(0, None, "b.parquet", 1),)})
    step = journal.PrepareCommit("skips", producer.producer_id, producer.epoch, skipped, prepared=prepared)
    with pytest.raises(InvalidTxnState, match="never registered"):
        commit(catalog, journal.JOURNAL, step)
    assert catalog.load_table(journal.JOURNAL).metadata_location == journal_before
    assert journal.transactional_ids(catalog)["skips"].txn.state == "ONGOING"
    producer.abort_transaction()
    assert rows(a) == rows(b) == [] and staged_files(a) == []


# --- 3. KAFKA-19367: epochs at their upper bound ----------------------------------------------------


def set_epoch(catalog, tid: str, epoch: int) -> None:
    """Test set-up: move a transactional id's epoch (as if it had been initialised that often)."""
    state = journal.transactional_ids(catalog)
    state[tid] = replace(state[tid], epoch=epoch)
    set_properties(catalog, journal.JOURNAL, {TRANSACTIONS: encode_transactions(state)})


@pytest.mark.parametrize(
    "zombie_epoch", [1, 2**31 - 3, 2**31 - 2], ids=["low", "takeover-reaches-the-bound", "takeover-rotates-the-id"]
)
def test_kafka_19367_old_epoch_is_fenced_at_the_epoch_upper_bound(heavy_spec, tmp_path, zombie_epoch):
    """KAFKA-19367 / KAFKA-20090: at the epoch's upper bound a takeover must still fence the
    old instance; there the coordinator moves to a new producer id, and a request from the old
    id must be fenced, not mistaken for an uninitialised client (nor leave its files behind).
    icelog: the epoch is checked at every journal step; at ``2**31 - 2`` init leases a fresh
    producer id, and a request with another producer id than the journal's is fenced.

    A zombie process holds an open transaction (both sends staged) at epoch ``zombie_epoch``;
    a new instance takes over; the released zombie's commit and abort are both fenced.
    """
    catalog = heavy_spec.open()
    a, b = two_tables(catalog)
    first = TransactionalProducer(catalog, "fenced")
    first.init_transactions()
    set_epoch(catalog, "fenced", zombie_epoch - 1)
    args = {"tid": "fenced", "a": "db.a", "b": "db.b"}
    with held(heavy_spec, "zombie", args, tmp_path, "zombie", faults.AFTER_TXN_STAGE, hit=2) as zombie:
        started = events(zombie.out)
        assert started[0] == {"event": "init", "producer_id": first.producer_id, "epoch": zombie_epoch}
        successor = TransactionalProducer(catalog, "fenced")
        taken = successor.init_transactions()
        if zombie_epoch >= 2**31 - 2:
            assert taken["producer_id"] != first.producer_id and taken["epoch"] == 0
        else:
            assert taken == {"producer_id": first.producer_id, "epoch": zombie_epoch + 1}
        seen = zombie.release()
    outcomes = {e["event"]: e.get("error") for e in seen if e["event"].endswith("_transaction")}
    # On SQL the one swap's epoch check fences the commit; the transaction ends with it, so the
    # abort after it has nothing left to abort. The journal never heard of the transaction.
    assert outcomes == {"commit_transaction": "ProducerFenced", "abort_transaction": None}, seen
    txn_id = started[1]["txn_id"]
    assert journal_states(catalog, txn_id) == []
    assert rows(a) == rows(b) == []
    assert staged_files(a) == staged_files(b) == [], "the fenced zombie's staged files were left behind"
    with successor.transaction():
        successor.send("db.a", 0, [{"key": "successor", "value": "1"}])
    assert [r[1] for r in rows(a)] == ["successor"]
    with pytest.raises(ProducerFenced):  # the old instance, in process, is fenced too (on SQL at its commit's swap)
        first.begin_transaction()
        first.send("db.b", 0, [{"key": "first", "value": "-1"}])
        first.commit_transaction()
    assert rows(b) == [] and staged_files(b) == []


# --- 4. Jepsen: indeterminate commits ----------------------------------------------------------------


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "never-landed"])
def test_jepsen_unknown_commit_outcome_is_resolved_by_look_up_never_by_blind_retry(catalog, monkeypatch, landed):
    """Jepsen's indeterminate failures: a commit whose response was lost may have happened;
    treating it as failed and retrying blind duplicates data (or, for a transaction, tells the
    producer it aborted when it committed). icelog: every commit's id is recorded in the same
    commit, and a retry looks it up before deciding again.

    The transaction's atomic commit fails with ``CommitOutcomeUnknown`` after landing (or
    before): the transaction stays open and prepared, refuses new sends and an abort, and
    ``commit_transaction()`` again returns the same offsets with the rows stored once. Then
    the commit core itself: an append whose catalog swap landed but whose connection dropped
    is found by its commit id on the next attempt, not applied again. (The restart after a
    kill -9 right after the swap is ``tests/storage/core/test_faults.py`` and the copier test in
    ``tests/storage/producers/test_transactions.py``.)
    """
    a, b = two_tables(catalog)
    source(catalog)
    producer = TransactionalProducer(catalog, "unsure")
    producer.init_transactions()
    txn_id = begin_one(producer, "once", 1, 5)
    real = tx.commit_tables

    def response_lost(catalog_, parts, **kwargs):
        monkeypatch.setattr(tx, "commit_tables", real)  # the next attempt reaches the catalog
        if landed:
            real(catalog_, parts, **kwargs)
        raise CommitOutcomeUnknown(table="db.a,db.b", commit_id=kwargs["commit_id"], reason="connection reset (injected)")

    monkeypatch.setattr(tx, "commit_tables", response_lost)
    with pytest.raises(CommitOutcomeUnknown):
        producer.commit_transaction()
    assert producer.txn_id == txn_id, "an unknown outcome is not a failure"
    with pytest.raises(InvalidTxnState):
        producer.send("db.a", 0, [{"key": "blind", "value": "1"}])
    with pytest.raises(InvalidTxnState, match="prepared"):
        producer.abort_transaction()
    assert producer.commit_transaction() == {"db.a": {"0": [0, 1]}, "db.b": {"0": [0, 1]}}
    assert rows(a) == [(0, "once", "1")] and rows(b) == [(0, "once", "-1")]
    assert committed_offsets(catalog, "g", "db.src") == {0: 5}
    assert journal_states(catalog, txn_id).count("COMMITTED") == 1 and "ABORTED" not in journal_states(catalog, txn_id)
    assert staged_files(a) == staged_files(b) == []

    swap = core.swap

    def swap_then_drop(catalog_, swaps):
        monkeypatch.setattr(core, "swap", swap)
        if landed:
            swap(catalog_, swaps)
        raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly (injected)"))

    monkeypatch.setattr(core, "swap", swap_then_drop)
    appended = a.append({0: [{"key": "append", "value": "0"}]}, commit_id="append-1")
    assert appended.ranges == {0: (1, 2)} and appended.duplicate == landed
    assert [r[1] for r in rows(a)] == ["once", "append"]
    contiguous(a)


# --- 5. a new coordinator finishes what was prepared ----------------------------------------------


def test_kafka_new_coordinator_finishes_a_prepared_transaction_never_aborts_it(heavy_spec, tmp_path):
    """Kafka's PREPARE_COMMIT: once the coordinator logged it, a new coordinator (after a
    failover) must complete the commit, never abort it: part of it may already be visible
    and the producer may have been told. icelog: PREPARE_COMMIT records the staged files in
    the journal; ``recover`` and ``init_transactions`` roll it forward, past its timeout too.

    The producer is killed right after PREPARE_COMMIT; the first coordinator (``recover``) is
    killed between the two tables' swaps of its roll-forward; then two coordinators race a new
    producer instance and a recovery past the timeout. All finish it once; none aborts it.
    """
    # SQL commits without PREPARE_COMMIT: the transaction is prepared as versions before that did
    # (a journal may hold one at an upgrade), the state this scenario is about.
    catalog, a, b, before, txn_id, epoch = kill_one_transaction(
        heavy_spec, tmp_path, faults.AFTER_TXN_PREPARE, legacy_prepare=True
    )
    kill_at(heavy_spec, "recover", {"pause": faults.BETWEEN_TABLE_SWAPS}, tmp_path, "coordinator0", module=SCENARIOS)
    assert journal.transactional_ids(catalog)["copier-1"].txn.state == "PREPARE_COMMIT"
    outs = [tmp_path / f"coordinator{i}.out" for i in (1, 2)]
    with (
        worker("recover", heavy_spec, {}, outs[0], module=SCENARIOS) as one,
        worker("recover", heavy_spec, {}, outs[1], module=SCENARIOS) as two,
    ):
        assert TransactionalProducer(catalog, "copier-1").init_transactions()["epoch"] == epoch + 1
        report = tx.recover(catalog, clock=past_timeout())
        codes = [one.wait(timeout=240), two.wait(timeout=240)]
    assert codes == [0, 0], [o.read_text()[-3000:] for o in outs]
    reports = [report] + [events(o)[-1] for o in outs]
    assert all(r["aborted"] == [] and r["rolled_forward"] in ([], [txn_id]) for r in reports), reports
    assert "ABORTED" not in journal_states(catalog, txn_id)
    check_all_or_nothing(catalog, a, b, before, txn_id, faults.BETWEEN_TABLE_SWAPS, prepared=True)  # rolled forward once


# --- 6. Jepsen: aborted and intermediate reads ------------------------------------------------------


POISON = 1_000_000  # an aborted transaction adds it to both tables: any sight of it breaks the zero sum


def abort_poisoned(producer: TransactionalProducer, how: str) -> str:
    """One transaction that must never be seen: aborted by its producer, or aborted after
    PREPARE_COMMIT because its expected offset can never hold."""
    txn_id = producer.begin_transaction()
    stale = None if how == "abort" else LogTable(producer.catalog, "db.a").watermarks()[0].end + 5
    producer.send("db.a", 0, [{"key": txn_id, "value": str(POISON)}], expected_offset=stale)
    producer.send("db.b", 0, [{"key": txn_id, "value": str(POISON)}])
    if how == "abort":
        producer.abort_transaction()
    else:
        with pytest.raises(OffsetMismatch):
            producer.commit_transaction()
    return txn_id


def test_jepsen_reader_never_sees_an_aborted_or_half_applied_transaction(heavy_spec, tmp_path):
    """Jepsen's aborted reads (G1a) and intermediate reads (G1b): a reader must never see rows
    of a transaction that aborted, nor part of one that committed. icelog: sends are staged
    out of the table; the commit point is one database transaction over every table's
    metadata pointer; a reader loads all tables at one catalog instant.

    A reader process polls both tables while committed transactions (+k, -k), aborted ones
    (+POISON on both, by abort and by an expected offset failing at the commit), one killed
    before its commit and one killed between its two tables' swaps (inside the one database
    transaction, so nothing of it lands) interleave.
    Every read sums to zero with equal log ends; the final read holds exactly what committed.
    """
    catalog = heavy_spec.open()
    a, b = two_tables(catalog)
    producer = TransactionalProducer(catalog, "mixed")
    producer.init_transactions()
    rng, total, committed, aborted = random.Random(7), 0, 0, []
    stop, out = tmp_path / "stop", tmp_path / "reader.out"
    with worker("reader", heavy_spec, {"a": "db.a", "b": "db.b", "stop": str(stop), "interval_s": 0.05}, out) as reader:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().strip()) and reader.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # a loaded machine starts the reader slowly: commit once it reads
        for i in range(12):
            if i % 3 == 2:
                aborted.append(abort_poisoned(producer, "abort" if i % 2 else "offset"))
                continue
            k = rng.randint(1, 1000)
            commit_balanced(producer, k)
            total, committed = total + k, committed + 1
        for n, point in enumerate((faults.AFTER_TXN_STAGE, faults.BETWEEN_TABLE_SWAPS)):
            seen = kill_at(
                heavy_spec, "one", {"tid": "killed", "a": "db.a", "b": "db.b", "k": 500, "pause": point}, tmp_path, f"killed{n}"
            )
            # On SQL neither landed: the second died inside its one swap, which rolled back.
            aborted.append(next(e["txn_id"] for e in seen if e.get("event") == "begin"))
        TransactionalProducer(catalog, "killed").init_transactions()
        commit_balanced(producer, 1)
        total, committed = total + 1, committed + 1
        stop.touch()
        assert reader.wait(timeout=180) == 0, out.read_text()[-4000:]
    reads = whole_transaction_reads(out)
    assert len({tuple(e["ends"]) for e in reads}) >= 3, "the reader never read while transactions committed"
    assert reads[-1]["ends"] == [committed, committed] and reads[-1]["sums"] == [total, -total]
    stored = {key for t in (a, b) for _, key, _ in rows(t)}
    assert not any(key.startswith(txn_id) for key in stored for txn_id in aborted)
    for t in (a, b):
        contiguous(t)


# --- 7. Jepsen: offsets reused after a crash --------------------------------------------------------


def emptied_by_retention(catalog) -> tuple[LogTable, LogTable]:
    """db.a and db.b with offsets [0, 3) written, then all of it removed by retention: no data
    file, no old snapshot, no orphan is left that could tell where the log ended."""
    a, b = two_tables(catalog)
    for t in (a, b):
        for i in range(3):
            t.append({0: [{"key": f"old{i}", "value": "0"}]})
        commit(catalog, t.identifier, Retention(t.identifier, retention_ms=1, now_ms=journal.now_ms() + 60_000))
        expire_snapshots(catalog, t.identifier, keep=1)
        remove_orphan_files(catalog, t.identifier, older_than_s=0)
        assert t.read(0).num_rows == 0 and (t.watermarks()[0].start, t.watermarks()[0].end) == (3, 3)
    return a, b


@pytest.mark.parametrize("crash", [*faults.POINTS, "transaction"])
def test_jepsen_offsets_never_restart_at_zero_after_a_crash(heavy_spec, tmp_path, crash):
    """Jepsen found logs that handed out offsets again after a crash (a new leader, or a log
    rebuilt from what was left on disk). icelog: each partition's log end lives in the table's
    properties, moved in the same commit as the rows, and never derived from the data files,
    so a partition emptied by retention keeps ``log_start == log_end``.

    Both tables are emptied by retention (offsets 0..2 gone, no file left); a writer is killed
    at each named point of an append (then re-sent), or a transaction is killed between its
    two tables' swaps (on SQL its database transaction rolls back). The next offsets are 3, 4, never 0.
    """
    catalog = heavy_spec.open()
    a, b = emptied_by_retention(catalog)
    if crash == "transaction":
        kill_at(
            heavy_spec,
            "one",
            {"tid": "crash", "a": "db.a", "b": "db.b", "k": 1, "pause": faults.BETWEEN_TABLE_SWAPS},
            tmp_path,
            "crash",
        )
        producer = TransactionalProducer(catalog, "crash")
        producer.init_transactions()  # on SQL the killed swap rolled back: nothing of it landed
        for key in ("next", "then"):
            with producer.transaction():
                producer.send("db.a", 0, [{"key": key, "value": "1"}])
                producer.send("db.b", 0, [{"key": key, "value": "-1"}])
        assert [r[0] for r in rows(a)] == [r[0] for r in rows(b)] == [3, 4]
    else:
        args = ("db.a", 0, 1, "victim", "crash-1")
        kill_9(heavy_spec, crash, "append_rows", *args, directory=tmp_path, table=a)
        assert run_append_worker(heavy_spec, "append_rows", *args, directory=tmp_path, name="resend")["range"] == [3, 4]
        assert a.append({0: [{"key": "next", "value": "0"}]}).ranges == {0: (4, 5)}
        assert [r[:2] for r in rows(a)] == [(3, "victim"), (4, "next")]
    assert (a.watermarks()[0].start, a.watermarks()[0].end) == (3, 5)
    contiguous(a)

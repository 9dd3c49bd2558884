"""Consume-transform-produce exactly once on a REST catalog (a real SeaweedFS server), which
cannot commit several tables in one step (I5, I10).

``Consumer.commit(also=...)`` there is a transaction of the member's transactional producer: the
group is registered in the coordinator journal (ADD_OFFSETS) before the member's generation is
checked, the journal decides, and the output and the range commit roll forward table by table
carrying the transaction id. A consumer adopting the group's partitions first finishes (or waits
for) every transaction registered with the group, so a decided batch is never consumed again.

The worker "dies" in-process at the named points (:func:`crash_at`); the subprocess SIGKILL
variant is ``test_consumer_processes.py``'s REST test.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from icelog.storage.core import faults
from icelog.storage.errors import (
    StaleGeneration,
    TransactionPartUnsupported,
    TransactionTableChanged,
    UnknownGroup,
    UnknownTable,
)
from icelog.storage.groups.consumer import Consumer
from icelog.storage.groups.offsets import committed_offsets, describe_group, group_state
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.validations.checks import run_checks
from tests.support.groups import output_files_request
from tests.support.transactions import journal, past_timeout, staged_files, unreferenced_data_files

pytestmark = [pytest.mark.integration]


class Crashed(BaseException):
    """The worker died here (an in-process stand-in for SIGKILL: nothing after it runs)."""


@contextlib.contextmanager
def crash_at(monkeypatch, point: str, after: str | None = None):
    """Raise :class:`Crashed` at fault point ``point`` (once ``after`` was passed, if given)."""
    real = faults.checkpoint
    armed = [after is None]

    def checkpoint(p: str) -> None:
        if p == after:
            armed[0] = True
        if armed[0] and p == point:
            armed[0] = False
            raise Crashed(point)
        real(p)

    with monkeypatch.context() as m:
        m.setattr(faults, "checkpoint", checkpoint)
        yield


def _source(catalog, n: int) -> LogTable:
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": f"k{i % 7}", "value": str(i)} for i in range(n)]})
    return src


def _process(consumer: Consumer, out: LogTable, max_records: int) -> list[int]:
    """Poll, transform (the source offset as the value) and commit with the output: the offsets done."""
    batches = consumer.poll(max_records)
    offsets = [o for b in batches for o in b.column("log_offset").to_pylist()]
    if not offsets:
        return []
    keys = [k for b in batches for k in b.column("key").to_pylist()]
    rows = [{"key": k, "value": str(o)} for k, o in zip(keys, offsets, strict=True)]
    consumer.commit(also=[(out.identifier, AppendRequest(out.identifier, out.conform({0: rows}), {}))])
    return offsets


def _produced(out: LogTable) -> list[int]:
    return [int(v) for v in out.read(0).column("value").to_pylist()] if out.watermarks()[0].end else []


def _drain(consumer: Consumer, out: LogTable, total: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while committed_offsets(consumer.catalog, consumer.group, "db.src").get(0, 0) < total:
        assert time.monotonic() < deadline, describe_group(consumer.catalog, consumer.group)
        _process(consumer, out, 10)


def test_i5_rest_consume_transform_produce_commits_output_and_ranges_once(rest_catalog):
    _source(rest_catalog, 12)
    out = LogTable.create(rest_catalog, "db.out", 1)
    c = Consumer(rest_catalog, "g", member_id="m1")
    c.subscribe("db.src")
    assert _process(c, out, 5) == [0, 1, 2, 3, 4]
    result = _process(c, out, 100)
    assert result == list(range(5, 12))
    assert _produced(out) == list(range(12))
    assert committed_offsets(rest_catalog, "g", "db.src") == {0: 12}
    c.close()  # leaves the group, records the last transaction COMMITTED
    states = [(r["txn_state"], json.loads(r["detail"]).get("group")) for r in journal(rest_catalog)]
    assert ("ADD_OFFSETS", {"group": "g", "member": "m1", "generation": 1}) in states
    assert [s for s, _ in states].count("COMMITTED") == 2
    entry = coordinator.transactional_ids(rest_catalog)["icelog-consumer/g/m1"]
    assert entry.txn is None
    assert tx.recover(rest_catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}


def test_i5_rest_consume_transform_produce_with_prewritten_files_lands_each_record_once(rest_catalog):
    """The output as data files numbered at the output's log end (as a group job's executors write
    it), committed with the consumed ranges in one transaction: as written where the output did not
    move, rewritten at the new log end where another writer moved it after the numbering."""
    _source(rest_catalog, 12)
    out = LogTable.create(rest_catalog, "db.out", 1)
    c = Consumer(rest_catalog, "g", member_id="m1")
    c.subscribe("db.src")

    def files_for(batches) -> AppendRequest:
        pairs = [
            (k, o) for b in batches for k, o in zip(b.column("key").to_pylist(), b.column("log_offset").to_pylist(), strict=True)
        ]
        return output_files_request(out, 0, [{"key": k, "value": str(o)} for k, o in pairs])

    first = files_for(c.poll(5))
    c.commit(also=[(out.identifier, first)])
    assert _produced(out) == list(range(5))
    referenced = {task.file.file_path for task in out.table().scan().plan_files()}
    assert {f.file_path for f in first.files[0]} <= referenced  # committed as written

    second = files_for(c.poll(100))
    out.append({0: [{"key": "other", "value": "-1"}]})  # another writer, after the numbering
    c.commit(also=[(out.identifier, second)])
    assert _produced(out) == [*range(5), -1, *range(5, 12)]
    assert committed_offsets(rest_catalog, "g", "db.src") == {0: 12}
    assert run_checks(out.table(), ["contiguity-deep", "transactions"]).ok
    assert unreferenced_data_files(out) == [], "the renumbered originals stay behind"
    c.close()
    assert tx.recover(rest_catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}


@pytest.mark.parametrize("kind", ["expected offsets", "idempotent producer"])
def test_i8_rest_output_parts_naming_offsets_or_sequences_are_refused_with_the_reason(rest_catalog, unchanged, kind):
    """Each table takes its part at its log end when it rolls forward: expected offsets of payload
    rows, or an idempotent producer's sequence numbers (checked against the log end at the
    commit), could not be kept. Refused before anything is written, naming the part and why."""
    _source(rest_catalog, 5)
    out = LogTable.create(rest_catalog, "db.out", 1)
    c = Consumer(rest_catalog, "g", member_id="m")
    c.subscribe("db.src")
    assert c.poll(5)
    rows = out.conform({0: [{"key": "k", "value": "v"}]})
    if kind == "expected offsets":
        part = AppendRequest(out.identifier, rows, {0: 0})
    else:
        part = AppendRequest(out.identifier, rows, {}, producer=ProducerBatch(1, 0, {0: 0}))
    with unchanged(out), pytest.raises(TransactionPartUnsupported, match=kind.split()[-1]) as caught:
        c.commit(also=[(out.identifier, part)])
    assert caught.value.table == out.identifier and "rolls forward" in caught.value.why + str(caught.value)
    assert committed_offsets(rest_catalog, "g", "db.src") == {}
    assert staged_files(out) == []
    c.close()


@pytest.mark.fault
@pytest.mark.parametrize(
    "point, after",
    [
        (faults.AFTER_TXN_PREPARE, None),  # decided, nothing rolled forward
        (faults.BETWEEN_TABLE_SWAPS, faults.AFTER_TXN_PREPARE),  # one table rolled forward, the other under way
        (faults.AFTER_DATA_FILES, faults.AFTER_TXN_PREPARE),  # inside a roll-forward: files written, no swap
        (faults.AFTER_CATALOG_SWAP, faults.AFTER_TXN_PREPARE),  # one table's roll-forward swapped
    ],
)
def test_i5_rest_member_dies_after_the_decision_then_the_next_owner_finishes_it_before_reading(
    rest_catalog, monkeypatch, point, after
):
    """The member dies after the journal decided its batch. Its session lapses; the member that
    takes the partition over rolls the batch forward before it reads the group's offsets, so the
    batch is neither lost nor processed again."""
    _source(rest_catalog, 30)
    out = LogTable.create(rest_catalog, "db.out", 1)
    # Armed only after this batch's decision: a rejoin's settling of the first batch is no crash site.
    dead = Consumer(rest_catalog, "g", member_id="dies", session_timeout_ms=10_000)
    dead.subscribe("db.src")
    assert _process(dead, out, 4) == [0, 1, 2, 3]
    with crash_at(monkeypatch, point, after), pytest.raises(Crashed):
        _process(dead, out, 6)  # offsets 4..9: decided, then the worker dies
    later = lambda: int(time.time() * 1000) + 20_000  # noqa: E731 - the dead member's session has lapsed
    heir = Consumer(rest_catalog, "g", member_id="heir", clock=later)
    heir.subscribe("db.src")  # adopts the partition: rolls the decided batch forward first
    assert committed_offsets(rest_catalog, "g", "db.src") == {0: 10}
    assert sorted(_produced(out)) == list(range(10))
    _drain(heir, out, 30)
    assert sorted(_produced(out)) == list(range(30)), "a batch lost or processed twice"
    heir.close()
    assert tx.recover(rest_catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    assert sorted(_produced(out)) == list(range(30))


def test_i5_rest_zombie_member_of_an_old_generation_is_fenced_and_nothing_lands(rest_catalog, unchanged):
    _source(rest_catalog, 10)
    out = LogTable.create(rest_catalog, "db.out", 1)
    zombie = Consumer(rest_catalog, "g", member_id="zombie", mode="chunks", chunk_size=1)
    zombie.subscribe("db.src")
    batches = zombie.poll(10)
    assert batches
    other = Consumer(rest_catalog, "g", member_id="other", mode="chunks", chunk_size=1)
    other.subscribe("db.src")  # a rebalance: the zombie's generation is stale
    rows = [{"key": "k", "value": "x"}]
    with unchanged(out), pytest.raises(StaleGeneration):
        zombie.commit(also=[(out.identifier, AppendRequest(out.identifier, out.conform({0: rows}), {}))])
    assert committed_offsets(rest_catalog, "g", "db.src") == {}
    states = [r["txn_state"] for r in journal(rest_catalog)]
    assert "PREPARE_COMMIT" not in states and states[-1] == "ABORTED", states
    assert all(e.txn is None for e in coordinator.transactional_ids(rest_catalog).values())


@pytest.mark.fault
def test_i5_rest_rebalance_racing_the_decision_commits_no_range_twice_and_duplicates_no_output(rest_catalog, monkeypatch):
    """A new member joins between the old member's generation check and its decision: the decision
    stands (the check passed), and the new member, which adopts partitions after its join, waits
    for the registered transaction and rolls it forward before reading offsets. The old member's
    roll-forward is slowed so the newcomer polls and commits while it is under way."""
    _source(rest_catalog, 20)
    out = LogTable.create(rest_catalog, "db.out", 1)
    old = Consumer(rest_catalog, "g", member_id="old", session_timeout_ms=3_000)
    old.subscribe("db.src")
    joined = threading.Event()
    newcomer: list[Consumer] = []
    errors: list[BaseException] = []
    real_check = tx._check_tables

    def join() -> None:
        try:
            c = Consumer(rest_catalog, "g", member_id="new", clock=lambda: int(time.time() * 1000) + 10_000)
            c.subscribe("db.src")  # the old member lapsed by this clock: the newcomer owns everything
            newcomer.append(c)
            _process(c, out, 20)  # while the old member's decided batch has not rolled forward yet
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            joined.set()

    def check_then_rebalance(*args, **kwargs):
        checked = real_check(*args, **kwargs)
        if threading.current_thread() is not threading.main_thread():
            return checked  # the newcomer's own commits
        generation = group_state(rest_catalog).members["g"]["generation"]
        threading.Thread(target=join, daemon=True).start()
        deadline = time.monotonic() + 60
        while group_state(rest_catalog).members["g"]["generation"] == generation:  # the join landed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return checked

    monkeypatch.setattr(tx, "_check_tables", check_then_rebalance)
    faults.set_delays(f"{faults.AFTER_TXN_PREPARE}:2")  # decided; the roll-forward starts 2 s later
    try:
        assert _process(old, out, 8) == list(range(8))
    finally:
        faults.set_delays(None)
        monkeypatch.setattr(tx, "_check_tables", real_check)
    assert joined.wait(120) and not errors, errors
    new = newcomer[0]
    _drain(new, out, 20)
    produced = _produced(out)
    assert sorted(produced) == list(range(20)), f"output duplicated or lost: {produced}"
    assert committed_offsets(rest_catalog, "g", "db.src") == {0: 20}
    assert describe_group(rest_catalog, "g")["partitions"][0]["ranges"] == []
    new.close()


def test_i8_rest_offsets_for_an_unknown_group_are_refused_and_nothing_lands(rest_catalog, unchanged):
    _source(rest_catalog, 5)
    out = LogTable.create(rest_catalog, "db.out", 1)
    producer = TransactionalProducer(rest_catalog, "copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.out", 0, [{"key": "k", "value": "v"}])
    producer.send_ranges_to_transaction({("db.src", 0): [(0, 4)]}, "nobody", member="m", generation=1)
    with unchanged(out), pytest.raises(UnknownGroup):
        producer.commit_transaction()
    assert producer.txn_id is None
    assert committed_offsets(rest_catalog, "nobody", "db.src") == {}
    assert coordinator.transactional_ids(rest_catalog)["copier"].txn is None


@pytest.mark.parametrize("recreate", [False, True])
def test_i8_rest_output_table_dropped_between_send_and_commit_is_refused_and_no_offset_lands(rest_catalog, recreate):
    _source(rest_catalog, 6)
    out = LogTable.create(rest_catalog, "db.out", 1)
    c = Consumer(rest_catalog, "g", member_id="m")
    c.subscribe("db.src")
    batches = c.poll(6)
    rows = [{"key": k, "value": "v"} for b in batches for k in b.column("key").to_pylist()]
    append = AppendRequest(out.identifier, out.conform({0: rows}), {})
    producer = c.transactional_producer()
    real_send = producer.send

    def send_then_drop(*args, **kwargs):
        staged = real_send(*args, **kwargs)
        rest_catalog.drop_table("db.out")
        if recreate:
            LogTable.create(rest_catalog, "db.out", 1)
        return staged

    producer.send = send_then_drop  # type: ignore[method-assign]
    with pytest.raises(TransactionTableChanged if recreate else UnknownTable):
        c.commit(also=[("db.out", append)])
    assert committed_offsets(rest_catalog, "g", "db.src") == {}
    assert coordinator.transactional_ids(rest_catalog)["icelog-consumer/g/m"].txn is None
    if recreate:
        assert LogTable(rest_catalog, "db.out").watermarks()[0].end == 0

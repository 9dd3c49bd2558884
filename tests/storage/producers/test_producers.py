"""I4: idempotent producers — exactly-once re-sends, sequences, epoch fencing, state from rows."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

import icelog.storage.core.commit as core
from icelog.storage.core.commit import commit
from icelog.storage.errors import (
    DuplicateSequence,
    InvalidInput,
    InvalidProducerEpoch,
    OffsetMismatch,
    OutOfOrderSequence,
    PartlyDuplicate,
    ProducerFenced,
    UnknownProducer,
)
from icelog.storage.log.producer_state import PartitionSequences, ProducerEntry, Producers, WrittenBatch
from icelog.storage.log.sequences import BATCHES_KEPT, ProducerBatch, admit
from icelog.storage.log.state import LogState, Watermark
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.idempotent import derive_state, init_producer, rebuild
from icelog.storage.properties import PRODUCERS
from icelog.validations.producers import check_producers
from tests.support.faults import kill_at, run_to_end, worker
from tests.support.interleave import Interleaved
from tests.support.processes import finish, run_workers, worker_processes


def batch(n: int, tag: str = "r") -> list[dict]:
    return [{"key": tag, "value": str(i)} for i in range(n)]


@pytest.fixture
def table(catalog) -> LogTable:
    return LogTable.create(catalog, "db.p", partitions=2)


def test_i4_resent_batch_returns_original_offsets_and_writes_nothing(catalog, table):
    me = init_producer(catalog, "db.p", "app")
    first = table.append({0: batch(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    table.append({0: batch(2, "other")})
    snapshot_before = table.table().metadata.current_snapshot_id
    again = table.append({0: batch(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    assert again.duplicate and not first.duplicate
    assert again.ranges == first.ranges == {0: (0, 3)}
    assert table.table().metadata.current_snapshot_id == snapshot_before
    assert table.read(0).num_rows == 5


def test_i4_duplicate_wins_over_a_stale_expected_offset(catalog, table):
    me = init_producer(catalog, "db.p")
    done = table.append({0: batch(2)}, {0: 0}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    again = table.append({0: batch(2)}, {0: 0}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    assert done.ranges == {0: (0, 2)}
    assert again.duplicate and again.ranges == {0: (0, 2)}
    with pytest.raises(OffsetMismatch):
        table.append({0: batch(1)}, {0: 0}, producer=ProducerBatch(me.producer_id, 0, {0: 2}))


def test_i4_sequence_gap_is_out_of_order_and_unknown_id_is_refused(catalog, table, unchanged):
    me = init_producer(catalog, "db.p")
    table.append({0: batch(2)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    with unchanged(table):
        with pytest.raises(OutOfOrderSequence) as e:
            table.append({0: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 5}))
        assert (e.value.expected, e.value.sequence) == (2, 5)
        with pytest.raises(OutOfOrderSequence):  # overlaps a batch but is not the same batch
            table.append({0: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 1}))
        with pytest.raises(UnknownProducer):
            table.append({0: batch(1)}, producer=ProducerBatch(999_999, 0, {0: 0}))
        with pytest.raises(InvalidProducerEpoch):
            table.append({0: batch(1)}, producer=ProducerBatch(me.producer_id, 7, {0: 2}))
    assert table.read(0).num_rows == 2


def test_i4_an_append_that_is_a_resend_on_one_partition_and_new_on_another_is_refused_whole(catalog, table, unchanged):
    me = init_producer(catalog, "db.p")
    table.append({0: batch(2), 1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 0, 1: 0}))
    with unchanged(table):
        with pytest.raises(PartlyDuplicate) as e:
            table.append({0: batch(2), 1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 0, 1: 1}))
        assert (e.value.partition, e.value.written) == (1, [0])
        assert isinstance(e.value, OutOfOrderSequence)
    assert table.append({1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {1: 1})).ranges == {1: (1, 2)}


@pytest.mark.parametrize(
    "bad",
    [
        ProducerBatch(0, 0, {1: 2}),  # sequences for a partition without rows
        ProducerBatch(0, -1, {0: 2}),
        ProducerBatch(0, 0, {0: -1}),
        ProducerBatch(0, 0, {0: 2**31 - 1}),  # the batch's last sequence overflows 32 bits
        ProducerBatch(-5, 0, {0: 2}),
        ProducerBatch(0, True, {0: 2}),
        ProducerBatch(0, 0, {0: "2"}),
    ],
)
def test_i8_bad_producer_fields_change_nothing(catalog, table, unchanged, bad):
    me = init_producer(catalog, "db.p")
    assert me.producer_id == 0
    table.append({0: batch(2)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    with unchanged(table), pytest.raises(InvalidInput):
        table.append({0: batch(2)}, producer=bad)


def test_i8_bad_client_id_changes_nothing(catalog, table, unchanged):
    for client_id in ("", "   ", "x" * 257, 5):
        with unchanged(table), pytest.raises(InvalidInput):
            init_producer(catalog, "db.p", client_id)


def test_i4_only_the_last_batches_are_remembered(catalog, table):
    me = init_producer(catalog, "db.p")
    for b in range(BATCHES_KEPT + 2):
        table.append({1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {1: b}))
    assert table.append({1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {1: 6})).duplicate
    with pytest.raises(DuplicateSequence):
        table.append({1: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {1: 0}))


def test_i4_new_instance_fences_the_zombie(catalog, table):
    zombie = init_producer(catalog, "db.p", "orders")
    table.append({0: batch(1)}, producer=ProducerBatch(zombie.producer_id, zombie.epoch, {0: 0}))
    fresh = init_producer(catalog, "db.p", "orders")
    assert (fresh.producer_id, fresh.epoch) == (zombie.producer_id, zombie.epoch + 1)
    for seq in (1, 0, 5):
        with pytest.raises(ProducerFenced) as e:
            table.append({0: batch(1)}, producer=ProducerBatch(zombie.producer_id, zombie.epoch, {0: seq}))
        assert e.value.current_epoch == fresh.epoch
    assert table.append({0: batch(1)}, producer=ProducerBatch(fresh.producer_id, fresh.epoch, {0: 0})).ranges == {0: (1, 2)}


def test_i4_zombie_commit_racing_the_new_init_is_fenced(catalog, table):
    zombie = init_producer(catalog, "db.p", "orders")
    rows = pa.Table.from_pylist(batch(1), schema=table.payload_schema())
    request = AppendRequest(table.identifier, {0: rows}, {}, "zombie-commit", ProducerBatch(zombie.producer_id, 0, {0: 0}))
    racing = Interleaved(request, lambda: init_producer(catalog, "db.p", "orders"))
    with pytest.raises(ProducerFenced):
        commit(catalog, table.identifier, racing, commit_id="zombie-commit")
    assert len(racing.decisions) == 1  # decided once (admitted on the old base), then fenced on the new one
    assert table.read(0).num_rows == 0


def test_i4_producers_expire_after_disuse_exactly_at_the_expiry(catalog):
    """The clock is injected (``admit(now_ms=...)``): alive at exactly ``expiry`` ms of disuse,
    unknown 1 ms later. The public append path has no clock parameter, see the next test."""
    entry = ProducerEntry(
        client="app", epoch=0, last_ms=1_000_000, partitions={0: PartitionSequences(0, (WrittenBatch(0, 0, 0, 1),))}
    )
    state = LogState(watermarks={0: Watermark(0, 1)}, producers={"7": entry})
    alive = admit("db.e", state, ProducerBatch(7, 0, {0: 1}), {0: (1, 2)}, now_ms=1_000_300, expiry=300)
    assert alive.state.producers["7"].last_ms == 1_000_300 and alive.state.producers["7"].partitions[0].last_seq == 1
    resent = admit("db.e", state, ProducerBatch(7, 0, {0: 0}), {0: (1, 2)}, now_ms=1_000_300, expiry=300)
    assert resent.duplicate_of == {0: (0, 1)}
    for seq in (1, 0):  # a new batch and a re-send alike: the producer is gone
        with pytest.raises(UnknownProducer):
            admit("db.e", state, ProducerBatch(7, 0, {0: seq}), {0: (1, 2)}, now_ms=1_000_301, expiry=300)


def test_i4_expired_producers_are_refused_and_dropped(catalog):
    """Through the public path, without sleeping: the stored state says the producer was last
    used long ago (as if the clock had moved on)."""
    t = LogTable.create(catalog, "db.e", partitions=1, properties={"icelog.producer.expiry-ms": "60000"})
    me = init_producer(catalog, "db.e", "app")
    t.append({0: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    state = dict(t.state().producers)
    mine = state[str(me.producer_id)]
    state[str(me.producer_id)] = replace(mine, last_ms=mine.last_ms - 60_001 - 10_000)  # disused for longer than the expiry
    with t.table().transaction() as txn:
        txn.set_properties({PRODUCERS: Producers.of(state).encode()})
    with pytest.raises(UnknownProducer):
        t.append({0: batch(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 1}))
    again = init_producer(catalog, "db.e", "app")
    assert again.producer_id != me.producer_id and again.epoch == 0
    t.append({0: batch(1)}, producer=ProducerBatch(again.producer_id, 0, {0: 0}))
    assert list(t.state().producers) == [str(again.producer_id)]  # the expired one was dropped
    assert t.read(0).num_rows == 2


def test_i4_state_rebuilt_from_rows_equals_stored_state(catalog, table):
    a = init_producer(catalog, "db.p", "a")
    b = init_producer(catalog, "db.p", "b")
    for s in range(7):
        table.append({s % 2: batch(2)}, producer=ProducerBatch(a.producer_id, 0, {s % 2: (s // 2) * 2}))
    table.append({0: batch(3), 1: batch(1)}, producer=ProducerBatch(b.producer_id, 0, {0: 0, 1: 0}))
    stored = table.state().producers
    derived = derive_state(table.table())
    for pid in stored:
        assert derived[pid].partitions == stored[pid].partitions
        assert derived[pid].epoch == stored[pid].epoch
    assert check_producers(table.table()).ok
    # Lose the state, rebuild it from the rows, and carry on exactly where the producer was.
    with table.table().transaction() as txn:
        txn.set_properties({PRODUCERS: ""})
    assert not check_producers(table.table()).ok
    rebuilt = rebuild(catalog, "db.p")
    assert {pid: e.partitions for pid, e in rebuilt.items()} == {pid: e.partitions for pid, e in stored.items()}
    assert check_producers(table.table()).ok
    assert table.append({0: batch(3)}, producer=ProducerBatch(b.producer_id, 0, {0: 0})).duplicate


def test_i4_rebuild_whose_response_was_lost_returns_the_state_it_left(catalog, table, monkeypatch):
    """The swap lands, then the catalog's answer is lost: the retry finds the commit by its id,
    and ``rebuild`` returns the rebuilt state (the registry keeps no state of a rebuild)."""
    me = init_producer(catalog, "db.p")
    table.append({0: batch(2)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    with table.table().transaction() as txn:  # lose the state, so the rebuild has something to write
        txn.set_properties({PRODUCERS: ""})
    real_swap, calls = core.swap, []

    def swap_then_lose_the_answer(*args, **kwargs):
        responses = real_swap(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise OSError("connection reset after the swap")
        return responses

    monkeypatch.setattr(core, "swap", swap_then_lose_the_answer)
    rebuilt = rebuild(catalog, "db.p")
    assert calls == [1]  # landed once; the retry found it
    assert rebuilt == dict(table.state().producers)
    assert rebuilt[str(me.producer_id)].partitions[0].last_seq == 1


def test_i4_validator_catches_stored_state_and_sequence_mismatch(catalog, table):
    me = init_producer(catalog, "db.p")
    table.append({0: batch(2)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    state = dict(table.state().producers)
    mine = state[str(me.producer_id)]
    state[str(me.producer_id)] = replace(mine, partitions={**mine.partitions, 0: replace(mine.partitions[0], last_seq=9)})
    with table.table().transaction() as txn:
        txn.set_properties({PRODUCERS: Producers.of(state).encode()})
    kinds = [v.kind for v in check_producers(table.table()).violations]
    assert kinds == ["producer_state"]


def test_i4_unknown_outcome_kill_9_after_swap_then_resend_lands_once(heavy_spec, tmp_path):
    catalog_spec = heavy_spec  # PostgreSQL's run in make test-slow: the kill -9 mid-commit test covers its swap
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.p", partitions=1)
    me = init_producer(catalog, "db.p", "app")
    args = ("db.p", 0, me.producer_id, 0, 0, 4, "x")
    with worker(catalog_spec, "produce_batch", *args, directory=tmp_path, pause_at="after_catalog_swap") as victim:
        kill_at(victim)
    assert run_to_end(catalog_spec, "produce_batch", *args, directory=tmp_path, name="resend") == {
        "range": [0, 4],
        "duplicate": True,
    }
    assert t.read(0).column("value").to_pylist() == [f"x-{i}" for i in range(4)]
    assert check_producers(t.table()).ok


def test_i4_retry_storm_each_batch_lands_once_in_order(heavy_spec):
    catalog_spec = heavy_spec  # PostgreSQL's run in make test-slow
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.p", partitions=1)
    me = init_producer(catalog, "db.p", "storm")
    batches, size = 6, 2
    acks = run_workers(
        catalog_spec, [["resend_storm", "db.p", "0", str(me.producer_id), str(batches), str(size)] for _ in range(4)]
    )
    assert len(acks) == 4 * batches
    data = t.read(0)
    assert data.column("value").to_pylist() == [str(i) for i in range(batches * size)]
    assert data.column("producer_seq").to_pylist() == list(range(batches * size))
    written = [a for a in acks if not a["duplicate"]]
    assert sorted(a["batch"] for a in written) == list(range(batches))
    assert check_producers(t.table()).ok


def test_i4_producer_ids_unique_across_processes(heavy_spec, tmp_path):
    heavy_spec.open()
    with worker_processes(heavy_spec, [["lease_ids", "5"] for _ in range(4)], tmp_path) as procs:
        finish(procs, tmp_path)
    per_process = [
        [json.loads(line)["id"] for line in Path(tmp_path, f"worker{i}.out").read_text().splitlines()] for i in range(4)
    ]
    ids = [i for ids in per_process for i in ids]
    assert len(ids) == 20 and len(set(ids)) == 20
    assert all(ids == sorted(ids) for ids in per_process)  # monotonic within each process
    assert set(ids) == set(range(20))  # dense: no id skipped, none reused


def test_i4_validator_reports_every_sequence_break_exactly(catalog, table):
    me = init_producer(catalog, "db.p")
    table.append({0: batch(3)}, producer=ProducerBatch(me.producer_id, 0, {0: 0}))
    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    rows = [
        {
            **{f.name: None for f in schema},
            "log_partition": 0,
            "log_offset": 3 + i,
            "log_timestamp": 0,
            "producer_id": me.producer_id,
            "producer_epoch": 0,
            "producer_seq": s,
        }
        for i, s in enumerate((7, 8, 4))
    ]
    iceberg.append(pa.Table.from_pylist(rows).cast(schema))  # seq 2 -> 7 and 8 -> 4: two breaks
    breaks = [
        (v.first, v.extra["sequence"], v.extra["expected"])
        for v in check_producers(table.table()).violations
        if v.kind == "sequence"
    ]
    assert breaks == [(3, 7, 3), (5, 4, 9)]


def test_the_producer_id_table_is_not_a_log_table(catalog, table):
    from icelog.storage.log.table import list_log_tables

    init_producer(catalog, "db.p", "app")
    assert list_log_tables(catalog) == ["db.p"]

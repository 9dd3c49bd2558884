"""Every icelog capability on an Iceberg REST catalog over S3 (a real SeaweedFS server).

Single-table commits run on REST: each proves its exact base with the table's tag
(``storage.core.swap.prove_base``). So idempotent producers (I4), consumer groups (I10), bulk
loads (I9) and the mirror (I6) work there, and a mirror carries a log from a SQL catalog to
REST and, after promotion, back (the disaster-recovery case). An atomic commit across tables
is refused before anything changes (I5): the server's ``transactions/commit`` is not atomic.
(Transactions, the ingest job and the Spark group job run on REST without one:
tests/storage/producers, tests/pipelines/test_spark_ingest_rest.py and
tests/pipelines/test_group_job_rest.py.)
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from icelog.storage.admin.maintenance import maintain
from icelog.storage.core.commit import commit_tables
from icelog.storage.errors import (
    AtomicCommitUnsupported,
    InvalidProducerEpoch,
    OffsetMismatch,
    OutOfOrderSequence,
    ProducerFenced,
    ReadOnlyTable,
    StaleGeneration,
)
from icelog.storage.groups.consumer import Consumer, key_hash
from icelog.storage.groups.offsets import (
    GroupAction,
    commit_offsets,
    commit_ranges,
    committed_offsets,
    describe_group,
    group_action,
    group_state,
)
from icelog.storage.ingest import ledger
from icelog.storage.ingest.bulk import bulk_load
from icelog.storage.log.maintenance import live_files
from icelog.storage.log.repair import repair
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.idempotent import Producer, init_producer, lease_producer_ids
from icelog.storage.replication.acls import add_acl
from icelog.storage.replication.mirror import promote
from icelog.validations.contiguity import check_contiguity
from tests.support.catalogs import CatalogSpec
from tests.support.mirror import PRINCIPAL, assert_parity, rows, run_mirror


def batch(n: int, tag: str = "r") -> list[dict]:
    return [{"key": tag, "value": str(i)} for i in range(n)]


def _log(catalog, name: str = "db.events", partitions: int = 1, n: int = 60) -> LogTable:
    t = LogTable.create(catalog, name, partitions)
    for p in range(partitions):
        t.append({p: [{"key": f"k{i % 7}", "value": str(i)} for i in range(n)]})
    return t


# --- idempotent producers (I4) ----------------------------------------------------------------


def test_i4_resent_batch_on_rest_returns_original_offsets_and_writes_nothing(rest_catalog):
    t = LogTable.create(rest_catalog, "db.p", 2)
    me = init_producer(rest_catalog, "db.p", "app")
    first = t.append({0: batch(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    t.append({0: batch(2, "other")})
    snapshot_before = t.table().metadata.current_snapshot_id
    again = t.append({0: batch(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    assert again.duplicate and not first.duplicate
    assert again.ranges == first.ranges == {0: (0, 3)}
    assert t.table().metadata.current_snapshot_id == snapshot_before
    assert t.read(0).num_rows == 5
    assert check_contiguity(t.table()).ok


def test_i4_producer_client_counts_sequences_on_rest(rest_catalog, unchanged):
    t = LogTable.create(rest_catalog, "db.p", 2)
    producer = Producer(rest_catalog, "db.p", client_id="orders")
    assert producer.send({0: batch(2), 1: batch(1)}).ranges == {0: (0, 2), 1: (0, 1)}
    assert producer.send({0: batch(3)}).ranges == {0: (2, 5)}
    assert (producer.next_sequence(0), producer.next_sequence(1)) == (5, 1)
    with unchanged(t):
        with pytest.raises(OutOfOrderSequence):
            t.append({0: batch(1)}, producer=ProducerBatch(producer.producer_id, producer.epoch, {0: 9}))
        with pytest.raises(InvalidProducerEpoch):
            t.append({0: batch(1)}, producer=ProducerBatch(producer.producer_id, producer.epoch + 3, {0: 5}))


def test_i4_new_instance_fences_the_zombie_on_rest(rest_catalog, unchanged):
    t = LogTable.create(rest_catalog, "db.p", 1)
    zombie = init_producer(rest_catalog, "db.p", "orders")
    t.append({0: batch(1)}, producer=ProducerBatch(zombie.producer_id, zombie.epoch, {0: 0}))
    fresh = init_producer(rest_catalog, "db.p", "orders")
    assert (fresh.producer_id, fresh.epoch) == (zombie.producer_id, zombie.epoch + 1)
    with unchanged(t):
        for seq in (1, 0):
            with pytest.raises(ProducerFenced) as e:
                t.append({0: batch(1)}, producer=ProducerBatch(zombie.producer_id, zombie.epoch, {0: seq}))
            assert e.value.current_epoch == fresh.epoch
    assert t.append({0: batch(1)}, producer=ProducerBatch(fresh.producer_id, fresh.epoch, {0: 0})).ranges == {0: (1, 2)}


def test_i4_producer_ids_leased_by_racing_clients_are_unique_on_rest(rest_spec):
    """The id counter lives in a system table's properties: only the base tag keeps two
    leases on one base from handing out the same id."""
    threads, each = 4, 3
    leased: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run() -> None:
        own = rest_spec.open()
        try:
            start.wait()
            for _ in range(each):
                leased.extend(lease_producer_ids(own, 1))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert sorted(leased) == list(range(threads * each))


# --- consumer groups (I10) --------------------------------------------------------------------


def _partition(catalog, group, table="db.events", p=0):
    entry = next(e for e in describe_group(catalog, group)["partitions"] if e["table"] == table and e["partition"] == p)
    return entry["stable_offset"], entry["ranges"]


def test_i10_range_commits_on_rest(rest_catalog):
    _log(rest_catalog)
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(0, 42)]})
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(45, 47), (50, 50)]})
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(48, 49)]})
    assert _partition(rest_catalog, "g") == (42, [[45, 50]])
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(43, 44)]})
    assert _partition(rest_catalog, "g") == (50, [])
    assert committed_offsets(rest_catalog, "g", "db.events") == {0: 51}


def test_i10_stale_generation_commit_fenced_on_rest(rest_catalog):
    _log(rest_catalog)
    a = group_action(rest_catalog, GroupAction("g", "a", "join", {"db.events": [0]}, 60_000))
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(0, 3)]}, member="a", generation=a["generation"])
    b = group_action(rest_catalog, GroupAction("g", "b", "join", {"db.events": [0]}, 60_000))
    assert b["generation"] == a["generation"] + 1
    before = group_state(rest_catalog)
    with pytest.raises(StaleGeneration):
        commit_ranges(rest_catalog, "g", {("db.events", 0): [(4, 5)]}, member="a", generation=a["generation"])
    assert group_state(rest_catalog).ranges == before.ranges and group_state(rest_catalog).offsets == before.offsets
    commit_ranges(rest_catalog, "g", {("db.events", 0): [(4, 5)]}, member="a", generation=b["generation"])
    assert _partition(rest_catalog, "g") == (5, [])


def test_i10_key_range_reads_split_the_partition_on_rest(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1)
    t.append({0: [{"key": f"k{i % 13}", "value": str(i)} for i in range(120)]})
    seen = {}
    for i, hashes in enumerate([(0, 32767), (32768, 65535)]):
        c = Consumer(rest_catalog, f"g{i}")
        c.assign("db.events", [0], key_range=hashes)
        records = []
        while polled := c.poll(17):
            records += [
                (o, k)
                for b in polled
                for o, k in zip(b.column("log_offset").to_pylist(), b.column("key").to_pylist(), strict=True)
            ]
            c.commit()
        seen[hashes] = records
    for (lo, hi), records in seen.items():
        assert [o for o, _ in records] == sorted(o for o, _ in records)
        assert all(lo <= key_hash(k) <= hi for _, k in records)
    assert sorted(o for rs in seen.values() for o, _ in rs) == list(range(120))
    for i, records in enumerate(seen.values()):  # each group committed exactly what it delivered
        entry = describe_group(rest_catalog, f"g{i}")["partitions"][0]
        assert entry["committed_offset"] + sum(last - first + 1 for first, last in entry["ranges"]) == len(records)


# --- multi-table commits: consumed offsets with an output, data with its ledger: refused (I5) -----------------------------------------


def test_i5_consumed_offsets_with_output_other_than_payload_appends_refused_on_rest(rest_catalog, unchanged):
    """Consume-transform-produce commits its output and its group offsets through a transaction
    (tests/storage/groups/test_consume_produce_rest.py): its output offsets are chosen when each
    table rolls forward, so an output part with expected offsets (or one that is no append) is
    refused before anything is written."""
    _log(rest_catalog, n=5)
    out = LogTable.create(rest_catalog, "db.out", 1)
    c = Consumer(rest_catalog, "g")
    c.assign("db.events", [0])
    assert c.poll(5)
    append = AppendRequest("db.out", out.conform({0: batch(1)}), {0: 0}, "c1", None)
    with unchanged(out), pytest.raises(AtomicCommitUnsupported):
        c.commit(also=[("db.out", append)])
    assert committed_offsets(rest_catalog, "g", "db.events") == {}


def test_i9_ingest_data_and_ledger_in_one_commit_refused_on_rest(rest_catalog, unchanged):
    """On REST the ledger rolls forward after the data (storage.ingest.ledger), never in one
    multi-table commit with it: that is refused before anything changes."""
    t = _log(rest_catalog, n=3)
    ledger.ensure_ledger(rest_catalog)
    with unchanged(t), unchanged(catalog=rest_catalog):
        data = AppendRequest(t.identifier, t.conform({0: batch(1)}), {}, "c1", None)
        with pytest.raises(AtomicCommitUnsupported):
            commit_tables(rest_catalog, [(t.identifier, data), (ledger.LEDGER_TABLE, ledger.LedgerAppend((), 0))])


def test_i9_bulk_load_resumes_by_load_id_on_rest(rest_catalog):
    t = LogTable.create(rest_catalog, "db.bulk", 1)

    def batches(skip: int):
        records = [{"key": f"k{i}", "value": str(i)} for i in range(10)][skip:]
        for i in range(0, len(records), 4):
            yield pa.Table.from_pylist(records[i : i + 4], schema=t.payload_schema())

    first = bulk_load(t, 0, lambda skip: (b for i, b in enumerate(batches(skip)) if i < 2), 0, load_id="day-1")
    assert (first["base_offset"], first["next_offset"]) == (0, 8)
    again = bulk_load(t, 0, batches, 0, load_id="day-1")  # a restart: continues after record 8
    assert again["resumed_lines"] == 8 and again["rows"] == 2
    assert t.read(0).column("value").to_pylist() == [str(i) for i in range(10)]
    with pytest.raises(OffsetMismatch):  # another load at the same start offset never lands
        bulk_load(t, 0, batches, 0, load_id="day-2")


# --- the mirror: SQL catalog -> REST -> SQL catalog (I6, disaster recovery) --------------------


@pytest.fixture
def recovery_spec(tmp_path) -> CatalogSpec:
    """A fresh SQLite catalog to mirror the promoted REST copy back into."""
    (tmp_path / "dr-warehouse").mkdir()
    return CatalogSpec("sqlite", "drcat", f"sqlite:///{tmp_path / 'dr.db'}", f"file://{tmp_path / 'dr-warehouse'}")


def test_i6_mirror_sqlite_to_rest_and_back_after_promotion(sqlite_catalog, rest_catalog, recovery_spec):
    source = sqlite_catalog
    src = LogTable.create(source, "orders", 2)
    me = init_producer(source, "logs.orders", "writer")
    for i in range(3):
        src.append({0: rows(3, f"a{i}"), 1: rows(1, f"b{i}")})
    src.append({0: rows(2)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    commit_offsets(source, "billing", {("orders", 0): 5, ("orders", 1): 2})

    add_acl(rest_catalog, PRINCIPAL, "logs.*")
    first = run_mirror(source, rest_catalog)
    assert first.ranges == {0: (0, 11), 1: (0, 3)} and first.groups == 1
    assert_parity(source, rest_catalog)
    assert committed_offsets(rest_catalog, "billing", "orders") == {0: 5, 1: 2}
    copy = LogTable.open(rest_catalog, "orders")
    assert all(f.file.file_path.startswith("s3://") for f in copy.table().scan().plan_files())
    with pytest.raises(ReadOnlyTable):
        copy.append({0: rows(1)})

    src.append({1: rows(4, "late")})  # incremental: only the delta
    assert run_mirror(source, rest_catalog).ranges == {1: (3, 7)}
    assert_parity(source, rest_catalog)
    assert check_contiguity(copy.table()).ok

    # The SQL catalog is lost: the REST copy takes over, producers and groups continue there.
    promote(rest_catalog, "orders")
    again = copy.append({0: rows(2)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    assert again.duplicate and again.ranges == {0: (9, 11)}
    copy.append({0: rows(2, "after")}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 2}))
    commit_offsets(rest_catalog, "billing", {("orders", 0): 12})

    recovered = recovery_spec.open()
    add_acl(recovered, PRINCIPAL, "logs.*")
    back = run_mirror(rest_catalog, recovered)
    assert back.ranges == {0: (0, 13), 1: (0, 7)}
    assert_parity(rest_catalog, recovered)
    assert committed_offsets(recovered, "billing", "orders") == {0: 12, 1: 2}
    assert check_contiguity(LogTable.open(recovered, "orders").table()).ok


def test_i6_i10_a_step_stopped_between_its_data_and_its_group_offsets_catches_up_on_rest(
    sqlite_catalog, rest_catalog, monkeypatch
):
    """On REST a step's group offsets follow its data in a second commit: stopped in between,
    the target's groups stay behind (never ahead of its log end), and the next step sets them."""
    import icelog.storage.replication.mirror as mirror_module

    src = LogTable.create(sqlite_catalog, "orders", 1)
    src.append({0: rows(4)})
    commit_offsets(sqlite_catalog, "billing", {("orders", 0): 3})
    add_acl(rest_catalog, PRINCIPAL, "logs.*")
    real = mirror_module._commit_groups_after

    def stopped(*args, **kwargs):
        raise ConnectionError("killed between the data and the group offsets")

    monkeypatch.setattr(mirror_module, "_commit_groups_after", stopped)
    with pytest.raises(ConnectionError):
        run_mirror(sqlite_catalog, rest_catalog)
    assert LogTable.open(rest_catalog, "orders").watermarks()[0].end == 4
    assert committed_offsets(rest_catalog, "billing", "orders") == {}
    monkeypatch.setattr(mirror_module, "_commit_groups_after", real)
    assert run_mirror(sqlite_catalog, rest_catalog).groups == 1
    assert committed_offsets(rest_catalog, "billing", "orders") == {0: 3}
    assert_parity(sqlite_catalog, rest_catalog)
    assert run_mirror(sqlite_catalog, rest_catalog).up_to_date


# --- maintenance and repair (I1, I7) ----------------------------------------------------------


def test_i1_i7_maintenance_keeps_every_offset_on_rest(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1)
    for i in range(9):  # compaction merges runs of at least 8 small files
        t.append({0: batch(2, f"b{i}")})
    stray = f"{t.table().metadata.location}/data/stray.parquet"
    with t.table().io.new_output(stray).create() as f:
        f.write(b"an orphan")
    time.sleep(1.5)  # an object store's modification times are whole seconds: let the orphan age
    report = maintain(rest_catalog, "db.events", retention_bytes=10**9, keep_snapshots=1, orphan_age_s=0)
    assert report["compaction"] and report["expired_snapshots"] and report["orphans_removed"] >= 1, report
    assert not t.table().io.new_input(stray).exists()
    assert t.read(0).column("value").to_pylist() == [str(i % 2) for i in range(18)]
    assert len(live_files(t.table())) == 1 and len(t.table().metadata.snapshots) <= 2
    assert check_contiguity(t.table()).ok
    assert t.append({0: batch(1)}).ranges == {0: (18, 19)}


def test_i1_repair_rolls_back_a_foreign_append_on_rest(rest_catalog):
    t = LogTable.create(rest_catalog, "db.dup", 1)
    mine = t.append({0: batch(10)})
    table = t.table()
    foreign = t.read(0, 5, 10)
    table.append(foreign.cast(table.schema().as_arrow()))  # a plain pyiceberg writer duplicates 5..9
    report = repair(rest_catalog, t.identifier)
    assert report["action"] == "rolled_back" and report["dropped_rows"] == 5
    assert t.table().metadata.current_snapshot_id == mine.snapshot_id
    assert t.append({0: batch(1)}).ranges == {0: (10, 11)}

"""I6: mirrors keep offsets. Writes with offsets, the replicator permission, the mirror.

Every test runs SQLite -> SQLite and SQLite -> PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from icelog.storage.admin.maintenance import maintain
from icelog.storage.admin.orphans import referenced_files
from icelog.storage.core.commit import commit
from icelog.storage.errors import (
    AuthorizationFailed,
    CorruptBatch,
    InvalidProduceOffset,
    MirrorGap,
    MirrorPromoted,
    MirrorSourceChanged,
    ProducerFenced,
    ReadOnlyTable,
)
from icelog.storage.groups.offsets import commit_offsets, committed_offsets
from icelog.storage.log import schema as cols
from icelog.storage.log.maintenance import Compaction, Retention, expire_snapshots, live_files
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer, lease_producer_ids, rebuild
from icelog.storage.replication.mirror import mirror, mirror_record, promote
from icelog.storage.replication.replica import write_with_offsets
from tests.support.mirror import PRINCIPAL, assert_parity, mirror_threads, race_once, rows, run_mirror

# --- writes with offsets ----------------------------------------------------------------------


def offset_rows(partition: int, offsets: list[int]) -> pa.Table:
    n = len(offsets)
    return pa.table(
        {
            cols.PARTITION: pa.array([partition] * n, pa.int32()),
            cols.OFFSET: pa.array(offsets, pa.int64()),
            cols.TIMESTAMP: pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            cols.PRODUCER_ID: pa.nulls(n, pa.int64()),
            cols.PRODUCER_EPOCH: pa.nulls(n, pa.int32()),
            cols.PRODUCER_SEQ: pa.nulls(n, pa.int32()),
            "key": [f"k{o}" for o in offsets],
            "value": [f"v{o}" for o in offsets],
        }
    )


@pytest.fixture
def replica(target):
    table = LogTable.create(target, "replica", 2)
    write_with_offsets(target, "replica", {0: offset_rows(0, [0, 1, 2])}, principal=PRINCIPAL)
    return table


def test_i6_write_with_offsets_keeps_them_and_returns_log_ends(target, replica):
    result = write_with_offsets(target, "replica", {0: offset_rows(0, [3, 4]), 1: offset_rows(1, [0])}, principal=PRINCIPAL)
    assert result.ranges == {0: (3, 5), 1: (0, 1)}
    assert result.log_ends == {0: 5, 1: 1}
    assert replica.read(0).column(cols.OFFSET).to_pylist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "offsets, error",
    [
        ([3, 5], CorruptBatch),  # not consecutive
        ([4, 3], CorruptBatch),  # going backward
        ([2, 3], InvalidProduceOffset),  # starts before the log end
        ([4, 5], InvalidProduceOffset),  # starts after the log end
    ],
)
def test_i6_bad_batches_refused_target_unchanged(target, replica, unchanged, offsets, error):
    with unchanged(replica):
        with pytest.raises(error) as caught:
            write_with_offsets(target, "replica", {0: offset_rows(0, offsets)}, principal=PRINCIPAL)
    if error is InvalidProduceOffset:
        assert caught.value.log_end == 3


def test_i6_batch_of_another_partition_refused(target, replica, unchanged):
    with unchanged(replica), pytest.raises(CorruptBatch):
        write_with_offsets(target, "replica", {1: offset_rows(0, [0, 1])}, principal=PRINCIPAL)


@pytest.mark.parametrize("principal", [None, "someone-else"])
def test_i6_unauthorized_principal_refused_nothing_written(target, replica, unchanged, monkeypatch, principal):
    monkeypatch.delenv("ICELOG_PRINCIPAL", raising=False)
    with unchanged(replica), pytest.raises(AuthorizationFailed):
        write_with_offsets(target, "replica", {0: offset_rows(0, [3])}, principal=principal)


def test_i6_principal_from_environment(target, replica, monkeypatch):
    monkeypatch.setenv("ICELOG_PRINCIPAL", PRINCIPAL)
    assert write_with_offsets(target, "replica", {0: offset_rows(0, [3])}).log_ends[0] == 4


def test_ordinary_appends_need_no_permission(target):
    table = LogTable.create(target, "plain", 1)
    assert table.append({0: rows(2)}).ranges == {0: (0, 2)}


# --- the mirror -------------------------------------------------------------------------------


def test_i6_mirror_same_partitions_offsets_rows_schema_and_properties(source, target):
    src = LogTable.create(source, "orders", 3, properties={"icelog.retention.ms": "86400000"})
    for i in range(3):
        src.append({0: rows(3, f"a{i}"), 2: rows(1, f"c{i}")})
    result = run_mirror(source, target)
    assert result.ranges == {0: (0, 9), 2: (0, 3)}
    assert result.copied_files == 6 and result.sliced_files == 0
    assert_parity(source, target)
    dst = LogTable.open(target, "orders").table()
    assert dst.schema().as_struct() == src.table().schema().as_struct()
    assert dst.spec() == src.table().spec()
    assert dst.metadata.properties["icelog.retention.ms"] == "86400000"
    assert mirror_record(dst.metadata)["table"] == "logs.orders"


def test_i6_incremental_copies_only_the_delta(source, target):
    src = LogTable.create(source, "orders", 2)
    for _ in range(5):
        src.append({0: rows(2), 1: rows(1)})
    run_mirror(source, target)
    src.append({1: rows(4, "new")})
    result = run_mirror(source, target)
    assert result.incremental and result.copied_files == 1 and result.ranges == {1: (5, 9)}
    assert run_mirror(source, target).up_to_date
    assert_parity(source, target)


def test_i6_files_are_byte_for_byte_copies(source, target):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(5)})
    run_mirror(source, target)
    (a,), (b,) = live_files(src.table()), live_files(LogTable.open(target, "orders").table())
    read = lambda path: Path(path.removeprefix("file://")).read_bytes()  # noqa: E731
    assert a.file_path != b.file_path and read(a.file_path) == read(b.file_path)


def test_i6_retention_and_new_partitions_propagate(source, target):
    src = LogTable.create(source, "orders", 1)
    for i in range(3):
        src.append({0: rows(2, f"r{i}")})
    run_mirror(source, target)
    commit(source, "logs.orders", Retention("logs.orders", retention_bytes=1))  # keeps only the newest file
    src.add_partitions(3)
    src.append({2: rows(2)})
    result = run_mirror(source, target)
    assert src.watermarks()[0].start == 4
    assert LogTable.open(target, "orders").watermarks()[0].start == 4
    assert result.log_ends == {0: 6, 1: 0, 2: 2}
    assert_parity(source, target)
    assert len([f for f in live_files(LogTable.open(target, "orders").table()) if f.partition[0] == 0]) == 1


def test_i6_new_mirror_of_trimmed_source_starts_at_its_log_start(source, target):
    src = LogTable.create(source, "orders", 1)
    for _ in range(3):
        src.append({0: rows(2)})
    commit(source, "logs.orders", Retention("logs.orders", retention_bytes=1))
    run_mirror(source, target)
    assert_parity(source, target)


def test_i6_gap_fails_fast_and_names_the_missing_range(source, target):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    for _ in range(3):
        src.append({0: rows(2)})
    commit(source, "logs.orders", Retention("logs.orders", retention_bytes=1))
    dst = LogTable.open(target, "orders")
    before = dst.watermarks()
    with pytest.raises(MirrorGap) as caught:
        run_mirror(source, target)
    assert (caught.value.partition, caught.value.missing_start, caught.value.missing_end) == (0, 2, 6)
    assert "[2, 6)" in str(caught.value)
    assert dst.watermarks() == before


def test_i6_recreated_source_fails_fast(source, target):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    source.drop_table("logs.orders")
    LogTable.create(source, "orders", 1).append({0: rows(5)})
    with pytest.raises(MirrorSourceChanged):
        run_mirror(source, target)
    assert LogTable.open(target, "orders").watermarks()[0].end == 2


def test_i6_unauthorized_mirror_writes_nothing(source, target, monkeypatch):
    monkeypatch.delenv("ICELOG_PRINCIPAL", raising=False)
    LogTable.create(source, "orders", 1).append({0: rows(2)})
    tables_before = target.list_tables("logs") if target.namespace_exists("logs") else []
    with pytest.raises(AuthorizationFailed):
        mirror(source, "orders", target, principal="intruder")
    assert (target.list_tables("logs") if target.namespace_exists("logs") else []) == tables_before


def test_i6_target_read_only_until_promoted(source, target):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    dst = LogTable.open(target, "orders")
    with pytest.raises(ReadOnlyTable):
        dst.append({0: rows(1)})
    from icelog.storage.producers.transactional import TransactionalProducer

    producer = TransactionalProducer(target, "writer-on-a-mirror")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(ReadOnlyTable):  # a transaction is refused at send, before anything is staged
        producer.send("orders", 0, rows(1))
    producer.abort_transaction()
    assert dst.watermarks()[0].end == 2
    promote(target, "orders")
    assert dst.append({0: rows(1)}).ranges == {0: (2, 3)}
    src.append({0: rows(1)})
    with pytest.raises(MirrorPromoted):
        run_mirror(source, target)


def test_i6_idempotent_producer_state_carried_over(source, target):
    src = LogTable.create(source, "orders", 1)
    me = init_producer(source, "logs.orders", "writer")
    src.append({0: rows(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    run_mirror(source, target)
    assert_parity(source, target)
    promote(target, "orders")
    again = LogTable.open(target, "orders").append({0: rows(3)}, producer=ProducerBatch(me.producer_id, me.epoch, {0: 0}))
    assert again.duplicate and again.ranges == {0: (0, 3)}


def test_i6_failover_drill_group_continues_from_committed_offset(source, target):
    src = LogTable.create(source, "orders", 2)
    for i in range(4):
        src.append({0: rows(3, f"a{i}"), 1: rows(2, f"b{i}")})
    consumed = {0: src.read(0, 0, 5), 1: src.read(1, 0, 3)}
    commit_offsets(source, "billing", {("orders", 0): 5, ("orders", 1): 3})
    src.append({0: rows(1, "late")})
    result = run_mirror(source, target)
    assert result.groups == 1
    # the group switches catalogs
    positions = committed_offsets(target, "billing", "orders")
    assert positions == {0: 5, 1: 3}
    dst = LogTable.open(target, "orders")
    for p, position in positions.items():
        after = dst.read(p, position)
        assert after.to_pylist() == src.read(p, position).to_pylist()
        assert after.column(cols.OFFSET).to_pylist()[0] == consumed[p].column(cols.OFFSET).to_pylist()[-1] + 1


def test_i6_compacted_source_is_sliced_not_duplicated(source, target):
    from icelog.storage.log.maintenance import Compaction

    src = LogTable.create(source, "orders", 1)
    for _ in range(3):
        src.append({0: rows(2)})
    run_mirror(source, target)
    src.append({0: rows(2)})
    commit(source, "logs.orders", Compaction("logs.orders", target_rows=100))  # one file 0..7
    result = run_mirror(source, target)
    assert result.ranges == {0: (6, 8)}
    assert_parity(source, target)


def test_i6_individually_committed_ranges_mirrored_verbatim(source, target):
    from icelog.storage.groups.offsets import commit_ranges, group_state

    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(10)})
    commit_offsets(source, "workers", {("orders", 0): 2})
    commit_ranges(source, "workers", {("orders", 0): [(5, 6)]})
    run_mirror(source, target)
    mine, theirs = group_state(target), group_state(source)
    assert mine.offsets["workers"]["logs.orders"] == theirs.offsets["workers"]["logs.orders"] == {"0": 2}
    assert mine.ranges["workers"]["logs.orders"] == theirs.ranges["workers"]["logs.orders"] == {"0": [[5, 6]]}
    assert mine.range_state("workers", "logs.orders", 0, 0) == theirs.range_state("workers", "logs.orders", 0, 0)


def test_i6_source_schema_gaining_a_column_fails_fast(source, target):
    from pyiceberg.types import StringType

    from icelog.storage.errors import MirrorSchemaChanged

    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    with src.table().update_schema() as update:
        update.add_column("note", StringType())
    src.append({0: [{"key": "k", "value": "v", "note": "n"}]})
    with pytest.raises(MirrorSchemaChanged) as caught:
        run_mirror(source, target)
    assert caught.value.columns == ["note"]
    assert LogTable.open(target, "orders").watermarks()[0].end == 2


def test_i6_concurrent_mirror_steps_into_one_target_end_in_parity(source_spec, target_spec, target):
    source = source_spec.open()
    src = LogTable.create(source, "orders", 2)
    join = mirror_threads(source_spec, target_spec, 2, lambda steps: steps < 6)
    for i in range(6):
        src.append({i % 2: rows(2, f"c{i}")})
    join()
    run_mirror(source, target)
    assert_parity(source, target)
    table = LogTable.open(target, "orders").table()
    on_disk = {str(f) for f in Path(table.metadata.location.removeprefix("file://"), "data").rglob("*.parquet")}
    assert on_disk == referenced_files(table) & on_disk, "a step that lost left its copies behind"


def test_i6_a_step_that_loses_to_a_concurrent_step_which_mirrored_everything_ends_up_to_date(source_spec, target_spec, target):
    """Deterministic version of the race above: while this step copies, another step mirrors
    everything into the target; this step's commit loses (InvalidProduceOffset) and, with no
    attempt left to re-plan, it still ends, because the target already holds what it was asked."""
    from icelog.storage.replication.mirror import copy_files

    source = source_spec.open()
    src = LogTable.create(source, "orders", 2)
    src.append({0: rows(3), 1: rows(2)})
    run_mirror(source, target)
    src.append({0: rows(2, "late")})
    raced = []

    def copier(pairs):
        copy_files(pairs)
        if not raced:  # the other step runs between this step's plan and its commit
            raced.append(mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL))

    result = run_mirror(source, target, copier=copier, max_attempts=1)
    assert raced[0].ranges == {0: (3, 5)}
    assert result.up_to_date and result.ranges == {} and result.log_ends == {0: 5, 1: 2}
    assert_parity(source, target)


def test_i6_a_step_whose_target_moved_on_after_it_read_the_source_is_not_a_changed_source(
    source_spec, target_spec, target, monkeypatch
):
    """CI saw this race: a step read the source, another step mirrored newer rows, then the
    first read the target, found it ahead of its (older) view of the source and refused with
    MirrorSourceChanged. The target is read before the source now."""
    source = source_spec.open()
    src = LogTable.create(source, "orders", 2)
    src.append({0: rows(3), 1: rows(2)})
    run_mirror(source, target)

    def race():
        src.append({0: rows(2, "late")})
        return mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL)

    # skip=1: the call's first load is its goal; the second is the step's read of the source.
    raced = race_once(monkeypatch, "load", race, skip=1)
    result = run_mirror(source, target)  # the old order raised MirrorSourceChanged here
    assert raced and raced[0].ranges == {0: (3, 5)}
    assert result.up_to_date  # it was asked for offsets up to 3: the target holds them
    assert_parity(source, target)


def test_i6_a_stale_step_never_moves_the_targets_group_offsets_back(source, target, monkeypatch):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(10)})
    run_mirror(source, target)
    commit_offsets(source, "workers", {("orders", 0): 3})

    def race():  # after this step planned offset 3: the group moves on and another step mirrors 7
        commit_offsets(source, "workers", {("orders", 0): 7})
        return run_mirror(source, target)

    raced = race_once(monkeypatch, "commit_tables", race, before=True)
    run_mirror(source, target)
    assert raced and raced[0].groups == 1
    assert committed_offsets(target, "workers", "orders") == committed_offsets(source, "workers", "orders") == {0: 7}


def test_i6_a_stale_step_never_moves_the_targets_progress_or_producers_back(source, target, monkeypatch):
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    init_producer(source, "logs.orders", "first")  # a state-only change for this step to mirror

    def race():  # after this step planned: another producer appears and another step mirrors it
        init_producer(source, "logs.orders", "second")
        return run_mirror(source, target)

    raced = race_once(monkeypatch, "commit_tables", race, before=True)
    run_mirror(source, target)
    assert raced
    assert set(LogTable.open(target, "orders").state().producers) == set(src.state().producers)
    assert (
        mirror_record(LogTable.open(target, "orders").table().metadata)["version"]
        == src.table().metadata.properties["icelog.version"]
    )
    assert_parity(source, target)


def test_i6_last_mirrored_snapshot_expired_falls_back_to_live_files(source, target):
    src = LogTable.create(source, "orders", 1, properties={"icelog.snapshots.keep": "2"})
    src.append({0: rows(2)})
    run_mirror(source, target)
    for i in range(4):
        src.append({0: rows(1, f"x{i}")})
    result = run_mirror(source, target)
    assert not result.incremental and result.ranges == {0: (2, 6)} and result.copied_files == 4
    assert_parity(source, target)


def test_i4_new_producer_on_a_promoted_mirror_never_takes_a_mirrored_producer_id(source, target):
    """Producer ids come from each catalog's allocator: the mirrored ids must be reserved in
    the target's, or a new producer there takes over a mirrored producer (its epoch, its
    sequences) after failover."""
    src = LogTable.create(source, "orders", 1)
    init_producer(source, "logs.orders", "orders")
    orders = init_producer(source, "logs.orders", "orders")  # epoch bumped: epoch 0 is a zombie
    b1 = src.append({0: rows(2, "b1")}, producer=ProducerBatch(orders.producer_id, orders.epoch, {0: 0}))
    b2 = src.append({0: rows(2, "b2")}, producer=ProducerBatch(orders.producer_id, orders.epoch, {0: 2}))
    run_mirror(source, target)
    assert lease_producer_ids(target, 1)[0] > orders.producer_id  # reserved as the state landed
    promote(target, "orders")
    new = init_producer(target, "logs.orders", "dr-new-app")
    assert new.producer_id != orders.producer_id
    dst = LogTable.open(target, "orders")
    with pytest.raises(ProducerFenced):  # the zombie stays fenced
        dst.append({0: rows(2, "b1")}, producer=ProducerBatch(orders.producer_id, 0, {0: 0}))
    again = dst.append({0: rows(2, "b2")}, producer=ProducerBatch(orders.producer_id, orders.epoch, {0: 2}))
    assert again.duplicate and again.ranges == b2.ranges
    assert dst.watermarks()[0].end == b1.ranges[0][1] + 2


@pytest.mark.parametrize("older", ["mirror step", "mirror step and promote"])
def test_i4_a_mirror_made_by_an_older_icelog_still_never_hands_out_a_mirrored_id(source, target, monkeypatch, older):
    """A target mirrored (or also promoted) before ids were reserved: promotion, and failing
    that the new producer's own lease, still go past every id the table holds."""
    LogTable.create(source, "orders", 1)
    mirrored = {init_producer(source, "logs.orders", f"app{i}").producer_id for i in range(3)}
    with monkeypatch.context() as old:  # what an older icelog did: no reservation
        old.setattr("icelog.storage.replication.mirror.reserve_producer_ids_below", lambda catalog, floor: None)
        run_mirror(source, target)
        if older == "mirror step and promote":
            promote(target, "orders")
    if older == "mirror step":
        promote(target, "orders")
    assert init_producer(target, "logs.orders", "dr-new-app").producer_id not in mirrored
    assert LogTable.open(target, "orders").state().producers.find_client("app0") is not None


def test_i6_read_only_mirror_refuses_every_write_path(source, target):
    """Until promoted, only the mirror writes its target: every other write is refused and
    changes nothing, and the next step carries on in parity."""
    src = LogTable.create(source, "orders", 2)
    for i in range(3):
        src.append({0: rows(2, f"a{i}"), 1: rows(1, f"b{i}")})
    run_mirror(source, target)
    dst = LogTable.open(target, "orders")
    before = dst.table().metadata_location
    writes: dict[str, Callable[[], Any]] = {
        "producers init": lambda: init_producer(target, "logs.orders", "dr-app"),
        "add-partitions": lambda: dst.add_partitions(4),
        "retention": lambda: maintain(target, "logs.orders", retention_bytes=1),
        "compaction": lambda: commit(target, "logs.orders", Compaction("logs.orders")),
        "snapshot expiry": lambda: expire_snapshots(target, "logs.orders", keep=1),
        "producers rebuild": lambda: rebuild(target, "logs.orders"),
        "write with offsets": lambda: write_with_offsets(target, "orders", {0: offset_rows(0, [6])}, principal=PRINCIPAL),
    }
    for name, write in writes.items():
        with pytest.raises(ReadOnlyTable):
            write()
        assert dst.table().metadata_location == before, f"{name} changed the mirror"
    assert "retention" not in maintain(target, "logs.orders")  # orphan cleanup alone
    assert dst.table().metadata_location == before
    src.append({0: rows(1, "late")})
    assert run_mirror(source, target).ranges == {0: (6, 7)}
    assert_parity(source, target)


def test_i6_a_foreign_commit_on_a_read_only_mirror_is_rolled_back_and_mirroring_resumes(source, target):
    """A foreign engine's commit on a mirror target stops the mirror (ForeignCommit: run
    repair); repair rolls it back (never adopts it: the target follows its source) and the
    next step continues in parity."""
    from icelog.storage.errors import ForeignCommit
    from icelog.storage.log.repair import RepairImpossible, repair

    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)
    table = LogTable.open(target, "orders")
    iceberg = target.load_table(table.identifier)
    foreign = iceberg.scan().to_arrow().slice(0, 1)
    foreign = foreign.set_column(
        foreign.schema.get_field_index(cols.OFFSET), foreign.schema.field(cols.OFFSET), pa.array([2], pa.int64())
    )
    iceberg.append(foreign)  # exactly the next offset, but not the source's record
    src.append({0: rows(1, "new")})
    with pytest.raises(ForeignCommit):
        run_mirror(source, target)
    with pytest.raises(RepairImpossible):
        repair(target, table.identifier, mode="adopt")
    assert repair(target, table.identifier)["action"] == "rolled_back"
    run_mirror(source, target)
    assert_parity(source, target)


def test_i4_a_commit_id_that_landed_on_the_source_is_never_written_again_on_the_promoted_mirror(source, target):
    """The target's commit-id registry holds none of the source's commits (the mirror writes
    them under its own ids), so it cannot prove that an id made before the promotion never
    landed: a re-send after failover must be refused (CommitIdForgotten), never written twice."""
    import time

    from icelog.storage.core.commit import new_commit_id
    from icelog.storage.errors import CommitIdForgotten

    src = LogTable.create(source, "orders", 1)
    sent = new_commit_id()
    src.append({0: rows(1, "deposit")}, commit_id=sent)
    run_mirror(source, target)
    promote(target, "orders")
    dst = LogTable.open(target, "orders")
    with pytest.raises(CommitIdForgotten):  # the producer fails over and re-sends its batch
        dst.append({0: rows(1, "deposit")}, commit_id=sent)
    assert dst.watermarks()[0].end == 1
    time.sleep(1.1)  # past the clock-skew margin
    fresh = new_commit_id()  # made after the promotion: proven new
    assert dst.append({0: rows(1, "fresh")}, commit_id=fresh).ranges == {0: (1, 2)}

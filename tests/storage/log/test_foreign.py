"""Foreign writers: icelog never builds on a snapshot it did not make (I1, I2), and repair is exact."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from icelog.storage.errors import ForeignCommit, ForeignPartitionSpec
from icelog.storage.log import schema as cols
from icelog.storage.log.repair import RepairImpossible, repair
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks


def rows(tag: str, n: int = 1) -> list[dict]:
    return [{"key": tag, "value": f"{tag}-{i}"} for i in range(n)]


def foreign_rows(table, partition: int, offsets: list[int]) -> pa.Table:
    """Rows as another engine would write them: every column filled by hand."""
    n = len(offsets)
    return pa.Table.from_pydict(
        {
            cols.PARTITION: pa.array([partition] * n, pa.int32()),
            cols.OFFSET: pa.array(offsets, pa.int64()),
            cols.TIMESTAMP: pa.array([datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC")),
            cols.PRODUCER_ID: pa.nulls(n, pa.int64()),
            cols.PRODUCER_EPOCH: pa.nulls(n, pa.int32()),
            cols.PRODUCER_SEQ: pa.nulls(n, pa.int32()),
            cols.KEY_HASH: pa.nulls(n, pa.int32()),  # a foreign engine does not know it
            "key": [f"f{o}" for o in offsets],
            "value": [f"foreign-{o}" for o in offsets],
        },
        schema=table.schema().as_arrow(),
    )


def plant(catalog, t: LogTable, partition: int, offsets: list[int]) -> int:
    table = catalog.load_table(t.identifier)
    table.append(foreign_rows(table, partition, offsets))
    return catalog.load_table(t.identifier).metadata.current_snapshot_id


def test_i1_append_on_a_foreign_snapshot_is_refused_naming_it(catalog):
    t = LogTable.create(catalog, "db.foreign", 2)
    t.append({0: rows("a", 10)})
    foreign = plant(catalog, t, 0, list(range(5, 10)))  # duplicates offsets 5..9
    location = t.table().metadata_location
    with pytest.raises(ForeignCommit) as caught:
        t.append({0: rows("b")})
    assert caught.value.snapshot_id == foreign and str(foreign) in str(caught.value)
    with pytest.raises(ForeignCommit):
        t.append({1: rows("other partition too")}, {1: 0})
    assert t.table().metadata_location == location  # nothing written


def test_i1_repair_rolls_back_a_foreign_duplicate_and_reports_it(catalog):
    t = LogTable.create(catalog, "db.dup", 1)
    mine = t.append({0: rows("a", 10)})
    plant(catalog, t, 0, list(range(5, 10)))
    assert not run_checks(t.table(), ["contiguity-deep"]).ok
    report = repair(catalog, t.identifier)
    assert report["action"] == "rolled_back" and report["dropped_rows"] == 5 and report["icelog_snapshot_id"] == mine.snapshot_id
    assert "offset 5" in report["reason"]
    assert t.table().metadata.current_snapshot_id == mine.snapshot_id
    assert run_checks(t.table(), ["contiguity-deep"]).ok
    assert t.append({0: rows("b")}).ranges == {0: (10, 11)}
    assert repair(catalog, t.identifier)["action"] == "none"


def test_i1_repair_adopts_foreign_rows_that_extend_the_log_exactly(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.adopt", 2)
    t.append({0: rows("a", 4)})
    plant(sqlite_catalog, t, 0, [4, 5, 6])
    plant(sqlite_catalog, t, 1, [0, 1])
    report = repair(sqlite_catalog, t.identifier)
    assert report["action"] == "adopted" and report["rows"] == {"0": 3, "1": 2} and len(report["foreign_snapshots"]) == 2
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (0, 7), 1: (0, 2)}
    assert run_checks(t.table(), ["contiguity-deep"]).ok
    assert t.append({0: rows("b")}).ranges == {0: (7, 8)}


@pytest.mark.parametrize("offsets", [[5, 6, 8], [6, 5, 7], [5, 5, 6], [4, 5]])
def test_i1_repair_never_adopts_rows_that_break_contiguity(sqlite_catalog, offsets):
    t = LogTable.create(sqlite_catalog, "db.bad", 1)
    mine = t.append({0: rows("a", 5)})
    plant(sqlite_catalog, t, 0, offsets)
    with pytest.raises(RepairImpossible):
        repair(sqlite_catalog, t.identifier, mode="adopt")
    assert t.table().metadata.current_snapshot_id != mine.snapshot_id  # adopt-only changed nothing
    assert repair(sqlite_catalog, t.identifier)["action"] == "rolled_back"
    assert t.read(0).column(cols.OFFSET).to_pylist() == [0, 1, 2, 3, 4]


def test_i1_repair_rolls_back_a_foreign_delete(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.deleted", 1)
    t.append({0: rows("a", 3)})
    t.append({0: rows("b", 3)})
    from pyiceberg.expressions import LessThan

    sqlite_catalog.load_table(t.identifier).delete(LessThan(cols.OFFSET, 3))
    with pytest.raises(ForeignCommit):
        t.append({0: rows("c")})
    report = repair(sqlite_catalog, t.identifier)
    assert report["action"] == "rolled_back" and report["restored_files"] >= 1
    assert t.read(0).column(cols.OFFSET).to_pylist() == list(range(6))


def test_i1_repair_rolls_a_foreign_first_snapshot_back_to_the_empty_table(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.first", 1)
    plant(sqlite_catalog, t, 0, [1, 2])  # not from offset 0: cannot be adopted
    with pytest.raises(ForeignCommit):
        t.append({0: rows("a")})
    report = repair(sqlite_catalog, t.identifier)
    assert report["action"] == "rolled_back" and report["icelog_snapshot_id"] is None
    assert report["dropped_rows"] == 2 and report["restored_rows"] == 0
    table = t.table()
    assert table.metadata.current_snapshot_id is None and not table.metadata.snapshot_log
    assert t.read(0).num_rows == 0
    assert repair(sqlite_catalog, t.identifier)["action"] == "none"
    assert t.append({0: rows("a")}, {0: 0}).ranges == {0: (0, 1)}
    assert run_checks(t.table(), ["contiguity-deep"]).ok


def test_i1_repair_of_a_foreign_delete_reports_the_rows_it_restores(sqlite_catalog):
    from pyiceberg.expressions import EqualTo

    t = LogTable.create(sqlite_catalog, "db.rewritten", 1)
    t.append({0: rows("a", 3)})
    sqlite_catalog.load_table(t.identifier).delete(EqualTo(cols.OFFSET, 1))  # rewrites the file: 2 rows
    report = repair(sqlite_catalog, t.identifier)
    assert report["action"] == "rolled_back"
    assert (report["dropped_rows"], report["restored_rows"]) == (0, 1)
    assert t.read(0).column(cols.OFFSET).to_pylist() == [0, 1, 2]


def test_i1_a_forged_record_in_a_system_table_is_rolled_back_never_adopted(sqlite_catalog):
    """A foreign engine's commit wedges icelog_system.transactions (every journal step raises
    ForeignCommit, which says: run repair); repair must roll it back, and must never adopt a
    forged record even when it extends the journal exactly."""
    from icelog.storage.producers.journal import ensure_journal
    from icelog.storage.producers.journal_state import JOURNAL
    from icelog.storage.producers.transactional import TransactionalProducer

    catalog = sqlite_catalog
    LogTable.create(catalog, "db.t", 1)
    producer = TransactionalProducer(catalog, "tx")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.t", 0, rows("a"))
    producer.commit_transaction()  # journal records to forge from
    journal = ensure_journal(catalog)
    end = journal.watermarks()[0].end
    table = catalog.load_table(JOURNAL)
    forged = table.scan().to_arrow().slice(0, 1)
    forged = forged.set_column(
        forged.schema.get_field_index(cols.OFFSET), forged.schema.field(cols.OFFSET), pa.array([end], pa.int64())
    )
    table.append(forged)  # exactly the next offset: adoptable, were it a user table
    with pytest.raises(ForeignCommit):
        producer.init_transactions()
    with pytest.raises(RepairImpossible):
        repair(catalog, JOURNAL, mode="adopt")
    report = repair(catalog, JOURNAL)
    assert report["action"] == "rolled_back" and report["dropped_rows"] == 1
    assert journal.watermarks()[0].end == end
    producer.init_transactions()  # the coordinator works again


# --- a foreign partition spec: icelog writes only under identity(log_partition) ----------------


def set_foreign_spec(catalog, t: LogTable, *, keep_log_partition: bool, transform=None) -> int:
    """Another tool's ``update_spec()``: a bucket of the key beside (or instead of) log_partition."""
    from pyiceberg.transforms import BucketTransform

    table = catalog.load_table(t.identifier)
    with table.update_spec() as update:
        if not keep_log_partition:
            update.remove_field(cols.PARTITION)
        if transform is None:
            update.add_field("key", BucketTransform(4), "key_bucket")
        else:
            update.add_field("key", transform, "key_foreign")
    return catalog.load_table(t.identifier).metadata.default_spec_id


def data_files_on_disk(t: LogTable) -> set[str]:
    """The Parquet files under the table, as its store lists them (local disk or S3)."""
    from icelog.storage.core.metadata_files import file_system, list_files

    fs, root = file_system(t.table().io, t.table().metadata.location)
    return {f.path for f in list_files(fs, root, recursive=True) if f.path.endswith(".parquet")}


@pytest.fixture(params=["sqlite", "rest"])
def any_catalog(request):
    """A SQL catalog on local disk, and the SeaweedFS Iceberg REST catalog over S3."""
    return request.getfixturevalue(f"{request.param}_catalog")


@pytest.mark.parametrize("keep_log_partition", [True, False], ids=["bucket-beside", "bucket-instead"])
def test_i8_append_under_a_foreign_partition_spec_is_refused_and_repair_sets_the_spec_back(any_catalog, keep_log_partition):
    import pickle

    t = LogTable.create(any_catalog, "db.respec", 2)
    t.append({0: rows("a", 3), 1: rows("b")})
    foreign = set_foreign_spec(any_catalog, t, keep_log_partition=keep_log_partition)
    location, files = t.table().metadata_location, data_files_on_disk(t)
    with pytest.raises(ForeignPartitionSpec) as caught:
        t.append({0: rows("c")})
    error = caught.value
    assert error.spec_id == foreign and "key_bucket=bucket[4]" in str(error) and "icelog repair db.respec" in str(error)
    assert pickle.loads(pickle.dumps(error)).fields == error.fields
    assert t.table().metadata_location == location and data_files_on_disk(t) == files  # nothing written
    # reads and both checks still answer, from the files as written
    assert t.read(0).column("key").to_pylist() == ["a", "a", "a"]
    assert run_checks(t.table(), ["contiguity"]).ok and run_checks(t.table(), ["contiguity-deep"]).ok
    report = repair(any_catalog, t.identifier)
    assert report["action"] == "spec_restored" and report["partition_spec"] == {"foreign": foreign, "restored": 0}
    assert t.table().metadata.default_spec_id == 0
    assert t.append({0: rows("c")}).ranges == {0: (3, 4)}
    assert run_checks(t.table(), ["contiguity-deep"]).ok
    assert repair(any_catalog, t.identifier)["action"] == "none"


def test_i1_foreign_rows_under_a_foreign_spec_are_diagnosed_by_validate_and_never_adopted(sqlite_catalog):
    """A foreign writer's file under a spec without identity(log_partition): its partition tuple
    names no log partition (here the key), so the metadata check cannot place it."""
    from pyiceberg.transforms import IdentityTransform

    t = LogTable.create(sqlite_catalog, "db.respec_rows", 1)
    mine = t.append({0: rows("a", 3)})
    foreign = set_foreign_spec(sqlite_catalog, t, keep_log_partition=False, transform=IdentityTransform())
    plant(sqlite_catalog, t, 0, [3, 4])  # extends the log exactly, but under the foreign spec
    for check in ("contiguity", "contiguity-deep"):
        found = run_checks(t.table(), [check]).violations
        assert any(v.kind == "partition_spec" and v.extra["spec_id"] == foreign for v in found), found
    report = repair(sqlite_catalog, t.identifier)
    assert report["action"] == "rolled_back" and f"partition spec {foreign}" in report["reason"]
    assert report["partition_spec"] == {"foreign": foreign, "restored": 0}
    assert t.table().metadata.current_snapshot_id == mine.snapshot_id
    assert t.append({0: rows("b")}).ranges == {0: (3, 4)}
    assert run_checks(t.table(), ["contiguity-deep"]).ok

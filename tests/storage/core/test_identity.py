"""A table is its identity, not its name (I2, I5, I7): nothing decided against a table that was
dropped and re-created under its name is committed into, or acknowledged from, the new one; and
a commit that ends without landing leaves no file behind.
"""

from __future__ import annotations

import glob
import os

import pytest

from icelog.storage.core import faults
from icelog.storage.core.metadata_files import file_system, list_files
from icelog.storage.errors import OffsetMismatch, TransactionTableChanged
from icelog.storage.log.files import local_path
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.transactional import TransactionalProducer
from tests.support.transactions import (
    SMALL,
    contiguous,
    journal_states,
    kill_one_transaction,
    past_timeout,
    rows,
    staged_files,
    two_tables,
)

OTHER_SCHEMA = [{"name": "n", "type": "long"}, {"name": "label", "type": "string"}]


def recreate(catalog, name: str, schema: str) -> LogTable:
    """Another client drops ``name`` and creates a table under it: the same payload, or another."""
    LogTable(catalog, name).drop()
    payload = None if schema == "same" else OTHER_SCHEMA
    return LogTable.create(catalog, name, 1, payload=payload, properties=SMALL)


@pytest.fixture(params=["sqlite", "rest"])
def any_catalog(request):
    """A SQL catalog on local disk, and the SeaweedFS Iceberg REST catalog over S3."""
    return request.getfixturevalue(f"{request.param}_catalog")


def stored(log_table: LogTable, folder: str) -> list[str]:
    """The files under one folder of the table, as its store lists them (local disk or S3)."""
    table = log_table.table()
    fs, root = file_system(table.io, table.metadata.location)
    return sorted(f.path for f in list_files(fs, f"{root}/{folder}", recursive=True))


def snapshot_files(log_table: LogTable) -> list[str]:
    """Manifests and manifest lists in store (every snapshot's, expired ones too)."""
    return [p for p in stored(log_table, "metadata") if p.endswith(".avro")]


def unreferenced(log_table: LogTable) -> list[str]:
    """Data files in store that no retained snapshot references."""
    table = log_table.table()
    keep = {
        task.file.file_path.split("://", 1)[-1]
        for snapshot in table.metadata.snapshots
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()
    }
    return [p for p in stored(log_table, "data") if p.split("://", 1)[-1] not in keep]


# --- 1. a transaction never commits into a table re-created under its name -----------------------


@pytest.mark.parametrize("schema", ["same", "another"])
def test_i5_commit_into_a_table_recreated_since_its_sends_aborts_and_leaves_it_untouched(catalog, schema):
    a, _ = two_tables(catalog)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    txn_id = producer.begin_transaction()
    producer.send("db.a", 0, [{"key": "mine", "value": "1"}])
    producer.send("db.b", 0, [{"key": "mine", "value": "-1"}])
    b = recreate(catalog, "db.b", schema)
    before = b.table().metadata_location
    with pytest.raises(TransactionTableChanged) as caught:
        producer.commit_transaction()
    assert (caught.value.table, caught.value.txn_id) == ("db.b", txn_id)
    assert b.table().metadata_location == before, "the re-created table was written"
    assert rows(a) == []
    assert journal_states(catalog, txn_id) == []  # on SQL the refused swap was its only journal write
    assert staged_files(a) == [] and staged_files(b) == []
    # The transactional id goes on: its next transaction commits into the table as it is.
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "next", "value": "2"}])
        if schema == "same":
            producer.send("db.b", 0, [{"key": "next", "value": "-2"}])
        else:
            producer.send("db.b", 0, [{"n": 7, "label": "next"}])
    assert rows(a) == [(0, "next", "2")]
    assert b.read(0).num_rows == 1
    contiguous(a)
    contiguous(b)


@pytest.mark.fault
@pytest.mark.timeout(180)
@pytest.mark.parametrize("schema", ["same", "another"])
@pytest.mark.parametrize("finisher", ["recover", "init_transactions"])
def test_i5_prepared_transaction_whose_table_was_recreated_is_aborted_by_recovery_not_wedged(
    sqlite_spec, tmp_path, schema, finisher
):
    """The producer is killed after PREPARE_COMMIT (as versions before the SQL fast path recorded
    it: a journal may hold one at an upgrade); then the table is dropped and re-created.
    Rolling forward would write rows checked for the old table into the new one (unreadable with
    another schema, or a KeyError that left the transaction prepared for good): recovery aborts it
    instead, with nothing written, and the transactional id is usable again."""
    catalog, a, _, before, txn_id, epoch = kill_one_transaction(
        sqlite_spec, tmp_path, faults.AFTER_TXN_PREPARE, legacy_prepare=True
    )
    b = recreate(catalog, "db.b", schema)
    untouched = b.table().metadata_location
    if finisher == "recover":
        report = tx.recover(catalog, clock=past_timeout())
        assert report == {"rolled_forward": [], "aborted": [txn_id]}
        producer = TransactionalProducer(catalog, "copier-1")
        assert producer.init_transactions()["epoch"] == epoch + 1
    else:
        producer = TransactionalProducer(catalog, "copier-1")
        assert producer.init_transactions()["epoch"] == epoch + 1
    assert b.table().metadata_location == untouched, "the re-created table was written"
    assert rows(a) == before[0]
    states = journal_states(catalog, txn_id)
    assert states.count("ABORTED") == 1 and "COMMITTED" not in states, states
    assert coordinator.transactional_ids(catalog)["copier-1"].txn is None
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "next", "value": "1"}])
    assert rows(a)[-1][1:] == ("next", "1")
    contiguous(a)


# --- 2. no acknowledgement by commit id from another table ------------------------------------------


def test_i2_resent_commit_id_after_the_table_was_recreated_is_not_acknowledged_from_the_old_one(any_catalog):
    """A long-lived LogTable appended with a commit id; another client drops and re-creates the
    table. Re-sending the same id must not answer ``duplicate`` with the old table's offsets:
    the new table never had it. The re-send lands in the table as it is."""
    writer = LogTable.create(any_catalog, "db.t", 1, properties=SMALL)
    writer.append({0: [{"key": "k", "value": "v"}] * 3})
    first = writer.append({0: [{"key": "k", "value": "mine"}]}, commit_id="batch-1")
    assert first.ranges == {0: (3, 4)} and not first.duplicate
    recreate(any_catalog, "db.t", "same")  # another process; `writer` still holds the old table
    again = writer.append({0: [{"key": "k", "value": "mine"}]}, commit_id="batch-1")
    assert not again.duplicate, "acknowledged from the dropped table's registry"
    assert again.ranges == {0: (0, 1)}
    assert rows(LogTable(any_catalog, "db.t")) == [(0, "k", "mine")]
    # A true re-send on the same table is still a duplicate, with the original offsets.
    third = writer.append({0: [{"key": "k", "value": "mine"}]}, commit_id="batch-1")
    assert third.duplicate and third.ranges == {0: (0, 1)}
    contiguous(writer)


# --- 3. a commit that ends without landing leaves nothing behind ------------------------------------


def test_i7_stale_conditional_appends_that_lose_leave_no_file_behind(any_catalog):
    """A writer whose cached base is stale decides on it, writes its data file, loses the swap,
    and ends in OffsetMismatch on a fresh read: its data file, manifests and manifest list are
    deleted (before, every such loss left one data file and its snapshot files)."""
    stale = LogTable.create(any_catalog, "db.t", 1, properties=SMALL)
    other = LogTable(any_catalog, "db.t")
    stale.append({0: [{"key": "k", "value": "0"}]}, expected_offsets={0: 0})
    start = len(snapshot_files(stale))
    other.append({0: [{"key": "o", "value": "first"}]})
    per_append = len(snapshot_files(stale)) - start  # what one landed append leaves
    for i in range(5):
        end = stale.state().end(0)  # read, and cached as its next append's base
        other.append({0: [{"key": "o", "value": str(i)}]})  # moves the log end under that base
        with pytest.raises(OffsetMismatch):
            stale.append({0: [{"key": "k", "value": "late"}]}, expected_offsets={0: end})
    assert unreferenced(stale) == []
    assert len(snapshot_files(stale)) - start == 6 * per_append, "a lost attempt left manifests behind"
    assert [r[1] for r in rows(stale)] == ["k", "o", "o", "o", "o", "o", "o"]


def test_i7_lost_race_on_the_sql_catalog_leaves_no_metadata_file(sqlite_catalog):
    """The SQL swap writes the new metadata file before its compare-and-swap; a lost race deletes it."""
    stale = LogTable.create(sqlite_catalog, "db.t", 1, properties=SMALL)
    stale.append({0: [{"key": "k", "value": "0"}]})
    other = LogTable(sqlite_catalog, "db.t")
    other.append({0: [{"key": "o", "value": "1"}]})  # `stale` keeps its base from before this
    location = local_path(other.table().metadata.location)
    before = set(glob.glob(f"{location}/metadata/*.metadata.json"))
    with pytest.raises(OffsetMismatch):
        stale.append({0: [{"key": "k", "value": "late"}]}, expected_offsets={0: 1})
    assert set(glob.glob(f"{location}/metadata/*.metadata.json")) == before
    assert all(os.path.exists(p) for p in before)

"""Transactions on an Iceberg REST catalog over S3 (a real SeaweedFS server), which cannot commit
several tables in one step: the journal's PREPARE_COMMIT is the decision, and each table then
rolls forward in its own commit, carrying the transaction id (docs/transactions.md).

Worker processes are killed with SIGKILL at every named point; recovery (or a new instance)
finishes what was decided exactly once and aborts what was not. The same path on a local
catalog, stopped at the points in-process, is section 7 of ``test_transactions.py``.
"""

from __future__ import annotations

import json

import pytest

from icelog.storage.admin.maintenance import maintain
from icelog.storage.core import faults
from icelog.storage.errors import ExpectedOffsetNeedsAtomicCatalog
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.validations.checks import run_checks
from tests.support.transactions import (
    BEFORE_PREPARE,
    check_all_or_nothing,
    journal,
    kill_one_transaction,
    past_timeout,
    rows,
    staged_files,
)

pytestmark = [pytest.mark.integration]


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", faults.TXN_POINTS)
def test_i5_rest_kill_at_every_transaction_point_then_recover_finishes_all_or_nothing(rest_spec, tmp_path, point):
    catalog, a, b, before, txn_id, _ = kill_one_transaction(rest_spec, tmp_path, point)
    report = tx.recover(catalog, clock=past_timeout())
    if point in BEFORE_PREPARE:
        assert report == {"rolled_forward": [], "aborted": [txn_id]}
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
        "BEGIN",
        "ADD_PARTITIONS",
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

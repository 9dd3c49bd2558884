"""A damaged transaction journal (I8): coordinator state that does not parse stops with
``JournalUnreadable`` before anything is written, as a whole or for one transactional id alone
(every other id goes on, and the damaged entry is kept as it was); the transactions check
reports a damaged journal as a violation instead of crashing."""

from __future__ import annotations

import json

import pytest

from icelog.storage.errors import JournalUnreadable, RecoveryIncomplete
from icelog.storage.log.table import LogTable
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.journal_state import JOURNAL
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.properties import TRANSACTIONS
from icelog.validations import transactions as check
from icelog.validations.checks import run_checks


def damage(catalog, edit) -> None:
    """Rewrite the coordinator state past icelog, as an outside tool or a bad restore would."""
    table = catalog.load_table(JOURNAL)
    with table.transaction() as txn:
        txn.set_properties({TRANSACTIONS: edit(table.metadata.properties[TRANSACTIONS])})


def journal_location(catalog) -> str:
    return catalog.load_table(JOURNAL).metadata_location


def test_i8_a_journal_state_that_does_not_parse_stops_every_coordinator_action_before_it_writes(catalog):
    a = LogTable.create(catalog, "db.a", 1)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    damage(catalog, lambda text: text[: len(text) // 2])
    before = journal_location(catalog), a.table().metadata_location
    actions = {
        "init": lambda: TransactionalProducer(catalog, "other").init_transactions(),
        # On SQL a send does not consult the journal; its commit's one swap does.
        "commit": lambda: (producer.begin_transaction(), producer.send("db.a", 0, [{"key": "k"}]), producer.commit_transaction()),
        "recover": lambda: tx.recover(catalog),
        "abort": lambda: tx.abort(catalog, "copier"),
    }
    for name, action in actions.items():
        with pytest.raises(JournalUnreadable, match="the coordinator state cannot be read") as caught:
            action()
        assert caught.value.transactional_id is None, name
        assert (journal_location(catalog), a.table().metadata_location) == before, f"{name} wrote something"
    report = run_checks(a.table(), ["transactions"])
    assert [v.kind for v in report.violations] == ["journal_unreadable"]


def test_i8_one_unreadable_entry_stops_only_its_transactional_id(catalog):
    a = LogTable.create(catalog, "db.a", 1)
    good = TransactionalProducer(catalog, "good")
    good.init_transactions()
    TransactionalProducer(catalog, "stuck").init_transactions()
    damage(catalog, lambda text: json.dumps({**json.loads(text), "stuck": {"producer_id": "x"}}))  # no epoch

    with good.transaction():  # every other transactional id goes on
        good.send("db.a", 0, [{"key": "k", "value": "v"}])
    assert a.watermarks()[0].end == 1
    assert json.loads(catalog.load_table(JOURNAL).metadata.properties[TRANSACTIONS])["stuck"] == {"producer_id": "x"}
    with pytest.raises(JournalUnreadable, match="the entry of 'stuck' cannot be read"):
        TransactionalProducer(catalog, "stuck").init_transactions()
    with pytest.raises(JournalUnreadable):
        tx.abort(catalog, "stuck")
    with pytest.raises(RecoveryIncomplete) as caught:
        tx.recover(catalog)
    (failed,) = caught.value.failed
    assert (failed["transactional_id"], failed["error"]) == ("stuck", "JournalUnreadable")
    assert run_checks(a.table(), ["transactions"]).ok  # what parses still vouches for the table


@pytest.mark.parametrize("detail", ["{not json", '{"ranges": {"db.a": {"0": [1]}}}', '{"ranges": {"db.a": {"p": [0, 1]}}}', "[]"])
def test_i8_a_committed_record_whose_detail_does_not_parse_is_a_violation_not_a_crash(sqlite_catalog, monkeypatch, detail):
    a = LogTable.create(sqlite_catalog, "db.a", 1)
    monkeypatch.setattr(check, "_journal", lambda table: ([("t1", "COMMITTED", detail)], {}))
    report = check.check_transactions(a.table())
    assert [v.kind for v in report.violations] == ["journal_unreadable"] and "t1" in report.violations[0].detail

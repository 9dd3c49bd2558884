"""The CLI for transactions, repair and consistent reads (one JSON document each, typed exit codes)."""

from __future__ import annotations

import json

from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import TransactionalProducer


def test_transactions_list_on_a_catalog_without_a_journal_creates_nothing(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 1)
    assert icelog("transactions", "list") == {"transactional_ids": []}
    assert not catalog.table_exists("icelog_system.transactions")


def test_transactions_describe_on_a_catalog_without_a_journal_creates_nothing(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 1)
    assert icelog("transactions", "describe", "0" * 32, code=2)["error"] == "InvalidInput"
    assert not catalog.table_exists("icelog_system.transactions")


def test_system_tables_are_listed_only_on_request(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 1)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    with producer.transaction():  # the coordinator's journal is a log table of icelog_system
        producer.send("db.a", 0, [{"key": "x"}])
    assert icelog("topics", "list") == {"tables": ["db.a"]}
    # Every table of icelog_system, log table or not (the producer-id allocator here).
    assert icelog("topics", "list", "--system") == {
        "tables": ["db.a", "icelog_system.producer_ids", "icelog_system.transactions"]
    }


def test_i5_transactions_list_describe_abort_recover(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 2)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "x"}])
    producer.begin_transaction()
    producer.send("db.a", 1, [{"key": "open"}])
    # On SQL the journal hears of a transaction of plain sends only in its commit's swap: open, it is not listed.
    assert icelog("transactions", "list")["transactional_ids"][0]["txn_id"] is None
    producer._register("db.a", [1], record=True)  # registered, as a send of pre-written files does
    listed = icelog("transactions", "list")["transactional_ids"]
    assert listed == [
        {
            "transactional_id": "copier",
            "producer_id": 0,
            "epoch": 0,
            "txn_id": producer.txn_id,
            "state": "ONGOING",
            "decided": False,
        }
    ]
    described = icelog("transactions", "describe", producer.txn_id)
    assert [r["state"] for r in described["records"]] == ["BEGIN"]
    assert icelog("transactions", "abort", "copier") == {"transactional_id": "copier", "aborted": producer.txn_id}
    assert [r["state"] for r in icelog("transactions", "describe", producer.txn_id)["records"]] == ["BEGIN", "ABORTED"]
    assert icelog("transactions", "recover") == {"rolled_forward": [], "aborted": []}
    assert icelog("transactions", "describe", "0" * 32, code=2)["error"] == "InvalidInput"
    assert icelog("transactions", "describe", "x;drop", code=2)["error"] == "InvalidInput"
    assert icelog("validate", "db.a", "--check", "transactions")["ok"] is True
    assert icelog("sql", "select count(*) from db.a")["rows"] == [[1]]
    assert icelog("sql", "--no-consistent", "select count(*) from db.a")["rows"] == [[1]]


def test_i8_produce_to_a_system_table_is_refused_and_the_journal_stays_true(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 1)
    producer = TransactionalProducer(catalog, "copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("db.a", 0, [{"key": "x"}])
    committed = icelog(
        "sql",
        "select txn_id, transactional_id, txn_producer_id, txn_epoch from icelog_system.transactions where txn_state = 'COMMITTED'",
    )["rows"][0]
    forged = json.dumps(
        dict(zip(("txn_id", "transactional_id", "txn_producer_id", "txn_epoch"), committed, strict=False))
        | {"txn_state": "ABORTED", "detail": "{}"}
    )
    refused = icelog("produce", "icelog_system.transactions", "--partition", "0", input=forged + "\n", code=2)
    assert refused["error"] == "InvalidIdentifier"
    assert icelog("topics", "create", "icelog_system.mine", "--partitions", "1", code=2)["error"] == "InvalidIdentifier"
    assert icelog("sql", "select count(*) from icelog_system.transactions where txn_state = 'ABORTED'")["rows"] == [[0]]
    assert icelog("validate", "db.a", "--check", "transactions")["ok"] is True


def test_i1_repair_from_the_cli(icelog, sqlite_spec):
    catalog = sqlite_spec.open()
    t = LogTable.create(catalog, "db.r", 1)
    t.append({0: [{"key": "a"}, {"key": "b"}]})
    table = catalog.load_table("db.r")
    table.append(table.scan().to_arrow())  # a foreign writer re-appends offsets 0..1
    refused = icelog("produce", "db.r", "--partition", "0", input='{"key": "c"}\n', code=3)
    assert refused["error"] == "ForeignCommit"
    report = icelog("repair", "db.r")
    assert report["action"] == "rolled_back" and report["dropped_rows"] == 2
    assert icelog("repair", "db.r")["action"] == "none"
    assert icelog("produce", "db.r", "--partition", "0", input='{"key": "c"}\n')["base_offset"] == 2
    assert icelog("repair", "db.r", "--mode", "sideways", code=2)["error"] == "BadParameter"

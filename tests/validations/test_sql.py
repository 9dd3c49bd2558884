"""Time travel over the whole catalog (``validations.sql.connect``): one cut, all or nothing (I5)."""

from __future__ import annotations

import pyarrow as pa

from icelog.storage.core.commit import commit_tables
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.validations.sql import connect


def counts(catalog, names: list[str], as_of_ms: int) -> list[int]:
    con = connect(catalog, as_of_ms=as_of_ms)
    return [con.execute(f"select count(*) from {name}").fetchall()[0][0] for name in names]


def test_i5_as_of_at_any_millisecond_shows_a_multi_table_commit_whole_or_not_at_all(sqlite_catalog):
    tables = [LogTable.create(sqlite_catalog, f"db.t{i}", 1) for i in range(3)]
    parts = [
        (t.identifier, AppendRequest(t.identifier, {0: pa.table({"key": ["x"], "value": ["x"]})}, {}, "txn")) for t in tables
    ]
    commit_tables(sqlite_catalog, parts, commit_id="txn")
    stamps = [t.table().metadata.current_snapshot().timestamp_ms for t in tables]
    names = [t.identifier for t in tables]
    for moment in range(min(stamps) - 1, max(stamps) + 2):
        assert counts(sqlite_catalog, names, moment) in ([0, 0, 0], [1, 1, 1]), moment


def test_i5_catalog_wide_as_of_is_not_limited_by_the_system_tables_history(sqlite_catalog):
    events = LogTable.create(sqlite_catalog, "db.events", 1)
    first = events.append({0: [{"key": "a"}]}).snapshot_id
    moment = events.table().metadata.snapshot_by_id(first).timestamp_ms
    producer = TransactionalProducer(sqlite_catalog, "copier")
    producer.init_transactions()
    for i in range(6):  # the journal keeps 10 snapshots: these make far more
        with producer.transaction():
            producer.send(events.identifier, 0, [{"key": f"t{i}"}])
    journal = sqlite_catalog.load_table("icelog_system.transactions")
    assert min(s.timestamp_ms for s in journal.metadata.snapshots) > moment
    assert counts(sqlite_catalog, ["db.events"], moment) == [1]
    assert counts(sqlite_catalog, ["db.events"], 2**41) == [7]

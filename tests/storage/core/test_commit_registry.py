"""Every commit is findable by its commit id, for a bounded window independent of snapshots (I4, I7).

The registry (``icelog.commits``) is written in the same commit as the change it records,
so a caller whose response was lost can always re-send with the same commit id.
"""

from __future__ import annotations

import json
import time

import pytest

from icelog.storage.core import registry
from icelog.storage.core.commit import KEEP_COMMIT_IDS, KEEP_SNAPSHOTS, commit, new_commit_id
from icelog.storage.core.registry import all_commits
from icelog.storage.errors import CommitIdForgotten, DuplicateSequence, ExpectedOffsetRequired, ProducerFenced
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.idempotent import InitProducer, LeaseProducerIds, Producer, lease_producer_ids
from icelog.storage.properties import COMMIT_IDS_MIN_RETENTION_MS, COMMITS

MIN_RETENTION_MS = COMMIT_IDS_MIN_RETENTION_MS.key


def rows(tag: str, n: int = 1) -> list[dict]:
    return [{"key": tag, "value": f"{tag}-{i}"} for i in range(n)]


def test_i7_plain_append_retried_after_more_commits_than_retained_snapshots_lands_once(catalog):
    t = LogTable.create(catalog, "db.reg", 2, properties={KEEP_SNAPSHOTS: "5"})
    first = t.append({0: rows("lost")}, commit_id="lost-response")
    for i in range(25):  # far more commits than the 5 retained snapshots
        t.append({1: rows(f"other{i}")})
    assert len(t.table().metadata.snapshots) <= 5
    again = t.append({0: rows("lost")}, commit_id="lost-response")
    assert again.duplicate and again.ranges == first.ranges == {0: (0, 1)}
    assert again.snapshot_id == first.snapshot_id
    assert t.watermarks()[0].end == 1 and t.read(0).num_rows == 1


def test_i4_property_only_commits_are_findable_by_commit_id(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.props", 1)
    outcome = commit(sqlite_catalog, t.identifier, InitProducer(t.identifier, "client-a", 7), commit_id="init-1")
    version = t.table().metadata.properties["icelog.version"]
    # A re-send after an unknown outcome finds the commit; it neither bumps the epoch again nor writes.
    again = commit(sqlite_catalog, t.identifier, InitProducer(t.identifier, "client-a", 8), commit_id="init-1")
    assert again.already_committed and again.result.to_dict() == outcome.result.to_dict() == {"producer_id": 7, "epoch": 0}
    assert t.table().metadata.properties["icelog.version"] == version

    lease_producer_ids(sqlite_catalog, 1)  # creates the system table
    leased = commit(sqlite_catalog, "icelog_system.producer_ids", LeaseProducerIds(3), commit_id="lease-1").result
    assert commit(sqlite_catalog, "icelog_system.producer_ids", LeaseProducerIds(3), commit_id="lease-1").result == leased
    assert lease_producer_ids(sqlite_catalog, 1)[0] == leased.stop


def test_i4_registry_is_bounded_by_the_table_property(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.bounded", 1, properties={KEEP_COMMIT_IDS: "10", MIN_RETENTION_MS: "0"})
    for i in range(15):
        t.append({0: rows(str(i))}, commit_id=f"c{i}")
    registry = all_commits(t.table())
    assert [entry[0] for entry in registry] == [f"c{i}" for i in range(5, 15)]
    assert len(t.table().metadata.properties[COMMITS]) < 2000


def test_i4_producer_counts_its_own_sequences_and_a_resend_lands_once(catalog):
    t = LogTable.create(catalog, "db.prod", 2)
    producer = Producer(catalog, t.identifier, client_id="writer")
    a = producer.send({0: rows("a", 3)})
    b = producer.send({0: rows("b", 2), 1: rows("c", 1)})
    assert a.ranges == {0: (0, 3)} and b.ranges == {0: (3, 5), 1: (0, 1)}
    assert producer.next_sequence(0) == 5 and producer.next_sequence(1) == 1
    # The same batch sent again with the sequences it had (as after a lost response) is a duplicate.
    from icelog.storage.log.sequences import ProducerBatch

    resent = t.append(
        {0: rows("b", 2), 1: rows("c", 1)}, producer=ProducerBatch(producer.producer_id, producer.epoch, {0: 3, 1: 0})
    )
    assert resent.duplicate and resent.ranges == b.ranges
    assert t.watermarks()[0].end == 5
    # A second instance with the same client id fences the first.
    newer = Producer(catalog, t.identifier, client_id="writer")
    assert newer.producer_id == producer.producer_id and newer.epoch == producer.epoch + 1
    with pytest.raises(ProducerFenced):
        producer.send({0: rows("zombie")})
    assert newer.send({0: rows("d")}).ranges == {0: (5, 6)}
    for _ in range(7):
        newer.send({1: rows("e")})
    with pytest.raises(DuplicateSequence):  # far older than the batches kept: written long ago
        t.append({1: rows("e")}, producer=ProducerBatch(newer.producer_id, newer.epoch, {1: 0}))


def test_i2_check_expected_offsets_flag_refuses_unconditional_appends(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.strict", 2, properties={"icelog.check-expected-offsets": "true"})
    before = t.table().metadata_location
    with pytest.raises(ExpectedOffsetRequired) as caught:
        t.append({0: rows("a"), 1: rows("b")}, {0: 0})
    assert caught.value.partitions == [1]
    assert t.table().metadata_location == before
    assert t.append({0: rows("a"), 1: rows("b")}, {0: 0, 1: 0}).ranges == {0: (0, 1), 1: (0, 1)}
    lax = LogTable.create(sqlite_catalog, "db.lax", 1)
    assert lax.append({0: rows("a")}).ranges == {0: (0, 1)}


def test_append_request_receipt_round_trips():
    request = AppendRequest("db.t", {}, {}, "cid")
    from icelog.storage.log.table import AppendResult

    result = AppendResult("db.t", {0: (3, 5), 2: (0, 1)}, "cid")
    back = request.from_receipt(request.receipt(result))
    assert back.ranges == result.ranges and back.duplicate


def test_i4_registry_keeps_commit_ids_for_the_time_floor_beyond_the_count(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.floor", 1, properties={KEEP_COMMIT_IDS: "3"})
    first = t.append({0: rows("first")}, commit_id="first")
    for i in range(8):  # far past the count, well inside the 7-day floor
        t.append({0: rows(str(i))})
    assert len(all_commits(t.table())) == 9
    again = t.append({0: rows("first")}, commit_id="first")
    assert again.duplicate and again.ranges == first.ranges and t.watermarks()[0].end == 9


def test_i4_resend_of_an_id_the_registry_may_have_forgotten_is_refused_not_written_again(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.forgets", 1, properties={KEEP_COMMIT_IDS: "2", MIN_RETENTION_MS: "0"})
    lost = new_commit_id()
    t.append({0: rows("lost")}, commit_id=lost)
    for i in range(4):  # the id leaves the window before the caller re-sends
        t.append({0: rows(str(i))})
    before = t.table().metadata_location
    with pytest.raises(CommitIdForgotten) as caught:
        t.append({0: rows("lost")}, commit_id=lost)
    assert caught.value.commit_id == lost
    assert t.table().metadata_location == before and t.watermarks()[0].end == 5


def test_i4_a_commit_id_made_after_the_forgotten_commits_is_proven_new(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.proven", 1, properties={KEEP_COMMIT_IDS: "2", MIN_RETENTION_MS: "0"})
    for i in range(4):
        t.append({0: rows(str(i))})
    time.sleep(1.1)  # past the clock-skew margin
    fresh = new_commit_id()
    assert t.append({0: rows("fresh")}, commit_id=fresh).ranges == {0: (4, 5)}
    assert t.append({0: rows("fresh")}, commit_id=fresh).duplicate  # still in the window: its result


def test_i4_a_first_send_is_never_judged_by_the_registrys_window(sqlite_catalog):
    """An append without a commit id gets a fresh UUIDv7 id, as a transaction's commit does: it was
    never sent, so a registry that forgot commits within the clock-skew margin (a second) must not
    refuse it as possibly landed."""
    t = LogTable.create(sqlite_catalog, "db.first", 1, properties={KEEP_COMMIT_IDS: "2", MIN_RETENTION_MS: "0"})
    for i in range(8):  # each forgets the commit of a few milliseconds before
        assert t.append({0: rows(str(i))}).ranges == {0: (i, i + 1)}
    assert LogTable(sqlite_catalog, "db.first").append({0: rows("new")}).ranges == {0: (8, 9)}  # a fresh writer too


def test_i4_a_registry_written_by_an_older_icelog_never_refuses_a_fresh_commit_id(sqlite_catalog, monkeypatch):
    """Entries without a commit time (an older icelog's) landed before the first entry with
    one: dropping them must not mark every id made before that drop as possibly forgotten."""

    monkeypatch.setattr(registry, "COMMIT_IDS_MAX", 4)
    t = LogTable.create(sqlite_catalog, "db.upgraded", 1, properties={KEEP_COMMIT_IDS: "2"})
    for i in range(3):
        t.append({0: rows(f"old{i}")}, commit_id=f"old{i}")
    legacy = [entry[:3] for entry in all_commits(t.table())]  # as an older icelog wrote them
    sqlite_catalog.load_table(t.identifier).transaction().set_properties({COMMITS: json.dumps(legacy)}).commit_transaction()
    time.sleep(1.1)
    t.append({0: rows("after-upgrade")})
    time.sleep(1.1)  # past the clock-skew margin
    fresh = new_commit_id()  # made after every commit the registry will drop
    t.append({0: rows("busy")})  # drops the oldest legacy entry
    assert len(all_commits(t.table())) == 4
    assert t.append({0: rows("fresh")}, commit_id=fresh).ranges == {0: (5, 6)}  # its first send
    with pytest.raises(CommitIdForgotten):  # an id made before the dropped commits still is refused
        t.append({0: rows("old0")}, commit_id="0" * 12 + "7000" + "8" + "0" * 15)

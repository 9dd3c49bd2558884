"""The coordinator state's codec (``icelog.transactions`` on the journal): decode then encode
gives back the stored text byte for byte, for states the coordinator writes and for older or
richer ones it must carry through unchanged (4-element staged sends, optional keys present or
absent, keys it does not know)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from icelog.storage.producers.journal import PrepareCommit
from icelog.storage.producers.journal_state import JOURNAL, JournalState, Prepared
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.properties import TRANSACTIONS
from tests.support.transactions import two_tables
from tests.support.workers.transactions import registering


def round_trip(text: str) -> str:
    metadata = SimpleNamespace(properties={TRANSACTIONS: text}, current_snapshot_id=None, location="memory:")
    return JournalState.from_metadata(metadata).to_properties()[TRANSACTIONS]  # type: ignore[arg-type]


def encoded(state: dict) -> str:
    return json.dumps(state, sort_keys=True, separators=(",", ":"))


TXN = {"id": "t1", "state": "ONGOING", "started_ms": 5, "last_ms": 7, "partitions": {"db.a": [0, 2]}}
SENDS = {
    "db.a": [
        [0, None, "file:///w/a/data/staging/t1/0-0.parquet", 3, False],
        [2, 10, "file:///w/a/data/txn-t1/2.parquet", 4, True],
    ]
}
GROUP = {"group": "g", "offsets": [["db.src", 0, 5], ["db.src", 1, 9]]}
SAMPLES = {
    "empty": {},
    "initialised": {"app": {"producer_id": 7, "epoch": 0, "txn": None}},
    "with a timeout": {"app": {"producer_id": 7, "epoch": 3, "timeout_ms": 60000, "txn": None}},
    "ongoing": {"app": {"producer_id": 7, "epoch": 1, "txn": TXN}},
    "ongoing, nothing registered": {"app": {"producer_id": 7, "epoch": 1, "txn": {**TXN, "partitions": {}}}},
    "prepared, no offsets": {
        "app": {
            "producer_id": 7,
            "epoch": 1,
            "txn": {**TXN, "state": "PREPARE_COMMIT", "prepared": {"sends": SENDS, "offsets": None}},
        }
    },
    "prepared, group offsets": {
        "app": {
            "producer_id": 7,
            "epoch": 1,
            "txn": {**TXN, "state": "PREPARE_COMMIT", "prepared": {"sends": SENDS, "offsets": GROUP}},
        }
    },
    "prepared, offsets only": {
        "app": {
            "producer_id": 7,
            "epoch": 1,
            "txn": {**TXN, "state": "PREPARE_COMMIT", "prepared": {"sends": {}, "offsets": GROUP}},
        }
    },
    "prepared by an older version: 4-element sends": {
        "app": {
            "producer_id": 7,
            "epoch": 1,
            "txn": {
                **TXN,
                "state": "PREPARE_COMMIT",
                "prepared": {"sends": {"db.a": [[0, None, "file:///w/x.parquet", 3]]}, "offsets": None},
            },
        }
    },
    "ended": {
        "app": {
            "producer_id": 7,
            "epoch": 2,
            "txn": None,
            "last_committed": {"id": "t1", "partitions": {"db.a": [0]}},
            "last_aborted": {"id": "t0", "partitions": {}},
        }
    },
    "a rotated producer id at the epoch's bound": {
        "app": {"producer_id": 12, "epoch": 0, "txn": None},
        "old": {"producer_id": 3, "epoch": 2**31 - 2, "txn": None},
    },
    "keys it does not know, at every level": {
        "app": {
            "producer_id": 7,
            "epoch": 1,
            "future": [1, {"b": 2}],
            "txn": {
                **TXN,
                "state": "PREPARE_COMMIT",
                "note": "x",
                "prepared": {"sends": SENDS, "offsets": {**GROUP, "meta": 1}, "v": 2},
            },
            "last_committed": {"id": "t0", "partitions": {}, "at_ms": 4},
        }
    },
    "unicode and escapes": {'ordres-é"\\': {"producer_id": 1, "epoch": 0, "txn": None}},
}


@pytest.mark.parametrize("state", SAMPLES.values(), ids=SAMPLES.keys())
def test_journal_state_round_trips_byte_for_byte(state):
    assert round_trip(encoded(state)) == encoded(state)


def test_a_prepare_without_an_offsets_key_reads_as_no_offsets():
    """No version wrote one (since the coordinator's first commit, 9aae533, PREPARE_COMMIT writes
    ``offsets``: null or the group's): read as no offsets, it is written back with ``null``."""
    txn = {**TXN, "state": "PREPARE_COMMIT", "prepared": {"sends": SENDS}}
    state = JournalState.from_metadata(
        SimpleNamespace(
            properties={TRANSACTIONS: encoded({"app": {"producer_id": 7, "epoch": 1, "txn": txn}})},
            current_snapshot_id=None,
            location="memory:",
        )
    )  # type: ignore[arg-type]
    assert state.transactions["app"].txn.prepared.offsets is None
    assert '"prepared":{"offsets":null,"sends"' in state.to_properties()[TRANSACTIONS]


def test_journal_state_round_trips_what_the_coordinator_writes(sqlite_catalog):
    """Every state a run of transactions leaves (init with and without a timeout, begin, add
    partitions, group offsets, prepare, commit, abort, a timeout, a takeover) decodes and
    encodes to the stored text."""
    catalog = sqlite_catalog
    two_tables(catalog)
    seen: list[str] = []

    def stored() -> None:
        seen.append(catalog.load_table(JOURNAL).metadata.properties[TRANSACTIONS])

    clock = SimpleNamespace(ms=1_000_000_000)
    tick = lambda: clock.ms  # noqa: E731
    # Every partition registered in the journal before the commit, as pre-written sends do on SQL
    # (plain sends there register nothing): the states of every step are then stored.
    committer = registering(TransactionalProducer(catalog, "committer", timeout_ms=5_000, clock=tick))
    committer.init_transactions()
    stored()
    committer.begin_transaction()
    committer.send("db.a", 0, [{"key": "k", "value": "1"}])
    committer.send("db.b", 0, [{"key": "k", "value": "2"}])
    committer.send_offsets_to_transaction({("db.a", 0): 0}, "g")
    stored()
    committer.commit_transaction()
    stored()
    aborter = registering(TransactionalProducer(catalog, "aborter", clock=tick))
    aborter.init_transactions()
    aborter.begin_transaction()
    aborter.send("db.a", 0, [{"key": "k", "value": "3"}])
    aborter.abort_transaction()
    stored()
    preparer = registering(TransactionalProducer(catalog, "preparer", clock=tick))
    preparer.init_transactions()
    preparer.begin_transaction()
    preparer.send("db.b", 0, [{"key": "k", "value": "4"}])
    preparer._journal(PrepareCommit, prepared=Prepared(sends={t: tuple(staged) for t, staged in preparer._sends.items()}))
    stored()
    committer.begin_transaction()
    committer.send("db.a", 0, [{"key": "k", "value": "5"}])
    clock.ms += 60_000  # past the committer's timeout: the next step aborts its transaction
    TransactionalProducer(catalog, "aborter", clock=tick).init_transactions()  # a takeover too
    stored()
    assert '"PREPARE_COMMIT"' in seen[-2] and '"timeout_ms":5000' in seen[0] and '"last_aborted"' in seen[-1]
    for text in seen:
        assert round_trip(text) == text

"""The state every commit rewrites (watermarks, producers): exact, lazily decoded, format 1 still read."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit
from icelog.storage.errors import UnsupportedFormat
from icelog.storage.log.producer_state import PartitionSequences, ProducerEntry, Producers, WrittenBatch
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.state import LogState, Watermark, Watermarks
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from icelog.storage.properties import FORMAT, PARTITIONS, PRODUCERS, WATERMARKS
from icelog.validations.contiguity import check_contiguity
from icelog.validations.producers import check_producers

# --- codecs, property-based ----------------------------------------------------------------------

pids = st.integers(0, 10**12).map(str)
longs = st.integers(-(2**63), 2**63 - 1)
batches = st.builds(WrittenBatch, longs, longs, longs, longs)
partition_entries = st.builds(PartitionSequences, st.integers(-1, 2**31 - 1), st.lists(batches, max_size=3).map(tuple))
entries = st.builds(
    ProducerEntry,
    client=st.none() | st.text(min_size=1, max_size=12),
    epoch=st.integers(0, 2**31 - 1),
    last_ms=st.integers(0, 40),  # few values: ties and out-of-order clocks are common
    partitions=st.dictionaries(st.integers(0, 10**5), partition_entries, max_size=2),
)
producer_maps = st.dictionaries(pids, entries, max_size=12)
# A shared 2-core machine: generation is slow at times, and that is no failure.
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
marks = st.builds(Watermark, st.integers(0, 2**62), st.integers(0, 2**62))


@relaxed
@given(producer_maps)
def test_producers_round_trip_exactly(producers):
    text = Producers.of(producers).encode()
    assert '"' not in text and "\\" not in text  # nothing to escape inside the metadata JSON
    decoded = Producers.decode(text)
    assert dict(decoded) == producers and len(decoded) == len(producers)
    assert Producers.decode(json.dumps({pid: e.to_dict() for pid, e in producers.items()})) == producers  # format 1


@relaxed
@given(producer_maps, st.data())
def test_lazily_changed_producers_encode_as_the_eager_encoding(producers, data):
    """Changes and expiry applied to the lazy value equal the same applied to a plain dict."""
    lazy = Producers.decode(Producers.of(producers).encode())
    model, cutoff = dict(producers), None
    for _ in range(data.draw(st.integers(0, 6))):
        if data.draw(st.booleans()):
            pid = data.draw(st.sampled_from(sorted(model)) | pids if model else pids)
            entry = data.draw(entries)
            lazy, model[pid] = lazy.with_entry(pid, entry), entry
        else:
            now, expiry = data.draw(st.integers(0, 50)), data.draw(st.integers(0, 30))
            lazy = lazy.live(now, expiry)
            cutoff = now - expiry if cutoff is None else max(cutoff, now - expiry)
    live = {pid: e for pid, e in model.items() if cutoff is None or e.last_ms >= cutoff}
    assert lazy.encode() == Producers.of(live).encode()
    assert dict(lazy) == live
    for pid in {*producers, *model, "0", "404"}:
        assert (pid in lazy) == (pid in live)
        assert lazy.get(pid) == live.get(pid)
    for client in {e.client for e in model.values() if e.client is not None}:
        found = lazy.find_client(client)
        owners = {pid for pid, e in live.items() if e.client == client}
        assert found in owners if owners else found is None


@relaxed
@given(st.lists(marks, min_size=1, max_size=40), st.data())
def test_watermarks_round_trip_and_updates_equal_a_model(initial, data):
    model = dict(enumerate(initial))
    lazy = Watermarks.decode(Watermarks.of(model).encode(), len(model))
    assert dict(lazy) == model
    legacy = json.dumps({str(p): [w.start, w.end] for p, w in model.items()})
    assert dict(Watermarks.decode(legacy, len(model))) == model  # format 1
    assert Watermarks.decode(Watermarks.of(model).encode(), len(model) + 1)[len(model)] == Watermark(
        0, 0
    )  # as format 1: absent is empty
    for _ in range(data.draw(st.integers(0, 5))):
        changes = data.draw(st.dictionaries(st.integers(0, len(model) - 1), marks, max_size=4))
        lazy, model = lazy.updated(changes), {**model, **changes}
    grow = data.draw(st.integers(0, 3))
    lazy, model = lazy.grown(len(model) + grow), {**model, **{p: Watermark(0, 0) for p in range(len(model), len(model) + grow)}}
    assert Watermarks.decode(lazy.encode(), len(model)) == model
    assert lazy.encode() == Watermarks.of(model).encode()
    for key in (-1, len(model), "0", None):
        assert key not in lazy


def test_the_encodings_are_byte_for_byte_those_of_older_versions():
    """Format 2 as written since it exists, and format 1 as an earlier icelog wrote it (tables on disk hold both)."""
    line = "7;1700000000000;3;orders%20writer;0:41:30,35,100,106/36,41,106,112|12:0:0,0,7,8"
    legacy = (
        '{"7":{"client":"orders writer","epoch":3,"last_ms":1700000000000,"partitions":'
        '{"0":{"batches":[[30,35,100,106],[36,41,106,112]],"last_seq":41},"12":{"batches":[[0,0,7,8]],"last_seq":0}}}}'
    )
    entry = ProducerEntry(
        client="orders writer",
        epoch=3,
        last_ms=1_700_000_000_000,
        partitions={
            0: PartitionSequences(41, (WrittenBatch(30, 35, 100, 106), WrittenBatch(36, 41, 106, 112))),
            12: PartitionSequences(0, (WrittenBatch(first_seq=0, last_seq=0, base_offset=7, next_offset=8),)),
        },
    )
    assert Producers.of({"7": entry}).encode() == line
    assert Producers.decode(line)["7"] == entry == Producers.decode(legacy)["7"]
    assert Producers.decode(legacy).encode() == line
    assert json.dumps({"7": entry.to_dict()}, sort_keys=True, separators=(",", ":")) == legacy
    assert Producers.of({"8": ProducerEntry(client=None, epoch=0, last_ms=5)}).encode() == "8;5;0;*;"


def test_lines_of_untouched_producers_are_written_back_verbatim():
    producers = {str(i): ProducerEntry(client=f"c {i}", epoch=0, last_ms=1000 + i) for i in range(100)}
    text = Producers.of(producers).encode()
    changed = Producers.decode(text).live(1050, 0).with_entry("7", ProducerEntry(client="c 7", epoch=1, last_ms=2000))
    lines = changed.encode().split(" ")
    assert lines[:-1] == text.split(" ")[50:]  # expired prefix cut, the rest as it was
    assert lines[-1].startswith("7;2000;1;c%207;")


# --- tables -----------------------------------------------------------------------------------------


def rows(n: int, tag: str = "r") -> list[dict]:
    return [{"key": tag, "value": str(i)} for i in range(n)]


def test_i1_watermarks_stay_exact_at_thousands_of_partitions(sqlite_catalog):
    """Appends to random partitions of a 3,000-partition table, checked against a model after each."""
    partitions = 3_000
    t = LogTable.create(sqlite_catalog, "db.wide", partitions=partitions)
    pick = random.Random(1)
    model = dict.fromkeys(range(partitions), 0)
    for _ in range(12):
        chosen = pick.sample(range(partitions), pick.randint(1, 3))
        sizes = {p: pick.randint(1, 4) for p in chosen}
        expected = {p: model[p] for p in chosen[:1]}
        result = t.append({p: rows(n) for p, n in sizes.items()}, expected)
        assert result.ranges == {p: (model[p], model[p] + n) for p, n in sizes.items()}
        model.update({p: model[p] + n for p, n in sizes.items()})
        assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {p: (0, e) for p, e in model.items()}
    t.add_partitions(partitions + 5)
    assert t.watermarks()[partitions + 4] == Watermark(0, 0) and len(t.watermarks()) == partitions + 5
    assert check_contiguity(t.table(), deep=True).ok


@dataclass
class SeedProducers(Request):
    """Register producers with given entries in one commit (through the commit core)."""

    state_type = LogState

    entries: dict[str, ProducerEntry]
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        producers = Producers.of({**dict(state.producers), **self.entries})
        return Decision(state=replace(state, producers=producers), result=None)


def test_i4_producer_state_stays_exact_beside_thousands_of_producers(sqlite_catalog):
    """Real producers send among 2,000 seeded ones, some of them expired: every entry is as the model says."""
    t = LogTable.create(sqlite_catalog, "db.busy", partitions=4, properties={"icelog.producer.expiry-ms": "3600000"})
    now = int(time.time() * 1000)
    seeded = {
        str(10**9 + i): ProducerEntry(
            client=f"seed {i}",
            epoch=i % 3,
            last_ms=now - (4_000_000 if i % 10 == 0 else i),
            partitions={1: PartitionSequences(4, (WrittenBatch(0, 4, i, i + 5),))},
        )
        for i in range(2_000)
    }
    commit(sqlite_catalog, t.identifier, SeedProducers(seeded))
    stored = t.state().producers
    assert dict(stored) == seeded  # expired ones stay until a producer commit drops them
    mine = [init_producer(sqlite_catalog, t.identifier, f"app-{i}") for i in range(3)]
    assert t.state().producers.get(str(10**9)) is None  # the init dropped the expired ones
    live = {pid: e for pid, e in seeded.items() if e.last_ms >= now - 3_600_000}
    sequences: dict[tuple[int, int], int] = {}
    pick = random.Random(4)
    for _ in range(8):
        me, p, n = pick.choice(mine), pick.randrange(4), pick.randint(1, 3)
        seq = sequences.get((me.producer_id, p), 0)
        t.append({p: rows(n)}, producer=ProducerBatch(me.producer_id, me.epoch, {p: seq}))
        sequences[(me.producer_id, p)] = seq + n
        state = t.state().producers
        assert {pid: state[pid] for pid in live} == live
        for other in mine:
            assert state[str(other.producer_id)].client == other.client_id
            for (pid, q), nxt in sequences.items():
                if pid == other.producer_id:
                    assert state[str(pid)].partitions[q].last_seq == nxt - 1
    assert len(t.state().producers) == len(live) + len(mine)
    assert init_producer(sqlite_catalog, t.identifier, "seed 7").producer_id == 10**9 + 7  # found by client id: epoch bumped
    assert t.state().producers[str(10**9 + 7)].epoch == seeded[str(10**9 + 7)].epoch + 1
    assert check_producers(t.table()).ok  # the real producers' state is what their rows say


def test_format_1_tables_are_read_and_rewritten_as_format_2(catalog):
    t = LogTable.create(catalog, "db.old", partitions=3)
    me = init_producer(catalog, "db.old", "app")
    t.append({0: rows(2), 2: rows(1)}, producer=ProducerBatch(me.producer_id, 0, {0: 0, 2: 0}))
    before = t.state()
    legacy = {
        FORMAT: "1",
        WATERMARKS: json.dumps({str(p): [w.start, w.end] for p, w in before.watermarks.items()}),
        PRODUCERS: json.dumps({pid: e.to_dict() for pid, e in before.producers.items()}, sort_keys=True, separators=(",", ":")),
    }
    with t.table().transaction() as txn:  # as an earlier icelog left it
        txn.set_properties(legacy)
    assert t.state().watermarks == before.watermarks and t.state().producers == before.producers
    assert t.append({2: rows(1)}, producer=ProducerBatch(me.producer_id, 0, {2: 0})).duplicate  # still remembered
    t.append({2: rows(3)}, {2: 1}, producer=ProducerBatch(me.producer_id, 0, {2: 1}))
    props = t.table().metadata.properties
    assert props[FORMAT] == "2" and not props[WATERMARKS].startswith("{") and not props[PRODUCERS].startswith("{")
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (0, 2), 1: (0, 0), 2: (0, 4)}
    assert check_contiguity(t.table(), deep=True).ok and check_producers(t.table()).ok


def test_i8_state_of_a_newer_format_is_refused_and_left_alone(catalog, unchanged):
    t = LogTable.create(catalog, "db.new", partitions=1)
    with t.table().transaction() as txn:
        txn.set_properties({FORMAT: "3"})
    with unchanged(t):
        with pytest.raises(UnsupportedFormat, match="format 3"):
            t.append({0: rows(1)})
    assert t.table().metadata.properties[PARTITIONS] == "1"

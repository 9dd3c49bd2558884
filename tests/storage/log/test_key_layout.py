"""The key-hash layout: every writer fills ``log_key_hash``; large files are clustered by it so a
key-range read skips row groups, while I1 stays provable (manifests and the deep check)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icelog.storage.admin.maintenance import maintain
from icelog.storage.groups.consumer import Consumer
from icelog.storage.log import schema as cols
from icelog.storage.log.files import GROUPS, MIN_GROUP_ROWS, local_path, write_log_files
from icelog.storage.log.keys import HASH_SPACE, key_hash
from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.properties import KEY_COLUMN
from icelog.validations.contiguity import check_contiguity, offset_runs

QUARTER = (0, 16383)


def rows(n: int, keys: int = 5000, start: int = 0) -> pa.Table:
    i = np.arange(start, start + n)
    return pa.table({"key": np.char.add("k", (i % keys).astype(str)), "value": np.char.add("v", i.astype(str))})


def footers(t: LogTable) -> list[pq.FileMetaData]:
    return [pq.ParquetFile(local_path(task.file.file_path)).metadata for task in t.table().scan().plan_files()]


def hash_index(t: LogTable) -> int:
    return t.table().schema().as_arrow().names.index(cols.KEY_HASH)


def assert_hashes_match_keys(t: LogTable) -> None:
    data = t.table().scan().to_arrow()
    assert data.column(cols.KEY_HASH).null_count == 0
    assert data.column(cols.KEY_HASH).to_pylist() == [key_hash(k) for k in data.column("key").to_pylist()]


def test_only_tables_with_a_hashable_key_column_get_the_hash_column(sqlite_catalog):
    assert cols.KEY_HASH in LogTable.create(sqlite_catalog, "db.keyed", 1).table().schema().column_names
    unkeyed = LogTable.create(sqlite_catalog, "db.unkeyed", 1, payload=[{"name": "amount", "type": "double"}])
    assert cols.KEY_HASH not in unkeyed.table().schema().column_names
    unkeyed.append({0: [{"amount": 1.0}] * 3})
    assert unkeyed.read(0, key_ranges=[QUARTER]).num_rows == 3  # nothing to prune by: every row
    by_user = LogTable.create(
        sqlite_catalog, "db.by_user", 1, payload=[{"name": "user", "type": "long"}], properties={KEY_COLUMN: "user"}
    )
    by_user.append({0: [{"user": 42}]})
    assert by_user.read(0).column(cols.KEY_HASH).to_pylist() == [key_hash("42")]


def test_every_writer_fills_the_hash_append_transaction_compaction(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.events", 2)
    t.append({0: rows(50), 1: [{"key": None, "value": "null key"}]})
    producer = TransactionalProducer(sqlite_catalog, "txn-1")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("db.events", 0, rows(30, start=50))
    producer.commit_transaction()
    assert_hashes_match_keys(t)
    assert t.read(1).column(cols.KEY_HASH).to_pylist() == [key_hash("")]
    for i in range(7):
        t.append({0: rows(10, start=80 + 10 * i)})
    assert maintain(sqlite_catalog, "db.events", orphan_age_s=0)["compaction"]["rewritten_files"] == 9
    assert_hashes_match_keys(t)
    assert check_contiguity(t.table(), deep=True).ok


def test_i1_large_files_are_clustered_by_hash_and_still_proven_contiguous(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.events", 1)
    t.append({0: rows(MIN_GROUP_ROWS - 1)})  # small: one row group, offset order
    t.append({0: rows(GROUPS * MIN_GROUP_ROWS * 2, start=MIN_GROUP_ROWS - 1)})
    small, large = sorted(footers(t), key=lambda m: m.num_rows)
    assert small.num_row_groups == 1
    assert large.num_row_groups == GROUPS
    h = hash_index(t)
    bounds = [(large.row_group(g).column(h).statistics.min, large.row_group(g).column(h).statistics.max) for g in range(GROUPS)]
    assert all(a[1] <= b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # row groups slice the hash space in order
    assert all(hi - lo < 65536 // GROUPS * 2 for lo, hi in bounds)
    for deep in (False, True):
        report = check_contiguity(t.table(), deep=deep)
        assert report.ok, report.violations
    read = t.read(0)
    assert read.column(cols.OFFSET).to_pylist() == list(range(read.num_rows))  # reads come back in offset order
    assert_hashes_match_keys(t)


def test_i1_gap_plus_duplicate_inside_a_clustered_file_is_caught_by_the_deep_check(sqlite_catalog):
    """count == max - min + 1 cannot tell; the deep check counts every offset of the file."""
    t = LogTable.create(sqlite_catalog, "db.events", 1)
    n = GROUPS * MIN_GROUP_ROWS
    offsets = np.arange(n)
    offsets[7] = 8  # 7 missing, 8 twice
    planted = rows(n).add_column(0, cols.PARTITION, pa.array(np.zeros(n, np.int32)))
    planted = planted.add_column(1, cols.OFFSET, pa.array(offsets))
    planted = planted.add_column(2, cols.TIMESTAMP, pa.array(np.zeros(n, np.int64)).cast(pa.timestamp("us", tz="UTC")))
    for name, kind in ((cols.PRODUCER_ID, pa.int64()), (cols.PRODUCER_EPOCH, pa.int32()), (cols.PRODUCER_SEQ, pa.int32())):
        planted = planted.append_column(name, pa.nulls(n, kind))
    table = t.table()
    files = write_log_files(table, {0: planted})
    assert pq.ParquetFile(local_path(files[0].file_path)).metadata.num_row_groups == GROUPS  # clustered
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:  # around icelog, as a foreign engine
        append.append_data_file(files[0])
    found = {(v.kind, v.first, v.last) for v in check_contiguity(t.table(), deep=True).violations if v.check == "contiguity"}
    assert found == {("duplicate", 8, 8), ("gap", 7, 7)}


def test_key_range_read_prunes_row_groups_and_returns_every_matching_record(sqlite_catalog):
    t = LogTable.create(sqlite_catalog, "db.events", 1)
    t.append({0: rows(GROUPS * MIN_GROUP_ROWS * 4)})
    meta = footers(t)[0]
    h = hash_index(t)
    opened = [g for g in range(meta.num_row_groups) if meta.row_group(g).column(h).statistics.min <= QUARTER[1]]
    assert len(opened) <= GROUPS // 4 + 1
    whole, part = t.read(0), t.read(0, key_ranges=[QUARTER])
    assert part.num_rows <= sum(meta.row_group(g).num_rows for g in opened) < whole.num_rows / 2

    def inside(table):
        return [
            (o, k)
            for o, k, hv in zip(*(table.column(c).to_pylist() for c in (cols.OFFSET, "key", cols.KEY_HASH)), strict=False)
            if hv <= QUARTER[1]
        ]  # noqa: E731

    assert inside(part) == inside(whole)  # nothing of the range is missed, in offset order
    consumer = Consumer(sqlite_catalog, "g")
    consumer.assign("db.events", [0], key_range=QUARTER)
    got = [o for b in consumer.poll(10**6) for o in b.column(cols.OFFSET).to_pylist()]
    assert got == [o for o, _ in inside(whole)]


def test_rows_without_a_hash_are_never_pruned(sqlite_catalog):
    """A foreign engine's rows (log_key_hash null) still reach the key range their key falls in."""
    t = LogTable.create(sqlite_catalog, "db.events", 1)
    table = t.table()
    schema = table.schema().as_arrow()
    keys = [f"k{i}" for i in range(40)]
    foreign = pa.Table.from_pylist(
        [
            {**{f.name: None for f in schema}, "log_partition": 0, "log_offset": i, "log_timestamp": 0, "key": k}
            for i, k in enumerate(keys)
        ]
    ).cast(schema)
    table.append(foreign)
    part = t.read(0, key_ranges=[QUARTER])
    assert part.num_rows == 40  # read, then filtered by the caller (the consumer computes the hash)
    from icelog.storage.groups.consumer import key_hashes

    assert sorted(np.flatnonzero(key_hashes(part.column("key")) <= QUARTER[1])) == [
        i for i, k in enumerate(keys) if key_hash(k) <= QUARTER[1]
    ]


@settings(max_examples=200, deadline=None)
@given(
    counts=st.dictionaries(st.integers(0, 10**9), st.integers(1, 3), min_size=1, max_size=40),
    dense=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_offset_runs_equal_a_counter_in_any_row_order(counts, dense, seed):
    if dense:  # compact offsets (the bincount path); else far apart (the sorting path)
        counts = dict(enumerate(counts.values()))
    offsets = [o for o, c in counts.items() for _ in range(c)]
    random.Random(seed).shuffle(offsets)
    runs = offset_runs(np.array(offsets, dtype=np.int64))
    assert Counter({o: c for first, last, c in runs for o in range(first, last + 1)}) == Counter(offsets)
    assert all(a[1] + 1 < b[0] or a[2] != b[2] for a, b in zip(runs, runs[1:], strict=False))  # maximal runs


def test_repair_never_adopts_foreign_rows_with_a_wrong_key_hash(sqlite_catalog):
    """A wrong log_key_hash would hide rows from key-range reads: such files are rolled back."""
    from icelog.storage.errors import TerminalError
    from icelog.storage.log.repair import repair

    t = LogTable.create(sqlite_catalog, "db.events", 1)
    mine = t.append({0: rows(3)})
    table = t.table()
    schema = table.schema().as_arrow()

    def foreign(offset: int, hash_value: int | None) -> pa.Table:
        row = {
            **{f.name: None for f in schema},
            "log_partition": 0,
            "log_offset": offset,
            "log_timestamp": 0,
            "key": "k9",
            cols.KEY_HASH: hash_value,
        }
        return pa.Table.from_pylist([row]).cast(schema)

    table.append(foreign(3, key_hash("k9")))  # right hash, and a missing one: adoptable
    sqlite_catalog.load_table(t.identifier).append(foreign(4, None))
    assert repair(sqlite_catalog, t.identifier)["action"] == "adopted"
    sqlite_catalog.load_table(t.identifier).append(foreign(5, (key_hash("k9") + 1) % 65536))
    with pytest.raises(TerminalError, match="log_key_hash does not match"):
        repair(sqlite_catalog, t.identifier, mode="adopt")
    assert repair(sqlite_catalog, t.identifier)["action"] == "rolled_back"
    assert t.watermarks()[0].end == 5 and mine.ranges == {0: (0, 3)}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.integers(0, 3) | st.sampled_from([0, HASH_SPACE - 1]) | st.integers(0, HASH_SPACE - 1), min_size=1, max_size=3000
    ),
    st.sampled_from(["offset order", "reversed", "a null hash"]),
    st.integers(0, 10**12),
)
def test_hash_order_is_the_sort_by_hash_then_offset(hashes, case, start):
    """The radix fast path and its fallbacks (a null hash, offsets out of order) all give (hash, offset) order."""
    import pyarrow.compute as pc

    from icelog.storage.log.files import _hash_order

    offsets = list(range(start, start + len(hashes)))
    if case == "reversed":
        offsets.reverse()
    if case == "a null hash":
        hashes = [None, *hashes[1:]]
    table = pa.table({cols.OFFSET: pa.array(offsets, pa.int64()), cols.KEY_HASH: pa.array(hashes, pa.int32())})
    expected = pc.sort_indices(table, sort_keys=[(cols.KEY_HASH, "ascending"), (cols.OFFSET, "ascending")]).to_pylist()
    assert np.asarray(_hash_order(table)).tolist() == expected

"""I3: every commit is decided on the exact base it replaces; conflicts re-decide, never replay."""

from __future__ import annotations

import threading
from typing import Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import SetPropertiesUpdate

from icelog.storage.core.catalog import LogSqlCatalog
from icelog.storage.core.commit import commit
from icelog.storage.errors import CommitConflict, ConflictError, OffsetMismatch, TransientError
from icelog.storage.log.maintenance import PartitionGrowth
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.interleave import Interleaved


def payload(*keys: str) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.large_string()), "value": pa.array(keys, pa.large_string())})


def test_i3_decision_held_back_while_others_commit_is_decided_again(catalog):
    t = LogTable.create(catalog, "db.t", partitions=1)
    request = Interleaved(
        AppendRequest(t.identifier, {0: payload("mine")}, {}, "c1"), lambda: t.append({0: [{"key": "other"}] * 2})
    )
    outcome = commit(catalog, t.identifier, request, commit_id="c1")
    assert request.decisions == [{0: (0, 1)}, {0: (2, 3)}]
    assert outcome.result.ranges == {0: (2, 3)} and outcome.attempts == 2
    assert t.read(0).column("key").to_pylist() == ["other", "other", "mine"]
    assert check_contiguity(t.table(), deep=True).ok


def test_i3_a_base_the_caller_loaded_that_moved_on_only_loses_the_swap(catalog):
    """``commit(loaded=)`` spares a metadata read; a stale one is decided on, loses, and is decided again."""
    t = LogTable.create(catalog, "db.t", partitions=1)
    stale = t.table()
    t.append({0: [{"key": "other"}] * 2})
    outcome = commit(
        catalog, t.identifier, AppendRequest(t.identifier, {0: payload("mine")}, {}, "c1"), commit_id="c1", loaded=stale
    )
    assert outcome.result.ranges == {0: (2, 3)} and outcome.attempts == 2
    with pytest.raises(OffsetMismatch):  # the stale base said 0, the table says 3: never replayed
        commit(
            catalog, t.identifier, AppendRequest(t.identifier, {0: payload("late")}, {0: 0}, "c2"), commit_id="c2", loaded=stale
        )
    assert t.read(0).column("key").to_pylist() == ["other", "other", "mine"]
    assert check_contiguity(t.table(), deep=True).ok


def test_i3_held_back_conditional_append_fails_instead_of_replaying(catalog):
    t = LogTable.create(catalog, "db.t", partitions=1)
    request = Interleaved(
        AppendRequest(t.identifier, {0: payload("mine")}, {0: 0}, "c1"), lambda: t.append({0: [{"key": "other"}]})
    )
    with pytest.raises(OffsetMismatch) as e:
        commit(catalog, t.identifier, request, commit_id="c1")
    assert e.value.actual == 1
    assert t.read(0).column("key").to_pylist() == ["other"]


def test_i3_lost_race_with_no_attempts_left_raises_conflict_and_writes_nothing(catalog):
    t = LogTable.create(catalog, "db.t", partitions=1)
    request = Interleaved(AppendRequest(t.identifier, {0: payload("mine")}, {}, "c1"), lambda: t.append({0: [{"key": "other"}]}))
    with pytest.raises(CommitConflict) as e:
        commit(catalog, t.identifier, request, commit_id="c1", max_attempts=1)
    assert (e.value.table, e.value.attempts) == (t.identifier, 1)
    assert isinstance(e.value, ConflictError) and isinstance(e.value, TransientError)
    assert request.decisions == [{0: (0, 1)}]  # decided once, never replayed onto the new base
    assert t.read(0).column("key").to_pylist() == ["other"]


def test_i3_property_only_changes_are_compare_and_swap(catalog):
    t = LogTable.create(catalog, "db.t", partitions=1)
    request = Interleaved(PartitionGrowth(t.identifier, 3), lambda: t.add_partitions(2))
    commit(catalog, t.identifier, request)
    assert len(request.decisions) == 2  # the stale decision (from 1 partition) was refused
    assert len(t.watermarks()) == 3


class RacingCatalog(LogSqlCatalog):
    """Between writing new metadata and the pointer swap, let another writer commit once."""

    competitor: Callable[[], None] | None = None

    def _write_metadata(self, *args, **kwargs):
        super()._write_metadata(*args, **kwargs)
        competitor, RacingCatalog.competitor = RacingCatalog.competitor, None
        if competitor:
            competitor()


def test_i3_compare_and_swap_that_updates_no_row_is_a_failure(catalog_spec):
    racing = RacingCatalog(catalog_spec.name, uri=catalog_spec.uri, warehouse=catalog_spec.warehouse)
    other = LogTable(catalog_spec.open(), "db.t")
    t = LogTable.create(racing, "db.t", partitions=1)
    # Directly at the catalog: the swap finds the pointer moved, so it must raise.
    table = t.table()
    RacingCatalog.competitor = lambda: other.append({0: [{"key": "other"}]})
    with pytest.raises(CommitFailedException):
        racing.commit_table(table, (), (SetPropertiesUpdate(updates={"x": "1"}),))
    assert t.read(0).column("key").to_pylist() == ["other"]
    assert "x" not in t.table().metadata.properties
    # Through the commit core: the lost swap is re-decided on the new base.
    RacingCatalog.competitor = lambda: other.append({0: [{"key": "other2"}]})
    result = t.append({0: [{"key": "mine"}]})
    assert result.ranges == {0: (2, 3)}
    assert t.read(0).column("key").to_pylist() == ["other", "other2", "mine"]


def test_i3_pyiceberg_own_append_on_a_log_table_cannot_rebase(catalog):
    """Other writers of an icelog table get pyiceberg's retry disabled by table property."""
    t = LogTable.create(catalog, "db.t", partitions=1)
    stale = catalog.load_table(t.identifier)
    t.append({0: [{"key": "a"}]})
    with pytest.raises(CommitFailedException):
        stale.append(_one_row(stale))
    assert t.read(0).num_rows == 1


def _one_row(table) -> pa.Table:
    schema = table.schema().as_arrow()
    values = {
        "log_partition": [0],
        "log_offset": [0],
        "log_timestamp": [0],
        "producer_id": [None],
        "producer_epoch": [None],
        "producer_seq": [None],
        "log_key_hash": [None],
        "key": ["dup"],
        "value": ["dup"],
    }
    return pa.table({f.name: pa.array(values[f.name]).cast(f.type) for f in schema}, schema=schema)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(1, 3)), min_size=4, max_size=12))
def test_i1_i2_randomized_threads_keep_every_partition_contiguous(sqlite_spec, plan):
    """Threads (each with its own catalog connection) race conditional and plain appends.

    Every thread reads the log end, then all append at once (a barrier), so the first round
    always races; two conditional appends on partition 0 both expecting its end are always
    among them. A conditional append that is acknowledged landed at the offset it expected.
    """
    import uuid

    plan = [(0, True, 1), (0, True, 2), *plan]
    name = f"db.t{uuid.uuid4().hex[:8]}"
    t = LogTable.create(sqlite_spec.open(), name, partitions=3)
    acked: list[tuple[int, tuple[int, int], str, int | None]] = []
    refused: list[tuple[int, int, int]] = []  # (partition, expected, actual)
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(len(plan), timeout=300)

    def worker(step: tuple[int, bool, int], tag: str) -> None:
        partition, conditional, n = step
        mine = LogTable(sqlite_spec.open(), name)
        first = True
        try:
            while True:
                expected = mine.watermarks()[partition].end if conditional else None
                if first:
                    start.wait()
                    first = False
                try:
                    result = mine.append(
                        {partition: [{"key": tag, "value": str(i)} for i in range(n)]},
                        {partition: expected} if conditional else None,
                    )
                    break
                except OffsetMismatch as e:
                    with lock:
                        refused.append((partition, expected, e.actual))
            with lock:
                acked.append((partition, result.ranges[partition], tag, expected))
        except BaseException as e:  # reported by the test thread, not lost in this one
            with lock:
                errors.append(e)
            start.abort()

    threads = [threading.Thread(target=worker, args=(step, f"s{i}")) for i, step in enumerate(plan)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    # I2: each acknowledged conditional append landed exactly at its expected offset ...
    assert [(lo, hi) for _, (lo, hi), _, expected in acked if expected is not None] == [
        (expected, expected + hi - lo) for _, (lo, hi), _, expected in acked if expected is not None
    ]
    # ... and each refusal named a log end beyond the one it expected.
    assert all(actual > expected for _, expected, actual in refused)
    # Two appends expected partition 0's first offset: at most one won (a plain append may
    # have beaten both), so at least one was refused.
    assert sum(1 for p, _, _, expected in acked if p == 0 and expected == 0) <= 1
    assert any(p == 0 and expected == 0 for p, expected, _ in refused)
    assert check_contiguity(t.table(), deep=True).ok
    for p in range(3):
        data = t.read(p)
        keys = data.column("key").to_pylist()
        expected_rows = sum(n for q, _, n in plan if q == p)
        assert len(keys) == expected_rows
        for partition, (lo, hi), tag, _ in acked:
            if partition == p:
                assert keys[lo:hi] == [tag] * (hi - lo)


def test_files_of_a_superseded_decision_are_deleted(catalog):
    import os

    t = LogTable.create(catalog, "db.t", partitions=1)
    request = Interleaved(AppendRequest(t.identifier, {0: payload("mine")}, {}, "c1"), lambda: t.append({0: [{"key": "other"}]}))
    commit(catalog, t.identifier, request, commit_id="c1")
    table = t.table()
    live = {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}
    data_dir = table.metadata.location.removeprefix("file://") + "/data"
    on_disk = {os.path.join(d, f) for d, _, names in os.walk(data_dir) for f in names if f.endswith(".parquet")}
    assert on_disk == live  # the first attempt's file (offset 0) was removed, not left behind


class FlakyCatalog(LogSqlCatalog):
    """load_table fails (as a busy database would) the first ``failures`` times."""

    failures = 0

    def load_table(self, identifier):
        from sqlalchemy.exc import OperationalError

        if FlakyCatalog.failures > 0:
            FlakyCatalog.failures -= 1
            raise OperationalError("SELECT", {}, Exception("database is locked"))
        return super().load_table(identifier)


def test_catalog_read_failures_are_retried_then_typed(sqlite_spec):
    from icelog.storage.errors import CatalogUnavailable, TransientError

    flaky = FlakyCatalog(sqlite_spec.name, uri=sqlite_spec.uri, warehouse=sqlite_spec.warehouse)
    t = LogTable.create(flaky, "db.t", partitions=1)
    request = AppendRequest(t.identifier, {0: payload("a")}, {}, "c1")
    FlakyCatalog.failures = 3
    assert commit(flaky, t.identifier, request, commit_id="c1").result.ranges == {0: (0, 1)}
    FlakyCatalog.failures = 10**6
    with pytest.raises(CatalogUnavailable) as e:
        commit(flaky, t.identifier, AppendRequest(t.identifier, {0: payload("b")}, {}, "c2"), commit_id="c2", max_attempts=4)
    assert isinstance(e.value, TransientError)
    FlakyCatalog.failures = 0
    assert t.read(0).column("key").to_pylist() == ["a"]

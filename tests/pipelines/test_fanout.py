"""The transactional fan-out job (I5, I9): one source to several tables, exactly once per record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import asdict

import pytest

from icelog.pipelines.fanout import fanout
from icelog.storage.core import faults
from icelog.storage.core.swap import is_atomic
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers.journal import transactional_ids
from icelog.validations.checks import run_checks
from icelog.validations.transactions import check_transactions
from tests.support.faults import kill_at

PAYLOAD = [{"name": "key", "type": "string"}, {"name": "route", "type": "string"}, {"name": "id", "type": "long"}]
ROUTES = {"a": "db.out_a", "b": "db.out_b"}


def make_tables(catalog) -> LogTable:
    source = LogTable.create(catalog, "db.src", 2, payload=PAYLOAD)
    for table in ROUTES.values():
        LogTable.create(catalog, table, 3, payload=PAYLOAD)
    return source


def add_source(source: LogTable, first_id: int, n: int) -> None:
    routes = "abx"  # x goes nowhere
    for p in (0, 1):
        source.append({p: [{"key": f"k{i % 7}", "route": routes[i % 3], "id": i} for i in range(first_id + p, first_id + n, 2)]})


def output_ids(catalog) -> Counter:
    ids: Counter = Counter()
    for route, table in ROUTES.items():
        t = LogTable.open(catalog, table)
        for p in range(3):
            rows = t.read(p).to_pylist()
            assert all(r["route"] == route for r in rows)
            ids.update(r["id"] for r in rows)
    return ids


def expected_ids(first: int, last: int) -> Counter:
    return Counter(i for i in range(first, last) if i % 3 != 2)


def test_i5_fanout_copies_each_record_once_and_moves_the_group_in_the_same_commit(spark, env_catalog):
    catalog = env_catalog.open()
    source = make_tables(catalog)
    add_source(source, 0, 60)
    result = fanout(spark, "db.src", "copier", ROUTES, route_column="route", catalog_name=env_catalog.name)
    assert result.rows == 40 and result.read == {0: (0, 30), 1: (0, 30)}
    assert output_ids(catalog) == expected_ids(0, 60)
    assert committed_offsets(catalog, "copier", "db.src") == {0: 30, 1: 30}
    # Per key, the output keeps the source order (ids rise within a source partition's keys).
    for table in ROUTES.values():
        for p in range(3):
            rows = LogTable.open(catalog, table).read(p).to_pylist()
            by_key: dict = {}
            for r in rows:
                by_key.setdefault((r["key"], r["id"] % 2), []).append(r["id"])
            assert all(ids == sorted(ids) for ids in by_key.values())
    # Nothing new: nothing written. New records: only they are copied.
    assert fanout(spark, "db.src", "copier", ROUTES, route_column="route", catalog_name=env_catalog.name).rows == 0
    add_source(source, 60, 30)
    assert fanout(spark, "db.src", "copier", ROUTES, route_column="route", catalog_name=env_catalog.name).rows == 20
    assert output_ids(catalog) == expected_ids(0, 90)
    for table in ROUTES.values():
        report = run_checks(catalog.load_table(table), ["contiguity-deep"])
        assert report.ok and check_transactions(catalog.load_table(table)).ok


@pytest.mark.integration
def test_i5_fanout_on_rest_copies_each_record_once_in_a_decided_transaction(spark, rest_env, monkeypatch):
    """On a REST catalog the executors' files go through ``send_files`` into the journal's
    decision; a target another writer moved after they were numbered takes them at its new end."""
    catalog = rest_env.open()
    source = make_tables(catalog)
    add_source(source, 0, 60)
    real = faults.checkpoint

    def other_writer(point: str) -> None:  # after the sends, before the decision
        if point == faults.AFTER_TXN_STAGE:
            LogTable.open(catalog, "db.out_a").append({p: [{"key": "other", "route": "a", "id": -1}] for p in range(3)})
        real(point)

    monkeypatch.setattr(faults, "checkpoint", other_writer)
    result = fanout(spark, "db.src", "copier", ROUTES, route_column="route", catalog_name=rest_env.name)
    monkeypatch.setattr(faults, "checkpoint", real)
    assert result.rows == 40 and all(r[0] == 1 for r in result.written["db.out_a"].values())
    assert output_ids(catalog) == expected_ids(0, 60) + Counter({-1: 3})
    assert committed_offsets(catalog, "copier", "db.src") == {0: 30, 1: 30}
    for table in ROUTES.values():
        assert run_checks(catalog.load_table(table), ["contiguity-deep"]).ok


@pytest.mark.integration
@pytest.mark.fault
@pytest.mark.parametrize("point", [pytest.param(faults.AFTER_TXN_STAGE, marks=pytest.mark.slow), faults.AFTER_TXN_PREPARE])
def test_i9_fanout_killed_then_rerun_writes_each_record_exactly_once(spark, env_catalog, tmp_path, point):
    catalog = env_catalog.open()
    source = make_tables(catalog)
    add_source(source, 0, 40)
    argv = [
        sys.executable,
        "-m",
        "tests.support.workers.fanout",
        json.dumps(asdict(env_catalog)),
        "db.src",
        "copier",
        json.dumps(ROUTES),
    ]
    pause = str(tmp_path / "paused")
    env = {**os.environ, "ICELOG_PAUSE_AT": point, "ICELOG_PAUSE_FILE": pause}
    with open(tmp_path / "worker.log", "w") as out:
        worker = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            kill_at(worker, pause, timeout=300)
        finally:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
    assert output_ids(catalog) == Counter()  # nothing visible yet, whatever the point
    rerun = fanout(spark, "db.src", "copier", ROUTES, route_column="route", catalog_name=env_catalog.name)
    if point == faults.AFTER_TXN_PREPARE and not is_atomic(catalog):  # the decided transaction rolled forward by init
        assert rerun.rows == 0
    elif point == faults.AFTER_TXN_PREPARE:  # SQL: killed before its one swap, so aborted by init: all copied again
        assert rerun.rows > 0
    assert output_ids(catalog) == expected_ids(0, 40)
    assert committed_offsets(catalog, "copier", "db.src") == {0: 20, 1: 20}
    assert all(e.txn is None for e in transactional_ids(catalog).values())
    for table in ROUTES.values():
        assert check_transactions(catalog.load_table(table)).ok
        location = LogTable.open(catalog, table).table().metadata.location.removeprefix("file://")
        leftovers = [os.path.join(d, f) for d, _, fs in os.walk(location + "/data") for f in fs if "staging" in d]
        assert leftovers == []

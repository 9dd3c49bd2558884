"""The Spark ingest job on a catalog without atomic multi-table commits (SeaweedFS REST + S3).

The data table's conditional commit decides and carries its ledger rows in its registry
receipt; the ledger rolls forward after it, and before any run plans (storage.ingest.ledger).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace

import pyarrow as pa
import pytest

from icelog.pipelines.ingest import ingest
from icelog.storage.admin.maintenance import maintain
from icelog.storage.core.commit import load
from icelog.storage.ingest import ledger
from icelog.storage.log.table import LogTable
from icelog.storage.properties import COMMIT_ID
from icelog.validations.checks import run_checks
from tests.support.faults import kill_at
from tests.support.ingest import write_landing

pytestmark = pytest.mark.integration


@pytest.fixture
def rest_spec(rest_spec):
    """The REST catalog, its FileIO patient with a server starved of CPU: the S3 client's default
    request timeout (3 s without a byte) failed executors' uploads on a 2-core machine under load."""
    return replace(rest_spec, rest=(*rest_spec.rest, ("s3.request-timeout", "60")))


def _ledger_rows(catalog, table: str) -> list[dict]:
    rows = load(catalog, ledger.LEDGER_TABLE).scan().to_arrow().to_pylist()
    return sorted((r for r in rows if r["table_name"] == table), key=lambda r: r["path"])


def _values(t: LogTable) -> list[str]:
    return sorted(v for p in t.watermarks() for v in t.read(p).column("value").to_pylist())


def test_ingest_on_rest_lands_each_file_once_and_a_rerun_skips_them(spark, rest_spec, tmp_path):
    catalog = rest_spec.open()
    t = LogTable.create(catalog, "db.events", partitions=3)
    source = write_landing(tmp_path / "landing")
    first = ingest(spark, "db.events", str(tmp_path / "landing"), "day-1", catalog_name=catalog)
    assert first.rows == 600 and len(first.loaded) == 3 and not first.duplicate
    assert _values(t) == sorted(r["value"] for r in source)
    book = _ledger_rows(catalog, "db.events")
    assert [r["rows"] for r in book] == [200, 200, 200] and {r["commit_id"] for r in book} == {_commit_id(t)}
    again = ingest(spark, "db.events", str(tmp_path / "landing"), "day-1", catalog_name=catalog)
    assert again.duplicate and again.rows == 0 and [s["reason"] for s in again.skipped] == ["already loaded"] * 3
    assert len(_values(t)) == 600 and len(_ledger_rows(catalog, "db.events")) == 3
    assert run_checks(t.table(), ("contiguity-deep",)).ok


def _commit_id(t: LogTable) -> str:
    return t.table().metadata.current_snapshot().summary.additional_properties[COMMIT_ID]


@pytest.mark.parametrize(
    "expire",
    [pytest.param(False, marks=pytest.mark.slow), True],  # the expiry run covers the plain one too
    ids=["rerun", "expiry-then-rerun"],
)
def test_driver_killed_between_data_and_ledger_commits_then_rerun_loads_each_file_once(expire, spark, rest_spec, tmp_path):
    """kill -9 after the data commit, before the ledger's; with ``expire``, another writer's
    append and maintenance (compaction, snapshot expiry keeping 1, orphan cleanup) drop the
    ingest's snapshot before the re-run: its ledger rows ride in the registry, not in it."""
    catalog = rest_spec.open()
    t = LogTable.create(catalog, "db.events", partitions=3)
    source = write_landing(tmp_path / "landing")
    pause = str(tmp_path / "paused")
    argv = [
        sys.executable,
        "-m",
        "tests.support.workers.ingest",
        json.dumps(asdict(rest_spec)),
        "db.events",
        str(tmp_path / "landing"),
        "k",
    ]
    env = {
        **os.environ,
        "ICELOG_SPARK_MASTER": "local[2]",
        "ICELOG_PAUSE_AT": "after_ingest_data_commit",
        "ICELOG_PAUSE_FILE": pause,
    }
    with open(tmp_path / "driver.log", "w") as out:
        kill_at(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT), pause, timeout=300)
    killed = _commit_id(t)
    assert len(_values(t)) == 600 and _ledger_rows(catalog, "db.events") == []  # the data landed, its ledger rows did not
    if expire:
        t.append({0: pa.table({"key": ["late"], "value": ["late"]})})
        maintain(catalog, "db.events", keep_snapshots=1, orphan_age_s=0)
        snapshots = t.table().metadata.snapshots
        assert all(s.summary.additional_properties.get(COMMIT_ID) != killed for s in snapshots)
    rerun = ingest(spark, "db.events", str(tmp_path / "landing"), "k", catalog_name=catalog)
    assert rerun.duplicate and rerun.rows == 0 and len(rerun.skipped) == 3
    assert _values(t) == sorted([r["value"] for r in source] + (["late"] if expire else []))  # each file's rows once
    book = _ledger_rows(catalog, "db.events")
    assert [(r["rows"], r["commit_id"]) for r in book] == [(200, killed)] * 3
    assert ledger.roll_forward(catalog, load(catalog, "db.events"), "db.events") == {}  # found by id: never twice
    assert len(_ledger_rows(catalog, "db.events")) == 3
    assert run_checks(t.table(), ("contiguity-deep",)).ok

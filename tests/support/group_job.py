"""The group job's test tables, members and checks, shared by its SQL and REST tests."""

from __future__ import annotations

from collections import Counter

from icelog.pipelines.group_job import group_job
from icelog.storage.groups.consumer import Consumer
from icelog.storage.groups.offsets import group_state
from icelog.storage.groups.ranges import RangeState
from icelog.storage.log.table import LogTable
from icelog.validations.checks import run_checks
from tests.support.spark import local_session

PAYLOAD = [{"name": "key", "type": "string"}, {"name": "id", "type": "long"}]
N = 120
LONG = 600_000  # session timeout: no member lapses during a test


def make_tables(catalog) -> LogTable:
    source = LogTable.create(catalog, "db.src", 1, payload=PAYLOAD)
    LogTable.create(catalog, "db.out", 2, payload=PAYLOAD)
    source.append({0: [{"key": f"k{i % 23}", "id": i} for i in range(N)]})
    return source


def join(catalog, *members: str) -> None:
    for m in members:
        Consumer(catalog, "g", member_id=m, session_timeout_ms=LONG).subscribe("db.src")


def run(env_catalog, member: str | None, **options):
    return group_job(
        local_session(),
        "db.src",
        "db.out",
        "g",
        member_id=member,
        session_timeout_ms=LONG,
        catalog_name=env_catalog.name,
        **options,
    )


def output(catalog) -> list[dict]:
    out = LogTable.open(catalog, "db.out")
    return [r for p in range(2) for r in out.read(p).to_pylist()]


def stable(catalog) -> RangeState:
    return group_state(catalog).range_state("g", "db.src", 0, 0)


def assert_each_record_once(catalog) -> None:
    rows = output(catalog)
    assert Counter(r["id"] for r in rows) == Counter(range(N))
    by_key: dict = {}
    for r in sorted(rows, key=lambda r: (r["log_partition"], r["log_offset"])):
        by_key.setdefault(r["key"], []).append(r["id"])
    assert all(ids == sorted(ids) for ids in by_key.values())  # per-key order kept
    assert run_checks(catalog.load_table("db.out"), ["contiguity-deep"]).ok
    assert stable(catalog) == RangeState(N - 1, ())  # the group is done up to the log end

"""``IcelogLogTrigger`` on a real SQLite catalog reached through an Airflow connection: one event
per committed range, none again after the trigger is re-created (a triggerer restart)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from icelog.provider.triggers import STATE_KEY, IcelogLogTrigger
from icelog.storage.errors import InvalidOffset, UnknownTable
from icelog.storage.log.table import LogTable


@pytest.fixture
def events(lake, monkeypatch, tmp_path):
    """The ``lake`` catalog as connection ``lake`` (no ICELOG_* catalog setting), with a log table."""
    catalog, spec = lake
    for key in [k for k in os.environ if k.startswith(("ICELOG_", "PYICEBERG_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "no-home"))
    extra = {"uri": spec["uri"], "warehouse": spec["warehouse"], "catalog_name": "lake"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "icelog", "extra": extra}))
    table = LogTable.create(catalog, "demo.events", 2)
    table.append({0: [{"key": "a", "value": "1"}] * 2})
    return table


class StateStore:
    """The asset state store's accessor as the triggerer hands it to a watcher (``aget``/``aset``
    of JSON values), kept in memory: what Airflow's database keeps across a restart."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    async def aget(self, key: str, default: object = None) -> object:
        return json.loads(json.dumps(self.values[key])) if key in self.values else default

    async def aset(self, key: str, value: object) -> None:
        self.values[key] = json.loads(json.dumps(value))


def recreated(trigger: IcelogLogTrigger, store: StateStore | None = None) -> IcelogLogTrigger:
    """The trigger as a triggerer builds it again: from ``serialize()``'s kwargs, through JSON."""
    classpath, kwargs = trigger.serialize()
    assert classpath == "icelog.provider.triggers.IcelogLogTrigger"
    again = IcelogLogTrigger(**json.loads(json.dumps(kwargs)))
    again.asset_state_store = store
    return again


async def collect(trigger: IcelogLogTrigger, actions: list, quiet: float = 1.5) -> list[dict]:
    """Run the trigger; do each action (in a thread) once the trigger is quiet; stop it after the last."""
    got: list[dict] = []
    runner = trigger.run()

    async def pump() -> None:
        async for event in runner:
            got.append(event.payload)

    task = asyncio.create_task(pump())
    try:
        for action in [*actions, None]:
            await asyncio.sleep(quiet)
            if task.done():
                break
            if action is not None:
                await asyncio.to_thread(action)
        await asyncio.sleep(quiet)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if task.done() and not task.cancelled() and task.exception():
        raise task.exception()
    return got


def append(table: LogTable, partition: int, n: int):
    return lambda: table.append({partition: [{"key": "k", "value": "v"}] * n})


def test_fires_once_per_committed_range_and_not_again_after_it_is_recreated(events):
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", poll_interval=0.2)
    got = asyncio.run(collect(trigger, [append(events, 0, 3), append(events, 1, 2)]))
    # It starts at the log ends it finds (0: 2, 1: 0): the rows before it are not a new range.
    assert [(e["status"], e["ranges"], e["rows"]) for e in got] == [
        ("committed", {"0": [2, 5]}, 3),
        ("committed", {"1": [0, 2]}, 2),
    ]
    assert got[-1]["ends"] == {"0": 5, "1": 2}
    assert got[-1]["snapshot_id"] == events.table().metadata.current_snapshot_id
    # Re-created from what it serializes (a triggerer restart): the old ranges stay fired.
    again = recreated(trigger)
    assert again.after == {0: 5, 1: 2}
    assert asyncio.run(collect(again, [append(events, 0, 1)])) == [
        {
            "status": "committed",
            "table": "demo.events",
            "snapshot_id": events.table().metadata.current_snapshot_id,
            "ranges": {"0": [5, 6]},
            "ends": {"0": 6, "1": 2},
            "rows": 1,
        }
    ]


def test_two_commits_between_polls_are_one_range_and_nothing_is_skipped(events):
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", after={"0": 1}, poll_interval=0.2)

    def two_commits():
        events.append({0: [{"key": "k", "value": "v"}]})
        events.append({1: [{"key": "k", "value": "v"}] * 4})

    got = asyncio.run(collect(trigger, [two_commits], quiet=0.1))
    ranges = [e["ranges"] for e in got]
    # `after` 0:1 is behind the log end 2: that range fires first; no offset twice, none missed.
    covered = {p: [o for r in ranges for o in range(*r.get(p, [0, 0]))] for p in ("0", "1")}
    assert covered == {"0": [1, 2], "1": [0, 1, 2, 3]}


def test_a_watcher_keeps_its_position_in_the_asset_state_store_across_a_restart(events):
    # As an AssetWatcher's trigger, the kwargs the triggerer re-creates it from are the DAG's
    # (no position): the position is read back from the watched Asset's state store.
    store = StateStore()
    dag_kwargs = {"table": "demo.events", "icelog_conn_id": "lake", "poll_interval": 0.2}
    first = IcelogLogTrigger(**dag_kwargs)
    first.asset_state_store = store
    got = asyncio.run(collect(first, [append(events, 1, 2)]))
    assert [e["ranges"] for e in got] == [{"1": [0, 2]}]
    assert store.values[STATE_KEY] == {"table": "demo.events", "ends": {"0": 2, "1": 2}}
    events.append({0: [{"key": "k", "value": "v"}]})  # committed while the triggerer is down
    restarted = IcelogLogTrigger(**dag_kwargs)
    restarted.asset_state_store = store
    got = asyncio.run(collect(restarted, [append(events, 1, 1)]))
    assert [e["ranges"] for e in got] == [{"0": [2, 3]}, {"1": [2, 3]}]  # the missed range, then the new one; no old one


def test_until_fires_once_when_every_named_partition_reaches_its_offset(events):
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", until={"0": 4, "1": 1}, poll_interval=0.2)
    got = asyncio.run(collect(trigger, [append(events, 0, 2), append(events, 1, 1), append(events, 1, 1)]))
    assert [(e["status"], e["until"], e["ends"]) for e in got] == [("reached", {"0": 4, "1": 1}, {"0": 4, "1": 1})]


def test_a_dropped_table_ends_the_trigger_with_unknown_table(events):
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", poll_interval=0.2)
    with pytest.raises(UnknownTable, match="demo.events"):
        asyncio.run(collect(trigger, [lambda: events.drop(purge=True)]))


def test_a_dropped_table_is_an_error_event_for_a_deferred_sensor(events):
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", poll_interval=0.2, errors_as_events=True)
    (event,) = asyncio.run(collect(trigger, [lambda: events.drop(purge=True)]))
    assert (event["status"], event["error"], event["table"]) == ("error", "UnknownTable", "demo.events")
    from icelog.provider.sensors import raise_event_error

    with pytest.raises(UnknownTable, match="no log table 'demo.events'"):
        raise_event_error(event)


def test_a_start_below_the_log_start_is_refused(events):
    from icelog.storage.core.commit import commit
    from icelog.storage.log.maintenance import Retention

    commit(events.catalog, events.identifier, Retention(events.identifier, retention_ms=1, now_ms=2**62))
    assert events.watermarks()[0].start == 2
    trigger = IcelogLogTrigger(table="demo.events", icelog_conn_id="lake", after={"0": 1}, poll_interval=0.2)
    with pytest.raises(InvalidOffset, match="invalid offset 1 for partition 0: below the log start 2 of demo.events"):
        asyncio.run(collect(trigger, []))

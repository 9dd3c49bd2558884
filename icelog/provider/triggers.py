"""``IcelogLogTrigger``: fires when a log table's partitions reach offsets, or once per new
committed range.

Two modes:

* ``until={partition: offset}``: one event when every named partition's log end is at or past
  its offset (a sensor's wait), then the trigger ends;
* otherwise, an event for each new committed range: the offsets committed past the trigger's
  position (``after``, default the log ends when it first runs). Each event moves the position
  to the log ends it reported, so no offset is reported twice and none is skipped.

As an ``AssetWatcher``'s trigger (a ``BaseEventTrigger``), it keeps its position in the watched
Asset's state store (Airflow's ``asset_state_store``), written after each event: a triggerer
that restarts re-creates the trigger from its kwargs, reads the position back and goes on
from there, without firing old ranges again. ``serialize()`` also returns the position reached,
so a trigger re-created from it (a deferred sensor's, say) goes on from there too. A kill -9
between an event and the position's write fires that range once more on restart (each event
names its ranges and snapshot: consumers can tell).

A table that does not exist (dropped while watched) ends the trigger with ``UnknownTable``;
a deferred sensor gets it as an error event (``errors_as_events``) and fails with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from icelog.provider import position as pos
from icelog.storage.errors import IcelogError

STATE_KEY = "icelog.position"


class IcelogLogTrigger(BaseEventTrigger):
    """Fires on a log table's new committed offsets.

    Args:
        table: The log table (``namespace.table``).
        icelog_conn_id: Its catalog's Airflow connection; ``None``: icelog's default catalog.
        until: ``{partition: offset}``: fire once when every named partition reaches its offset.
        after: ``{partition: offset}``: the position new ranges start from (default: the log
            ends when the trigger first runs).
        poll_interval: Seconds between reads of the table's metadata.
        errors_as_events: Report an icelog error as an event (``status: error``) instead of
            raising it: a deferred sensor then fails with the typed error.
    """

    def __init__(
        self,
        table: str,
        icelog_conn_id: str | None = None,
        until: dict[str, int] | None = None,
        after: dict[str, int] | None = None,
        poll_interval: float = 30.0,
        errors_as_events: bool = False,
    ) -> None:
        super().__init__()
        self.table = table
        self.icelog_conn_id = icelog_conn_id
        self.until = pos.as_offsets(until)
        self.after = pos.as_offsets(after)
        self.poll_interval = float(poll_interval)
        self.errors_as_events = errors_as_events

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "table": self.table,
                "icelog_conn_id": self.icelog_conn_id,
                "until": None if self.until is None else pos.as_json(self.until),
                "after": None if self.after is None else pos.as_json(self.after),
                "poll_interval": self.poll_interval,
                "errors_as_events": self.errors_as_events,
            },
        )

    def _open(self) -> Any:
        from icelog.provider.hooks import IcelogHook

        return IcelogHook(self.icelog_conn_id).get_log_table(self.table)

    async def _stored_position(self) -> dict[int, int] | None:
        if self.asset_state_store is None:
            return None
        try:
            stored = await self.asset_state_store.aget(STATE_KEY)
        except ValueError:  # one trigger watching several Assets: Airflow needs the Asset named
            self.log.warning("%s: the trigger watches several Assets; its position is not kept across restarts", self.table)
            self.asset_state_store = None
            return None
        if isinstance(stored, dict) and stored.get("table") == self.table and isinstance(stored.get("ends"), dict):
            return pos.as_offsets(stored["ends"])
        return None

    async def _store_position(self, ends: dict[int, int]) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(STATE_KEY, {"table": self.table, "ends": pos.as_json(ends)})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            async for event in self._events():
                yield event
        except IcelogError as e:
            if not self.errors_as_events:
                raise
            self.log.error("icelog trigger failed: %s", e)
            yield TriggerEvent({"status": "error", "table": self.table, **e.to_dict()})

    async def _events(self) -> AsyncIterator[TriggerEvent]:
        log_table = await asyncio.to_thread(self._open)
        snapshot_id, marks = await asyncio.to_thread(pos.read_marks, log_table)
        if self.until is not None:
            pos.check_until(self.table, marks, self.until)
            while not pos.reached(marks, self.until):
                await asyncio.sleep(self.poll_interval)
                snapshot_id, marks = await asyncio.to_thread(pos.read_marks, log_table)
            event = pos.event_payload(self.table, snapshot_id, marks, {})
            yield TriggerEvent({"status": "reached", "until": pos.as_json(self.until), **event})
            return
        stored = await self._stored_position()
        position = stored if stored is not None else pos.start_position(self.table, marks, self.after)
        if stored is None:
            # From now on a restart goes on from here, not from the log ends it finds then.
            await self._store_position(position)
        self.after = position
        while True:
            ranges = pos.new_ranges(marks, position)
            if ranges:
                event = pos.event_payload(self.table, snapshot_id, marks, ranges)
                position = {p: end for p, (_, end) in marks.items()}
                self.after = position
                self.log.info("new committed range of %s: %s (snapshot %s)", self.table, event["ranges"], snapshot_id)
                yield TriggerEvent({"status": "committed", **event})
                await self._store_position(position)
            await asyncio.sleep(self.poll_interval)
            snapshot_id, marks = await asyncio.to_thread(pos.read_marks, log_table)

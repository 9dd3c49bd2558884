"""``IcelogLogSensor``: wait until a log table's partitions reach offsets, or for its next
committed range; deferrable (the wait runs in the triggerer as :class:`IcelogLogTrigger`).

XCom: the table, its snapshot, the new ranges ``{partition: [first, end]}`` (``until``: none),
the log ends and the rows in the ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from icelog.provider import position as pos
from icelog.provider.hooks import IcelogHook
from icelog.provider.triggers import IcelogLogTrigger


def raise_event_error(event: dict[str, Any]) -> None:
    """Raise the icelog error a trigger reported: its type from ``storage.errors``, with its fields."""
    from icelog.storage import errors

    error = getattr(errors, str(event.get("error")), None)
    if isinstance(error, type) and issubclass(error, errors.IcelogError) and all(f in event for f in error._field_names):
        raise error(**{f: event[f] for f in error._field_names})
    raise errors.InvalidInput(reason=f"{event.get('error')}: {event.get('message')}")


class IcelogLogSensor(BaseSensorOperator):
    """Waits for a log table's offsets.

    Args:
        table: The log table; templated.
        icelog_conn_id: Its catalog's Airflow connection; ``None``: icelog's default catalog.
        until: ``{partition: offset}``: succeed when every named partition's log end is at or
            past its offset; templated.
        after: Otherwise: succeed at the first range committed past these offsets (default:
            the log ends when the sensor starts); templated.
        poll_interval: Seconds between reads (the trigger's, and ``poke_interval`` when not deferred).
        deferrable: Wait in the triggerer (default) instead of a worker slot.
    """

    template_fields: Sequence[str] = ("table", "icelog_conn_id", "until", "after")

    def __init__(
        self,
        *,
        table: str,
        icelog_conn_id: str | None = IcelogHook.default_conn_name,
        until: dict[Any, int] | None = None,
        after: dict[Any, int] | None = None,
        poll_interval: float = 30.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.table, self.icelog_conn_id = table, icelog_conn_id
        self.until, self.after = until, after
        self.poll_interval, self.deferrable = poll_interval, deferrable
        self._position: dict[int, int] | None = None

    def _check(self, log_table: Any) -> dict[str, Any] | None:
        """The event, if the wait is over; fixes the start position on the first call."""
        snapshot_id, marks = pos.read_marks(log_table)
        until = pos.as_offsets(self.until)
        if until is not None:
            pos.check_until(self.table, marks, until)
            if pos.reached(marks, until):
                return {"status": "reached", "until": pos.as_json(until), **pos.event_payload(self.table, snapshot_id, marks, {})}
            return None
        if self._position is None:
            self._position = pos.start_position(self.table, marks, pos.as_offsets(self.after))
        ranges = pos.new_ranges(marks, self._position)
        return {"status": "committed", **pos.event_payload(self.table, snapshot_id, marks, ranges)} if ranges else None

    def execute(self, context: Any) -> Any:
        log_table = IcelogHook(self.icelog_conn_id).get_log_table(self.table)  # bad input fails here, on the worker
        event = self._check(log_table)
        if event is not None:
            return event
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=IcelogLogTrigger(
                table=self.table,
                icelog_conn_id=self.icelog_conn_id,
                until=None if self.until is None else pos.as_json(pos.as_offsets(self.until)),
                after=None if self._position is None else pos.as_json(self._position),
                poll_interval=self.poll_interval,
                errors_as_events=True,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def poke(self, context: Any) -> PokeReturnValue:
        event = self._check(IcelogHook(self.icelog_conn_id).get_log_table(self.table))
        return PokeReturnValue(is_done=event is not None, xcom_value=event)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") == "error":
            raise_event_error(event)
        return event

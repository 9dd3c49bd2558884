"""A key-value store whose write-ahead log is one partition of a log table (KIP-27's example).

KIP-27 (conditional publish) motivates the expected offset with exactly this: a replicated
store keeps its state in memory and its history in a log partition. A leader may write only
if it has seen the whole log, so every write expects the offset the leader has read up to.
If another leader wrote meanwhile, the append fails with :class:`OffsetMismatch` instead of
landing on a state the writer never saw. The loser reads just the records it missed, decides
again on the new state, and re-sends. No lock or lease is needed, and no update is lost.

Records use the default payload: ``key`` is the key, ``value`` is the new value as JSON, or
null for a delete (a tombstone). Replaying the partition in offset order rebuilds the state.

Command line (JSON out; the table is created with one partition if it is missing)::

    python -m icelog.pipelines.examples.kv_store [--catalog NAME] TABLE put K V | get K | delete K | incr K [--times N] | dump

``put`` stores V as JSON if it parses (``5``, ``{"a": 1}``), else as a string.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from pyiceberg.catalog import Catalog

from icelog.pipelines.cli import exit_code
from icelog.storage.core.catalog import open_catalog
from icelog.storage.errors import (
    ConflictError,
    IcelogError,
    InvalidInput,
    OffsetMismatch,
    TableAlreadyExists,
    TerminalError,
    TransientError,
    UnknownTable,
)
from icelog.storage.log.schema import OFFSET
from icelog.storage.log.table import LogTable


class TooManyConflicts(ConflictError, TransientError):
    """Every attempt of one write lost to another leader's write.

    The store has caught up each time, so calling the operation again is safe.
    """

    table: str
    partition: int
    key: str
    attempts: int
    message = "{table} partition {partition}: write of key {key!r} lost to other leaders {attempts} times in a row"


class ReplayGap(TerminalError):
    """The partition no longer holds every record the state depends on.

    The store replays the whole history, so it cannot run on a partition whose start was
    moved by retention (there is no log compaction or state snapshot here).
    """

    table: str
    partition: int
    offset: int
    message = (
        "{table} partition {partition}: record {offset} is missing "
        "(removed by retention?), so the key-value state cannot be rebuilt"
    )


@dataclass
class Write:
    """One acknowledged write: it is in the log at ``offset``. ``value`` None is a delete."""

    key: str
    value: Any
    offset: int
    mismatches: int  # how many times another leader got there first


class KVStore:
    """The state of one log partition, replayed into a dict, plus conditional writes to it.

    Args:
        catalog: The catalog holding ``table``.
        table: A log table with the default payload (``key``, ``value`` strings).
        partition: The partition used as the write-ahead log.
        max_attempts: Sends per write before :class:`TooManyConflicts`.
    """

    def __init__(self, catalog: Catalog, table: str, partition: int = 0, max_attempts: int = 100) -> None:
        self.log = LogTable(catalog, table)
        if not {"key", "value"} <= set(self.log.payload_schema(self.log.table()).names):
            raise InvalidInput(reason=f"{self.log.identifier}: a key-value store needs the default key/value payload")
        self.partition, self.max_attempts = partition, max_attempts
        self.data: dict[str, Any] = {}
        self.next_offset = 0  # the log end this state reflects: every write expects it
        self.mismatches = 0
        self.refresh()

    def refresh(self) -> None:
        """Catch up to the partition's current log end (reads only the records not yet seen)."""
        self._catch_up(self.log.watermarks()[self.partition].end)

    def _catch_up(self, end: int) -> None:
        """Apply the records ``[next_offset, end)`` in offset order."""
        if end <= self.next_offset:
            return
        rows = self.log.read(self.partition, start=self.next_offset, end=end)
        offsets = rows.column(OFFSET).to_pylist()
        for i, offset in enumerate(offsets):
            if offset != self.next_offset + i:
                raise ReplayGap(table=self.log.identifier, partition=self.partition, offset=self.next_offset + i)
        if len(offsets) != end - self.next_offset:
            raise ReplayGap(table=self.log.identifier, partition=self.partition, offset=self.next_offset + len(offsets))
        for key, value in zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True):
            if key is not None:  # not a key-value record
                self._apply(key, _decode(value))
        self.next_offset = end

    def _apply(self, key: str, value: Any) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value

    # --- reads: from the local state, as of next_offset (call refresh() for the latest) ---

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    # --- writes: each one conditional on next_offset ---------------------------------------

    def put(self, key: str, value: Any) -> Write:
        """Set ``key`` to ``value`` (any JSON value; None deletes)."""
        return self.update(key, lambda _old: value)

    def delete(self, key: str) -> Write:
        """Write a tombstone for ``key`` (also when it is absent: the log records the intent)."""
        return self.update(key, lambda _old: None)

    def incr(self, key: str, by: int = 1) -> Write:
        """Add ``by`` to an integer counter (absent counts as 0)."""

        def add(old: Any) -> int:
            if old is not None and (not isinstance(old, int) or isinstance(old, bool)):
                raise InvalidInput(reason=f"key {key!r} holds {old!r}, not an integer")
            return (old or 0) + by

        return self.update(key, add)

    def update(self, key: str, fn: Callable[[Any], Any]) -> Write:
        """Read-modify-write: ``fn(current value or None)`` gives the new value (None deletes).

        ``fn`` decides on the state as of ``next_offset``, and the append expects exactly that
        offset. If another leader wrote first, catch up from ``next_offset`` to the offset the
        mismatch reports and call ``fn`` again on the new state. A transient failure re-sends
        the same record with the same commit id, so it lands at most once.

        Raises:
            TooManyConflicts: ``max_attempts`` sends without success.
            InvalidInput: ``fn`` refused the current value.
        """
        if not isinstance(key, str) or not key:
            raise InvalidInput(reason="a key is a non-empty string")
        mismatches, pending = 0, None
        for _ in range(self.max_attempts):
            if pending is None:  # decide on the state as of the offset we will expect
                pending = (self.next_offset, fn(self.data.get(key)), uuid.uuid4().hex)
            expected, value, commit_id = pending
            record = {"key": key, "value": None if value is None else json.dumps(value)}
            try:
                result = self.log.append({self.partition: [record]}, {self.partition: expected}, commit_id=commit_id)
            except OffsetMismatch as e:
                mismatches += 1
                self.mismatches += 1
                self._catch_up(e.actual)
                pending = None
                continue
            except TransientError:
                continue  # same expected offset and commit id: never written twice
            self._apply(key, value)
            self.next_offset = result.ranges[self.partition][1]
            return Write(key, value, result.ranges[self.partition][0], mismatches)
        raise TooManyConflicts(table=self.log.identifier, partition=self.partition, key=key, attempts=self.max_attempts)


def _decode(value: str | None) -> Any:
    """A record's value: JSON, or a plain string for records written by other tools."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def open_or_create(catalog: Catalog, table: str) -> None:
    """Create ``table`` with one partition unless it exists (safe when leaders race)."""
    try:
        LogTable.open(catalog, table)
    except UnknownTable:
        try:
            LogTable.create(catalog, table, partitions=1)
        except TableAlreadyExists:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m icelog.pipelines.examples.kv_store", description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default=None, help="pyiceberg catalog name (default: $ICELOG_CATALOG or the embedded one)")
    parser.add_argument("table")
    ops = parser.add_subparsers(dest="op", required=True)
    put = ops.add_parser("put", help="set K to V (JSON if it parses, else a string)")
    put.add_argument("key")
    put.add_argument("value")
    ops.add_parser("get", help="print K's value (null if absent)").add_argument("key")
    ops.add_parser("delete", help="write a tombstone for K").add_argument("key")
    incr = ops.add_parser("incr", help="add 1 to the integer counter K, N times (one line per write)")
    incr.add_argument("key")
    incr.add_argument("--times", type=int, default=1)
    ops.add_parser("dump", help="print the whole state")
    args = parser.parse_args(argv)

    def emit(doc: dict) -> None:
        print(json.dumps(doc), flush=True)

    try:
        catalog = open_catalog(args.catalog)
        open_or_create(catalog, args.table)
        store = KVStore(catalog, args.table)
        if args.op == "put":
            emit({"op": "put", **asdict(store.put(args.key, _parse_value(args.value)))})
        elif args.op == "delete":
            emit({"op": "delete", **asdict(store.delete(args.key))})
        elif args.op == "incr":
            for _ in range(args.times):
                emit({"op": "incr", **asdict(store.incr(args.key))})
        elif args.op == "get":
            emit(
                {"key": args.key, "value": store.get(args.key), "found": args.key in store.data, "next_offset": store.next_offset}
            )
        else:
            emit(
                {
                    "table": store.log.identifier,
                    "partition": store.partition,
                    "next_offset": store.next_offset,
                    "data": store.data,
                }
            )
    except IcelogError as e:
        emit(e.to_dict())
        return exit_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

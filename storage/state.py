"""Table state kept in table properties, decoded into types.

Properties are one copy per table (not one per snapshot), so they survive snapshot expiry,
and they change in the same catalog commit as the data they describe. Each commit request
names its state type (:class:`LogState` for log tables, :class:`SystemState` for system
tables); the commit core decodes the base with it and writes ``to_properties()`` back.
The core's own bookkeeping (``icelog.version``, ``icelog.head``, ``icelog.commits``) is
written by ``storage.commit`` for every table.

A log table's state:

* ``icelog.partitions``: the partition count (partitions are added, never removed).
* ``icelog.watermarks``: ``{"p": [log_start, log_end]}``.
* ``icelog.producers``: idempotent-producer state (see ``producers``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol

from pyiceberg.table.metadata import TableMetadata

PARTITIONS = "icelog.partitions"
WATERMARKS = "icelog.watermarks"
PRODUCERS = "icelog.producers"
FORMAT = "icelog.format"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class Watermark:
    start: int
    end: int


class TableState(Protocol):
    """What a commit request decides on: decoded from the base metadata, encoded back."""

    snapshot_id: int | None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> Any: ...

    def to_properties(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class SystemState:
    """A system table's state: nothing decoded; requests set properties directly."""

    snapshot_id: int | None = None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> SystemState:
        return cls(snapshot_id=metadata.current_snapshot_id)

    def to_properties(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class LogState:
    """The decision input of a log-table commit: what the base metadata says about the log."""

    watermarks: Mapping[int, Watermark]
    producers: Mapping[str, Any] = field(default_factory=dict)
    snapshot_id: int | None = None

    @property
    def partitions(self) -> int:
        return len(self.watermarks)

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> LogState:
        props = metadata.properties
        raw = json.loads(props.get(WATERMARKS, "{}"))
        count = int(props.get(PARTITIONS, "0"))
        marks = {p: Watermark(*raw.get(str(p), (0, 0))) for p in range(count)}
        return cls(
            watermarks=marks,
            producers=json.loads(props.get(PRODUCERS, "{}")),
            snapshot_id=metadata.current_snapshot_id,
        )

    @classmethod
    def initial(cls, partitions: int) -> LogState:
        return cls(watermarks={p: Watermark(0, 0) for p in range(partitions)})

    def end(self, partition: int) -> int:
        return self.watermarks[partition].end

    def with_ends(self, ends: Mapping[int, int]) -> LogState:
        marks = dict(self.watermarks)
        for p, e in ends.items():
            marks[p] = Watermark(marks[p].start, e)
        return replace(self, watermarks=marks)

    def with_starts(self, starts: Mapping[int, int]) -> LogState:
        marks = dict(self.watermarks)
        for p, s in starts.items():
            marks[p] = Watermark(s, marks[p].end)
        return replace(self, watermarks=marks)

    def with_partitions(self, count: int) -> LogState:
        marks = dict(self.watermarks)
        for p in range(len(marks), count):
            marks[p] = Watermark(0, 0)
        return replace(self, watermarks=marks)

    def to_properties(self) -> dict[str, str]:
        """The properties that describe this state."""
        return {
            PARTITIONS: str(self.partitions),
            WATERMARKS: json.dumps({str(p): [w.start, w.end] for p, w in sorted(self.watermarks.items())}),
            PRODUCERS: json.dumps(self.producers, sort_keys=True, separators=(",", ":")),
        }

"""A log table's current state, kept in its table properties.

Properties are one copy per table (not one per snapshot), so they survive snapshot expiry,
and they change in the same catalog commit as the data they describe.

* ``icelog.version``: bumped by every icelog commit; commits assert it (see ``commit``),
  which makes property-only changes compare-and-swap too.
* ``icelog.partitions``: the partition count (partitions are added, never removed).
* ``icelog.watermarks``: ``{"p": [log_start, log_end]}``.
* ``icelog.producers``: idempotent-producer state (see ``producers``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from pyiceberg.table.metadata import TableMetadata

VERSION = "icelog.version"
PARTITIONS = "icelog.partitions"
WATERMARKS = "icelog.watermarks"
PRODUCERS = "icelog.producers"
FORMAT = "icelog.format"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class Watermark:
    start: int
    end: int


@dataclass(frozen=True)
class LogState:
    """The decision input of every commit: what the base metadata says about the log."""

    version: int
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
            version=int(props.get(VERSION, "0")),
            watermarks=marks,
            producers=json.loads(props.get(PRODUCERS, "{}")),
            snapshot_id=metadata.current_snapshot_id,
        )

    @classmethod
    def initial(cls, partitions: int) -> LogState:
        return cls(version=0, watermarks={p: Watermark(0, 0) for p in range(partitions)})

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
        """The properties that describe this state, with the version already bumped."""
        return {
            VERSION: str(self.version + 1),
            PARTITIONS: str(self.partitions),
            WATERMARKS: json.dumps({str(p): [w.start, w.end] for p, w in sorted(self.watermarks.items())}),
            PRODUCERS: json.dumps(self.producers, sort_keys=True, separators=(",", ":")),
        }

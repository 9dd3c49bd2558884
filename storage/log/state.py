"""A log table's state, kept in its table properties and decoded into types.

A log table's state (``icelog.format`` 2):

* ``icelog.partitions``: the partition count (partitions are added, never removed).
* ``icelog.watermarks``: ``start:end`` per partition, in partition order, joined by ``,``.
* ``icelog.producers``: one :class:`ProducerEntry` per producer, joined by spaces, ordered by
  ``(last_ms, producer id)``: ``pid;last_ms;epoch;client;partitions`` where client is
  percent-encoded (``*`` for none) and partitions are ``p:last_seq:batches``
  (:class:`PartitionSequences`) joined by ``|``, batches
  ``first_seq,last_seq,base_offset,next_offset`` (:class:`WrittenBatch`) joined by ``/``.

Why this shape: every commit carries this state, at 10,000 partitions or producers too.

* A commit decodes it lazily: it splits the text at C speed and parses only the entries it
  reads; untouched entries are written back as the very same text.
* No quotes or backslashes: inside the metadata JSON the text needs no escaping, which makes
  reading and writing a metadata file with megabytes of state several times cheaper.
* Producers ordered by last use: the expired ones are a prefix, found without parsing the rest.

Format 1 (JSON objects ``{"p": [start, end]}`` and ``{"pid": {...}}``, the entries as
:meth:`ProducerEntry.to_dict` writes them) is still read; the next commit rewrites it as
format 2.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from icelog.storage.errors import UnsupportedFormat
from icelog.storage.log.producer_state import ProducerEntry, Producers
from icelog.storage.properties import FORMAT, PARTITIONS, PRODUCERS, WATERMARKS

if TYPE_CHECKING:  # a reader of the state alone (icelog offsets) does not import pyiceberg's metadata
    from pyiceberg.table.metadata import TableMetadata

FORMAT_VERSION = "2"
READABLE_FORMATS = ("1", "2")


@dataclass(frozen=True)
class Watermark:
    start: int
    end: int


# --- watermarks ---------------------------------------------------------------------------------


class Watermarks(Mapping[int, Watermark]):
    """Watermarks of partitions ``0..n-1``, kept as their encoded pieces and parsed on access."""

    __slots__ = ("_pieces",)

    def __init__(self, pieces: list[str]) -> None:
        self._pieces = pieces

    @classmethod
    def of(cls, marks: Mapping[int, Watermark]) -> Watermarks:
        if isinstance(marks, Watermarks):
            return marks
        if sorted(marks) != list(range(len(marks))):
            raise ValueError(f"watermarks are for partitions 0..n-1, not {sorted(marks)}")
        return cls([_mark(marks[p].start, marks[p].end) for p in range(len(marks))])

    @classmethod
    def decode(cls, text: str, partitions: int) -> Watermarks:
        if text.startswith("{"):  # format 1
            raw = json.loads(text)
            return cls([_mark(*raw.get(str(p), (0, 0))) for p in range(partitions)])
        pieces = text.split(",") if text else []
        if len(pieces) != partitions:
            pieces = (pieces + ["0:0"] * partitions)[:partitions]
        return cls(pieces)

    def encode(self) -> str:
        return ",".join(self._pieces)

    def __getitem__(self, partition: Any) -> Watermark:
        try:
            start, end = self._pieces[_partition_index(partition, len(self._pieces))].split(":")
        except IndexError:
            raise KeyError(partition) from None
        return Watermark(int(start), int(end))

    def __len__(self) -> int:
        return len(self._pieces)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._pieces)))

    def updated(self, marks: Mapping[int, Watermark]) -> Watermarks:
        pieces = list(self._pieces)
        for p, mark in marks.items():
            pieces[_partition_index(p, len(pieces))] = _mark(mark.start, mark.end)
        return Watermarks(pieces)

    def grown(self, partitions: int) -> Watermarks:
        return Watermarks(self._pieces + ["0:0"] * (partitions - len(self._pieces)))

    def __repr__(self) -> str:
        return f"Watermarks({dict(self.items())!r})"


def _partition_index(partition: Any, count: int) -> int:
    try:
        i = operator.index(partition)
    except TypeError:
        raise KeyError(partition) from None
    if not 0 <= i < count:
        raise KeyError(partition)
    return i


def _mark(start: int, end: int) -> str:
    return f"{operator.index(start)}:{operator.index(end)}"


# --- the state of a log table -------------------------------------------------------------------


@dataclass(frozen=True)
class LogState:
    """The decision input of a log-table commit: what the base metadata says about the log.

    ``watermarks`` and ``producers`` accept any mapping and are kept as :class:`Watermarks`
    and :class:`Producers`.
    """

    watermarks: Mapping[int, Watermark]
    producers: Mapping[str, ProducerEntry] = field(default_factory=dict)
    snapshot_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "watermarks", Watermarks.of(self.watermarks))
        object.__setattr__(self, "producers", Producers.of(self.producers))

    @property
    def partitions(self) -> int:
        return len(self.watermarks)

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> LogState:
        return cls.from_properties(metadata.properties, metadata.location, metadata.current_snapshot_id)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], location: str, snapshot_id: int | None) -> LogState:
        """The state a metadata file's ``properties`` hold (its table at ``location``)."""
        check_format_of(props, location)
        return cls(
            watermarks=Watermarks.decode(props.get(WATERMARKS, ""), int(props.get(PARTITIONS, "0"))),
            producers=Producers.decode(props.get(PRODUCERS, "")),
            snapshot_id=snapshot_id,
        )

    @classmethod
    def initial(cls, partitions: int) -> LogState:
        return cls(watermarks=Watermarks(["0:0"] * partitions))

    def end(self, partition: int) -> int:
        return self.watermarks[partition].end

    def with_ends(self, ends: Mapping[int, int]) -> LogState:
        marks = self.watermarks
        return self._with(marks.updated({p: Watermark(marks[p].start, e) for p, e in ends.items()}))  # type: ignore[attr-defined]

    def with_starts(self, starts: Mapping[int, int]) -> LogState:
        marks = self.watermarks
        return self._with(marks.updated({p: Watermark(s, marks[p].end) for p, s in starts.items()}))  # type: ignore[attr-defined]

    def with_partitions(self, count: int) -> LogState:
        return self._with(self.watermarks.grown(count))  # type: ignore[attr-defined]

    def _with(self, marks: Watermarks) -> LogState:
        return replace(self, watermarks=marks)

    def to_properties(self) -> dict[str, str]:
        """The properties that describe this state."""
        return {
            FORMAT: FORMAT_VERSION,
            PARTITIONS: str(self.partitions),
            WATERMARKS: self.watermarks.encode(),  # type: ignore[attr-defined]
            PRODUCERS: self.producers.encode(),  # type: ignore[attr-defined]
        }


def check_format(metadata: TableMetadata) -> None:
    """Raise :class:`UnsupportedFormat` for state written by a newer icelog."""
    check_format_of(metadata.properties, metadata.location)


def check_format_of(props: Mapping[str, str], location: str) -> None:
    found = props.get(FORMAT, FORMAT_VERSION)
    if found not in READABLE_FORMATS:
        raise UnsupportedFormat(location=location, format=found, supported=", ".join(READABLE_FORMATS))

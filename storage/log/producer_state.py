"""Idempotent producers' state on one log table (the ``icelog.producers`` property).

Encoded as ``storage.log.state`` describes; the sequence checks that read it are
``storage.log.sequences``.
"""

from __future__ import annotations

import bisect
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping
from urllib.parse import quote, unquote

# --- producers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WrittenBatch:
    """One batch a producer wrote to a partition: sequences ``first_seq..last_seq`` at offsets
    ``[base_offset, next_offset)``. A re-send of the same sequences gets these offsets back."""

    first_seq: int
    last_seq: int
    base_offset: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class PartitionSequences:
    """A producer's sequences on one partition: the last one written, and its last batches."""

    last_seq: int = -1
    batches: tuple[WrittenBatch, ...] = ()

    def written(self, batch: WrittenBatch, keep: int) -> PartitionSequences:
        """These sequences after ``batch``, remembering the last ``keep`` batches."""
        return PartitionSequences(max(self.last_seq, batch.last_seq), (*self.batches, batch)[-keep:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "last_seq": self.last_seq,
            "batches": [[b.first_seq, b.last_seq, b.base_offset, b.next_offset] for b in self.batches],
        }


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """An idempotent producer's state on one log table (its id is the key it is stored under).

    ``partitions`` is not copied: build a new mapping rather than editing one you read.
    """

    client: str | None
    epoch: int
    last_ms: int
    partitions: Mapping[int, PartitionSequences] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """As JSON (format 1, and the CLI): partitions keyed by their number as a string."""
        return {
            "client": self.client,
            "epoch": self.epoch,
            "last_ms": self.last_ms,
            "partitions": {str(p): seen.to_dict() for p, seen in self.partitions.items()},
        }


class Producers(Mapping[str, ProducerEntry]):
    """Idempotent-producer entries by producer id, as ``storage.producers.idempotent`` reads and writes them.

    Immutable. Entries are parsed when read (a fresh value each time); :meth:`with_entry` and
    :meth:`live` return a new value whose :meth:`encode` re-parses nothing it did not touch:
    it cuts the changed and expired entries out of the text and appends the new ones.
    """

    __slots__ = ("_text", "_changed", "_cutoff", "_spans", "_index")

    def __init__(
        self,
        text: str = "",
        changed: Mapping[str, str] | None = None,
        cutoff: int | None = None,
        spans: dict[str, tuple[int, int] | None] | None = None,
    ) -> None:
        self._text = text  # format 2, ordered by (last_ms, pid)
        self._changed = dict(changed or {})  # pid -> its new line
        self._cutoff = cutoff  # entries last used before this are gone
        self._spans = {} if spans is None else spans  # pid -> where its line is in _text (shared: same text)
        self._index: dict[str, str] | None = None

    @classmethod
    def of(cls, producers: Mapping[str, ProducerEntry]) -> Producers:
        if isinstance(producers, Producers):
            return producers
        return cls(" ".join(sorted((_line(str(pid), entry) for pid, entry in producers.items()), key=_order)))

    @classmethod
    def decode(cls, text: str) -> Producers:
        if text.startswith("{"):  # format 1
            return cls.of({pid: _entry_from_json(pid, raw) for pid, raw in json.loads(text).items()})
        return cls(text)

    def encode(self) -> str:
        if not self._changed and self._cutoff is None:
            return self._text
        text, live_from = self._text, self._live_from()
        cuts = sorted(span for span in map(self._span, self._changed) if span is not None and span[0] >= live_from)
        pieces, at = [], live_from
        for a, b in cuts:
            pieces.append(text[at:a])
            at = b
        pieces.append(text[at:])
        pieces = [piece for piece in pieces if piece]
        added = sorted(
            (line for line in self._changed.values() if self._cutoff is None or _last_ms(line) >= self._cutoff), key=_order
        )
        last = _last_line(pieces[-1]) if pieces else None
        if last is not None and added and _order(added[0]) < _order(last):  # rare: a clock behind the others
            lines = "".join(pieces).rstrip(" ").split(" ")
            for line in added:
                bisect.insort(lines, line, key=_order)
            return " ".join(lines)
        if pieces and added and not pieces[-1].endswith(" "):
            pieces.append(" ")
        return "".join([*pieces, " ".join(added)]).rstrip(" ")  # one copy: the usual case appends

    def with_entry(self, pid: str, entry: ProducerEntry) -> Producers:
        return Producers(self._text, {**self._changed, pid: _line(pid, entry)}, self._cutoff, self._spans)

    def live(self, now_ms: int, expiry_ms: int) -> Producers:
        """The producers used within ``expiry_ms`` of ``now_ms``; the others are dropped on encode."""
        cutoff = now_ms - expiry_ms
        cutoff = cutoff if self._cutoff is None else max(cutoff, self._cutoff)
        return Producers(self._text, self._changed, cutoff, self._spans)

    def find_client(self, client_id: str) -> str | None:
        """The producer id registered for ``client_id``, if any."""
        for pid in self._changed:
            if pid in self and self[pid].client == client_id:
                return pid
        needle = f";{quote(client_id, safe='')};"
        at = self._text.find(needle)
        while at >= 0:  # a candidate: the pattern may match another field, so parse to be sure
            start = self._text.rfind(" ", 0, at) + 1
            pid = self._text[start : self._text.index(";", start)]
            if pid not in self._changed and pid in self and self[pid].client == client_id:
                return pid
            at = self._text.find(needle, at + 1)
        return None

    def __getitem__(self, pid: str) -> ProducerEntry:
        if pid in self._changed:
            line = self._changed[pid]
        else:
            span = self._span(pid)
            if span is None:
                raise KeyError(pid)
            line = self._text[span[0] : span[1]].rstrip(" ")
        if self._cutoff is not None and _last_ms(line) < self._cutoff:
            raise KeyError(pid)
        return _entry(line)

    def __contains__(self, pid: object) -> bool:
        try:
            self[pid]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._all()))

    def __repr__(self) -> str:
        return f"Producers({dict(self.items())!r})"

    def _all(self) -> dict[str, str]:
        if self._index is None:
            text = self.encode()
            self._index = {line.split(";", 1)[0]: line for line in text.split(" ")} if text else {}
        return self._index

    def _span(self, pid: str) -> tuple[int, int] | None:
        """Where ``pid``'s line is in the text, its trailing space included (found at C speed)."""
        if pid not in self._spans:
            text, span = self._text, None
            if isinstance(pid, str) and pid and ";" not in pid and " " not in pid:
                at = 0 if text.startswith(pid + ";") else text.find(f" {pid};") + 1
                if at > 0 or text.startswith(pid + ";"):
                    end = text.find(" ", at)
                    span = (at, len(text) if end < 0 else end + 1)
            self._spans[pid] = span
        return self._spans[pid]

    def _live_from(self) -> int:
        """Where the first line used at or after the cutoff starts (lines are in last-use order)."""
        text, at = self._text, 0
        if self._cutoff is None:
            return 0
        while at < len(text):
            first = text.index(";", at) + 1
            if int(text[first : text.index(";", first)]) >= self._cutoff:
                break
            end = text.find(" ", at)
            at = len(text) if end < 0 else end + 1
        return at


def _line(pid: str, entry: ProducerEntry) -> str:
    """``entry`` as its format-2 line (the codec's one writer)."""
    if not isinstance(entry, ProducerEntry) or not pid.isdigit():
        raise ValueError(f"not a producer entry: {pid!r}: {entry!r}")
    client = "*" if entry.client is None else quote(entry.client, safe="")
    parts = []
    for p, seen in entry.partitions.items():
        if not isinstance(seen, PartitionSequences):
            raise ValueError(f"not a producer partition entry: {p!r}: {seen!r}")
        batches = "/".join(
            f"{operator.index(b.first_seq)},{operator.index(b.last_seq)},{operator.index(b.base_offset)},{operator.index(b.next_offset)}"
            for b in seen.batches
        )
        parts.append(f"{operator.index(p)}:{operator.index(seen.last_seq)}:{batches}")
    return f"{pid};{operator.index(entry.last_ms)};{operator.index(entry.epoch)};{client};{'|'.join(parts)}"


def _entry(line: str) -> ProducerEntry:
    """A format-2 line as its entry (the codec's one reader)."""
    _, last_ms, epoch, client, parts = line.split(";")
    partitions = {}
    for part in parts.split("|") if parts else ():
        p, last_seq, batches = part.split(":")
        partitions[int(p)] = PartitionSequences(int(last_seq), tuple(map(_batch, batches.split("/"))) if batches else ())
    return ProducerEntry(None if client == "*" else unquote(client), int(epoch), int(last_ms), partitions)


def _batch(text: str) -> WrittenBatch:
    first_seq, last_seq, base_offset, next_offset = text.split(",")
    return WrittenBatch(int(first_seq), int(last_seq), int(base_offset), int(next_offset))


def _entry_from_json(pid: str, raw: Mapping[str, Any]) -> ProducerEntry:
    """A format-1 entry (:meth:`ProducerEntry.to_dict`'s shape) as its entry."""
    if set(raw) != {"client", "epoch", "last_ms", "partitions"}:
        raise ValueError(f"not a producer entry: {pid!r}: {raw!r}")
    partitions = {}
    for p, seen in raw["partitions"].items():
        if set(seen) != {"last_seq", "batches"} or not str(p).lstrip("-").isdigit():
            raise ValueError(f"not a producer partition entry: {p!r}: {seen!r}")
        batches = tuple(WrittenBatch(first_seq=b[0], last_seq=b[1], base_offset=b[2], next_offset=b[3]) for b in seen["batches"])
        partitions[int(p)] = PartitionSequences(seen["last_seq"], batches)
    return ProducerEntry(raw["client"], raw["epoch"], raw["last_ms"], partitions)


def _last_line(text: str) -> str:
    end = len(text) - 1 if text.endswith(" ") else len(text)
    return text[text.rfind(" ", 0, end) + 1 : end]


def _last_ms(line: str) -> int:
    return int(line.split(";", 2)[1])


def _order(line: str) -> tuple[int, str]:
    pid, last_ms, _ = line.split(";", 2)
    return int(last_ms), pid

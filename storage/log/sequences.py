"""Producer-sequence admission (I4): the check every idempotent append makes, inside its commit.

A log table's ``icelog.producers`` property (``storage.log.producer_state.Producers``) remembers, per
producer id, its epoch and the last :data:`BATCHES_KEPT` batches per partition. :func:`admit`
decides one batch against the exact base of the commit, so a zombie racing the new instance's
init is still refused (I3). Allocating ids and epochs is ``storage.producers``' job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Mapping

from icelog.storage import properties as properties_
from icelog.storage.errors import (
    DuplicateSequence,
    InvalidInput,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    PartlyDuplicate,
    ProducerFenced,
    UnknownProducer,
)
from icelog.storage.log.producer_state import PartitionSequences, ProducerEntry, Producers, WrittenBatch
from icelog.storage.log.state import LogState

BATCHES_KEPT = 5
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class ProducerBatch:
    """The producer fields of one append: ``first_sequences[p]`` is the batch's first sequence on p."""

    producer_id: int
    epoch: int
    first_sequences: Mapping[int, int]

    def validate(self, partitions: Mapping[int, int]) -> None:
        """Check field types and ranges against the rows per partition (I8)."""
        for name, value in (("producer id", self.producer_id), ("epoch", self.epoch)):
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not 0 <= value <= (2**63 - 1 if name == "producer id" else MAX_INT32)
            ):
                raise InvalidInput(reason=f"{name} must be a non-negative integer, got {value!r}")
        if set(self.first_sequences) != set(partitions):
            raise InvalidInput(
                reason=f"sequences given for partitions {sorted(self.first_sequences)} but rows for {sorted(partitions)}"
            )
        for p, seq in self.first_sequences.items():
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or seq + partitions[p] - 1 > MAX_INT32:
                raise InvalidInput(reason=f"partition {p}: sequence {seq!r} is not a non-negative 32-bit integer range")


@dataclass(frozen=True)
class Admission:
    state: LogState
    lineage: dict[str, str] = field(default_factory=dict)
    duplicate_of: dict[int, tuple[int, int]] | None = None


def expiry_ms(properties: Mapping[str, str]) -> int:
    return properties_.read(properties, properties_.PRODUCER_EXPIRY_MS)  # type: ignore[return-value] - has a default


def live_producers(producers: Mapping[str, ProducerEntry], now_ms: int, expiry: int) -> Producers:
    """The producers used within ``expiry`` ms of ``now_ms`` (without parsing the others)."""
    return Producers.of(producers).live(now_ms, expiry)


def admit(
    table: str,
    state: LogState,
    batch: ProducerBatch,
    ranges: Mapping[int, tuple[int, int]],
    now_ms: int | None = None,
    expiry: int = properties_.PRODUCER_EXPIRY_MS.default,  # type: ignore[assignment]
) -> Admission:
    """Decide one producer batch against the base state (pure).

    Returns:
        The state with the batch recorded, or ``duplicate_of`` with the original offsets.

    Raises:
        UnknownProducer, ProducerFenced, InvalidProducerEpoch, OutOfOrderSequence, DuplicateSequence.
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    producers = live_producers(state.producers, now_ms, expiry)
    pid = str(batch.producer_id)
    entry = producers.get(pid)
    if entry is None:
        raise UnknownProducer(table=table, producer_id=batch.producer_id)
    if batch.epoch < entry.epoch:
        raise ProducerFenced(table=table, producer_id=batch.producer_id, epoch=batch.epoch, current_epoch=entry.epoch)
    if batch.epoch > entry.epoch:
        raise InvalidProducerEpoch(table=table, producer_id=batch.producer_id, epoch=batch.epoch, current_epoch=entry.epoch)

    duplicates: dict[int, tuple[int, int]] = {}
    partitions = dict(entry.partitions)
    for p, (base, nxt) in sorted(ranges.items()):
        first = batch.first_sequences[p]
        last = first + (nxt - base) - 1
        seen = partitions.get(p, PartitionSequences())
        cached = next((b for b in seen.batches if b.first_seq == first and b.last_seq == last), None)
        if cached is not None:
            duplicates[p] = (cached.base_offset, cached.next_offset)
            continue
        if first <= seen.last_seq:
            oldest = seen.batches[0].first_seq if seen.batches else seen.last_seq + 1
            if first < oldest:  # written, but too long ago for its offsets to be remembered
                raise DuplicateSequence(table=table, partition=p, producer_id=batch.producer_id, sequence=first)
            raise OutOfOrderSequence(
                table=table, partition=p, producer_id=batch.producer_id, sequence=first, expected=seen.last_seq + 1
            )
        if first != seen.last_seq + 1:
            raise OutOfOrderSequence(
                table=table, partition=p, producer_id=batch.producer_id, sequence=first, expected=seen.last_seq + 1
            )
        partitions[p] = seen.written(WrittenBatch(first, last, base, nxt), BATCHES_KEPT)
    if duplicates:
        if len(duplicates) != len(ranges):  # commits are atomic, so a half-duplicate is a protocol error
            p = next(p for p in ranges if p not in duplicates)
            raise PartlyDuplicate(
                table=table,
                partition=p,
                producer_id=batch.producer_id,
                sequence=batch.first_sequences[p],
                expected=-1,
                written=sorted(duplicates),
            )
        return Admission(state=state, duplicate_of=duplicates)
    producers = producers.with_entry(pid, replace(entry, last_ms=now_ms, partitions=partitions))
    lineage = {
        "icelog.producer": f"{batch.producer_id}:{batch.epoch}",
        "icelog.sequences": ",".join(f"{p}:{s}" for p, s in sorted(batch.first_sequences.items())),
    }
    return Admission(state=replace(state, producers=producers), lineage=lineage)

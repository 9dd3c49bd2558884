"""Idempotent producers (I4): producer ids, epochs (fencing) and sequences.

* **Ids** are leased from a catalog-wide counter kept in the properties of the system table
  ``icelog_system.producer_ids``. Each lease is a compare-and-swap commit, so ids are unique
  in the catalog, never reused, and allocated in increasing order.
* **State** lives in the log table's ``icelog.producers`` property (encoded by
  ``storage.log.producer_state.Producers``), changed in the same commit as the rows it describes: per
  producer id a ``ProducerEntry(client, epoch, last_ms, partitions)``, per partition its
  ``PartitionSequences(last_seq, batches)``, each batch a
  ``WrittenBatch(first_seq, last_seq, base_offset, next_offset)``.

  Only the last :data:`BATCHES_KEPT` batches per partition are remembered (as in Kafka).
* **Admission** happens inside the commit decision, against the exact base of the commit
  (``storage.log.sequences``), so a zombie racing the new instance's init is still refused (I3).
* Producers unused for ``icelog.producer.expiry-ms`` (default 7 days) expire.
* Rows carry ``producer_id``, ``producer_epoch`` and ``producer_seq``, so the state can be
  rebuilt from the log (:func:`derive_state`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, check_writable, commit
from icelog.storage.core.state import SystemState
from icelog.storage.core.system import ensure_system_table
from icelog.storage.errors import InvalidInput, PlanOutdated
from icelog.storage.log.producer_state import PartitionSequences, ProducerEntry, WrittenBatch
from icelog.storage.log.scan import parquet_from, planned_paths
from icelog.storage.log.sequences import (
    BATCHES_KEPT,
    MAX_INT32,
    ProducerBatch,
    expiry_ms,
    live_producers,
)
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.properties import NEXT_PRODUCER_ID

SYSTEM_TABLE = "icelog_system.producer_ids"


# --- producer ids -------------------------------------------------------------------------------


@dataclass
class LeaseProducerIds(Request):
    """Lease ``count`` ids, none below ``floor`` (``count=0``: only raise the floor)."""

    count: int
    commit_id: str = ""
    floor: int = 0
    state_type = SystemState
    writes_system = True

    def decide(self, state: LogState, table: Table) -> Decision:
        allocated = int(table.metadata.properties.get(NEXT_PRODUCER_ID, "0"))
        first = max(allocated, self.floor)
        nxt = first + self.count
        return Decision(state=state, result=range(first, nxt), properties={NEXT_PRODUCER_ID: str(nxt)}, write=nxt != allocated)

    def receipt(self, result: range) -> list[int]:
        return [result.start, result.stop]

    def from_receipt(self, receipt: list[int]) -> range:
        return range(*receipt)


def lease_producer_ids(catalog: Catalog, count: int = 1, floor: int = 0) -> range:
    """Lease ``count`` producer ids, unique in the catalog and never reused, none below ``floor``."""
    if not isinstance(count, int) or count < 1:
        raise InvalidInput(reason=f"lease at least one producer id, not {count!r}")
    ensure_system_table(catalog, SYSTEM_TABLE, {NEXT_PRODUCER_ID: "0"})
    return commit(catalog, SYSTEM_TABLE, LeaseProducerIds(count, floor=floor)).result


def producer_id_floor(producers: Mapping[str, ProducerEntry]) -> int:
    """The lowest id above every producer id in ``producers`` (0 for none)."""
    return max((int(pid) for pid in producers), default=-1) + 1


def reserve_producer_ids_below(catalog: Catalog, floor: int) -> None:
    """Never lease an id below ``floor`` in this catalog from now on.

    Producer ids come from each catalog's own allocator, so producer state that arrives from
    another catalog (a mirror) brings ids this catalog's allocator never handed out: reserve
    them before that state lands, or a new producer here would take over a mirrored one.
    A no-op (nothing committed) when the allocator is past ``floor`` already.
    """
    if floor <= 0:
        return
    ensure_system_table(catalog, SYSTEM_TABLE, {NEXT_PRODUCER_ID: "0"})
    commit(catalog, SYSTEM_TABLE, LeaseProducerIds(0, floor=floor))


# --- init (epochs) ------------------------------------------------------------------------------


@dataclass
class ProducerIdentity:
    producer_id: int
    epoch: int
    client_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "epoch": self.epoch}


@dataclass
class InitProducer(Request):
    """Register a producer on a table, or bump the epoch of the client id's existing producer."""

    state_type = LogState

    table: str
    client_id: str | None
    fresh_id: int
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        now_ms = int(time.time() * 1000)
        producers = live_producers(state.producers, now_ms, expiry_ms(table.metadata.properties))
        existing = producers.find_client(self.client_id) if self.client_id is not None else None
        if existing is not None:
            pid = existing
            epoch = producers[pid].epoch + 1
            if epoch > MAX_INT32:
                raise InvalidInput(reason=f"producer {pid} exhausted its epochs; use a new client id")
        else:
            pid, epoch = str(self.fresh_id), 0
            if pid in producers:  # never take over another producer's id, its epoch and sequences
                raise PlanOutdated(table=self.table, what=f"the producer ids (id {pid} is taken here)")
        # A new epoch starts its sequences at 0, as in Kafka; older epochs are fenced from now on.
        producers = producers.with_entry(pid, ProducerEntry(client=self.client_id, epoch=epoch, last_ms=now_ms))
        return Decision(state=replace(state, producers=producers), result=ProducerIdentity(int(pid), epoch, self.client_id))

    def receipt(self, result: ProducerIdentity) -> list[int]:
        return [result.producer_id, result.epoch]

    def from_receipt(self, receipt: list[int]) -> ProducerIdentity:
        return ProducerIdentity(receipt[0], receipt[1], self.client_id)


def init_producer(catalog: Catalog, table: str, client_id: str | None = None) -> ProducerIdentity:
    """Initialise a producer for ``table``.

    With a ``client_id`` that already has a producer here, returns the same producer id with
    the epoch bumped: every batch of an older epoch is rejected from then on.

    Raises:
        InvalidInput: empty client id.
        UnknownTable: no such table.
        ReadOnlyTable: a mirror target that was not promoted.
        InvalidIdentifier: a system table (``icelog_system.*``).
    """

    if client_id is not None and (not isinstance(client_id, str) or not client_id.strip() or len(client_id) > 256):
        raise InvalidInput(reason="a client id is a non-empty string of at most 256 characters")
    log_table = LogTable.open(catalog, table)
    metadata = log_table.table().metadata
    check_writable(log_table.identifier, metadata, InitProducer)  # before leasing an id for nothing
    # Above every id the table holds: ids mirrored from another catalog (a promoted mirror) were
    # never leased here.
    floor = producer_id_floor(LogState.from_metadata(metadata).producers)
    fresh = lease_producer_ids(catalog, 1, floor)[0]
    return commit(catalog, log_table.identifier, InitProducer(log_table.identifier, client_id, fresh)).result


# --- rebuild from rows --------------------------------------------------------------------------


def derive_state(table: Table, snapshot_id: int | None = None) -> dict[str, ProducerEntry]:
    """Producer state as the rows say it is: the newest epoch per producer, last batches per partition.

    A batch is a run of rows of one (producer, epoch, partition) committed together (one
    ``log_timestamp``). Client ids and fenced-but-unused epochs are not in rows.
    """
    import duckdb

    paths = planned_paths(table, snapshot_id)
    if not paths:
        return {}
    with duckdb.connect() as con:
        rows = con.execute(
            f"""
            SELECT producer_id, producer_epoch, log_partition, min(producer_seq), max(producer_seq),
                   min(log_offset), max(log_offset) + 1, epoch_ms(max(log_timestamp))
            FROM {parquet_from(con, paths, table.io)}
            WHERE producer_id IS NOT NULL
            GROUP BY producer_id, producer_epoch, log_partition, log_timestamp
            ORDER BY producer_id, log_partition, min(log_offset)
            """
        ).fetchall()
    derived: dict[str, ProducerEntry] = {}
    sequences: dict[str, dict[int, PartitionSequences]] = {}  # each entry's partitions, built in place
    for pid, epoch, p, first_seq, last_seq, base, nxt, last_ms in rows:
        key = str(pid)
        entry = derived.get(key)
        if entry is not None and epoch < entry.epoch:
            continue
        if entry is None or epoch > entry.epoch:  # a newer epoch starts its sequences anew
            sequences[key] = {}
            entry = ProducerEntry(
                client=None, epoch=epoch, last_ms=last_ms if entry is None else entry.last_ms, partitions=sequences[key]
            )
        seen = sequences[key]
        seen[p] = seen.get(p, PartitionSequences()).written(WrittenBatch(first_seq, last_seq, base, nxt), BATCHES_KEPT)
        derived[key] = replace(entry, last_ms=max(entry.last_ms, last_ms))
    return derived


def merge_derived(stored: Mapping[str, ProducerEntry], derived: Mapping[str, ProducerEntry]) -> dict[str, ProducerEntry]:
    """What rebuild writes: rows win for sequences; stored state adds client ids and newer epochs."""
    merged = dict(derived)
    for pid, entry in stored.items():
        mine = merged.get(pid)
        if mine is None:
            merged[pid] = entry
            continue
        mine = replace(mine, client=entry.client, last_ms=max(mine.last_ms, entry.last_ms))
        if entry.epoch > mine.epoch:
            mine = replace(mine, epoch=entry.epoch, partitions=entry.partitions)
        merged[pid] = mine
    return merged


@dataclass
class RebuildProducers(Request):
    state_type = LogState

    table: str
    commit_id: str = ""

    def decide(self, state: LogState, table: Table) -> Decision:
        merged = merge_derived(state.producers, derive_state(table))
        return Decision(state=replace(state, producers=merged), result=merged, write=merged != state.producers)


def rebuild(catalog: Catalog, table: str) -> dict[str, ProducerEntry]:
    """Recompute producer state from the rows and store it (decided on the base it replaces)."""

    log_table = LogTable.open(catalog, table)
    outcome = commit(catalog, log_table.identifier, RebuildProducers(log_table.identifier))
    if outcome.result is None:  # it landed on an attempt whose response was lost: the state it left, as now
        return dict(log_table.state().producers)
    return outcome.result


# --- a client that counts for you -------------------------------------------------------------


class Producer:
    """An idempotent producer on one log table that tracks its own sequence numbers.

    Like Kafka's idempotent producer: callers never count sequences. A send that raised a
    :class:`storage.errors.TransientError` (the outcome may be unknown) is re-sent with
    the same rows and gets the same sequences, so it lands once; its original offsets come
    back with ``duplicate=True`` if the first attempt had landed.

    A new instance with the same ``client_id`` bumps the epoch: every older instance is
    fenced from then on (:class:`storage.errors.ProducerFenced`).

    Example::

        producer = Producer(catalog, "db.events", client_id="orders-writer")
        producer.send({0: [{"key": "k", "value": "v"}]})
    """

    def __init__(self, catalog: Catalog, table: str, client_id: str | None = None) -> None:

        self.log_table = LogTable.open(catalog, table)
        self.identity = init_producer(catalog, self.log_table.identifier, client_id)
        self._next: dict[int, int] = {}

    @property
    def producer_id(self) -> int:
        return self.identity.producer_id

    @property
    def epoch(self) -> int:
        return self.identity.epoch

    def next_sequence(self, partition: int) -> int:
        return self._next.get(partition, 0)

    def send(self, rows: Mapping[int, Any], expected_offsets: Mapping[int, int] | None = None) -> Any:
        """Append ``rows`` (per partition) idempotently; see :meth:`storage.log.table.LogTable.append`.

        Returns:
            The :class:`storage.log.table.AppendResult`; ``duplicate`` is True if an earlier
            attempt of this very send had landed.
        """
        batch = ProducerBatch(self.producer_id, self.epoch, {p: self.next_sequence(p) for p in rows})
        result = self.log_table.append(rows, expected_offsets, producer=batch)
        for p, (base, nxt) in result.ranges.items():
            self._next[p] = batch.first_sequences[p] + (nxt - base)
        return result

"""Produce: record batches to conditional appends, coalesced per table, acknowledged after the commit.

Every batch waits in its table's queue for the linger window, which opens when the first batch
of the queue arrived (a batch that waited through the previous commit does not wait a window
more); then the queue is cut, in arrival order, into commits: the batches of plain producers (no
producer id) all go into one append, an idempotent producer's batches into one append per run in
which no partition repeats (each keeps its own sequence range, so a re-sent batch is recognised by
identity; an append that is a re-send on some partitions only is split into one append per
partition). Batches of different idempotent producers commit one after another. A batch is
acknowledged with the offsets its commit gave it, or with the error its commit raised; nothing is
acknowledged before it landed.

Kafka producer ids are icelog producer ids, leased from ``icelog_system.producer_ids``; the first
batch of an id on a table registers it there at epoch 0 (``InitProducer``), and from then on the
table's producer state admits or refuses its sequences and epochs inside each commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from kio.schema.errors import ErrorCode
from pyiceberg.catalog import Catalog

from icelog.pipelines.gateway.records import Batch
from icelog.pipelines.gateway.topics import batch_rows, has_kafka_schema
from icelog.storage import errors
from icelog.storage.core.commit import commit
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import InitProducer

log = logging.getLogger(__name__)


def error_code(error: BaseException) -> ErrorCode:
    """The Kafka error a failed append answers with."""
    table = [
        (errors.DuplicateSequence, ErrorCode.duplicate_sequence_number),
        (errors.OutOfOrderSequence, ErrorCode.out_of_order_sequence_number),
        ((errors.ProducerFenced, errors.InvalidProducerEpoch), ErrorCode.invalid_producer_epoch),
        (errors.UnknownProducer, ErrorCode.unknown_producer_id),
        ((errors.UnknownPartition, errors.UnknownTable, errors.NotALogTable), ErrorCode.unknown_topic_or_partition),
        ((errors.InvalidIdentifier, errors.ReadOnlyTable), ErrorCode.invalid_topic_exception),
        (errors.InvalidInput, ErrorCode.invalid_record),
        (errors.TransientError, ErrorCode.kafka_storage_error),
    ]
    for kinds, code in table:
        if isinstance(error, kinds):
            return code
    return ErrorCode.unknown_server_error


@dataclass
class Pending:
    partition: int
    batch: Batch
    done: asyncio.Future = field(repr=False)
    arrived: float = 0.0  # the event loop's clock when it was queued

    @property
    def producer(self) -> tuple[int, int] | None:
        return (self.batch.producer_id, self.batch.producer_epoch) if self.batch.idempotent else None


@dataclass(frozen=True)
class Acked:
    error: ErrorCode
    base_offset: int = -1
    message: str | None = None


def commit_groups(items: list[Pending]) -> list[list[Pending]]:
    """Cut the queue into appends, keeping each producer's batches per partition in order."""
    groups: list[list[Pending]] = []
    open_group: dict[Any, list[Pending]] = {}  # the group a producer's next batch may join
    for item in items:
        key = item.producer
        group = open_group.get(key)
        if group is None or (key is not None and any(i.partition == item.partition for i in group)):
            group = []
            groups.append(group)
            open_group[key] = group
        group.append(item)
    return groups


class Appender:
    """One queue and one committing task per table; commits run in threads."""

    def __init__(self, catalog: Catalog, linger_ms: float) -> None:
        self.catalog = catalog
        self.linger = linger_ms / 1000
        self.queues: dict[str, list[Pending]] = {}
        self.wakeups: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.tables: dict[str, LogTable] = {}
        self.kafka_schema: dict[str, bool] = {}  # per table, checked once
        self.registered: set[tuple[str, int]] = set()
        self.committed = asyncio.Condition()  # notified after every commit (long-polling fetches wait on it)
        self.closing = False

    def submit(self, table: str, partition: int, batch: Batch) -> asyncio.Future:
        """Queue ``batch``; the future gets its :class:`Acked` once its commit landed or failed."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if self.closing:
            done.set_result(Acked(ErrorCode.not_leader_or_follower, message="the gateway is stopping"))
            return done
        self.queues.setdefault(table, []).append(Pending(partition, batch, done, loop.time()))
        if table not in self.tasks:
            self.wakeups[table] = asyncio.Event()
            self.tasks[table] = asyncio.create_task(self._run(table))
        self.wakeups[table].set()
        return done

    async def _run(self, table: str) -> None:
        wakeup = self.wakeups[table]
        loop = asyncio.get_running_loop()
        while True:
            await wakeup.wait()
            # The window opens when its first batch arrives: one that waited through the previous
            # commit is committed next, not held for another whole window.
            queue = self.queues[table]
            opened = queue[0].arrived if queue else loop.time()
            await asyncio.sleep(max(0.0, opened + self.linger - loop.time()))
            wakeup.clear()
            items, self.queues[table] = self.queues[table], []
            for group in commit_groups(items):
                acks = await asyncio.to_thread(self._commit, table, group)
                for item, ack in zip(group, acks, strict=True):
                    if not item.done.done():
                        item.done.set_result(ack)
            async with self.committed:
                self.committed.notify_all()
            if self.closing and not self.queues[table]:
                return

    async def close(self) -> None:
        """Refuse new batches and wait until every queued one is committed (or refused)."""
        self.closing = True
        for table, task in list(self.tasks.items()):
            self.wakeups[table].set()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- in a thread -------------------------------------------------------------------------

    def _commit(self, table: str, group: list[Pending]) -> list[Acked]:
        try:
            log_table = self.tables.get(table) or LogTable.open(self.catalog, table)
            self.tables[table] = log_table
            if table not in self.kafka_schema:
                self.kafka_schema[table] = has_kafka_schema(log_table.payload_schema())
            if not self.kafka_schema[table]:
                return [Acked(ErrorCode.invalid_record, message=f"{table} does not have the Kafka record schema")] * len(group)
            producer = group[0].producer
            rows: dict[int, list[pa.Table]] = {}
            for item in group:
                rows.setdefault(item.partition, []).append(batch_rows(item.batch))
            batch = None
            if producer is not None:
                self._register(log_table, *producer)
                batch = ProducerBatch(producer[0], producer[1], {i.partition: i.batch.base_sequence for i in group})
            result = log_table.append({p: pa.concat_tables(ts) for p, ts in rows.items()}, producer=batch)
        except errors.PartlyDuplicate:
            # A client re-sends its unanswered batches one partition at a time, so a re-send can
            # share a window with the next new batch of another partition. Nothing was written.
            return [ack for item in group for ack in self._commit(table, [item])]
        except Exception as e:  # noqa: BLE001 - every failure is an answer to the batches, never a crash
            if not isinstance(e, errors.IcelogError):
                log.exception("append to %s failed", table)
            return [Acked(error_code(e), message=str(e))] * len(group)
        acks, next_base = [], {p: r[0] for p, r in result.ranges.items()}
        for item in group:
            acks.append(Acked(ErrorCode.none, next_base[item.partition]))
            next_base[item.partition] += len(item.batch)
        return acks

    def _register(self, log_table: LogTable, producer_id: int, epoch: int) -> None:
        """Make the Kafka producer id a producer of this table (epoch 0), once."""
        key = (log_table.identifier, producer_id)
        if key in self.registered:
            return
        if str(producer_id) not in log_table.state().producers:
            if epoch != 0:
                raise errors.UnknownProducer(table=log_table.identifier, producer_id=producer_id)
            try:
                commit(self.catalog, log_table.identifier, InitProducer(log_table.identifier, None, producer_id))
            except errors.PlanOutdated:
                pass  # another gateway registered it meanwhile
        self.registered.add(key)

"""Commit latency as the state every commit rewrites grows.

Watermarks (one per partition) and idempotent-producer state (one entry per active producer)
live in table properties, so every commit carries them. Two figures, each beside a small table
measured in the same run, samples interleaved so that load spikes on a shared machine hit both:

* append p50 at 10,000 partitions beside 10 partitions;
* idempotent append p50 with 10,000 active producers beside one producer (10 partitions each).

The producer entries are seeded in one commit through the commit core, shaped as
``storage.log.sequences.admit`` leaves them (a client id, a few remembered batches), instead of
20,000 init commits. ``python -m tests.bench.state_scale [--quick]`` runs it alone.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from pyiceberg.table import Table

from icelog.storage.core.commit import Decision, Request, commit
from icelog.storage.log.producer_state import PartitionSequences, ProducerEntry, WrittenBatch
from icelog.storage.log.sequences import BATCHES_KEPT, ProducerBatch
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from tests.bench.run import batch, catalog

Record = Callable[..., None]


@dataclass
class SeedProducers(Request):
    """Register ``count`` active producers at once, each with ``BATCHES_KEPT`` remembered batches."""

    state_type = LogState

    count: int
    partitions: int
    first_id: int = 1_000_000
    commit_id: str = ""

    def decide(self, state: Any, table: Table) -> Decision:
        now_ms = int(time.time() * 1000)
        producers = dict(state.producers)
        for i in range(self.count):
            base = 1_000_000 + 10 * i
            batches = tuple(WrittenBatch(5 * b, 5 * b + 4, base + 5 * b, base + 5 * b + 5) for b in range(BATCHES_KEPT))
            partitions = {i % self.partitions: PartitionSequences(5 * BATCHES_KEPT - 1, batches)}
            producers[str(self.first_id + i)] = ProducerEntry(f"client-{i}", 0, now_ms, partitions)
        return Decision(state=replace(state, producers=producers), result=None)


def _p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _interleaved(samples: int, *appends: Callable[[int], None]) -> list[list[float]]:
    """Time each append function ``samples`` times, taking turns."""
    timings: list[list[float]] = [[] for _ in appends]
    for i in range(samples):
        for fn, out in zip(appends, timings, strict=True):
            started = time.perf_counter()
            fn(i)
            out.append(time.perf_counter() - started)
    return timings


def bench_partitions(root: Path, partitions: int, samples: int, record: Record) -> None:
    cat = catalog(root / "partitions")
    small = LogTable.create(cat, "bench.small", partitions=10)
    large = LogTable.create(cat, "bench.large", partitions=partitions)
    rows = batch(100)
    for p in range(0, partitions, max(1, partitions // 50)):  # non-trivial watermarks across the table
        large.append({p: rows})
    for p in range(10):
        small.append({p: rows})
    pick = random.Random(14)
    small_lat, large_lat = _interleaved(
        samples,
        lambda i: small.append({i % 10: rows}),
        lambda i: large.append({pick.randrange(partitions): rows}),
    )
    props = large.table().metadata.properties
    record(
        f"append 100 rows p50 @ {partitions:,} partitions",
        _p50(large_lat),
        "ms",
        "the same @ 10 partitions p50",
        _p50(small_lat),
        "<= 1.5x",
    )
    record(f"watermark state @ {partitions:,} partitions", len(props.get("icelog.watermarks", "")) / 1024, "KiB")


def bench_producers(root: Path, producers: int, samples: int, record: Record) -> None:
    cat = catalog(root / "producers")
    one = LogTable.create(cat, "bench.one", partitions=10)
    many = LogTable.create(cat, "bench.many", partitions=10)
    commit(cat, many.identifier, SeedProducers(producers, 10))
    mine = {t.identifier: init_producer(cat, t.identifier, "bench") for t in (one, many)}
    rows = batch(100)

    def send(t: LogTable) -> Callable[[int], None]:
        me = mine[t.identifier]
        return lambda i: t.append({i % 10: rows}, producer=ProducerBatch(me.producer_id, me.epoch, {i % 10: (i // 10) * 100}))

    warm = 10
    for i in range(warm):
        send(one)(i)
        send(many)(i)
    one_lat, many_lat = _interleaved(samples, lambda i: send(one)(i + warm), lambda i: send(many)(i + warm))
    props = many.table().metadata.properties
    record(
        f"idempotent append p50, {producers:,} active producers",
        _p50(many_lat),
        "ms",
        "the same with 1 producer p50",
        _p50(one_lat),
        "<= 1.5x",
    )
    record(f"producer state, {producers:,} active producers", len(props.get("icelog.producers", "")) / 1024, "KiB")


def bench_state_scale(root: Path, quick: bool, record: Record) -> None:
    """Record append p50 at 10,000 partitions and with 10,000 active producers, each beside a small table."""
    size, samples = (500, 8) if quick else (10_000, 40)
    bench_partitions(root, size, samples, record)
    bench_producers(root, size, samples, record)


if __name__ == "__main__":
    import argparse

    from tests.bench.run import record as print_record

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        bench_state_scale(Path(directory), args.quick, print_record)

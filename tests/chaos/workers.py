"""Chaos workers: ``python -m tests.chaos.workers KIND ARGS_JSON``.

Every worker owns a directory (``args["dir"]``) holding:

* ``ack.jsonl``: one line per acknowledged call, written (flushed and fsync'd) only *after*
  the call returned success. A kill between the call and its line leaves the call's
  outcome unknown: the checks allow its rows once or not at all, never twice.
* ``state.json``: what the worker must reuse after a restart (producer id, epoch and next
  sequence; the batch number in flight), replaced atomically.

SIGTERM asks a worker to stop cleanly: it finishes the current step and exits 0. A worker
that hits an unknown outcome it cannot resolve in place (``TransientError`` in the middle of a
transaction or a group commit) exits with :data:`RESTART_ME`; the controller restarts it, and
the restarted process resolves the outcome from durable state, as after a kill.

An error of no icelog type (a raw ``OSError`` from a full disk, a raw SQLAlchemy error while
the catalog database is down) ends a worker with :data:`UNTYPED`: the controller records it
(the product should have raised a typed error) and restarts the worker, which again resolves
its last call from durable state.

With ``args["drain"]``, a worker runs until its work is complete (the copier's and the
group's positions at the log end, the mirror up to date) and then exits 0.
"""

from __future__ import annotations

import faulthandler
import signal

_stopping = False


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001
    global _stopping
    _stopping = True


if __name__ == "__main__":  # not when the controller imports this module
    # Before the slow imports below: a SIGTERM during start-up is a clean stop too.
    signal.signal(signal.SIGTERM, _on_sigterm)
    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, on demand

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from icelog.storage.errors import AbortableError, OffsetMismatch, StaleGeneration, TransientError  # noqa: E402
from icelog.storage.log.table import AppendRequest, LogTable  # noqa: E402
from icelog.storage.producers.journal import TransactionAborted  # noqa: E402
from tests.support.catalogs import CatalogSpec  # noqa: E402

RESTART_ME = 75
UNTYPED = 76  # ended by an error of no icelog type (see the module docstring)
KEYS = 24  # distinct keys across all writers: the consumer group shares them by hash range


def batch_rows(worker: str, batch: int, size: int) -> list[dict[str, str]]:
    """The rows of a writer's batch: the same for every attempt, unique across the run."""
    return [{"key": f"k{(batch * size + i) % KEYS}", "value": f"{worker}:{batch}:{i}"} for i in range(size)]


class WorkerFiles:
    """A worker's acknowledgement log and restart state."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.acks = self.dir / "ack.jsonl"
        self.state_path = self.dir / "state.json"

    def ack(self, **fields: Any) -> None:
        with open(self.acks, "a") as f:
            f.write(json.dumps({"t": time.time(), **fields}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def state(self) -> dict[str, Any] | None:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else None

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)


def _catalog(args: dict, key: str = "spec"):
    return CatalogSpec(**args[key]).open()


def _until_stopped(step: Callable[[], bool], pause_s: float = 0.0) -> None:
    """Run ``step`` until SIGTERM (or until it returns True: its work is done)."""
    while not _stopping:
        if step():
            return
        if pause_s:
            time.sleep(pause_s)


def producer(args: dict) -> None:
    """An idempotent producer: a batch is re-sent with the same (id, epoch, sequence) until
    acknowledged, across restarts (the id, epoch and sequence live in ``state.json``)."""
    from icelog.storage.log.sequences import ProducerBatch
    from icelog.storage.producers.idempotent import init_producer

    files, name, p, size = WorkerFiles(args["dir"]), args["name"], args["partition"], args["batch"]
    catalog = _catalog(args)
    log_table = LogTable(catalog, args["table"])
    state = files.state()
    if state is None:
        try:
            identity = init_producer(catalog, log_table.identifier, name)
        except TransientError:
            sys.exit(RESTART_ME)  # a new instance inits again (a new epoch: the same rows, once)
        state = {"producer_id": identity.producer_id, "epoch": identity.epoch, "sequence": 0, "batch": 0}
        files.save(state)

    def step() -> bool:
        b = state["batch"]
        batch = ProducerBatch(state["producer_id"], state["epoch"], {p: state["sequence"]})
        try:
            result = log_table.append({p: batch_rows(name, b, size)}, producer=batch)
        except TransientError:
            return False  # unknown outcome: the re-send carries the same sequence
        files.ack(kind="producer", batch=b, partition=p, rows=size, range=list(result.ranges[p]), duplicate=result.duplicate)
        state.update(sequence=state["sequence"] + size, batch=b + 1)
        files.save(state)
        return False

    _until_stopped(step, args.get("pause_s", 0.0))


def appender(args: dict) -> None:
    """Conditional appends: read the log end, append expecting it, re-bootstrap on
    ``OffsetMismatch``. The batch's commit id is fixed, so an unknown outcome is resolved by
    the commit core's commit-id lookup, never by a blind second append."""
    files, name, p, size = WorkerFiles(args["dir"]), args["name"], args["partition"], args["batch"]
    log_table = LogTable(_catalog(args), args["table"])
    state = files.state() or {"batch": 0, "mismatches": 0}

    def step() -> bool:
        b = state["batch"]
        expected = log_table.watermarks()[p].end
        try:
            result = log_table.append({p: batch_rows(name, b, size)}, {p: expected}, commit_id=f"{name}-{b}")
        except OffsetMismatch:
            state["mismatches"] += 1
            return False
        except TransientError:
            return False
        files.ack(
            kind="appender",
            batch=b,
            partition=p,
            rows=size,
            range=list(result.ranges[p]),
            expected=expected,
            duplicate=result.duplicate,
        )
        state["batch"] = b + 1
        files.save(state)
        return False

    _until_stopped(step, args.get("pause_s", 0.0))


def copier(args: dict) -> None:
    """Transactional consume–transform–produce: source rows ``(p, o, value)`` become output
    rows ``key="p:o", value=value.upper()`` in partition p, committed with the group's new
    position in one transaction. ``init_transactions`` settles what a killed instance left."""
    from icelog.storage.groups.offsets import committed_offsets
    from icelog.storage.producers.transactional import TransactionalProducer

    files = WorkerFiles(args["dir"])
    catalog = _catalog(args)
    src, out, group = LogTable(catalog, args["src"]), args["out"], args["group"]
    producer = TransactionalProducer(catalog, args["tid"])
    try:
        producer.init_transactions()  # rolls forward or aborts what a killed instance left
    except TransientError:
        sys.exit(RESTART_ME)
    turn = [0]

    def step() -> bool:
        positions = committed_offsets(catalog, group, src.identifier)
        ends = {p: w.end for p, w in src.watermarks().items()}
        pending = [p for p in sorted(ends) if positions.get(p, 0) < ends[p]]
        if not pending:
            if args.get("drain"):
                return True
            time.sleep(0.2)
            return False
        p = pending[turn[0] % len(pending)]
        turn[0] += 1
        start = positions.get(p, 0)
        rows = src.read(p, start, min(ends[p], start + args["batch"]))
        offsets, values = rows.column("log_offset").to_pylist(), rows.column("value").to_pylist()
        try:
            with producer.transaction():
                producer.send(out, p, [{"key": f"{p}:{o}", "value": v.upper()} for o, v in zip(offsets, values, strict=False)])
                producer.send_offsets_to_transaction({(src.identifier, p): start + len(offsets)}, group)
        except TransientError:
            sys.exit(RESTART_ME)  # the transaction's outcome is unknown: a new instance settles it
        except AbortableError:
            return False
        files.ack(kind="copier", partition=p, start=start, end=start + len(offsets))
        return False

    _until_stopped(step)


def mirror_loop(args: dict) -> None:
    """Mirror steps to the target catalog (a step resumes where the target ends)."""
    from icelog.storage.replication.mirror import mirror

    files = WorkerFiles(args["dir"])
    source, target = _catalog(args), _catalog(args, "target_spec")

    def step() -> bool:
        try:
            result = mirror(source, args["table"], target, principal=args["principal"])
        except (TransientError, AbortableError):
            return False
        files.ack(kind="mirror", ranges={str(p): list(r) for p, r in result.ranges.items()}, up_to_date=result.up_to_date)
        if args.get("drain"):
            ends = {p: w.end for p, w in LogTable(source, args["table"]).watermarks().items()}
            return result.up_to_date and all(result.log_ends.get(p) == e for p, e in ends.items())
        return False

    _until_stopped(step, 0.2)


def member(args: dict) -> None:
    """A consumer-group member: each polled batch becomes output rows (source key, value
    ``"p:o"``) committed with the batch's offsets in one atomic commit (``commit(also=...)``).
    With ``args["out"]`` None (a REST catalog: no atomic multi-table commit), it commits the
    batch's offsets alone. On a REST catalog the commit is a transaction (see
    ``Consumer.commit``). The ack lists the processed ``[p, o, key]`` only after the commit
    returned."""
    from icelog.storage.groups.consumer import Consumer
    from icelog.storage.groups.offsets import committed_offsets

    files = WorkerFiles(args["dir"])
    catalog = _catalog(args)
    out = LogTable(catalog, args["out"]) if args.get("out") else None
    src = LogTable(catalog, args["src"])
    consumer = Consumer(catalog, args["group"], member_id=args["name"], session_timeout_ms=args["session_ms"])
    try:
        consumer.subscribe(src.identifier)
    except TransientError:
        sys.exit(RESTART_ME)

    size = args["batch"] * (10 if args.get("drain") else 1)  # draining alone: catch up faster

    def step() -> bool:
        try:
            batches = consumer.poll(size)
        except TransientError:
            return False
        if not batches:
            if args.get("drain"):
                ends = {p: w.end for p, w in src.watermarks().items()}
                done = committed_offsets(catalog, args["group"], src.identifier)
                if all(done.get(p, 0) >= e for p, e in ends.items()):
                    return True
            time.sleep(0.1)
            return False
        processed = [
            [p, o, k]
            for b in batches
            for p, o, k in zip(
                b.column("log_partition").to_pylist(),
                b.column("log_offset").to_pylist(),
                b.column("key").to_pylist(),
                strict=False,
            )
        ]
        also = []
        if out is not None:
            rows = [{"key": k, "value": f"{p}:{o}"} for p, o, k in processed]
            also.append((out.identifier, AppendRequest(out.identifier, out.conform({0: rows}), {}, uuid.uuid4().hex, None)))
        try:
            consumer.commit(also=also)
        except (StaleGeneration, TransactionAborted):
            return False  # rebalanced (or, on REST, its transaction timed out): fetched again
        except TransientError:
            sys.exit(RESTART_ME)  # unknown outcome: restart from the group's durable state
        files.ack(kind="member", generation=consumer.generation, processed=processed)
        return False

    _until_stopped(step)
    try:
        consumer.close()  # a clean stop leaves the group at once
    except (TransientError, AbortableError):
        pass


def maintainer(args: dict) -> None:
    """Compaction, snapshot expiry and orphan cleanup (orphans older than a week only, so no
    in-flight file of the run is ever deleted) over the tables, in turn. Retention runs on
    the tables whose ``icelog.retention.*`` properties set it (the soak table)."""
    from icelog.storage.admin.maintenance import maintain

    files = WorkerFiles(args["dir"])
    catalog = _catalog(args)
    turn = [0]

    def step() -> bool:
        if args.get("drain") and turn[0] >= len(args["tables"]):
            return True  # draining: one pass over every table (the soak's retention sees its whole history)
        table = args["tables"][turn[0] % len(args["tables"])]
        turn[0] += 1
        try:
            report = maintain(catalog, table, compact=True, keep_snapshots=args.get("keep_snapshots", 20), orphan_age_s=7 * 86400)
        except (TransientError, AbortableError):
            if args.get("drain"):
                turn[0] -= 1  # draining: that table again
            return False
        files.ack(kind="maintainer", table=table, **{k: v for k, v in report.items() if k not in ("started", "table")})
        return False

    _until_stopped(step, args.get("pause_s", 1.0))


DRAIN_TAIL = 5  # soak commits made while draining, after the final maintenance pass


def soak(args: dict) -> None:
    """The soak: conditional appends to a table of its own, one after another, timed.

    Each append's latency is kept (in ``state.json``, so a restart loses none); every
    ``window`` commits a ``soak-window`` line records the window's p50/p95/max latency and the
    table's current metadata JSON size, snapshots, manifests and commit-id registry length.
    Batches are acknowledged like an appender's, with ``sent`` (the wall time the call began:
    no row of the batch is older), so retention on this table can be checked exactly.
    Draining, it runs until ``commits`` batches are acknowledged and at least ``DRAIN_TAIL`` of
    them in the drain itself: rows younger than the last retention pass, so the final table
    always holds soak rows above ``log_start`` however early the fault phase reached ``commits``.
    """
    files, name, size, window = WorkerFiles(args["dir"]), args["name"], args["batch"], args["window"]
    log_table = LogTable(_catalog(args), args["table"])
    state = files.state() or {"batch": 0, "latencies": [], "windows": 0}
    drained = [0]

    def step() -> bool:
        b = state["batch"]
        if args.get("drain") and b >= args["commits"] and drained[0] >= DRAIN_TAIL:
            return True
        expected = log_table.watermarks()[0].end
        sent, started = time.time(), time.monotonic()
        try:
            result = log_table.append({0: batch_rows(name, b, size)}, {0: expected}, commit_id=f"{name}-{b}")
        except (OffsetMismatch, TransientError):
            return False
        state["latencies"].append(time.monotonic() - started)
        files.ack(
            kind="soak",
            batch=b,
            partition=0,
            rows=size,
            range=list(result.ranges[0]),
            expected=expected,
            duplicate=result.duplicate,
            sent=sent,
        )
        state["batch"], drained[0] = b + 1, drained[0] + 1
        if len(state["latencies"]) >= window:
            files.ack(
                kind="soak-window",
                index=state["windows"],
                commits=state["batch"],
                **_latency_summary(state["latencies"]),
                **table_shape(log_table),
            )
            state.update(latencies=[], windows=state["windows"] + 1)
        files.save(state)
        return False

    _until_stopped(step)


def _latency_summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(1000 * at(0.50), 1), "p95_ms": round(1000 * at(0.95), 1), "max_ms": round(1000 * ordered[-1], 1)}


def table_shape(log_table: LogTable) -> dict[str, int]:
    """What commit cost grows with: the metadata JSON's size and what it lists."""
    from icelog.storage.core.registry import all_commits

    table = log_table.table()
    snapshot = table.current_snapshot()
    return {
        "metadata_bytes": len(table.io.new_input(table.metadata_location)),  # a local file or an S3 object
        "snapshots": len(table.metadata.snapshots),
        "manifests": len(snapshot.manifests(table.io)) if snapshot else 0,
        "commit_ids": len(all_commits(table)),
    }


KINDS = {
    "producer": producer,
    "appender": appender,
    "copier": copier,
    "mirror": mirror_loop,
    "member": member,
    "maintainer": maintainer,
    "soak": soak,
}


def main(argv: list[str]) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    kind, raw = argv
    try:
        KINDS[kind](json.loads(raw))
    except TransientError as e:
        # Typed, and retrying later can succeed (e.g. a read outside a commit while the catalog
        # is down): what a supervisor does with such an exit is restart the process.
        print(f"RESTART {type(e).__qualname__}: {e}", flush=True)
        return RESTART_ME
    except (OSError, SQLAlchemyError) as e:
        import traceback

        traceback.print_exc()
        print(f"UNTYPED {type(e).__module__}.{type(e).__qualname__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        return UNTYPED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

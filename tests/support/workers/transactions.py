"""Worker processes for the transaction tests (``tests/storage/producers/test_transactions.py``).

``python -m tests.support.workers.transactions MODE SPEC_JSON ARGS_JSON``

Every mode prints one JSON line per event on stdout, flushed at once, so a test that
redirects stdout to a file and kills the process with SIGKILL still reads every event
that happened before the kill. Modes:

* ``one``: one transaction: ``+k`` to table ``a``, ``-k`` to table ``b`` and the group's
  position on ``src``. ``pause`` names a fault point of ``storage.core.faults``; the worker
  arms it (sets ``ICELOG_PAUSE_AT``) at the moment that makes it hit *this* transaction's
  step, since some points (``after_catalog_swap``) fire in every commit.
* ``loop``: ``n`` transactions of ``+k`` / ``-k`` (the sum over both tables stays 0), some
  with expected offsets; reports each outcome (committed, or the typed error).
* ``reader``: polls consistent cuts of two tables (``storage.core.swap.load_tables``), sums
  each table's ``value`` column with DuckDB over the planned files, until a stop file appears.
* ``abort``: one transaction aborted by its own producer, ``pause`` armed just before the abort.
* ``copier``: consume-transform-produce: reads ``src`` from the group's committed
  position, writes transformed rows to ``out`` and the new position in one transaction,
  batch by batch, until the group's position reaches the source's log end.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time

from icelog.storage.core import faults
from icelog.storage.errors import IcelogError
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.producers.transactional import TransactionalProducer
from tests.support.catalogs import CatalogSpec

# When to arm each fault point so that it pauses inside the transaction's own step.
ARM = {
    faults.AFTER_TXN_BEGIN: "before_first_send",  # a's partition registered (BEGIN), nothing staged
    faults.AFTER_TXN_STAGE: "before_last_send",  # a and b registered, both files staged
    faults.AFTER_TXN_PREPARE: "before_commit",
    faults.BETWEEN_TABLE_SWAPS: "before_commit",  # only multi-table commits reach it
    faults.AFTER_CATALOG_SWAP: "at_prepare",  # not the PREPARE commit's swap: the atomic commit's
}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def arm(point: str) -> None:
    faults.set_pause(point)


def _arm_at_checkpoint(trigger: str, point: str) -> None:
    """Arm ``point`` when the process passes ``trigger`` (storage calls faults.checkpoint)."""
    original = faults.checkpoint

    def checkpoint(name: str) -> None:
        if name == trigger:
            arm(point)
        original(name)

    faults.checkpoint = checkpoint


def one(catalog, args: dict) -> None:
    pause = args.get("pause")
    when = ARM.get(pause) if pause else None
    if when == "at_prepare":
        _arm_at_checkpoint(faults.AFTER_TXN_PREPARE, pause)
    producer = TransactionalProducer(catalog, args["tid"])
    emit(event="init", **producer.init_transactions())
    txn_id = producer.begin_transaction()
    emit(event="begin", txn_id=txn_id)
    k = args["k"]
    if when == "before_first_send":
        arm(pause)
    producer.send(args["a"], 0, [{"key": f"{txn_id}:a", "value": str(k)}])
    if when == "before_last_send":
        arm(pause)
    producer.send(args["b"], 0, [{"key": f"{txn_id}:b", "value": str(-k)}])
    if args.get("src"):
        producer.send_offsets_to_transaction({(args["src"], 0): args["position"]}, args["group"])
    if when == "before_commit":
        arm(pause)
    if args.get("legacy_prepare"):
        prepare_as_before_the_fast_path(producer)
    ranges = producer.commit_transaction()
    emit(event="committed", txn_id=txn_id, ranges=ranges)


def registering(producer: TransactionalProducer) -> TransactionalProducer:
    """The producer registers every partition in the journal before staging to it, as a send of
    pre-written files does on SQL (plain sends there register nothing before the commit)."""
    producer._register = functools.partial(TransactionalProducer._register, producer, record=True)  # type: ignore[method-assign]
    return producer


def prepare_as_before_the_fast_path(producer: TransactionalProducer) -> None:
    """Record the transaction PREPARE_COMMIT in the journal as versions before the SQL fast path
    did (their journals may still hold one at an upgrade), then pass the point where those
    versions paused: recovery must roll such a transaction forward."""
    from icelog.storage.producers.journal import PrepareCommit, RegisterPartitions
    from icelog.storage.producers.journal_state import Prepared, TxnOffsets

    producer._journal(RegisterPartitions, partitions={t: sorted(ps) for t, ps in producer._registered.items()})
    producer._recorded = True
    held = producer._offsets
    offsets = None if held is None else TxnOffsets(held[0], tuple((t, p, o) for (t, p), o in held[1].items()))
    prepared = Prepared(sends={t: tuple(s) for t, s in producer._sends.items()}, offsets=offsets)
    producer._journal(PrepareCommit, prepared=prepared)
    faults.checkpoint(faults.AFTER_TXN_PREPARE)


def loop(catalog, args: dict) -> None:
    """``n`` transactions; every ``expected_every``-th one sends with expected offsets."""
    rng = random.Random(args.get("seed"))
    producer = TransactionalProducer(catalog, args["tid"])
    producer.init_transactions()
    a, b = LogTable(catalog, args["a"]), LogTable(catalog, args["b"])
    if args.get("barrier"):  # start racing only when every racer is ready
        open(os.path.join(args["barrier"], args["tid"]), "w").close()
        deadline = time.monotonic() + 300
        while len(os.listdir(args["barrier"])) < args["parties"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"barrier: {os.listdir(args['barrier'])} of {args['parties']} racers arrived")
            time.sleep(0.01)
    every = args.get("expected_every", 0)
    for i in range(args["n"]):
        k = rng.randint(1, 1000)
        expected = bool(every) and i % every == 0
        txn_id = producer.begin_transaction()
        try:
            ea = a.watermarks()[0].end if expected else None
            eb = b.watermarks()[0].end if expected else None
            producer.send(args["a"], 0, [{"key": f"{txn_id}:a", "value": str(k)}], expected_offset=ea)
            producer.send(args["b"], 0, [{"key": f"{txn_id}:b", "value": str(-k)}], expected_offset=eb)
            ranges = producer.commit_transaction()
        except IcelogError as e:
            if producer.txn_id is not None:
                producer.abort_transaction()
            emit(i=i, txn_id=txn_id, status="failed", error=type(e).__name__, message=str(e), expected=expected)
            continue
        emit(i=i, txn_id=txn_id, status="committed", k=k, ranges=ranges, expected=expected)


def reader(catalog, args: dict) -> None:
    import duckdb

    from icelog.storage.core.swap import load_tables
    from icelog.storage.log.scan import planned_paths

    names = [args["a"], args["b"]]
    con = duckdb.connect()
    final = False
    while True:
        if os.path.exists(args["stop"]):
            final = True  # one last read after the writer finished
        try:
            tables = load_tables(catalog, names)
            ends, sums = [], []
            for name in names:
                table = tables[name]
                ends.append(LogState.from_metadata(table.metadata).end(0))
                paths = planned_paths(table)
                if paths:
                    sums.append(
                        con.execute(
                            "SELECT coalesce(sum(CAST(value AS BIGINT)), 0), count(*) FROM read_parquet(?)", [paths]
                        ).fetchone()
                    )
                else:
                    sums.append((0, 0))
            emit(ends=ends, sums=[int(s[0]) for s in sums], rows=[int(s[1]) for s in sums])
        except Exception as e:  # noqa: BLE001 (reported, the test fails on it)
            emit(error=repr(e))
        if final:
            return
        time.sleep(args.get("interval_s", 0.05))  # leave the writer a core


def copier(catalog, args: dict) -> None:
    """Copy ``src`` (one partition) to ``out``, ``batch`` records per transaction.

    With ``pause``, the fault point is armed once ``pause_after`` batches have committed,
    so the next transaction stops there (the test then kills the process)."""
    from icelog.storage.groups.offsets import committed_offsets

    producer = TransactionalProducer(catalog, args["tid"])
    producer.init_transactions()  # rolls forward or aborts what the killed instance left
    src, out, group = LogTable(catalog, args["src"]), args["out"], args["group"]
    end = src.watermarks()[0].end
    batches = 0
    while True:
        position = committed_offsets(catalog, group, args["src"]).get(0, 0)
        emit(event="position", position=position)
        if position >= end:
            emit(event="done", position=position)
            return
        if args.get("pause") and batches == args.get("pause_after", 0):
            trigger = ARM[args["pause"]]
            if trigger == "at_prepare":
                _arm_at_checkpoint(faults.AFTER_TXN_PREPARE, args["pause"])
            else:
                arm(args["pause"])  # every point of the copier's next transaction can hit it
        rows = src.read(0, position, min(end, position + args["batch"]))
        with producer.transaction():
            producer.send(
                out,
                0,
                [
                    {"key": f"src:{o}", "value": str(v).upper()}
                    for o, v in zip(rows.column("log_offset").to_pylist(), rows.column("value").to_pylist(), strict=False)
                ],
            )
            producer.send_offsets_to_transaction({(args["src"], 0): position + rows.num_rows}, group)
        batches += 1
        emit(event="batch", position=position + rows.num_rows)


def abort(catalog, args: dict) -> None:
    """One transaction staged to ``a`` and ``b``, then aborted by its own producer; ``pause``
    is armed just before the abort (``after_catalog_swap``: the ABORTED record has landed)."""
    producer = TransactionalProducer(catalog, args["tid"])
    emit(event="init", **producer.init_transactions())
    txn_id = producer.begin_transaction()
    emit(event="begin", txn_id=txn_id)
    producer.send(args["a"], 0, [{"key": f"{txn_id}:a", "value": "1"}])
    producer.send(args["b"], 0, [{"key": f"{txn_id}:b", "value": "-1"}])
    if args.get("record"):  # registered in the journal, as a send of pre-written files does on SQL
        producer._register(args["a"], [0], record=True)
    arm(args["pause"])
    producer.abort_transaction()
    emit(event="aborted", txn_id=txn_id)


MODES = {"one": one, "loop": loop, "reader": reader, "copier": copier, "abort": abort}

if __name__ == "__main__":
    mode, spec, raw = sys.argv[1:4]
    MODES[mode](CatalogSpec(**json.loads(spec)).open(), json.loads(raw))

"""Worker processes for the named scenarios (``tests/chaos/test_scenarios.py``).

``python -m tests.chaos.scenario_worker MODE SPEC_JSON ARGS_JSON``; one JSON line per event on
stdout (``tests.support.workers.transactions.emit``). Besides ``pause`` (stop at a fault point and wait for
SIGKILL), a worker can be *held*: ``hold`` names a fault point, ``hit`` which pass of it
(default the first); there the worker writes its pid to ``held`` and waits until the file
``release`` exists, then goes on. A held process is a delayed one: it decided (or read the
journal) long before it acts, while the live processes go on.

Modes:

* ``recover``: ``storage.producers.transactional.recover``; emits its report.
* ``abort``: ``storage.producers.transactional.abort`` for ``tid`` (the operator's tool); emits its report.
* ``zombie``: one transaction of ``+1`` to ``a`` and ``-1`` to ``b`` (hold it after its
  second send to let a newer instance take over), then commit and abort; emits each outcome.
* ``late``: one transaction of ``+1`` to ``a`` and ``-1`` to ``b`` in ``producer.transaction()``
  (hold it inside its first send, after the partition is registered and before the file is
  staged; every partition registered in the journal, see :func:`registering`); emits
  ``committed`` or the refusal.
"""

from __future__ import annotations

import json
import os
import sys
import time

from icelog.storage.core import faults
from icelog.storage.errors import IcelogError
from icelog.storage.producers import transactional as tx
from tests.support.catalogs import CatalogSpec
from tests.support.workers.transactions import arm, emit, registering


def _hold(point: str, hit: int, held: str, release: str) -> None:
    """Wait at the ``hit``-th pass of ``point`` until ``release`` exists (see module doc)."""
    original, passes = faults.checkpoint, [0]

    def checkpoint(name: str) -> None:
        if name == point:
            passes[0] += 1
            if passes[0] == hit:
                with open(held + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(held + ".tmp", held)
                deadline = time.monotonic() + 300
                while not os.path.exists(release):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"never released from {point}")
                    time.sleep(0.02)
        original(name)

    faults.checkpoint = checkpoint


def recover(catalog, args: dict) -> None:
    emit(event="report", **tx.recover(catalog))


def abort(catalog, args: dict) -> None:
    emit(event="report", **tx.abort(catalog, args["tid"]))


def zombie(catalog, args: dict) -> None:
    producer = tx.TransactionalProducer(catalog, args["tid"])
    emit(event="init", **producer.init_transactions())
    emit(event="begin", txn_id=producer.begin_transaction())
    producer.send(args["a"], 0, [{"key": "zombie", "value": "1"}])
    producer.send(args["b"], 0, [{"key": "zombie", "value": "-1"}])
    for step in ("commit_transaction", "abort_transaction"):
        try:
            getattr(producer, step)()
            emit(event=step, ok=True)
        except IcelogError as e:
            emit(event=step, error=type(e).__name__, message=str(e))


def late(catalog, args: dict) -> None:
    producer = registering(tx.TransactionalProducer(catalog, args["tid"]))
    producer.init_transactions()
    try:
        with producer.transaction():
            emit(event="begin", txn_id=producer.txn_id)
            producer.send(args["a"], 0, [{"key": "late", "value": "1"}])
            producer.send(args["b"], 0, [{"key": "late", "value": "-1"}])
        emit(event="committed")
    except IcelogError as e:
        emit(event="refused", error=type(e).__name__, message=str(e))


MODES = {"recover": recover, "abort": abort, "zombie": zombie, "late": late}

if __name__ == "__main__":
    mode, spec, raw = sys.argv[1:4]
    arguments = json.loads(raw)
    if arguments.get("pause"):
        arm(arguments["pause"])
    if arguments.get("hold"):
        _hold(arguments["hold"], arguments.get("hit", 1), arguments["held"], arguments["release"])
    MODES[mode](CatalogSpec(**json.loads(spec)).open(), arguments)

"""A group member for the cooperative-consumption kill tests (``tests/storage/groups/test_consumer_processes.py``).

``python -m tests.support.workers.consumer SPEC_JSON ARGS_JSON``

Consume–transform–produce, exactly once: each polled batch of ``src`` becomes rows of
``out`` (key, value ``"<source offset>"``), committed in one multi-table commit with the
batch's offset ranges (``Consumer.commit(also=...)``); with ``files``, as data files numbered at
``out``'s log end (``LogTable.files_request``). Prints one JSON line per event.
Once ``arm_file`` exists, the worker arms ``ICELOG_PAUSE_AT`` (``pause_point``) before its next
commit, so that commit stops at the fault point for the parent's SIGKILL. (Armed only after a
commit, a member whose share of the next round fits one batch would commit it, arm, and then sit
idle: it would never reach the point.)
Runs until ``stop_file`` exists and a poll comes back empty.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time
import uuid
from pathlib import Path

from icelog.storage.core import faults
from icelog.storage.errors import StaleGeneration
from icelog.storage.groups.consumer import Consumer
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.storage.producers.journal import TransactionAborted
from tests.support.catalogs import CatalogSpec
from tests.support.groups import output_files_request


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(spec_json: str, args_json: str) -> None:
    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, on demand
    args = json.loads(args_json)
    catalog = CatalogSpec(**json.loads(spec_json)).open()
    out = LogTable(catalog, args["out"])
    consumer = Consumer(catalog, args["group"], member_id=args["member"], session_timeout_ms=args["session_ms"])
    consumer.subscribe(args["src"], [0])
    emit(event="joined", member=args["member"], generation=consumer.generation)
    committed = 0
    idle_since = time.monotonic()
    while True:
        batches = consumer.poll(args.get("batch", 15))
        if not batches:
            if time.monotonic() - idle_since > 1.0:
                emit(event="idle", member=args["member"], generation=consumer.generation)
                idle_since = time.monotonic()
            if Path(args["stop_file"]).exists():
                break
            time.sleep(0.05)
            continue
        rows = [
            {"key": k, "value": str(o)}
            for b in batches
            for o, k in zip(b.column("log_offset").to_pylist(), b.column("key").to_pylist(), strict=False)
        ]
        time.sleep(args.get("work_s", 0.0))  # the "processing"
        if args.get("files"):  # the output as data files numbered at out's log end (a group job's executors)
            append = output_files_request(out, 0, rows)
        else:
            append = AppendRequest(out.identifier, out.conform({0: rows}), {}, uuid.uuid4().hex, None)
        if args.get("arm_file") and Path(args["arm_file"]).exists():
            faults.set_pause(args["pause_point"])
        try:
            consumer.commit(also=[(out.identifier, append)])
        except StaleGeneration as e:
            emit(event="fenced", member=args["member"], generation=e.generation, current=e.current_generation)
            continue
        except TransactionAborted as e:  # a REST catalog's commit transaction timed out: nothing committed
            emit(event="aborted", member=args["member"], reason=str(e))
            continue
        committed += 1
        emit(event="committed", member=args["member"], offsets=[int(r["value"]) for r in rows])
    consumer.close()
    emit(event="closed", member=args["member"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

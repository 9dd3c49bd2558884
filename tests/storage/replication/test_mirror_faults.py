"""I6: a mirror process killed (-9) at any point while the source is written, then resumed,
ends in parity: no gap, no duplicate, no data file referenced twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import pytest

from icelog.storage.core import faults
from icelog.storage.groups.offsets import committed_offsets
from icelog.storage.log.sequences import ProducerBatch
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from icelog.storage.producers.transactional import TransactionalProducer
from tests.support.faults import kill_at
from tests.support.mirror import PRINCIPAL, assert_parity, rows, run_mirror


def spawn(source_spec, target_spec, directory, name: str, pause_at: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "ICELOG_PAUSE_AT"}
    pause_file = directory / f"{name}.paused"
    if pause_at:
        env.update(ICELOG_PAUSE_AT=pause_at, ICELOG_PAUSE_FILE=str(pause_file))
    out = open(directory / f"{name}.out", "w")
    err = open(directory / f"{name}.err", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.workers.mirror",
            json.dumps(asdict(source_spec)),
            json.dumps(asdict(target_spec)),
            "orders",
            PRINCIPAL,
        ],
        env=env,
        stdout=out,
        stderr=err,
    )
    out.close(), err.close()
    return proc, pause_file


class SourceWriter(threading.Thread):
    """Appends, idempotent-producer batches and transactions (with group offsets) to the source."""

    def __init__(self, catalog, rounds: int) -> None:
        super().__init__(daemon=True)
        self.catalog, self.rounds, self.error = catalog, rounds, None

    def run(self) -> None:
        try:
            table = LogTable.open(self.catalog, "orders")
            me = init_producer(self.catalog, "logs.orders", "writer")
            txn = TransactionalProducer(self.catalog, "copier")
            txn.init_transactions()
            seq = 0
            for i in range(self.rounds):
                table.append({i % 3: rows(2, f"plain{i}")})
                table.append({1: rows(3, f"idem{i}")}, producer=ProducerBatch(me.producer_id, me.epoch, {1: seq}))
                seq += 3
                with txn.transaction():
                    txn.send("orders", 2, rows(2, f"txn{i}"))
                    txn.send_offsets_to_transaction(
                        {("orders", 0): LogTable.open(self.catalog, "orders").watermarks()[0].end}, "billing"
                    )
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def finish(source, target) -> None:
    run_mirror(source, target)
    assert run_mirror(source, target).up_to_date
    assert_parity(source, target)
    assert committed_offsets(target, "billing", "orders") == committed_offsets(source, "billing", "orders")


@pytest.mark.parametrize("point", [faults.AFTER_DATA_FILES, faults.BETWEEN_TABLE_SWAPS, faults.AFTER_CATALOG_SWAP])
def test_i6_mirror_killed_at_each_commit_fault_point_resumes_in_parity(source_spec, target_spec, source, target, tmp_path, point):
    LogTable.create(source, "orders", 3)
    writer = SourceWriter(source, 4)
    writer.run()  # before the kill: the groups table must change so the commit spans two tables
    assert writer.error is None, writer.error
    proc, pause_file = spawn(source_spec, target_spec, tmp_path, "victim", pause_at=point)
    kill_at(proc, pause_file)
    finish(source, target)


def test_i6_mirror_killed_at_random_points_while_source_written_resumes_in_parity(
    source_spec, target_spec, source, target, tmp_path
):
    LogTable.create(source, "orders", 3)
    writer = SourceWriter(source, 12)
    writer.start()
    rng = random.Random(6)
    kills = 0
    while writer.is_alive() or kills < 3:
        proc, _ = spawn(source_spec, target_spec, tmp_path, f"mirror{kills}")
        time.sleep(rng.uniform(0.2, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
    writer.join(timeout=300)
    assert writer.error is None, writer.error
    finish(source, target)
    assert LogTable.open(target, "orders").watermarks()[2].end == 12 * 2 + 4 * 2  # transactions, plain appends

"""Worker processes for concurrency and kill -9 tests: ``python -m tests.support.workers.log_table CMD ARGS``.

Each prints one JSON line per outcome on stdout (logs go to stderr), so the parent can
compare acknowledged writes with what the table holds. Every acknowledgement of a
conditional append carries the offset it expected, so the parent can check that it landed
exactly there (I2).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from icelog.storage.errors import ConflictError, IcelogError
from icelog.storage.log.table import LogTable
from tests.support.catalogs import CatalogSpec


def _emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _catalog(spec_json: str):
    return CatalogSpec(**json.loads(spec_json)).open()


def _table(spec_json: str, table: str) -> LogTable:
    return LogTable(_catalog(spec_json), table)


def _barrier(directory: str, parties: int, me: str, timeout: float = 120.0) -> None:
    """Wait until ``parties`` workers have arrived (one file each in ``directory``)."""
    Path(directory, me).touch()
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {directory}: {len(os.listdir(directory))} of {parties} arrived")
        time.sleep(0.01)


def conditional_once(spec_json: str, table: str, partition: int, expected: int, tag: str) -> None:
    """One conditional append; report committed (with the offset it expected) or the mismatch."""
    log_table = _table(spec_json, table)
    try:
        result = log_table.append({partition: [{"key": tag, "value": tag}]}, {partition: expected})
        _emit(tag=tag, committed=True, expected=expected, range=result.ranges[partition])
    except ConflictError as e:
        _emit(tag=tag, committed=False, expected=expected, error=e.to_dict())


def conditional_loop(
    spec_json: str, table: str, partition: int, count: int, tag: str, barrier: str = "", parties: int = 0
) -> None:
    """Append ``count`` single-row batches, each expecting the end it just read (retrying).

    With a barrier, every worker reads the log end first and then all append at once, so
    the first round is a guaranteed race of conditional appends expecting the same offset.
    Prints ``{"value", "expected", "offset"}`` per acknowledged append and
    ``{"value", "expected", "mismatch"}`` per refused one.
    """
    log_table = _table(spec_json, table)
    done = 0
    while done < count:
        end = log_table.watermarks()[partition].end
        if barrier and done == 0:
            _barrier(barrier, parties, tag)
            barrier = ""
        value = f"{tag}-{done}"
        try:
            result = log_table.append({partition: [{"key": tag, "value": value}]}, {partition: end})
        except ConflictError as e:
            _emit(value=value, expected=end, mismatch=e.to_dict())
            continue
        _emit(value=value, expected=end, offset=result.ranges[partition][0], next=result.ranges[partition][1])
        done += 1


def append_loop(spec_json: str, table: str, partition: int, count: int, tag: str) -> None:
    """``count`` unconditional single-row appends, back to back (commit pressure)."""
    log_table = _table(spec_json, table)
    for n in range(count):
        log_table.append({partition: [{"key": tag, "value": f"{tag}-{n}"}]})
    _emit(tag=tag, appended=count)


def append_rows(spec_json: str, table: str, partition: int, rows: int, tag: str, commit_id: str = "") -> None:
    """One append (used with ICELOG_PAUSE_AT to be killed mid-commit)."""
    log_table = _table(spec_json, table)
    batch = [{"key": tag, "value": f"{tag}-{i}"} for i in range(int(rows))]
    result = log_table.append({int(partition): batch}, commit_id=commit_id or None)
    _emit(tag=tag, range=result.ranges[int(partition)], duplicate=result.duplicate)


def produce_batch(
    spec_json: str, table: str, partition: int, producer_id: int, epoch: int, sequence: int, rows: int, tag: str
) -> None:
    """One idempotent batch (killed mid-commit by the fault tests, then re-sent)."""
    from icelog.storage.log.sequences import ProducerBatch

    log_table = _table(spec_json, table)
    batch = [{"key": tag, "value": f"{tag}-{sequence + i}"} for i in range(rows)]
    result = log_table.append({partition: batch}, producer=ProducerBatch(producer_id, epoch, {partition: sequence}))
    _emit(range=result.ranges[partition], duplicate=result.duplicate)


def resend_storm(spec_json: str, table: str, partition: int, producer_id: int, batches: int, size: int) -> None:
    """Send batches 0..n-1 in order, each until acknowledged (written or duplicate)."""
    from icelog.storage.errors import DuplicateSequence, TransientError
    from icelog.storage.log.sequences import ProducerBatch

    log_table = _table(spec_json, table)
    for b in range(batches):
        rows = [{"key": f"b{b}", "value": str(b * size + i)} for i in range(size)]
        while True:
            try:
                result = log_table.append({partition: rows}, producer=ProducerBatch(producer_id, 0, {partition: b * size}))
            except DuplicateSequence:
                _emit(batch=b, duplicate=True, range=None)
                break
            except TransientError:
                continue
            _emit(batch=b, duplicate=result.duplicate, range=result.ranges[partition])
            break


def lease_ids(spec_json: str, count: int) -> None:
    from icelog.storage.producers.idempotent import lease_producer_ids

    catalog = _catalog(spec_json)
    for _ in range(count):
        _emit(id=lease_producer_ids(catalog, 1)[0])


def init_producer(spec_json: str, table: str, client_id: str, stage: str = "register") -> None:
    """``storage.producers.idempotent.init_producer``; ``stage`` says which of its two commits may pause.

    Init leases a fresh id (a commit to the producer-id system table), then registers the
    producer on the log table (a second commit). ``ICELOG_PAUSE_AT`` arms the fault point
    for the ``lease`` commit or for the ``register`` commit only.
    """
    from icelog.storage.core import faults
    from icelog.storage.producers import idempotent as producers

    armed = faults.set_pause(None)
    lease = producers.lease_producer_ids

    def staged_lease(catalog, count=1, floor=0):
        if stage == "lease" and armed:
            faults.set_pause(armed)
        try:
            return lease(catalog, count, floor)
        finally:
            faults.set_pause(None)
            if stage == "register" and armed:
                faults.set_pause(armed)

    producers.lease_producer_ids = staged_lease
    identity = producers.init_producer(_catalog(spec_json), table, client_id)
    _emit(producer_id=identity.producer_id, epoch=identity.epoch)


def maintain(spec_json: str, table: str, retention_bytes: int, compact: int) -> None:
    """``storage.admin.maintenance.maintain``: retention (if ``retention_bytes`` > 0), compaction (if ``compact``)."""
    from icelog.storage.admin.maintenance import maintain as run

    report = run(
        _catalog(spec_json),
        table,
        retention_bytes=retention_bytes or None,
        compact=bool(compact),
        keep_snapshots=50,
        orphan_age_s=3600,
    )
    _emit(**{k: v for k, v in report.items() if k != "started"})


COMMANDS = {
    f.__name__: f
    for f in (
        conditional_once,
        conditional_loop,
        append_loop,
        append_rows,
        produce_batch,
        resend_storm,
        lease_ids,
        init_producer,
        maintain,
    )
}


def main(argv: list[str]) -> int:
    command, spec_json, *rest = argv
    try:
        COMMANDS[command](spec_json, *[int(a) if a.lstrip("-").isdigit() else a for a in rest])
    except IcelogError as e:
        _emit(error=e.to_dict())
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

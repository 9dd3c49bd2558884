"""Worker processes for concurrency and kill -9 tests: ``python -m tests.workers CMD ARGS``.

Each prints one JSON line per outcome, so the parent can compare acknowledged writes with
what the table holds.
"""

from __future__ import annotations

import json
import sys
from storage.errors import ConflictError, IcelogError
from storage.log import LogTable
from tests.catalogs import CatalogSpec


def _table(spec_json: str, table: str) -> LogTable:
    return LogTable(CatalogSpec(**json.loads(spec_json)).open(), table)


def conditional_once(spec_json: str, table: str, partition: int, expected: int, tag: str) -> None:
    """One conditional append; report committed or the mismatch."""
    log_table = _table(spec_json, table)
    try:
        result = log_table.append({partition: [{"key": tag, "value": tag}]}, {partition: expected})
        print(json.dumps({"tag": tag, "committed": True, "range": result.ranges[partition]}))
    except ConflictError as e:
        print(json.dumps({"tag": tag, "committed": False, "error": e.to_dict()}))


def conditional_loop(spec_json: str, table: str, partition: int, count: int, tag: str) -> None:
    """Append ``count`` single-row batches, each expecting the end it just read (retrying)."""
    log_table = _table(spec_json, table)
    done = 0
    while done < count:
        end = log_table.watermarks()[partition].end
        value = f"{tag}-{done}"
        try:
            result = log_table.append({partition: [{"key": tag, "value": value}]}, {partition: end})
        except ConflictError:
            continue
        print(json.dumps({"value": value, "offset": result.ranges[partition][0]}), flush=True)
        done += 1


def append_rows(spec_json: str, table: str, partition: int, rows: int, tag: str, commit_id: str = "") -> None:
    """One append (used with ICELOG_PAUSE_AT to be killed mid-commit)."""
    log_table = _table(spec_json, table)
    batch = [{"key": tag, "value": f"{tag}-{i}"} for i in range(int(rows))]
    result = log_table.append({int(partition): batch}, commit_id=commit_id or None)
    print(json.dumps({"tag": tag, "range": result.ranges[int(partition)], "duplicate": result.duplicate}), flush=True)


def produce_batch(spec_json: str, table: str, partition: int, producer_id: int, epoch: int, sequence: int, rows: int, tag: str) -> None:
    """One idempotent batch (killed mid-commit by the fault tests, then re-sent)."""
    from storage.producers import ProducerBatch

    log_table = _table(spec_json, table)
    batch = [{"key": tag, "value": f"{tag}-{sequence + i}"} for i in range(rows)]
    result = log_table.append({partition: batch}, producer=ProducerBatch(producer_id, epoch, {partition: sequence}))
    print(json.dumps({"range": result.ranges[partition], "duplicate": result.duplicate}), flush=True)


def resend_storm(spec_json: str, table: str, partition: int, producer_id: int, batches: int, size: int) -> None:
    """Send batches 0..n-1 in order, each until acknowledged (written or duplicate)."""
    from storage.errors import DuplicateSequence, TransientError
    from storage.producers import ProducerBatch

    log_table = _table(spec_json, table)
    for b in range(batches):
        rows = [{"key": f"b{b}", "value": str(b * size + i)} for i in range(size)]
        while True:
            try:
                result = log_table.append({partition: rows}, producer=ProducerBatch(producer_id, 0, {partition: b * size}))
            except DuplicateSequence:
                print(json.dumps({"batch": b, "duplicate": True, "range": None}), flush=True)
                break
            except TransientError:
                continue
            print(json.dumps({"batch": b, "duplicate": result.duplicate, "range": result.ranges[partition]}), flush=True)
            break


def lease_ids(spec_json: str, count: int) -> None:
    from storage.producers import lease_producer_ids

    catalog = CatalogSpec(**json.loads(spec_json)).open()
    for _ in range(count):
        print(json.dumps({"id": lease_producer_ids(catalog, 1)[0]}), flush=True)


COMMANDS = {f.__name__: f for f in (conditional_once, conditional_loop, append_rows, produce_batch, resend_storm)}

if __name__ == "__main__":
    try:
        if sys.argv[1] == "lease_ids":
            lease_ids(sys.argv[2], int(sys.argv[3]))
        else:
            COMMANDS[sys.argv[1]](*sys.argv[2:4], *[int(a) if a.lstrip("-").isdigit() else a for a in sys.argv[4:]])
    except IcelogError as e:
        print(json.dumps({"error": e.to_dict()}), flush=True)
        sys.exit(3)

"""Transaction tests' harness: ``tests.support.workers.transactions`` processes (started, held at
a fault point, killed with SIGKILL), their events, and what a test reads back (journal states,
rows, staged and unreferenced files) to check a transaction landed all or nothing.

Worker stdout goes to files (never pipes), and every process started here is waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from icelog.storage.admin.orphans import referenced_files, remove_orphan_files
from icelog.storage.core import faults
from icelog.storage.core.swap import is_atomic
from icelog.storage.groups.offsets import commit_offsets, committed_offsets
from icelog.storage.log.table import LogTable
from icelog.storage.producers import journal as coordinator
from icelog.storage.producers import transactional as tx
from icelog.storage.producers.transactional import TransactionalProducer
from icelog.storage.properties import TRANSACTION_TIMEOUT_MS
from icelog.validations.checks import run_checks

ROOT = Path(__file__).resolve().parents[2]
# Killed here, a transaction is unknown to the journal (its sends register nothing; orphan cleanup
# removes its files); killed at any later point, rolled forward (a catalog without atomic
# multi-table commits: PREPARE_COMMIT is its decision, and registers its partitions).
BEFORE_PREPARE = (faults.AFTER_TXN_BEGIN, faults.AFTER_TXN_STAGE)


def lands(catalog, point: str) -> bool:
    """Whether a transaction killed at ``point`` is (or, after recovery, becomes) visible.

    On an atomic (SQL) catalog the one swap of data, offsets and COMMITTED record is the only
    decision: killed before it ran to its end (even between two tables' pointer updates, inside
    the database transaction), nothing lands. Without atomic commits PREPARE_COMMIT decides."""
    if is_atomic(catalog):
        return point == faults.AFTER_CATALOG_SWAP
    return point not in BEFORE_PREPARE


# Data tables keep few snapshots: commit cost stays flat over hundreds of transactions.
SMALL = {"icelog.snapshots.keep": "4"}


def spec_json(spec) -> str:
    return json.dumps(dataclasses.asdict(spec))


def worker_env(pause_file: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_PAUSE")}
    if pause_file:
        env["ICELOG_PAUSE_FILE"] = pause_file
    return env


@contextlib.contextmanager
def worker(
    mode: str, spec, args: dict, out: Path, pause_file: str | None = None, module: str = "tests.support.workers.transactions"
):
    """A ``tests.support.workers.transactions`` (or ``module``) process writing to ``out``; always killed (if alive) and waited for."""
    with open(out, "w") as f:
        child = subprocess.Popen(
            [sys.executable, "-m", module, mode, spec_json(spec), json.dumps(args)],
            cwd=ROOT,
            env=worker_env(pause_file),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        try:
            yield child
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()


def events(out: Path) -> list[dict]:
    """The JSON lines a worker printed (log lines and tracebacks are skipped)."""
    found = []
    for line in out.read_text().splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                found.append(value)
    return found


def wait_for_pause(child: subprocess.Popen, marker: str, out: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.path.exists(marker), f"worker never paused (exit {child.poll()}):\n{out.read_text()[-4000:]}"
    assert int(Path(marker).read_text()) == child.pid


def kill_at(spec, mode: str, args: dict, tmp: Path, tag: str, module: str = "tests.support.workers.transactions") -> list[dict]:
    """Run a worker until it pauses at its fault point, SIGKILL it there, return its events."""
    marker, out = str(tmp / f"{tag}.paused"), tmp / f"{tag}.out"
    with worker(mode, spec, args, out, pause_file=marker, module=module) as child:
        wait_for_pause(child, marker, out)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    os.remove(marker)
    return events(out)


def run_to_end(spec, mode: str, args: dict, out: Path, timeout: float = 300) -> list[dict]:
    with worker(mode, spec, args, out) as child:
        code = child.wait(timeout=timeout)
    assert code == 0, out.read_text()[-4000:]
    return events(out)


def journal(catalog) -> list[dict]:
    rows = LogTable(catalog, coordinator.JOURNAL).read(0)
    return rows.select(["log_offset", "txn_id", "transactional_id", "txn_state", "detail"]).to_pylist()


def journal_states(catalog, txn_id: str) -> list[str]:
    return [r["txn_state"] for r in journal(catalog) if r["txn_id"] == txn_id]


def rows(log_table: LogTable, partition: int = 0) -> list[tuple[int, str, str]]:
    table = log_table.read(partition)
    return list(
        zip(
            table.column("log_offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=False,
        )
    )


def _files_under(table, folder: str) -> list[str]:
    """Every file under ``folder`` of the table's location, local or on an object store, by its
    path in the table's file system (``bucket/key`` on S3), as ``referenced_files`` names them."""
    from pyarrow import fs as pafs

    from icelog.storage.log.files import arrow_location

    filesystem, root = arrow_location(table.io, f"{table.metadata.location}/{folder}")
    found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(f.path for f in found if f.type == pafs.FileType.File)


def _mtimes(table, paths):
    from icelog.storage.log.files import arrow_location

    filesystem, _ = arrow_location(table.io, table.metadata.location)
    return [(i.path, i.mtime.timestamp() if i.mtime else None) for i in filesystem.get_file_info(paths)]


def staged_files(log_table: LogTable) -> list[str]:
    """Files of transactions not (yet) in the table: staged payloads, and data files written
    into a transaction's folder (``data/txn-<id>``) that no snapshot references."""
    table = log_table.table()
    keep = referenced_files(table)
    written = [p for p in _files_under(table, "data") if "/data/txn-" in p and p not in keep]
    return sorted(_files_under(table, "data/staging") + written)


def unreferenced_data_files(log_table: LogTable) -> list[str]:
    """Files under the table's data folder that no snapshot references (staging included)."""
    table = log_table.table()
    keep = referenced_files(table)
    return [p for p in _files_under(table, "data") if p not in keep]


def contiguous(log_table: LogTable) -> None:
    report = run_checks(log_table.table(), ["contiguity-deep"])
    assert report.ok, report


def metadata_locations(catalog, *identifiers: str) -> dict[str, str]:
    from icelog.storage.groups.offsets import GROUPS_TABLE

    names = [*identifiers, coordinator.JOURNAL, GROUPS_TABLE]
    return {n: catalog.load_table(n).metadata_location for n in names}


def past_timeout(ms: int = TRANSACTION_TIMEOUT_MS.default):
    return lambda: coordinator.now_ms() + ms + 1_000


def two_tables(catalog, partitions: int = 1) -> tuple[LogTable, LogTable]:
    return LogTable.create(catalog, "db.a", partitions, properties=SMALL), LogTable.create(
        catalog, "db.b", partitions, properties=SMALL
    )


def kill_one_transaction(catalog_spec, tmp_path, point: str, legacy_prepare: bool = False):
    """Set up a, b and src with history, run one transaction in a worker, kill it at ``point``
    (``legacy_prepare``: after recording PREPARE_COMMIT as versions before the SQL fast path did)."""
    catalog = catalog_spec.open()
    a, b = two_tables(catalog)
    src = LogTable.create(catalog, "db.src", 1)
    src.append({0: [{"key": str(i), "value": str(i)} for i in range(10)]})
    # Earlier history that recovery must leave alone.
    a.append({0: [{"key": "before", "value": "100"}]})
    b.append({0: [{"key": "before", "value": "-100"}]})
    commit_offsets(catalog, "g", {("db.src", 0): 3})
    before = (rows(a), rows(b))
    args = {"tid": "copier-1", "a": "db.a", "b": "db.b", "src": "db.src", "group": "g", "position": 8, "k": 5, "pause": point}
    if legacy_prepare:
        args["legacy_prepare"] = True
    seen = kill_at(catalog_spec, "one", args, tmp_path, "one")
    if catalog_spec.kind == "rest":
        # SeaweedFS can finish the upload of a client killed mid-request a moment later: seen as a
        # data file appearing after orphan cleanup listed the folder (with no wait, about 1 run in 2).
        time.sleep(3)
    assert not any(e.get("event") == "committed" for e in seen)
    txn_id = next(e["txn_id"] for e in seen if e.get("event") == "begin")
    epoch = next(e["epoch"] for e in seen if e.get("event") == "init")
    return catalog, a, b, before, txn_id, epoch


def check_all_or_nothing(catalog, a, b, before, txn_id, point, prepared: bool = False) -> None:
    """The killed transaction is either wholly visible once (see :func:`lands`) or not at all;
    no staged or orphan file is left once orphan cleanup ran; recovery again changes nothing."""
    states = journal_states(catalog, txn_id)
    assert coordinator.transactional_ids(catalog)["copier-1"].txn is None
    landed = prepared or lands(catalog, point)
    if not landed:
        assert (rows(a), rows(b)) == before, "an aborted transaction became visible"
        assert committed_offsets(catalog, "g", "db.src") == {0: 3}
        # Its decision (the one swap, or PREPARE_COMMIT) never landed: the journal never heard of it.
        assert states == [], states
    else:
        assert rows(a) == [*before[0], (1, f"{txn_id}:a", "5")]
        assert rows(b) == [*before[1], (1, f"{txn_id}:b", "-5")]
        assert committed_offsets(catalog, "g", "db.src") == {0: 8}
        assert states.count("COMMITTED") == 1 and "ABORTED" not in states, states
        committed = next(r for r in journal(catalog) if r["txn_id"] == txn_id and r["txn_state"] == "COMMITTED")
        assert json.loads(committed["detail"])["ranges"] == {"db.a": {"0": [1, 2]}, "db.b": {"0": [1, 2]}}

    leaked = {}
    # A transaction killed before its decision is unknown to the journal: recovery cannot delete
    # its staged or pre-written files, orphan cleanup does (and must find every one).
    unknown = not landed
    for t in (a, b):
        staged = staged_files(t)
        leaked[t.identifier] = [] if unknown else staged  # asserted last, so every other check runs too
        leftovers = [p for p in unreferenced_data_files(t) if p not in staged]
        # Only a commit killed in the middle leaves data files it wrote but never committed: the
        # atomic one, or a roll-forward's other tables, under way at once (no atomic catalog).
        if point != faults.BETWEEN_TABLE_SWAPS and (is_atomic(catalog) or point in BEFORE_PREPARE):
            assert leftovers == [], leftovers
        removed = remove_orphan_files(catalog, t.identifier, older_than_s=0)
        left = unreferenced_data_files(t)
        assert left == [], (left, removed, _mtimes(t.table(), left), time.time())
        assert staged_files(t) == [], "orphan cleanup left a dead transaction's staged files"
        contiguous(t)
    contiguous(LogTable(catalog, coordinator.JOURNAL))

    # Idempotent: recovery again does nothing at all.
    settled = metadata_locations(catalog, "db.a", "db.b")
    assert tx.recover(catalog, clock=past_timeout()) == {"rolled_forward": [], "aborted": []}
    assert metadata_locations(catalog, "db.a", "db.b") == settled
    assert leaked == {"db.a": [], "db.b": []}, f"recovery left staged files after a kill at {point}"


def commit_balanced(producer: TransactionalProducer, k: int) -> None:
    """One transaction: +k to db.a, -k to db.b (so the sum over both tables stays 0)."""
    with producer.transaction():
        producer.send("db.a", 0, [{"key": producer.txn_id, "value": str(k)}])
        producer.send("db.b", 0, [{"key": producer.txn_id, "value": str(-k)}])


def whole_transaction_reads(out: Path) -> list[dict]:
    """A ``reader`` worker's reads, each checked: no error, both tables' sums add up to 0, equal
    log ends, and as many rows as offsets (a transaction seen in part, or an aborted one that
    wrote unbalanced rows, fails it)."""
    seen = events(out)
    errors = [e["error"] for e in seen if "error" in e]
    assert not errors, errors[:5]
    partial = [e for e in seen if sum(e["sums"]) != 0 or e["ends"][0] != e["ends"][1] or e["rows"] != e["ends"]]
    assert not partial, f"a reader saw part of a transaction, or an aborted one: {partial[:5]}"
    return seen

"""Faults beyond kill -9 and SIGTERM, each in a short focused test:

* a slow metadata write (``ICELOG_DELAY_AT``, ``storage.core.faults``): a commit that sleeps between
  writing its metadata file and swapping the pointer loses to the commits made meanwhile, and
  decides again on the new base (I2, I3, I4);
* the catalog database down for a few seconds (PostgreSQL stopped and started again): a commit
  in flight rides it out, and writers in separate processes lose nothing acknowledged (I7);
* a full disk under the warehouse (a small tmpfs, filled and freed): writers fail with nothing
  acknowledged lost and no corrupt table, and go on once space is back (I7, I1).

The multi-process scenarios reuse the chaos workers (``tests.chaos.workers``) and checks
(``tests.chaos.run``); each runs once per module, and its tests assert on the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from icelog.storage.core import faults
from icelog.storage.properties import METADATA_DELETE_GRACE_MS
from tests.chaos.run import (
    EVENTS,
    ROOT,
    _acks,
    _rows,
    check_acked,
    fill_disk,
    free_disk,
    mount_tmpfs,
    start_catalog_server,
    stop_catalog_server,
    unmount,
)
from tests.chaos.workers import RESTART_ME, UNTYPED
from tests.support.catalogs import CatalogSpec

BATCH = 10


# --- the fault point itself ----------------------------------------------------------------------


def test_delay_sleeps_at_the_named_point_only(monkeypatch):
    monkeypatch.setattr(faults, "_delays", {})
    faults.set_delays(f"{faults.AFTER_METADATA_WRITE}:0.3, {faults.AFTER_DATA_FILES}:0")
    try:
        started = time.monotonic()
        faults.checkpoint(faults.AFTER_CATALOG_SWAP)
        assert time.monotonic() - started < 0.1
        faults.checkpoint(faults.AFTER_METADATA_WRITE)
        assert time.monotonic() - started >= 0.3
    finally:
        faults.set_delays(None)
    assert faults._delays == {}


@pytest.mark.parametrize("spec", ["after_metadata_write", "after_metadata_write:-1", "after_metadata_write:x", ":2"])
def test_delay_spec_is_checked(spec):
    with pytest.raises(ValueError):
        faults.parse_delays(spec)


# --- helpers ---------------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICELOG_PAUSE", "ICELOG_DELAY"))}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "icelog-chaos-pycache")
    return {**env, **extra}


ONE_APPEND = """
import json, sys
from icelog.storage.errors import IcelogError
from icelog.storage.log.table import LogTable
from tests.support.catalogs import CatalogSpec
args = json.loads(sys.argv[1])
log_table = LogTable(CatalogSpec(**args["spec"]).open(), "chaos.events")
rows = [{"key": "k", "value": f"slow:{i}"} for i in range(args["rows"])]
try:
    if args.get("producer"):
        from icelog.storage.log.sequences import ProducerBatch
        batch = ProducerBatch(args["producer"][0], args["producer"][1], {0: 0})
        result = log_table.append({0: rows}, producer=batch)
    else:
        result = log_table.append({0: rows}, {0: args["expected"]}, commit_id="slow-1")
    print(json.dumps({"ranges": {str(p): list(r) for p, r in result.ranges.items()}, "duplicate": result.duplicate}))
except IcelogError as e:
    print(json.dumps({"error": type(e).__name__, "fields": {k: v for k, v in vars(e).items() if isinstance(v, (int, str))}}))
"""


def _one_append(spec: CatalogSpec, delay_s: float, **args) -> subprocess.Popen:
    env = _env(ICELOG_DELAY_AT=f"{faults.AFTER_METADATA_WRITE}:{delay_s}")
    argv = [sys.executable, "-c", ONE_APPEND, json.dumps({"spec": asdict(spec), **args})]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_metadata_write(spec: CatalogSpec, proc: subprocess.Popen, before: set[str], timeout: float = 600.0) -> None:
    """Until the slow process has written a metadata file the pointer does not name yet.

    The timeout is generous: on a loaded 2-core machine a fresh interpreter took over a minute to
    import icelog and reach its first append. The test fails at once if the process exits."""
    directory = Path(spec.warehouse.removeprefix("file://")) / "chaos" / "events" / "metadata"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {p.name for p in directory.glob("*.metadata.json")} - before:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the slow process wrote no metadata file in {timeout:.0f} s: {proc.communicate()}")


def _metadata_files(spec: CatalogSpec) -> set[str]:
    return {
        p.name for p in (Path(spec.warehouse.removeprefix("file://")) / "chaos" / "events" / "metadata").glob("*.metadata.json")
    }


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _validators(log_table) -> list[str]:
    from icelog.validations.checks import CHECKS, run_checks

    return run_checks(log_table.table(), [c for c in CHECKS if c != "mirror-parity"]).violations


@pytest.fixture
def events(heavy_spec):  # PostgreSQL in make test-slow (the suite's time budget)
    from icelog.storage.log.table import LogTable

    return heavy_spec, LogTable.create(heavy_spec.open(), EVENTS, 2)


# --- a slow metadata write races the others ------------------------------------------------------------


def test_i2_i3_a_slow_conditional_append_loses_to_a_commit_made_while_it_slept(events):
    """The slow append decided on offset 0, wrote its metadata, and slept; meanwhile another
    append took offset 0. Its swap must fail on the moved base, and deciding again it must
    report the mismatch, never land its rows at 0 (or anywhere) on top of the other's."""
    spec, log_table = events
    before = _metadata_files(spec)
    slow = _one_append(spec, 8.0, expected=0, rows=BATCH)
    _wait_for_metadata_write(spec, slow, before)
    fast = log_table.append({0: [{"key": "k", "value": f"fast:{i}"} for i in range(BATCH)]}, {0: 0})
    assert fast.ranges[0] == (0, BATCH)
    outcome = _result(slow)
    assert outcome["error"] == "OffsetMismatch", outcome
    assert outcome["fields"]["actual"] == BATCH, outcome  # the log end it carries
    assert [r["value"] for r in log_table.read(0).to_pylist()] == [f"fast:{i}" for i in range(BATCH)]
    assert _validators(log_table) == []


def test_i4_a_slow_idempotent_batch_lands_once_after_the_commit_made_while_it_slept(events):
    """An idempotent producer's batch is not conditional: after losing the swap it decides
    again on the new base and lands after the other commit, once, with every acknowledged row kept."""
    from icelog.storage.producers.idempotent import init_producer

    spec, log_table = events
    identity = init_producer(spec.open(), log_table.identifier, "slow-producer")
    before = _metadata_files(spec)
    slow = _one_append(spec, 8.0, producer=[identity.producer_id, identity.epoch], rows=BATCH)
    _wait_for_metadata_write(spec, slow, before)
    log_table.append({0: [{"key": "k", "value": f"fast:{i}"} for i in range(BATCH)]}, {0: 0})
    outcome = _result(slow)
    assert outcome == {"ranges": {"0": [BATCH, 2 * BATCH]}, "duplicate": False}, outcome
    values = [r["value"] for r in log_table.read(0).to_pylist()]
    assert values == [f"fast:{i}" for i in range(BATCH)] + [f"slow:{i}" for i in range(BATCH)]
    assert _validators(log_table) == []


# --- the catalog database down ------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_postgres():
    """A PostgreSQL server of this module alone: the tests stop and start it."""
    from infra import postgres

    directory = Path(tempfile.mkdtemp(prefix="icelog-pg-faults-"))
    try:
        uri = postgres.start(directory)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no PostgreSQL server: {e}")
    yield directory, uri
    postgres.stop(directory)


def _pg_events(own_postgres, tmp_path: Path, name: str):
    """``(server directory, spec, log table)``: a one-partition events table on the module's server."""
    from icelog.storage.log.table import LogTable

    directory, uri = own_postgres
    (tmp_path / "warehouse").mkdir()
    spec = CatalogSpec("postgres", name, uri, f"file://{tmp_path / 'warehouse'}")
    return directory, spec, LogTable.create(spec.open(), EVENTS, 1)


def test_i7_a_commit_in_flight_rides_out_the_catalog_going_down(own_postgres, tmp_path):
    """The append's swap meets a stopped server (its outcome is unknown to it): the commit
    core reads again until the server is back, finds its commit id absent, and lands once."""
    from icelog.storage.log.table import LogTable

    directory, spec, log_table = _pg_events(own_postgres, tmp_path, "faultdown")
    before = _metadata_files(spec)
    slow = _one_append(spec, 2.0, expected=0, rows=BATCH)
    _wait_for_metadata_write(spec, slow, before)
    stop_catalog_server(directory)
    try:
        time.sleep(4.0)  # the swap comes due while the server is down
    finally:
        start_catalog_server(directory)
    assert _result(slow) == {"ranges": {"0": [0, BATCH]}, "duplicate": False}
    # A fresh catalog: this process's pooled connections died with the server (see test_catalog_down_surfaces_only_typed_errors).
    log_table = LogTable(spec.open(), EVENTS)
    assert [r["value"] for r in log_table.read(0).to_pylist()] == [f"slow:{i}" for i in range(BATCH)]
    assert _validators(log_table) == []


@dataclass
class Scenario:
    """What a few writer processes did around one fault."""

    stored: list = field(default_factory=list)
    acks: list = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)  # "worker: error" of UNTYPED exits
    crashed: list[str] = field(default_factory=list)
    acks_after: int = 0  # acknowledged batches that began after the fault ended
    violations: list[str] = field(default_factory=list)
    logs: str = ""


WRITERS = {"producer0": ("producer", 0), "appender0": ("appender", 0), "appender1": ("appender", 1)}


def _writers_around(
    spec: CatalogSpec,
    workdir: Path,
    fault,
    heal,
    before_s: float = 3.0,
    fault_s: float = 4.0,
    after_s: float = 5.0,
    properties: dict[str, str] | None = None,
) -> Scenario:
    """Run the writers, ``fault()`` for ``fault_s`` seconds, ``heal()``, run on, stop, check.

    A writer that exits (RESTART_ME, UNTYPED) is restarted at once, as the chaos controller does.
    """
    from icelog.storage.log.table import LogTable

    LogTable.create(spec.open(), EVENTS, 2, properties=properties)
    procs: dict[str, subprocess.Popen] = {}
    scenario = Scenario()
    workers = workdir / "workers"  # the chaos layout: tests.chaos.run._acks reads it

    def start(name: str) -> None:
        kind, partition = WRITERS[name]
        args = {
            "spec": asdict(spec),
            "batch": BATCH,
            "table": EVENTS,
            "partition": partition,
            "name": name,
            "dir": str(workers / name),
        }
        (workers / name).mkdir(parents=True, exist_ok=True)
        with open(workers / name / "process.log", "a") as out:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.workers", kind, json.dumps(args)],
                cwd=ROOT,
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def reap() -> None:
        for name, proc in list(procs.items()):
            code = proc.poll()
            if code is None:
                continue
            if code == UNTYPED:
                lines = [
                    line for line in (workers / name / "process.log").read_text().splitlines() if line.startswith("UNTYPED ")
                ]
                scenario.untyped.append(f"{name}: {lines[-1] if lines else '?'}")
            elif code != RESTART_ME:
                scenario.crashed.append(f"{name} exited with {code}")
            start(name)

    def run_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            reap()
            time.sleep(0.05)

    for name in WRITERS:
        start(name)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all((workers / n / "ack.jsonl").exists() for n in WRITERS):
            run_for(0.2)  # until every writer has committed once (start-up is slow under load)
        run_for(before_s)
        fault()
        try:
            run_for(fault_s)
        finally:
            heal()
        healed = time.time()
        run_for(after_s)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            any(a["t"] > healed for a in _acks(workdir, kind) if a["worker"] == n) for n, (kind, _) in WRITERS.items()
        ):
            run_for(0.5)  # each writer goes on after the fault
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code == UNTYPED:
                scenario.untyped.append(f"{name}: at stop")
            elif code not in (0, RESTART_ME):
                scenario.crashed.append(f"{name} exited with {code} at stop")
    catalog = spec.open()
    scenario.stored = _rows(catalog, EVENTS, ["value", "log_partition", "log_offset"])
    scenario.acks = _acks(workdir, "producer") + _acks(workdir, "appender")
    scenario.acks_after = sum(1 for a in scenario.acks if a["t"] > healed + 0.5)
    scenario.violations = _validators(LogTable(catalog, EVENTS))
    scenario.logs = "\n".join(f"--- {n}\n" + (workers / n / "process.log").read_text()[-1500:] for n in WRITERS)
    return scenario


def _assert_nothing_lost(scenario: Scenario) -> None:
    print(
        f"{len(scenario.acks)} batches acknowledged, {scenario.acks_after} after the fault; {len(scenario.stored)} rows; untyped exits: {scenario.untyped}"
    )
    assert scenario.crashed == [], scenario.logs
    assert check_acked(scenario.stored, scenario.acks, sorted(WRITERS)) == []
    assert scenario.violations == []
    assert scenario.acks and scenario.acks_after > 0, f"no writer went on after the fault:\n{scenario.logs}"


@pytest.fixture(scope="module")
def catalog_outage(own_postgres, tmp_path_factory) -> Scenario:
    directory, uri = own_postgres
    workdir = tmp_path_factory.mktemp("catalog-outage")
    (workdir / "warehouse").mkdir()
    spec = CatalogSpec("postgres", "outage", uri, f"file://{workdir / 'warehouse'}")
    return _writers_around(spec, workdir, lambda: stop_catalog_server(directory), lambda: start_catalog_server(directory))


def test_i7_writers_lose_nothing_acknowledged_while_the_catalog_is_down(catalog_outage):
    _assert_nothing_lost(catalog_outage)


def test_catalog_down_a_read_raises_catalog_unavailable(own_postgres, tmp_path):
    """Deterministic: the server is down when a read begins (in the scenario above, a writer
    meets this only when the outage starts between its calls, not inside a commit)."""
    from icelog.storage.errors import CatalogUnavailable

    directory, _, log_table = _pg_events(own_postgres, tmp_path, "readdown")
    stop_catalog_server(directory)
    try:
        with pytest.raises(CatalogUnavailable):
            log_table.watermarks()
    finally:
        start_catalog_server(directory)


def test_catalog_down_a_commit_gives_up_at_its_deadline(own_postgres, tmp_path):
    """A commit whose reads keep failing stops at ``deadline_s`` with CatalogUnavailable, not
    after ``max_attempts`` rounds of read retries and back-off (minutes)."""
    from icelog.storage.core.commit import commit
    from icelog.storage.errors import CatalogUnavailable
    from icelog.storage.log.maintenance import Compaction

    directory, _, log_table = _pg_events(own_postgres, tmp_path, "commitdown")
    stop_catalog_server(directory)
    try:
        started = time.monotonic()
        with pytest.raises(CatalogUnavailable):
            commit(log_table.catalog, log_table.identifier, Compaction(log_table.identifier), deadline_s=1.0)
        assert time.monotonic() - started < 10
    finally:
        start_catalog_server(directory)


def test_catalog_restarted_a_read_on_an_old_connection_succeeds(own_postgres, tmp_path):
    directory, _, log_table = _pg_events(own_postgres, tmp_path, "readrestart")
    log_table.watermarks()  # a pooled connection
    stop_catalog_server(directory)
    start_catalog_server(directory)
    assert log_table.watermarks()[0].end == 0


# --- a full disk under the warehouse ---------------------------------------------------------------


@contextlib.contextmanager
def small_warehouse(warehouse: Path, mb: int) -> Iterator[Path]:
    """``warehouse`` on a tmpfs of ``mb`` MB for the block (the test is skipped if mount is refused)."""
    reason = mount_tmpfs(warehouse, mb)
    if reason is not None:
        pytest.skip(f"the full-disk test needs a small tmpfs for the warehouse: {reason}")
    try:
        yield warehouse
    finally:
        unmount(warehouse)


@pytest.fixture(scope="module")
def disk_full(tmp_path_factory) -> tuple[Scenario, list[int]]:
    workdir = tmp_path_factory.mktemp("disk-full")
    ballast: list[int] = []
    # The disk must fill with the ballast, not with the table's own files: superseded metadata
    # stays for icelog.metadata.delete-grace-ms (60 s) and grows with the history, and expired
    # snapshots' manifests wait for maintenance (20,000 Avro files, 123 MB, after 1,700 commits).
    # Writers that ran 45-90 s before the fault (a slow start under load) filled 32 MB, even
    # 128 MB, by themselves, so freeing the ballast freed too little for anyone to go on (CI).
    # A 1 s grace and 1 GB (tmpfs takes memory only as it fills) leave that room.
    with small_warehouse(workdir / "warehouse", 1024) as warehouse:
        spec = CatalogSpec("sqlite", "diskfull", f"sqlite:///{workdir / 'catalog.db'}", f"file://{warehouse}")
        scenario = _writers_around(
            spec,
            workdir,
            lambda: ballast.append(fill_disk(warehouse)),
            lambda: free_disk(warehouse),
            properties={METADATA_DELETE_GRACE_MS.key: "1000"},
        )
        return scenario, ballast


def test_i7_writers_lose_nothing_acknowledged_when_the_disk_fills(disk_full):
    scenario, ballast = disk_full
    assert ballast[0] >= 64 << 20, f"the table filled the disk before the fault: a ballast of {ballast[0]:,} bytes"
    _assert_nothing_lost(scenario)


def test_disk_full_an_append_raises_a_typed_error(tmp_path):
    """Deterministic: the disk is full when an append writes its data file."""
    from icelog.storage.errors import StorageUnavailable
    from icelog.storage.log.table import LogTable

    with small_warehouse(tmp_path / "warehouse", 8) as warehouse:
        spec = CatalogSpec("sqlite", "full", f"sqlite:///{tmp_path / 'catalog.db'}", f"file://{warehouse}")
        log_table = LogTable.create(spec.open(), EVENTS, 1)
        log_table.append({0: [{"key": "k", "value": "before"}]}, {0: 0})
        fill_disk(warehouse)
        with pytest.raises(StorageUnavailable):
            log_table.append({0: [{"key": "k", "value": "full"}]}, {0: 1}, commit_id="full-1")
        assert log_table.watermarks()[0].end == 1  # the table is unchanged (I8)
        free_disk(warehouse)
        assert log_table.append({0: [{"key": "k", "value": "after"}]}, {0: 1}, commit_id="full-1").ranges[0] == (1, 2)


def test_disk_full_compaction_raises_a_typed_error_and_changes_nothing(tmp_path):
    """Compaction writes its merged files while it decides, before the commit core's writes."""
    from icelog.storage.core.commit import commit
    from icelog.storage.errors import StorageUnavailable
    from icelog.storage.log.maintenance import COMPACT_MIN_FILES, Compaction
    from icelog.storage.log.table import LogTable

    with small_warehouse(tmp_path / "warehouse", 8) as warehouse:
        spec = CatalogSpec("sqlite", "full", f"sqlite:///{tmp_path / 'catalog.db'}", f"file://{warehouse}")
        catalog = spec.open()
        log_table = LogTable.create(catalog, EVENTS, 1)
        for i in range(COMPACT_MIN_FILES + 1):
            log_table.append({0: [{"key": "k", "value": f"v{i}"}]}, {0: i})
        before = log_table.table().current_snapshot().snapshot_id
        fill_disk(warehouse)
        with pytest.raises(StorageUnavailable):
            commit(catalog, EVENTS, Compaction(EVENTS))
        assert log_table.table().current_snapshot().snapshot_id == before  # nothing committed (I8)
        free_disk(warehouse)
        assert commit(catalog, EVENTS, Compaction(EVENTS)).result["rewritten_files"] == COMPACT_MIN_FILES + 1
        assert log_table.read(0)["value"].to_pylist() == [f"v{i}" for i in range(COMPACT_MIN_FILES + 1)]

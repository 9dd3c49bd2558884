"""The chaos controller and its end-of-run checks: ``python -m tests.chaos.run --help``.

One run: create the tables, start the workers (``tests.chaos.workers``) as OS processes, and
for ``--duration`` seconds, at seeded random times, inject one fault of a kind the seeded rng
picks among ``--faults`` (:data:`FAULT_KINDS`):

* ``kill``: SIGKILL a random worker, restart it;
* ``sigterm``: stop a random worker cleanly (it finishes its step), restart it;
* ``slow``: SIGKILL a random worker and restart it with ``ICELOG_DELAY_AT=after_metadata_write:S``
  (``storage.core.faults``): its commits sleep between writing the new metadata file and the pointer
  swap, so the others commit meanwhile and its swap races a moved base. It stays slow until
  its next fault;
* ``catalog-down``: on PostgreSQL, stop the catalog's server (``pg_ctl stop -m fast``) for a
  few seconds and start it again on the same port; on REST, ``kill -9`` the SeaweedFS server
  (its catalog and its S3 store, one process group) and start it again on the same directory
  and ports a few seconds later;
* ``disk-full`` (with ``--warehouse-tmpfs``): the source warehouse lives on a tmpfs of that
  size; fill it with a ballast file for a few seconds, then delete the ballast.

On a REST catalog (SeaweedFS, ``--catalog rest``) the workload is what a REST catalog runs: the
copier's transactions decide in the journal and roll forward table by table; so do the group
members' ``Consumer.commit(also=...)`` (output and range commit, fenced by the member's generation
registered in the journal); and the mirror carries the log
to a SQLite catalog (the disaster-recovery direction); ``slow`` delays a commit after its data
files (the REST server writes the metadata file itself).

The soak worker is never picked for a worker fault (its latencies are the measurement); the
catalog and disk faults hit it like everyone. Then stop everything, drain (one maintenance
pass, the soak to its ``--soak-commits``, then copier, group and mirror to the log end), and check:

* ``validators``: every check of ``validations.checks.CHECKS`` on every log table of both
  catalogs (``mirror-parity`` on the mirror targets, against their source);
* ``acked``: every acknowledged row is stored, at its acknowledged offset; no row twice;
* ``copy``: the copier's output is the transformed input, exactly once;
* ``group``: each source record processed once, each key's records in offset order, and
  every member's acknowledged offsets stored (on every catalog, REST too: its output table);
* ``soak-acked``: the same on the soak table, where retention runs: an acknowledged row below
  the partition's ``log_start`` was dropped by retention, which is allowed only if its append
  began before ``check time - retention.ms`` (no row of it is younger, so no retention run
  could drop a younger one); every other acknowledged row is stored at its offset;
* ``soak``: commit latency and metadata stay bounded (:func:`check_soak`);
* ``typed``: no worker ended on an error of no icelog type (``UNTYPED``: a raw ``OSError`` or
  SQLAlchemy error where the product should raise ``CatalogUnavailable`` and the like);
* ``workers``: no worker died on its own (exit code other than 0, ``RESTART_ME``, ``UNTYPED``).

A failure prints the seed, the controller's event log and the failed check's details, and
exits 1. The pure checks (``check_acked``, ``check_copy``, ``check_group``) take plain data,
so tests can plant a duplicate or drop a row and see them fail.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from icelog.storage.log.table import TABLE_DEFAULTS
from tests.chaos.workers import RESTART_ME, UNTYPED, batch_rows
from tests.support.catalogs import CatalogSpec

ROOT = Path(__file__).resolve().parents[2]
PRINCIPAL = "chaos-mirror"
EVENTS, COPIED, CONSUMED, SOAK = "chaos.events", "chaos.copied", "chaos.consumed", "chaos.soak"
FAULT_KINDS = ("kill", "sigterm", "slow", "catalog-down", "disk-full")
CATALOG_KINDS = ("sqlite", "postgres", "rest")
CATALOG_CHOICES = {**{k: (k,) for k in CATALOG_KINDS}, "both": ("sqlite", "postgres"), "all": CATALOG_KINDS}
WORKER_FAULTS = ("kill", "sigterm", "slow")
GROUP = "chaos-group"
MAX_SHOWN = 20  # details per failed check


@dataclass
class Config:
    duration: float = 60.0
    seed: int = 0
    producers: int = 2
    appenders: int = 2
    members: int = 3
    partitions: int = 2
    batch: int = 20
    session_ms: int = 3000
    interval: tuple[float, float] = (1.0, 4.0)  # seconds between faults
    down: tuple[float, float] = (0.0, 1.5)  # seconds a stopped worker stays down
    faults: tuple[str, ...] = FAULT_KINDS  # those that do not apply to a run are left out (noted)
    outage: tuple[float, float] = (2.0, 6.0)  # seconds the catalog is down or the disk full
    slow: tuple[float, float] = (0.5, 3.0)  # seconds a slow worker sleeps per metadata write
    warehouse_tmpfs_mb: int | None = None  # the source warehouse on a tmpfs (disk-full needs it)
    soak_commits: int = 1000  # 0: no soak worker
    soak_window: int = 100
    retention_ms: int = 30_000  # the soak table's icelog.retention.ms


@dataclass
class Report:
    catalog: str
    seed: int
    events: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    replay: str = ""
    soak: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def describe(self) -> str:
        kinds = Counter(e["action"] for e in self.events)
        head = f"chaos {self.catalog} seed={self.seed}: {'OK' if self.ok else 'FAILED'} in {self.seconds:.0f} s; faults {dict(kinds)}; {self.counts}"
        lines = [head, *(f"note: {n}" for n in self.notes), *soak_table(self.soak)]
        if self.ok:
            return "\n".join(lines)
        lines += [f"replay: python -m tests.chaos.run {self.replay}", "history:"]
        lines += [
            f"  {e['t']:8.2f}s {e['action']:<8} {e['worker']}" + (f" ({e['detail']})" if e.get("detail") else "")
            for e in self.events
        ]
        for check, found in self.failures.items():
            for line in found[:MAX_SHOWN]:
                lines.append(f"FAILED {check}: {line}")
            if len(found) > MAX_SHOWN:
                lines.append(f"FAILED {check}: ... {len(found) - MAX_SHOWN} more")
        return "\n".join(lines)


# --- the pure checks ---------------------------------------------------------------------------


def check_acked(
    stored: list[tuple[str, int, int]],
    acks: list[dict[str, Any]],
    writers: list[str],
    log_starts: dict[int, int] | None = None,
    retention_cutoff: float | None = None,
) -> list[str]:
    """Acknowledged writes against what the table holds.

    Args:
        stored: ``(value, partition, offset)`` of every row of the written table.
        acks: The writers' acknowledgement lines (``worker`` added), for batches of
            :func:`tests.chaos.workers.batch_rows`.
        writers: The writers' names; every stored row must come from one of them.
        log_starts: Per partition, ``log_start`` as the rows were read, on a table where
            retention runs. An acknowledged row below it may be gone (retention moved the
            start, I7), but only if its ack's ``sent`` (the wall time its append began, no row
            of it younger) is before ``retention_cutoff`` (check time - retention.ms).
    """
    failures: list[str] = []
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for value, p, o in stored:
        where[value].append((p, o))
    failures += [f"row {v!r} stored {len(at)} times, at {sorted(at)}" for v, at in sorted(where.items()) if len(at) > 1]
    failures += [f"row {v!r} written by no writer of the run" for v in sorted(where) if v.split(":")[0] not in writers]
    seen: dict[tuple[str, int], tuple[int, list[int]]] = {}
    for ack in acks:
        key = (ack["worker"], ack["batch"])
        placed = (ack["partition"], list(ack["range"]))
        if seen.setdefault(key, placed) != placed:
            failures.append(f"{ack['worker']} batch {ack['batch']} acknowledged at {seen[key]} and at {placed}")
            continue
        base, end = ack["range"]
        if end - base != ack["rows"]:
            failures.append(f"{ack['worker']} batch {ack['batch']}: {ack['rows']} rows acknowledged as offsets [{base}, {end})")
        if ack.get("expected") is not None and not ack["duplicate"] and base != ack["expected"]:
            failures.append(f"{ack['worker']} batch {ack['batch']} expected offset {ack['expected']} but landed at {base} (I2)")
        for i, row in enumerate(batch_rows(ack["worker"], ack["batch"], ack["rows"])):
            at = where.get(row["value"])
            if not at and log_starts is not None and base + i < log_starts.get(ack["partition"], 0):
                if retention_cutoff is None or ack["sent"] >= retention_cutoff:
                    failures.append(
                        f"acknowledged row {row['value']!r} (partition {ack['partition']}, offset {base + i}) dropped by retention "
                        f"(log_start {log_starts[ack['partition']]}) though its append began {ack['sent'] - (retention_cutoff or 0):.1f} s after the cutoff"
                    )
            elif not at:
                failures.append(f"acknowledged row {row['value']!r} (partition {ack['partition']}, offset {base + i}) lost")
            elif (ack["partition"], base + i) not in at:
                failures.append(
                    f"acknowledged row {row['value']!r} at partition {ack['partition']} offset {base + i}, stored at {at}"
                )
    return failures


def check_copy(source: list[tuple[int, int, str]], output: list[tuple[str, str]]) -> list[str]:
    """The copier's output ``(key, value)`` equals the transformed source ``(p, o, value)`` once."""
    failures: list[str] = []
    counts = Counter(k for k, _ in output)
    failures += [f"source record {k} copied {n} times" for k, n in sorted(counts.items()) if n > 1]
    want = {f"{p}:{o}": v.upper() for p, o, v in source}
    got = dict(output)
    failures += [f"source record {k} never copied" for k in sorted(set(want) - set(got))]
    failures += [f"output {k} has no source record" for k in sorted(set(got) - set(want))]
    failures += [
        f"source record {k}: copied as {got[k]!r}, expected {want[k]!r}"
        for k in sorted(set(want) & set(got))
        if got[k] != want[k]
    ]
    return failures


def check_group(
    source: list[tuple[int, int, str]], output: list[tuple[str, str]], acked: list[tuple[str, int, int]]
) -> list[str]:
    """The group's output, in output-offset order (the commit order), against the source.

    Args:
        source: ``(partition, offset, key)`` of every source record.
        output: ``(key, "p:o")`` of every output row, in output-offset order.
        acked: ``(member, partition, offset)`` the members acknowledged as processed.
    """
    failures: list[str] = []
    counts = Counter(v for _, v in output)
    failures += [f"source record {v} processed {n} times" for v, n in sorted(counts.items()) if n > 1]
    want = {f"{p}:{o}": k for p, o, k in source}
    failures += [f"source record {v} never processed" for v in sorted(set(want) - set(counts))]
    failures += [f"output {v} has no source record" for v in sorted(set(counts) - set(want))]
    failures += [
        f"source record {v}: key {k!r} in the output, {want[v]!r} in the source" for k, v in output if v in want and want[v] != k
    ]
    last: dict[tuple[int, str], int] = {}
    for k, v in output:
        p, o = (int(x) for x in v.split(":"))
        prior = last.get((p, k))
        if prior is not None and o <= prior:
            failures.append(f"key {k!r} of partition {p}: offset {o} processed after offset {prior}")
        last[(p, k)] = o if prior is None else max(prior, o)
    failures += [f"{m} acknowledged {p}:{o}, not in the output" for m, p, o in acked if f"{p}:{o}" not in counts]
    return failures


def check_group_commits(
    source: list[tuple[int, int, str]], acked: list[tuple[str, int, int, str]], committed: dict[int, int]
) -> list[str]:
    """A group that commits its offsets alone (a REST catalog), against the source.

    With no output table, what a member processed is known from its acknowledgements only,
    written after its commit returned (a commit cut by a kill is not acknowledged).

    Args:
        source: ``(partition, offset, key)`` of every source record.
        acked: ``(member, partition, offset, key)`` the members acknowledged as committed, each
            member's in the order of its commits.
        committed: The group's committed offset per partition after the drain: every record
            below it is committed (nothing skipped), and it must be the log end.
    """
    failures: list[str] = []
    want = {(p, o): k for p, o, k in source}
    by: dict[tuple[int, int], list[str]] = defaultdict(list)
    last: dict[tuple[str, int, str], int] = {}
    for m, p, o, k in acked:
        by[(p, o)].append(m)
        if (p, o) not in want:
            failures.append(f"{m} acknowledged {p}:{o}, which has no source record")
        elif want[(p, o)] != k:
            failures.append(f"{m} acknowledged {p}:{o} with key {k!r}, {want[(p, o)]!r} in the source")
        prior = last.get((m, p, k))
        if prior is not None and o <= prior:
            failures.append(f"{m}: key {k!r} of partition {p}: offset {o} committed after offset {prior}")
        last[(m, p, k)] = o if prior is None else max(prior, o)
    failures += [f"source record {p}:{o} committed {len(ms)} times, by {ms}" for (p, o), ms in sorted(by.items()) if len(ms) > 1]
    ends: dict[int, int] = defaultdict(int)
    for p, o, _ in source:
        ends[p] = max(ends[p], o + 1)
    failures += [
        f"partition {p}: the group's committed offset is {committed.get(p, 0)}, the log ends at {end}"
        for p, end in sorted(ends.items())
        if committed.get(p, 0) != end
    ]
    return failures


SOAK_LATENCY_FACTOR = 3.0
SOAK_GROWTH_FACTOR = 1.5
SOAK_SLACK = {"metadata_bytes": 4096, "snapshots": 2, "manifests": 2, "commit_ids": 2}
MANIFEST_MERGE_COUNT = int(TABLE_DEFAULTS["commit.manifest.min-count-to-merge"])


def check_soak(windows: list[dict[str, Any]], commits: int, window: int) -> list[str]:
    """Commit latency and metadata must not grow without bound over the soak.

    Windows are the soak's ``soak-window`` lines, one per ``window`` commits. The rule:

    * latency: the last window's p50 is at most ``SOAK_LATENCY_FACTOR`` (3x) the first's;
    * metadata: every retained structure (metadata JSON bytes, snapshots, manifests,
      commit ids) has reached its plateau in the first half of the soak: the last window's
      value is at most ``SOAK_GROWTH_FACTOR`` (1.5x) the largest of the first half, plus a
      small slack (``SOAK_SLACK``). Linear growth doubles from mid-soak to the end and
      fails; a bounded structure is flat by then. Manifests saw-tooth instead: appends merge
      them once ``commit.manifest.min-count-to-merge`` (50) pile up, and a window sampled every
      100 commits drifts through that cycle (2, 4, ... 20 over 1,000 commits, measured), so
      their bound is at least that count plus the slack. The soak table keeps
      ``icelog.commit-ids.keep = commits / 4`` commit ids so that this plateau comes within
      the first half (the default, 1,000, would need a 2,000-commit soak).
    """
    expected = commits // window
    if len(windows) < max(2, expected):
        return [f"the soak recorded {len(windows)} windows of {window} commits, expected {max(2, expected)}"]
    failures: list[str] = []
    first, last = windows[0], windows[-1]
    if last["p50_ms"] > SOAK_LATENCY_FACTOR * first["p50_ms"]:
        failures.append(
            f"commit latency grew: p50 {last['p50_ms']} ms in the last window, {first['p50_ms']} ms in the first (> {SOAK_LATENCY_FACTOR:g}x)"
        )
    half = windows[: (len(windows) + 1) // 2]
    for key, slack in SOAK_SLACK.items():
        bound = SOAK_GROWTH_FACTOR * max(w[key] for w in half) + slack
        if key == "manifests":
            bound = max(bound, MANIFEST_MERGE_COUNT + slack)
        if last[key] > bound:
            failures.append(
                f"{key} kept growing: {last[key]} at the end, over {bound:.0f} ({SOAK_GROWTH_FACTOR:g}x the first half's largest, {max(w[key] for w in half)}, + {slack})"
            )
    return failures


def soak_table(windows: list[dict[str, Any]]) -> list[str]:
    """The soak's windows as text lines (for the run's log, and BENCHMARKS.md)."""
    if not windows:
        return []
    lines = ["soak: commits  p50_ms  p95_ms  max_ms  metadata_bytes  snapshots  manifests  commit_ids"]
    lines += [
        f"soak: {w['commits']:7d} {w['p50_ms']:7.1f} {w['p95_ms']:7.1f} {w['max_ms']:7.1f} {w['metadata_bytes']:15d} {w['snapshots']:10d} {w['manifests']:10d} {w['commit_ids']:11d}"
        for w in windows
    ]
    return lines


# --- catalog and disk faults ---------------------------------------------------------------------


def _pg_ctl(directory: Path, *args: str) -> subprocess.CompletedProcess:
    from infra import postgres

    argv = [str(postgres.bin_dir() / "pg_ctl"), "-D", str(Path(directory).resolve() / "data"), *args]
    return subprocess.run(postgres._as_server_user(argv), capture_output=True, text=True)


def stop_catalog_server(directory: Path) -> None:
    """``pg_ctl stop -m fast``: clients are disconnected, the server shuts down cleanly."""
    done = _pg_ctl(directory, "-m", "fast", "-w", "stop")
    if done.returncode != 0:
        raise RuntimeError(f"pg_ctl stop failed: {done.stderr or done.stdout}")


def start_catalog_server(directory: Path) -> None:
    """Start a server of ``infra.postgres`` again, on the port it had (clients reconnect)."""
    from infra import postgres

    directory = Path(directory).resolve()
    done = _pg_ctl(
        directory,
        "-o",
        postgres.server_options(directory, (directory / "port").read_text().strip()),
        "-l",
        str(directory / "server.log"),
        "-w",
        "start",
    )
    if done.returncode != 0:
        raise RuntimeError(f"pg_ctl start failed: {done.stderr or done.stdout}")


def kill_rest_server(directory: Path) -> None:
    """``kill -9`` the SeaweedFS server of ``infra.seaweedfs`` (catalog and S3 store together)."""
    from infra import seaweedfs

    seaweedfs.stop(directory, grace=0)


def start_rest_server(directory: Path, uri: str) -> None:
    """Start it again on its directory; it must come back on the same ports (clients reconnect)."""
    from infra import seaweedfs

    config = seaweedfs.start(directory)
    if config["uri"] != uri:
        raise RuntimeError(f"the SeaweedFS server came back at {config['uri']}, not {uri} (a port was taken meanwhile)")


def mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` at ``path``; return why not (None: mounted)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {(done.stderr or done.stdout).strip()}"


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(directory: Path) -> int:
    """Write a ballast file into ``directory`` until the file system is full; its size in bytes."""
    ballast = directory / "ballast"
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                written += f.write(chunk)
        except OSError:
            pass
        try:  # the last, partial megabyte
            while f.write(b"\0" * 4096):
                written += 4096
        except OSError:
            pass
    return written


def free_disk(directory: Path) -> None:
    (directory / "ballast").unlink(missing_ok=True)


# --- the run -------------------------------------------------------------------------------------


def _specs(workdir: Path, kind: str, pg_uri: str | None, rest_dir: Path | None = None) -> tuple[CatalogSpec, CatalogSpec]:
    if kind == "rest":
        from infra import seaweedfs

        assert rest_dir is not None, "a REST run needs its SeaweedFS server's directory"
        config = seaweedfs.catalog_config(rest_dir)
        source = CatalogSpec("rest", "chaos_source", config.pop("uri"), config.pop("warehouse"), tuple(sorted(config.items())))
        # The mirror's target: a SQL catalog beside it (the disaster-recovery direction).
        (workdir / "target-warehouse").mkdir(parents=True, exist_ok=True)
        target = CatalogSpec(
            "sqlite", "chaos_target", f"sqlite:///{workdir / 'target'}.db", f"file://{workdir / 'target-warehouse'}"
        )
        return source, target
    specs = []
    for role in ("source", "target"):
        warehouse = workdir / f"{role}-warehouse"
        warehouse.mkdir(parents=True, exist_ok=True)
        if kind == "sqlite":
            specs.append(CatalogSpec("sqlite", f"chaos_{role}", f"sqlite:///{workdir / role}.db", f"file://{warehouse}"))
        else:
            specs.append(CatalogSpec("postgres", f"chaos{uuid.uuid4().hex[:8]}_{role}", pg_uri or "", f"file://{warehouse}"))
    return specs[0], specs[1]


def _worker_args(config: Config, workdir: Path, source: CatalogSpec, target: CatalogSpec) -> dict[str, tuple[str, dict]]:
    base = {"spec": asdict(source), "batch": config.batch}
    workers: dict[str, tuple[str, dict]] = {}
    for i in range(config.producers):
        workers[f"producer{i}"] = ("producer", {"table": EVENTS, "partition": i % config.partitions})
    for i in range(config.appenders):
        workers[f"appender{i}"] = ("appender", {"table": EVENTS, "partition": i % config.partitions})
    workers["copier"] = (
        "copier",
        {"src": EVENTS, "out": COPIED, "group": "chaos-copier", "tid": "chaos-copier", "batch": 4 * config.batch},
    )
    workers["mirror"] = ("mirror", {"table": EVENTS, "target_spec": asdict(target), "principal": PRINCIPAL})
    for i in range(config.members):
        workers[f"member{i}"] = (
            "member",
            {
                "src": EVENTS,
                "out": CONSUMED,
                "group": GROUP,
                "session_ms": config.session_ms,
                "batch": 5 * config.batch,
            },
        )
    maintained = [EVENTS, COPIED, CONSUMED] + ([SOAK] if config.soak_commits else [])
    workers["maintainer"] = ("maintainer", {"tables": maintained, "pause_s": 1.0})
    if config.soak_commits:
        workers["soak"] = ("soak", {"table": SOAK, "commits": config.soak_commits, "window": config.soak_window})
    return {
        name: (kind, {**base, **args, "name": name, "dir": str(workdir / "workers" / name)})
        for name, (kind, args) in workers.items()
    }


class Controller:
    """Starts, kills, stops and restarts the workers, and logs every event."""

    def __init__(
        self,
        workdir: Path,
        workers: dict[str, tuple[str, dict]],
        report: Report,
        echo: bool,
        pg_dir: Path | None = None,
        full_disk: Path | None = None,
        rest: tuple[Path, str] | None = None,
    ) -> None:
        self.workdir, self.workers, self.report, self.echo = workdir, workers, report, echo
        self.pg_dir, self.full_disk = pg_dir, full_disk  # what catalog-down stops, what disk-full fills
        self.rest = rest  # the SeaweedFS server's directory and catalog URI, what catalog-down kills on REST
        # Where a slow worker sleeps: the SQL catalog writes the metadata file, a REST server writes its own.
        self.delay_point = "after_data_files" if rest else "after_metadata_write"
        self.procs: dict[str, subprocess.Popen] = {}
        self.started = time.monotonic()
        self.expected_exit: set[str] = set()
        self.delays: dict[str, str] = {}  # worker -> ICELOG_DELAY_AT it runs with (a slow worker)
        self.soak_seen = 0  # soak-window lines already echoed

    def event(self, action: str, worker: str, detail: str = "") -> None:
        entry = {"t": round(time.monotonic() - self.started, 2), "action": action, "worker": worker, "detail": detail}
        self.report.events.append(entry)
        if self.echo:
            print(f"  {entry['t']:8.2f}s {action:<8} {worker} {detail}", flush=True)

    def log(self, name: str) -> Path:
        return self.workdir / "workers" / name / "process.log"

    def start(self, name: str, **extra: Any) -> subprocess.Popen:
        kind, args = self.workers[name]
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ICELOG_PAUSE", "ICELOG_DELAY")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        if name in self.delays:
            env["ICELOG_DELAY_AT"] = self.delays[name]
        # Restarts are frequent: compiling every import afresh would cost seconds of CPU each.
        # The bytecode goes to a cache of its own, never into the tree or the venv.
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "icelog-chaos-pycache")
        with open(self.log(name), "a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.workers", kind, json.dumps({**args, **extra})],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def reap(self) -> None:
        """Restart workers that exited on their own; a crash (not RESTART_ME) is a failure."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or name in self.expected_exit:
                continue
            self.judge_own_exit(name, code)
            self.event("exited", name, f"code {code}")
            self.start(name)

    def judge_own_exit(self, name: str, code: int) -> None:
        """A worker that ended unasked: RESTART_ME is fine, an untyped error or a crash fails the run."""
        if code == UNTYPED:
            self.untyped(name)
        elif code != RESTART_ME:
            tail = self.log(name).read_text()[-2000:]
            self.report.failures.setdefault("workers", []).append(f"{name} exited with {code} on its own:\n{tail}")

    def untyped(self, name: str) -> None:
        """A worker ended on an error of no icelog type: record it (the ``typed`` check)."""
        last = [line for line in self.log(name).read_text().splitlines() if line.startswith("UNTYPED ")]
        what = last[-1][len("UNTYPED ") :] if last else "?"
        self.event("untyped", name, what[:200])
        self.report.failures.setdefault("typed", []).append(f"{name} ended on {what}")

    def echo_soak(self) -> None:
        """Print the soak's new windows as they come (the run's log)."""
        path = self.workdir / "workers" / "soak" / "ack.jsonl"
        if not self.echo or not path.exists():
            return
        windows = [json.loads(line) for line in path.read_text().splitlines() if '"soak-window"' in line]
        for line in soak_table(windows)[1:][self.soak_seen :]:
            print(f"  {time.monotonic() - self.started:8.2f}s {line}", flush=True)
        self.soak_seen = len(windows)

    def fault(self, rng: random.Random, config: Config, kinds: tuple[str, ...]) -> None:
        """One fault of a kind the rng picks (with kinds ``kill, sigterm``, the draws of old)."""
        name = rng.choice(sorted(n for n in self.procs if n != "soak"))
        kind = kinds[int(rng.random() * len(kinds))]
        if kind == "catalog-down":
            return self.catalog_down(rng, config)
        if kind == "disk-full":
            return self.disk_full(rng, config)
        hard = kind != "sigterm"
        proc = self.procs[name]
        self.expected_exit.add(name)
        self.delays.pop(name, None)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
        if kind == "slow":
            self.delays[name] = f"{self.delay_point}:{rng.uniform(*config.slow):.2f}"
            self.event("slow", name, f"kill -9, restarted with ICELOG_DELAY_AT={self.delays[name]}")
        else:
            self.event("kill -9" if hard else "sigterm", name)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a long step (a compaction under load): slow, not wrong
            proc.kill()
            code = proc.wait()
            self.event("kill -9", name, "did not stop within 60 s of SIGTERM")
            hard = True
        self.check_exit(name, code, hard)
        time.sleep(rng.uniform(*config.down))
        self.start(name)
        self.expected_exit.discard(name)
        self.event("restart", name)

    def catalog_down(self, rng: random.Random, config: Config) -> None:
        """Stop the catalog's server for a few seconds, with every worker running: PostgreSQL
        cleanly, SeaweedFS (REST catalog and S3 store) by ``kill -9``."""
        seconds = rng.uniform(*config.outage)
        if self.rest is not None:
            kill_rest_server(self.rest[0])
            self.event("catalog-down", "all", f"kill -9 of the SeaweedFS server for {seconds:.1f} s")
            self.watch(seconds)
            start_rest_server(*self.rest)
        else:
            assert self.pg_dir is not None
            stop_catalog_server(self.pg_dir)
            self.event("catalog-down", "all", f"pg_ctl stop -m fast for {seconds:.1f} s")
            self.watch(seconds)
            start_catalog_server(self.pg_dir)
        self.event("catalog-up", "all")

    def disk_full(self, rng: random.Random, config: Config) -> None:
        """Fill the warehouse's file system for a few seconds, with every worker running."""
        seconds = rng.uniform(*config.outage)
        assert self.full_disk is not None
        filled = fill_disk(self.full_disk)
        self.event("disk-full", "all", f"ballast {filled >> 20} MiB fills {self.full_disk.name}, for {seconds:.1f} s")
        self.watch(seconds)
        free_disk(self.full_disk)
        self.event("disk-freed", "all")

    def watch(self, seconds: float) -> None:
        """Wait, restarting workers that end meanwhile (they must ride an outage out)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.reap()
            time.sleep(0.1)

    def check_exit(self, name: str, code: int, hard: bool, clean: tuple[int, ...] = (0, RESTART_ME)) -> None:
        """How a worker ended after a signal: an untyped error, or a crash on SIGTERM, fails the run."""
        if code == UNTYPED:
            self.untyped(name)
        elif not hard and code not in clean:
            self.report.failures.setdefault("workers", []).append(
                f"{name} exited with {code} after SIGTERM:\n{self.log(name).read_text()[-2000:]}"
            )

    def stop_all(self) -> None:
        # A worker that ended on its own since the last reap is judged as reap judges it; the
        # rest must stop cleanly on SIGTERM, as a sigterm fault requires.
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and name not in self.expected_exit:
                self.judge_own_exit(name, code)
        self.expected_exit.update(self.procs)
        running = {name: proc for name, proc in self.procs.items() if proc.poll() is None}
        for proc in running.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in running.items():
            hard = False
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                hard = True
                self.event("kill -9", name, "did not stop within 60 s of SIGTERM")
            # Ended by SIGTERM itself (the signal's default action: seen on REST runs, e.g. a
            # member or the soak inside a library call), it stopped as asked; a crash is any other code.
            self.check_exit(name, code, hard, clean=(0, RESTART_ME, -signal.SIGTERM))
        self.event("stopped", "all")

    def drain(self, name: str, timeout: float = 600.0) -> None:
        """Run one worker to completion (its ``drain`` mode); restart it on RESTART_ME."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.start(name, drain=True)
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.report.failures.setdefault("drain", []).append(
                    f"{name} did not finish within {timeout:.0f} s:\n{self.log(name).read_text()[-2000:]}"
                )
                return
            if code == 0:
                self.event("drained", name)
                return
            if code == UNTYPED:
                self.untyped(name)
            elif code != RESTART_ME:
                self.report.failures.setdefault("drain", []).append(
                    f"{name} exited with {code}:\n{self.log(name).read_text()[-2000:]}"
                )
                return


def _setup(config: Config, source: CatalogSpec, target: CatalogSpec) -> None:
    from icelog.storage.log.table import LogTable
    from icelog.storage.replication.acls import add_acl

    catalog = source.open()
    LogTable.create(catalog, EVENTS, config.partitions)
    LogTable.create(catalog, COPIED, config.partitions)  # the copier's output
    LogTable.create(catalog, CONSUMED, 1)  # the group's output
    if config.soak_commits:
        keep_ids = str(max(config.soak_window, config.soak_commits // 4))  # see check_soak
        LogTable.create(
            catalog,
            SOAK,
            1,
            properties={
                "icelog.commit-ids.keep": keep_ids,
                "icelog.commit-ids.min-retention-ms": "0",
                "icelog.retention.ms": str(config.retention_ms),
            },
        )
    add_acl(target.open(), PRINCIPAL, "chaos.*")


def _acks(workdir: Path, kind: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((workdir / "workers").glob("*/ack.jsonl")):
        for line in path.read_text().splitlines():
            ack = json.loads(line)
            if ack["kind"] == kind:
                found.append({**ack, "worker": path.parent.name})
    return found


def _rows(catalog, table: str, columns: list[str]) -> list[tuple]:
    from icelog.storage.log.table import LogTable

    log_table = LogTable(catalog, table)
    out: list[tuple] = []
    for p in sorted(log_table.watermarks()):
        rows = log_table.read(p)
        out += list(zip(*(rows.column(c).to_pylist() for c in columns), strict=False))
    return out


def run_validators(source: CatalogSpec, target: CatalogSpec) -> list[str]:
    """Every registered check on every log table: ``mirror-parity`` on the mirrors only."""
    from icelog.storage.core.commit import load
    from icelog.storage.log.table import list_log_tables
    from icelog.storage.replication.mirror import mirror_record
    from icelog.validations.checks import CHECKS, run_checks
    from icelog.validations.mirror import check_mirror_parity

    failures: list[str] = []
    src = source.open()
    for catalog in (src, target.open()):
        for name in list_log_tables(catalog):
            table = load(catalog, name)
            record = mirror_record(table.metadata)
            report = run_checks(table, [c for c in CHECKS if c != "mirror-parity"])
            if record is not None:
                parity = check_mirror_parity(table, source=load(src, record["table"]))
                report.violations.extend(parity.violations)
            failures += [f"{catalog.name}.{name}: {v}" for v in report.violations]
    return failures


def check_run(workdir: Path, source: CatalogSpec, target: CatalogSpec, report: Report, config: Config | None = None) -> None:
    catalog = source.open()
    if config is not None and config.soak_commits:
        check_soak_run(workdir, catalog, config, report)
    writers = sorted(p.name for p in (workdir / "workers").iterdir() if p.name.startswith(("producer", "appender")))
    stored = _rows(catalog, EVENTS, ["value", "log_partition", "log_offset"])
    acks = _acks(workdir, "producer") + _acks(workdir, "appender")
    report.failures["acked"] = check_acked(stored, acks, writers)
    keys = {(p, o): k for k, p, o in _rows(catalog, EVENTS, ["key", "log_partition", "log_offset"])}
    source_keys = [(p, o, k) for (p, o), k in keys.items()]
    source_rows = [(p, o, v) for v, p, o in stored]
    report.failures["copy"] = check_copy(source_rows, _rows(catalog, COPIED, ["key", "value"]))
    member_processed = [(a["worker"], p, o) for a in _acks(workdir, "member") for p, o, _ in a["processed"]]
    report.failures["group"] = check_group(source_keys, _rows(catalog, CONSUMED, ["key", "value"]), member_processed)
    report.failures["validators"] = run_validators(source, target)
    report.counts.update(
        rows=len(stored),
        acked_batches=len({(a["worker"], a["batch"]) for a in acks}),
        copied=len(_acks(workdir, "copier")),
        group_commits=len(_acks(workdir, "member")),
        consumed=len(_rows(catalog, CONSUMED, ["key"])),  # the group's output, exactly once (``group``)
        mirror_steps=len(_acks(workdir, "mirror")),
        maintenance=len(_acks(workdir, "maintainer")),
    )


def check_soak_run(workdir: Path, catalog: Any, config: Config, report: Report) -> None:
    """The soak table: acknowledged rows (retention allowed for), and the soak's bounds."""
    from icelog.storage.log.table import LogTable

    log_starts = {p: w.start for p, w in LogTable(catalog, SOAK).watermarks().items()}
    cutoff = time.time() - config.retention_ms / 1000  # after the read: retention could only have cut earlier
    stored = _rows(catalog, SOAK, ["value", "log_partition", "log_offset"])
    acks = _acks(workdir, "soak")
    report.failures["soak-acked"] = check_acked(stored, acks, ["soak"], log_starts, cutoff)
    report.soak = [{k: v for k, v in w.items() if k not in ("kind", "worker", "t")} for w in _acks(workdir, "soak-window")]
    report.failures["soak"] = check_soak(report.soak, config.soak_commits, config.soak_window)
    acked_rows = sum(a["rows"] for a in {(a["batch"]): a for a in acks}.values())
    report.counts.update(
        soak_commits=len({a["batch"] for a in acks}),
        soak_rows_stored=len(stored),
        soak_rows_retained_away=max(0, acked_rows - len(stored)),
        soak_log_start=sum(log_starts.values()),
    )


def applicable_faults(
    config: Config, kind: str, pg_dir: Path | None, full_disk: Path | None, report: Report, rest_dir: Path | None = None
) -> tuple[str, ...]:
    """The run's fault kinds: ``config.faults`` less those that cannot apply here (noted)."""
    unknown = set(config.faults) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {FAULT_KINDS}")
    kinds = []
    for fault in config.faults:
        server = {"postgres": pg_dir, "rest": rest_dir}.get(kind)
        if fault == "catalog-down" and server is None:
            report.notes.append("catalog-down left out: it needs a catalog server (PostgreSQL or REST) and its directory")
        elif fault == "disk-full" and kind == "rest":
            report.notes.append("disk-full left out: a REST catalog's tables live in the SeaweedFS server's store")
        elif fault == "disk-full" and full_disk is None:
            report.notes.append(f"disk-full left out: {report.counts.get('tmpfs_reason') or 'no --warehouse-tmpfs'}")
        else:
            kinds.append(fault)
    if not kinds:
        raise ValueError(f"no fault kind of {config.faults} applies to this run")
    return tuple(kinds)


def run_chaos(
    config: Config,
    workdir: Path,
    kind: str = "sqlite",
    pg_uri: str | None = None,
    echo: bool = True,
    pg_dir: Path | None = None,
    rest_dir: Path | None = None,
) -> Report:
    """One chaos run on one catalog kind; returns the report (``report.ok``).

    Args:
        pg_dir: The PostgreSQL server's directory (``infra.postgres``), for ``catalog-down``.
        rest_dir: With ``kind="rest"``, the running SeaweedFS server's directory
            (``infra.seaweedfs``): the catalog, and what ``catalog-down`` kills. The server is
            the run's own (it is killed); its tables must not exist yet.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report(kind, config.seed)
    report.replay = (
        f"--catalog {kind} --seed {config.seed} --duration {config.duration:g} --producers {config.producers} --appenders {config.appenders} "
        f"--members {config.members} --batch {config.batch} --interval {config.interval[0]:g} {config.interval[1]:g} "
        f"--faults {','.join(config.faults)} --soak-commits {config.soak_commits} --soak-window {config.soak_window} --retention-ms {config.retention_ms}"
        + (f" --warehouse-tmpfs {config.warehouse_tmpfs_mb}" if config.warehouse_tmpfs_mb else "")
    )
    started = time.monotonic()
    full_disk: Path | None = None
    if config.warehouse_tmpfs_mb and "disk-full" in config.faults and kind != "rest":
        warehouse = workdir / "source-warehouse"
        reason = mount_tmpfs(warehouse, config.warehouse_tmpfs_mb)
        if reason is None:
            full_disk = warehouse
        else:
            report.notes.append(f"disk-full left out: {reason}")
    try:
        kinds = applicable_faults(config, kind, pg_dir, full_disk, report, rest_dir)
        source, target = _specs(workdir, kind, pg_uri, rest_dir)
        _setup(config, source, target)
        workers = _worker_args(config, workdir, source, target)
        rest = (rest_dir, source.uri) if kind == "rest" and rest_dir is not None else None
        controller = Controller(workdir, workers, report, echo, pg_dir=pg_dir, full_disk=full_disk, rest=rest)
        _run_workers(controller, config, kinds)
        if not report.failures.get("drain"):
            check_run(workdir, source, target, report, config)
            if full_disk is not None:
                report.counts["warehouse_mib"] = int(shutil.disk_usage(full_disk).used) >> 20
    finally:
        if full_disk is not None:
            unmount(full_disk)
    report.seconds = time.monotonic() - started
    (workdir / "report.json").write_text(json.dumps(asdict(report), indent=1))
    return report


def _run_workers(controller: Controller, config: Config, kinds: tuple[str, ...]) -> None:
    rng = random.Random(config.seed)
    try:
        for name in controller.workers:
            controller.start(name)
        controller.event("started", "all", f"{len(controller.workers)} workers; faults {', '.join(kinds)}")
        end = time.monotonic() + config.duration
        next_fault = time.monotonic() + rng.uniform(*config.interval)
        while time.monotonic() < end:
            controller.reap()
            controller.echo_soak()
            if time.monotonic() >= next_fault:
                controller.fault(rng, config, kinds)
                next_fault = time.monotonic() + rng.uniform(*config.interval)
            time.sleep(0.1)
        controller.reap()
        controller.stop_all()
        # One maintenance pass first (retention sees the whole fault phase), then the soak to
        # its commit count (so rows younger than the pass stay: the soak checks see stored
        # rows above log_start, not only rows below it); the mirror last: it copies the final source.
        for name in ("maintainer", "soak", "copier", "member0", "mirror"):
            if name in controller.workers:
                # A soak that has not reached its commit count under faults gets time for the rest.
                controller.drain(name, 600.0 + (2.0 * config.soak_commits if name == "soak" else 0.0))
        controller.echo_soak()
    finally:
        for proc in controller.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _fault_list(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"fault kinds are a comma-separated subset of {','.join(FAULT_KINDS)}, not {text!r}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults per catalog")
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument(
        "--catalog",
        choices=list(CATALOG_CHOICES),
        default="both",
        help="both: sqlite then postgres; all: sqlite, postgres, then rest (a SeaweedFS server)",
    )
    parser.add_argument("--producers", type=int, default=Config.producers)
    parser.add_argument("--appenders", type=int, default=Config.appenders)
    parser.add_argument("--members", type=int, default=Config.members)
    parser.add_argument("--batch", type=int, default=Config.batch, help="rows per writer batch")
    parser.add_argument(
        "--interval", type=float, nargs=2, default=Config.interval, metavar=("MIN", "MAX"), help="seconds between faults"
    )
    parser.add_argument(
        "--faults",
        type=_fault_list,
        default=FAULT_KINDS,
        help=f"comma-separated fault kinds (default: {','.join(FAULT_KINDS)}; those that cannot apply are left out)",
    )
    parser.add_argument(
        "--soak-commits", type=int, default=Config.soak_commits, help="commits of the soak worker, at least (0: no soak)"
    )
    parser.add_argument("--soak-window", type=int, default=Config.soak_window, help="commits per soak report line")
    parser.add_argument("--retention-ms", type=int, default=Config.retention_ms, help="icelog.retention.ms of the soak table")
    parser.add_argument(
        "--warehouse-tmpfs",
        type=int,
        default=1024,
        metavar="MB",
        help="the source warehouse on a tmpfs of this size, for disk-full (0: none)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory (kept)")
    a = parser.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1_000_000)
    config = Config(
        duration=a.duration,
        seed=seed,
        producers=a.producers,
        appenders=a.appenders,
        members=a.members,
        batch=a.batch,
        interval=tuple(a.interval),
        faults=a.faults,
        soak_commits=a.soak_commits,
        soak_window=a.soak_window,
        retention_ms=a.retention_ms,
        warehouse_tmpfs_mb=a.warehouse_tmpfs or None,
    )
    root = a.workdir or Path(tempfile.mkdtemp(prefix="icelog-chaos-"))
    failed = False
    for kind in CATALOG_CHOICES[a.catalog]:
        print(f"chaos on {kind}: seed {seed}, {a.duration:.0f} s, workdir {root / kind}", flush=True)
        if kind == "postgres":
            from infra import postgres

            server = root / "postgres"
            try:
                report = run_chaos(config, root / kind, kind, postgres.start(server), pg_dir=server)
            finally:
                postgres.stop(server)
        elif kind == "rest":
            from infra import seaweedfs

            server = root / "seaweedfs"
            seaweedfs.start(server)
            try:
                report = run_chaos(config, root / kind, kind, rest_dir=server)
            finally:
                seaweedfs.stop(server)
        else:
            report = run_chaos(config, root / kind, kind)
        print(report.describe(), flush=True)
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

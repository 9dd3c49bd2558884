"""The chaos controller and its end-of-run checks: ``python -m tests.chaos.run --help``.

One run: create the tables, start the workers (``tests.chaos.workers``) as OS processes, and
for ``--duration`` seconds, at seeded random times, pick a random worker and either SIGKILL it
or stop it cleanly (SIGTERM: it finishes its step), then restart it. Then stop everything,
drain (copier, group and mirror run to the log end), and check:

* ``validators``: every check of ``validations.checks.CHECKS`` on every log table of both
  catalogs (``mirror-parity`` on the mirror targets, against their source);
* ``acked``: every acknowledged row is stored, at its acknowledged offset; no row twice;
* ``copy``: the copier's output is the transformed input, exactly once;
* ``group``: each source record processed once, each key's records in offset order, and
  every member's acknowledged offsets stored;
* ``workers``: no worker died on its own (exit code other than 0 or ``RESTART_ME``).

A failure prints the seed, the controller's event log and the failed check's details, and
exits 1. The pure checks (``check_acked``, ``check_copy``, ``check_group``) take plain data,
so tests can plant a duplicate or drop a row and see them fail.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

from tests.catalogs import CatalogSpec
from tests.chaos.workers import RESTART_ME, batch_rows

ROOT = Path(__file__).resolve().parents[2]
PRINCIPAL = "chaos-mirror"
EVENTS, COPIED, CONSUMED = "chaos.events", "chaos.copied", "chaos.consumed"
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


@dataclass
class Report:
    catalog: str
    seed: int
    events: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    replay: str = ""

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def describe(self) -> str:
        kinds = Counter(e["action"] for e in self.events)
        head = f"chaos {self.catalog} seed={self.seed}: {'OK' if self.ok else 'FAILED'} in {self.seconds:.0f} s; faults {dict(kinds)}; {self.counts}"
        if self.ok:
            return head
        lines = [head, f"replay: python -m tests.chaos.run {self.replay}", "history:"]
        lines += [f"  {e['t']:8.2f}s {e['action']:<8} {e['worker']}" + (f" ({e['detail']})" if e.get("detail") else "") for e in self.events]
        for check, found in self.failures.items():
            for line in found[:MAX_SHOWN]:
                lines.append(f"FAILED {check}: {line}")
            if len(found) > MAX_SHOWN:
                lines.append(f"FAILED {check}: ... {len(found) - MAX_SHOWN} more")
        return "\n".join(lines)


# --- the pure checks ---------------------------------------------------------------------------


def check_acked(stored: list[tuple[str, int, int]], acks: list[dict[str, Any]], writers: list[str]) -> list[str]:
    """Acknowledged writes against what the table holds.

    Args:
        stored: ``(value, partition, offset)`` of every row of the written table.
        acks: The writers' acknowledgement lines (``worker`` added), for batches of
            :func:`tests.chaos.workers.batch_rows`.
        writers: The writers' names; every stored row must come from one of them.
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
            if not at:
                failures.append(f"acknowledged row {row['value']!r} (partition {ack['partition']}, offset {base + i}) lost")
            elif (ack["partition"], base + i) not in at:
                failures.append(f"acknowledged row {row['value']!r} at partition {ack['partition']} offset {base + i}, stored at {at}")
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
    failures += [f"source record {k}: copied as {got[k]!r}, expected {want[k]!r}" for k in sorted(set(want) & set(got)) if got[k] != want[k]]
    return failures


def check_group(source: list[tuple[int, int, str]], output: list[tuple[str, str]], acked: list[tuple[str, int, int]]) -> list[str]:
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
    failures += [f"source record {v}: key {k!r} in the output, {want[v]!r} in the source" for k, v in output if v in want and want[v] != k]
    last: dict[tuple[int, str], int] = {}
    for k, v in output:
        p, o = (int(x) for x in v.split(":"))
        prior = last.get((p, k))
        if prior is not None and o <= prior:
            failures.append(f"key {k!r} of partition {p}: offset {o} processed after offset {prior}")
        last[(p, k)] = o if prior is None else max(prior, o)
    failures += [f"{m} acknowledged {p}:{o}, not in the output" for m, p, o in acked if f"{p}:{o}" not in counts]
    return failures


# --- the run -------------------------------------------------------------------------------------


def _specs(workdir: Path, kind: str, pg_uri: str | None) -> tuple[CatalogSpec, CatalogSpec]:
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
    workers["copier"] = ("copier", {"src": EVENTS, "out": COPIED, "group": "chaos-copier", "tid": "chaos-copier", "batch": 4 * config.batch})
    workers["mirror"] = ("mirror", {"table": EVENTS, "target_spec": asdict(target), "principal": PRINCIPAL})
    for i in range(config.members):
        workers[f"member{i}"] = ("member", {"src": EVENTS, "out": CONSUMED, "group": GROUP, "session_ms": config.session_ms, "batch": 5 * config.batch})
    workers["maintainer"] = ("maintainer", {"tables": [EVENTS, COPIED, CONSUMED], "pause_s": 1.0})
    return {name: (kind, {**base, **args, "name": name, "dir": str(workdir / "workers" / name)}) for name, (kind, args) in workers.items()}


class Controller:
    """Starts, kills, stops and restarts the workers, and logs every event."""

    def __init__(self, workdir: Path, workers: dict[str, tuple[str, dict]], report: Report, echo: bool) -> None:
        self.workdir, self.workers, self.report, self.echo = workdir, workers, report, echo
        self.procs: dict[str, subprocess.Popen] = {}
        self.started = time.monotonic()
        self.expected_exit: set[str] = set()

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
        env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_PAUSE") and k != "PYTHONDONTWRITEBYTECODE"}
        # Restarts are frequent: compiling every import afresh would cost seconds of CPU each.
        # The bytecode goes to a cache of its own, never into the tree or the venv.
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "icelog-chaos-pycache")
        with open(self.log(name), "a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.workers", kind, json.dumps({**args, **extra})],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def reap(self) -> None:
        """Restart workers that exited on their own; a crash (not RESTART_ME) is a failure."""
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or name in self.expected_exit:
                continue
            if code != RESTART_ME:
                tail = self.log(name).read_text()[-2000:]
                self.report.failures.setdefault("workers", []).append(f"{name} exited with {code} on its own:\n{tail}")
            self.event("exited", name, f"code {code}")
            self.start(name)

    def fault(self, rng: random.Random, config: Config) -> None:
        name = rng.choice(sorted(self.procs))
        hard = rng.random() < 0.5
        proc = self.procs[name]
        self.expected_exit.add(name)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
        self.event("kill -9" if hard else "sigterm", name)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a long step (a compaction under load): slow, not wrong
            proc.kill()
            code = proc.wait()
            self.event("kill -9", name, "did not stop within 60 s of SIGTERM")
            hard = True
        if not hard and code not in (0, RESTART_ME):
            self.report.failures.setdefault("workers", []).append(f"{name} exited with {code} after SIGTERM:\n{self.log(name).read_text()[-2000:]}")
        time.sleep(rng.uniform(*config.down))
        self.start(name)
        self.expected_exit.discard(name)
        self.event("restart", name)

    def stop_all(self) -> None:
        self.expected_exit.update(self.procs)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.event("kill -9", name, "did not stop within 60 s of SIGTERM")
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
                self.report.failures.setdefault("drain", []).append(f"{name} did not finish within {timeout:.0f} s:\n{self.log(name).read_text()[-2000:]}")
                return
            if code == 0:
                self.event("drained", name)
                return
            if code != RESTART_ME:
                self.report.failures.setdefault("drain", []).append(f"{name} exited with {code}:\n{self.log(name).read_text()[-2000:]}")
                return


def _setup(config: Config, source: CatalogSpec, target: CatalogSpec) -> None:
    from storage.acls import add_acl
    from storage.log import LogTable

    catalog = source.open()
    LogTable.create(catalog, EVENTS, config.partitions)
    LogTable.create(catalog, COPIED, config.partitions)
    LogTable.create(catalog, CONSUMED, 1)
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
    from storage.log import LogTable

    log_table = LogTable(catalog, table)
    out: list[tuple] = []
    for p in sorted(log_table.watermarks()):
        rows = log_table.read(p)
        out += list(zip(*(rows.column(c).to_pylist() for c in columns)))
    return out


def run_validators(source: CatalogSpec, target: CatalogSpec) -> list[str]:
    """Every registered check on every log table: ``mirror-parity`` on the mirrors only."""
    from storage.commit import load
    from storage.log import list_log_tables
    from storage.mirror import mirror_record
    from validations.checks import CHECKS, run_checks
    from validations.mirror import check_mirror_parity

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


def check_run(workdir: Path, source: CatalogSpec, target: CatalogSpec, report: Report) -> None:
    catalog = source.open()
    writers = sorted(p.name for p in (workdir / "workers").iterdir() if p.name.startswith(("producer", "appender")))
    stored = _rows(catalog, EVENTS, ["value", "log_partition", "log_offset"])
    acks = _acks(workdir, "producer") + _acks(workdir, "appender")
    report.failures["acked"] = check_acked(stored, acks, writers)
    source_rows = [(p, o, v) for v, p, o in stored]
    report.failures["copy"] = check_copy(source_rows, _rows(catalog, COPIED, ["key", "value"]))
    keys = {(p, o): k for k, p, o in _rows(catalog, EVENTS, ["key", "log_partition", "log_offset"])}
    member_acks = [(a["worker"], p, o) for a in _acks(workdir, "member") for p, o, _ in a["processed"]]
    report.failures["group"] = check_group([(p, o, k) for (p, o), k in keys.items()], _rows(catalog, CONSUMED, ["key", "value"]), member_acks)
    report.failures["validators"] = run_validators(source, target)
    report.counts.update(
        rows=len(stored), acked_batches=len({(a["worker"], a["batch"]) for a in acks}),
        copied=len(_acks(workdir, "copier")), group_commits=len(_acks(workdir, "member")),
        mirror_steps=len(_acks(workdir, "mirror")), maintenance=len(_acks(workdir, "maintainer")),
    )


def run_chaos(config: Config, workdir: Path, kind: str = "sqlite", pg_uri: str | None = None, echo: bool = True) -> Report:
    """One chaos run on one catalog kind; returns the report (``report.ok``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report(kind, config.seed)
    report.replay = (
        f"--catalog {kind} --seed {config.seed} --duration {config.duration:g} --producers {config.producers} --appenders {config.appenders} "
        f"--members {config.members} --batch {config.batch} --interval {config.interval[0]:g} {config.interval[1]:g}"
    )
    started = time.monotonic()
    source, target = _specs(workdir, kind, pg_uri)
    _setup(config, source, target)
    workers = _worker_args(config, workdir, source, target)
    controller = Controller(workdir, workers, report, echo)
    rng = random.Random(config.seed)
    try:
        for name in workers:
            controller.start(name)
        controller.event("started", "all", f"{len(workers)} workers")
        end = time.monotonic() + config.duration
        next_fault = time.monotonic() + rng.uniform(*config.interval)
        while time.monotonic() < end:
            controller.reap()
            if time.monotonic() >= next_fault:
                controller.fault(rng, config)
                next_fault = time.monotonic() + rng.uniform(*config.interval)
            time.sleep(0.1)
        controller.reap()
        controller.stop_all()
        for name in ("copier", "member0", "mirror"):  # the mirror last: it copies the final source
            controller.drain(name)
    finally:
        for proc in controller.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if not report.failures.get("drain"):
        check_run(workdir, source, target, report)
    report.seconds = time.monotonic() - started
    (workdir / "report.json").write_text(json.dumps(asdict(report), indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults per catalog")
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--catalog", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--producers", type=int, default=Config.producers)
    parser.add_argument("--appenders", type=int, default=Config.appenders)
    parser.add_argument("--members", type=int, default=Config.members)
    parser.add_argument("--batch", type=int, default=Config.batch, help="rows per writer batch")
    parser.add_argument("--interval", type=float, nargs=2, default=Config.interval, metavar=("MIN", "MAX"), help="seconds between faults")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory (kept)")
    a = parser.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1_000_000)
    config = Config(duration=a.duration, seed=seed, producers=a.producers, appenders=a.appenders, members=a.members, batch=a.batch, interval=tuple(a.interval))
    root = a.workdir or Path(tempfile.mkdtemp(prefix="icelog-chaos-"))
    failed = False
    for kind in (["sqlite", "postgres"] if a.catalog == "both" else [a.catalog]):
        print(f"chaos on {kind}: seed {seed}, {a.duration:.0f} s, workdir {root / kind}", flush=True)
        if kind == "postgres":
            from infra import postgres

            server = root / "postgres"
            try:
                report = run_chaos(config, root / kind, kind, postgres.start(server))
            finally:
                postgres.stop(server)
        else:
            report = run_chaos(config, root / kind, kind)
        print(report.describe(), flush=True)
        failed |= not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

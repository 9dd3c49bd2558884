"""Start-up of the command line's read-only commands on SQLite, PostgreSQL and REST (SeaweedFS).

Each command is the whole process, sampled alternately with its reference, ``pyiceberg describe
T`` on the same catalog, after one warm run each. Beside each figure: how many modules the
command imports (``python -X importtime``), the measure of how light its start is. On SQLite,
also the floor: an interpreter importing click and pyiceberg's configuration reader, which
resolves the catalog name as every command does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from icelog.storage.core.catalog import open_catalog
from icelog.storage.groups.offsets import commit_offsets
from icelog.storage.log.table import LogTable
from tests.bench.report import Target

TABLE = "bench.cli"
COMMANDS = {
    "offsets T": ["offsets", TABLE],
    "snapshots T": ["snapshots", TABLE],
    "topics describe T": ["topics", "describe", TABLE],
    "topics list": ["topics", "list"],
    "groups describe": ["groups", "describe", "--group", "g"],
}


def _env(properties: dict[str, str]) -> dict[str, str]:
    """The environment that names the catalog ``bench`` for icelog and pyiceberg alike."""
    return {
        **os.environ,
        **{f"PYICEBERG_CATALOG__BENCH__{k.replace('.', '__').replace('-', '_').upper()}": v for k, v in properties.items()},
    }


@contextlib.contextmanager
def catalogs(root: Path) -> Iterator[Iterator[tuple[str, dict[str, str]]]]:
    """The three catalogs' properties, each server started when its turn comes and stopped after."""
    from infra import postgres, seaweedfs

    def each() -> Iterator[tuple[str, dict[str, str]]]:
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        yield "SQLite", {"uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'warehouse'}"}
        pg = Path(tempfile.mkdtemp(prefix="icelog-pg-"))
        try:
            yield "PostgreSQL", {"uri": postgres.start(pg), "warehouse": f"file://{root / 'warehouse'}"}
        finally:
            postgres.stop(pg)
            shutil.rmtree(pg, ignore_errors=True)
        sw = Path(tempfile.mkdtemp(prefix="seaweedfs-", dir=root))
        try:
            yield "REST (SeaweedFS)", seaweedfs.start(sw)
        finally:
            seaweedfs.stop(sw)

    yield each()


def import_count(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    """Modules a command imports: the lines ``python -X importtime`` writes, less its header."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return sum(1 for line in out.stderr.splitlines() if line.startswith("import time:")) - 1


def bench_cli(root: Path, runs: int, record: Callable[..., None]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    scripts = Path(sys.executable).parent
    with catalogs(root) as each:
        for kind, properties in each:
            cat = open_catalog("bench", **properties)
            LogTable.create(cat, TABLE, partitions=4).append({0: [{"key": f"k{i}", "value": "v" * 16} for i in range(100)]})
            commit_offsets(cat, "g", {(TABLE, 0): 50})
            env = _env(properties)
            commands: dict[str, list[str]] = {
                name: [str(scripts / "icelog"), "--catalog", "bench", *args] for name, args in COMMANDS.items()
            }
            commands["pyiceberg"] = [str(scripts / "pyiceberg"), "--catalog", "bench", "describe", TABLE]
            if kind == "SQLite":
                commands["floor"] = [sys.executable, "-c", "import click, pyiceberg.utils.config"]
            modules = {
                name: import_count(["-m", "icelog.pipelines.cli", "--catalog", "bench", *args], env, root)
                for name, args in COMMANDS.items()
            }
            walls: dict[str, list[float]] = {name: [] for name in commands}
            for run in range(runs + 1):  # run 0 warms the page cache and the .pyc files
                for name, argv in commands.items():  # interleaved: a burst of load hits all alike
                    started = time.perf_counter()
                    subprocess.run(argv, env=env, cwd=root, capture_output=True, check=True)
                    if run:
                        walls[name].append(time.perf_counter() - started)
            medians: dict[str, Any] = {name: 1000 * statistics.median(w) for name, w in walls.items()}
            reference = f"pyiceberg describe T, {kind} (median of {runs})"
            for name in COMMANDS:
                record(
                    f"{kind}: icelog {name}, whole process ({modules[name]} modules; median of {runs}; "
                    f"load {os.getloadavg()[0]:.1f})",
                    medians[name],
                    "ms",
                    reference,
                    medians["pyiceberg"],
                    Target("ratio", "<=", 0.5),
                )
            if "floor" in medians:
                record(
                    f"floor: python -c 'import click, pyiceberg.utils.config' (median of {runs})",
                    medians["floor"],
                    "ms",
                    reference,
                    medians["pyiceberg"],
                    "not checked: what resolving the catalog name costs any command",
                )

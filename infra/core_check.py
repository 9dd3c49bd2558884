"""What a core install of icelog (no extras) must do: run inside the environment under test.

Runs as a file, not from the repository (``python -I infra/core_check.py``): it imports
nothing of the checkout, only the ``icelog`` installed where it runs. On the embedded SQLite
catalog of a fresh ``$ICELOG_HOME`` it checks ``icelog --version``, a conditional append (and
its refusal when the offset moved on), a deep check, a transaction through the Python API,
and that a command needing an extra that is absent fails with exit 2 naming
``pip install 'icelog[extra]'``. ``infra/wheel_smoke.py`` runs it in venvs built from the
wheel; tests/test_packaging.py runs it with the extras hidden.

Usage: python -I core_check.py [--core] [--expect-version V] [--expect-location DIR]
  --core             the heavy extras (Spark, Airflow, Great Expectations, pandas) must be absent
  --expect-location  icelog must be imported from under DIR (the venv, not a checkout)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# module -> the extra that brings it (icelog.storage.extras.EXTRAS); the heavy ones a core
# install must not pull in.
HEAVY = {"pyspark": "spark", "airflow": "airflow", "great_expectations": "quality", "pandas": "quality"}
TABLE = "smoke.events"


def absent(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        return e.name == module
    return False


def icelog_command() -> list[str]:
    """The installed console script beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("icelog")
    return [str(script)] if script.exists() else [sys.executable, "-m", "icelog.pipelines.cli"]


class Check:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.icelog = icelog_command()

    def run(self, *args: str, input: str = "", code: int = 0) -> subprocess.CompletedProcess:
        started = time.perf_counter()
        done = subprocess.run([*self.icelog, *args], input=input, capture_output=True, text=True, timeout=300)
        took = time.perf_counter() - started
        ok = done.returncode == code
        print(f"{'ok  ' if ok else 'FAIL'} icelog {' '.join(args)} -> exit {done.returncode} ({took:.1f} s)", flush=True)
        if not ok:
            self.failures.append(f"icelog {' '.join(args)}: exit {done.returncode}, wanted {code}\n{done.stdout}{done.stderr}")
        return done

    def expect(self, condition: bool, what: str) -> None:
        print(f"{'ok  ' if condition else 'FAIL'} {what}", flush=True)
        if not condition:
            self.failures.append(what)


def transaction(check: Check) -> None:
    """Two tables and a consumer group's offsets in one atomic commit (the Python API)."""
    from icelog import LogTable, TransactionalProducer, committed_offsets, open_catalog

    catalog = open_catalog()
    for name in ("smoke.orders", "smoke.source"):
        LogTable.create(catalog, name, partitions=1)
    LogTable.open(catalog, "smoke.source").append({0: [{"key": "k", "value": "v"}] * 3})
    producer = TransactionalProducer(catalog, "smoke-copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("smoke.orders", 0, [{"key": "k", "value": "V"}], expected_offset=0)
        producer.send_offsets_to_transaction({("smoke.source", 0): 3}, "smoke-group")
    marks = {p: (w.start, w.end) for p, w in LogTable.open(catalog, "smoke.orders").watermarks().items()}
    check.expect(marks == {0: (0, 1)}, f"transaction committed smoke.orders offsets 0..0 ({marks})")
    offsets = committed_offsets(catalog, "smoke-group", "smoke.source")
    check.expect(offsets == {0: 3}, f"transaction committed the group's offsets ({offsets})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", action="store_true")
    parser.add_argument("--expect-version")
    parser.add_argument("--expect-location")
    args = parser.parse_args(argv)
    check = Check()
    with tempfile.TemporaryDirectory(prefix="icelog-smoke-") as home:
        os.environ["ICELOG_HOME"] = home
        for name in [n for n in os.environ if n == "ICELOG_CATALOG" or n.startswith("PYICEBERG_CATALOG__")]:
            del os.environ[name]
        os.environ["PYICEBERG_HOME"] = home  # an empty home: no ~/.pyiceberg.yaml catalogs
        Path(home, ".pyiceberg.yaml").write_text("icelog-smoke: isolated\n")

        import icelog

        print(f"icelog {icelog.__version__} from {Path(icelog.__file__).parent} on Python {sys.version.split()[0]}")
        if args.expect_location:
            check.expect(
                Path(icelog.__file__).resolve().is_relative_to(Path(args.expect_location).resolve()),
                f"icelog imported from under {args.expect_location}",
            )
        missing = {m for m in HEAVY if absent(m)}
        if args.core:
            check.expect(missing == set(HEAVY), f"a core install has none of {sorted(HEAVY)} (absent: {sorted(missing)})")

        version = check.run("--version").stdout.strip()
        if args.expect_version:
            check.expect(version == f"icelog {args.expect_version}", f"icelog --version says {version!r}")
        check.run("--help")
        check.run("topics", "create", TABLE, "--partitions", "2")
        rows = '{"key": "a", "value": "1"}\n{"key": "b", "value": "2"}\n'
        check.run("produce", TABLE, "--partition", "0", "--expected-offset", "0", input=rows)
        refused = check.run(
            "--output", "json", "produce", TABLE, "--partition", "0", "--expected-offset", "0", input=rows, code=3
        )
        check.expect('"OffsetMismatch"' in refused.stdout, "a stale expected offset is an OffsetMismatch")
        offsets = json.loads(check.run("--output", "json", "offsets", TABLE).stdout or "{}")
        check.expect(offsets.get("partitions", {}).get("0") == {"start": 0, "end": 2}, f"offsets after the append: {offsets}")
        deep = check.run("--output", "json", "validate", TABLE, "--deep")
        check.expect("contiguity-deep" in deep.stdout, "validate --deep ran the deep contiguity check")
        check.run("consume", TABLE, "--from-beginning")
        check.run("sql", f"SELECT count(*) FROM {TABLE}")
        check.run("report", TABLE, "--no-gx", "--out", str(Path(home, "report")))
        transaction(check)
        check.run("validate", "smoke.orders", "--check", "transactions", "--check", "groups")

        # A command that needs an absent extra says which one to install.
        source = Path(home, "rows.jsonl")
        source.write_text(rows)
        if "pyspark" in missing:
            spark = check.run("--output", "json", "ingest", TABLE, str(source), code=2)
            check.expect("pip install 'icelog[spark]'" in spark.stdout, "ingest without pyspark names icelog[spark]")
        if "great_expectations" in missing:
            gx = check.run("--output", "json", "report", TABLE, "--out", str(Path(home, "gx")), code=2)
            check.expect("pip install 'icelog[quality]'" in gx.stdout, "report without GX names icelog[quality]")
    for failure in check.failures:
        print(f"\n{failure}", file=sys.stderr)
    print(f"core check: {'FAILED' if check.failures else 'passed'} ({len(check.failures)} failures)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())

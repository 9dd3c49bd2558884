"""``icelog offsets`` starts without the heavy packages.

A read of watermarks needs the catalog (sqlalchemy, pyiceberg's catalog and table metadata) and
nothing that writes or scans data: pyiceberg.io.pyarrow (which loads pyarrow.dataset and with it
pandas), DuckDB, Spark, Great Expectations, Airflow. Each test runs a fresh interpreter, since
this one has long since imported all of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.cli import ROOT, Cli

HEAVY = ("pandas", "pyarrow.dataset", "pyiceberg.io.pyarrow", "duckdb", "pyspark", "great_expectations", "airflow")

# Runs the CLI as the ``icelog`` script does, then reports which heavy modules it loaded.
_RUN_AND_REPORT = f"""
import json, sys
from icelog.pipelines.cli import main
try:
    main()
finally:
    sys.stdout.flush()
    print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)
"""


def loaded_heavy_modules(code: str, env: dict | None = None, argv: tuple[str, ...] = ()) -> tuple[list[str], str]:
    """The heavy modules a fresh interpreter running ``code`` loaded (it prints them last on stderr), and its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300, check=True
    )
    return json.loads(result.stderr.strip().splitlines()[-1]), result.stdout


def test_the_modules_offsets_imports_load_no_heavy_package():
    code = (
        "import json, sys\n"
        "import pipelines.cli, storage.core.catalog, storage.log.table\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    heavy, _ = loaded_heavy_modules(code)
    assert heavy == []


def test_icelog_offsets_loads_no_heavy_package(sqlite_spec):
    """The whole command, table read included. pyiceberg's default FileIO for local files
    (PyArrowFileIO) imports pyarrow.dataset and pandas itself when it loads a table, so the run
    reads the metadata through pyiceberg's fsspec FileIO: what is left is what icelog loads."""
    icelog = Cli(sqlite_spec)
    icelog("topics", "create", "db.events", "--partitions", "2")
    icelog("produce", "db.events", "--partition", "1", input='{"key": "a", "value": "b"}\n')
    env = {**icelog.env, f"PYICEBERG_CATALOG__{sqlite_spec.name.upper()}__PY_IO_IMPL": "pyiceberg.io.fsspec.FsspecFileIO"}
    heavy, stdout = loaded_heavy_modules(_RUN_AND_REPORT, env, ("--output", "json", "offsets", "db.events"))
    assert json.loads(stdout)["partitions"] == {"0": {"start": 0, "end": 0}, "1": {"start": 0, "end": 1}}
    assert heavy == []

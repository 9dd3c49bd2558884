"""The locked environment: one owner per installed file, and Spark imports and runs from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from infra import check_install

ROOT = Path(__file__).resolve().parents[2]


def locked_names() -> set[str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==", (ROOT / "requirements.lock").read_text(), flags=re.M)
    return {re.sub(r"[-_.]+", "-", name).lower() for name in pins}


def test_the_lock_holds_one_owner_of_the_pyspark_package():
    # pyspark-client (via the Airflow Spark provider) ships pyspark/ too: with both, install order decided.
    names = locked_names()
    assert "pyspark" in names
    assert "pyspark-client" not in names
    excluded = {
        line.strip()
        for line in (ROOT / "infra/lock-excludes.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not excluded & names


def test_no_two_installed_distributions_own_one_file():
    assert check_install.shared_files() == {}


def test_pyspark_imports_and_runs_a_tiny_job_from_the_locked_environment():
    script = (
        "from pyspark import SparkContext\n"  # the import that failed with pyspark-client's copy
        "from pipelines.spark import spark_session\n"
        "spark = spark_session('local[1]', 'icelog-install-check')\n"
        "print('sum', spark.range(10).selectExpr('sum(id) AS s').first()['s'])\n"
        "spark.stop()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sum 45" in done.stdout

"""icelog as a package a team installs: what the wheel holds, what a core install needs, and
that its names never clash with a team's own top-level packages.

The repository keeps its folders at the top (``storage/``, ``pipelines/``, ...) and
``pyproject.toml`` maps them under ``icelog`` (``[tool.setuptools]``). The wheel smoke
(``make smoke``, infra/wheel_smoke.py) installs the built wheel into fresh venvs; these tests
are the fast part that runs in ``make test``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
FOLDERS = ("icelog", "storage", "pipelines", "validations", "dags")
# The heavy extras a core install lives without (infra/core_check.py checks they are absent).
HEAVY = ("pyspark", "airflow", "great_expectations", "pandas")


def installed_name(folder: Path) -> str:
    """``pipelines/cli`` -> ``icelog.pipelines.cli``, through ``[tool.setuptools.package-dir]``."""
    top, *rest = folder.relative_to(ROOT).parts
    (package,) = [name for name, where in SETUPTOOLS["package-dir"].items() if where == top]
    return ".".join([package, *rest])


def test_the_packages_list_names_every_package_folder():
    """A folder with an ``__init__.py`` missing from the list would be missing from the wheel
    while every test passes on the checkout (the editable install maps folders, not the list)."""
    folders = {p.parent for top in FOLDERS for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert sorted(installed_name(f) for f in folders) == sorted(SETUPTOOLS["packages"])


def test_every_extra_a_missing_module_names_is_declared():
    from icelog.storage.extras import EXTRAS

    assert set(EXTRAS.values()) <= set(PYPROJECT["project"]["optional-dependencies"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built as a release builds it: the sdist first, the wheel from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    uv = Path(sys.executable).with_name("uv")
    subprocess.run([str(uv), "build", "-q", "-o", str(out), str(ROOT)], check=True, timeout=600)
    (built,) = out.glob("icelog-*.whl")
    return built


def test_the_wheel_holds_every_module_and_the_spark_log_settings(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    modules = {
        f"{installed_name(p.parent).replace('.', '/')}/{p.name}"
        for top in FOLDERS
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert sorted(modules - names) == []
    assert "icelog/pipelines/log4j2.properties" in names  # pipelines.spark points the driver JVM at it
    assert not any(n.startswith(("tests/", "infra/", "storage/", "pipelines/")) for n in names)


def test_a_team_s_own_pipelines_and_storage_packages_never_clash_with_icelog(tmp_path):
    """A DAG folder (on sys.path, as Airflow puts it) with its own top-level ``pipelines`` and
    ``storage``: the team's imports get theirs, icelog's get icelog's, in either order."""
    dags = tmp_path / "dags"
    for package in ("pipelines", "storage"):
        (dags / package).mkdir(parents=True)
        (dags / package / "__init__.py").write_text("WHO = 'the team'\n")
    probe = textwrap.dedent(
        """
        import json, sys
        if sys.argv[1] == "theirs-first":
            import pipelines, storage
            import icelog.pipelines.tasks
            from icelog import LogTable
        else:
            import icelog.pipelines.tasks
            from icelog import LogTable
            import pipelines, storage
        import icelog.storage
        print(json.dumps({
            "theirs": [pipelines.WHO, storage.WHO, pipelines.__file__, storage.__file__],
            "icelog": [icelog.pipelines.tasks.__file__, icelog.storage.__file__, LogTable.__module__],
            "same": [pipelines is icelog.pipelines, storage is icelog.storage],
        }))
        """
    )
    for order in ("theirs-first", "icelog-first"):
        done = subprocess.run(
            [sys.executable, "-c", probe, order], cwd=dags, capture_output=True, text=True, timeout=120, check=True
        )
        seen = json.loads(done.stdout)
        assert seen["theirs"] == [
            "the team",
            "the team",
            str(dags / "pipelines" / "__init__.py"),
            str(dags / "storage" / "__init__.py"),
        ]
        tasks, storage, log_table = seen["icelog"]
        assert Path(tasks) == ROOT / "pipelines" / "tasks.py" and Path(storage) == ROOT / "storage" / "__init__.py"
        assert log_table == "icelog.storage.log.table"
        assert seen["same"] == [False, False]


def test_a_core_install_runs_the_cli_and_a_transaction_without_the_heavy_extras(tmp_path):
    """infra/core_check.py with Spark, Airflow, Great Expectations and pandas hidden: the same
    check the wheel smoke runs in venvs that lack them, here on the checkout in seconds.

    Each hidden package is a stand-in whose import fails as a missing one does."""
    hidden = tmp_path / "hidden"
    for module in HEAVY:
        (hidden / module).mkdir(parents=True)
        message = f"No module named {module!r} (hidden by tests/test_packaging.py)"
        (hidden / module / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={module!r})\n")
    done = subprocess.run(
        # -P: not infra/ on sys.path (its airflow.py would pass for the airflow package)
        [sys.executable, "-P", str(ROOT / "infra" / "core_check.py"), "--core"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(hidden), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ingest without pyspark names icelog[spark]" in done.stdout
    assert "report without GX names icelog[quality]" in done.stdout

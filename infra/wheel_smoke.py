"""The wheel smoke: build icelog from the checkout, install it as a team would, and use it.

Builds the sdist and, from it, the wheel (``uv build``: what a release uploads), then for each
supported Python other than the one ``make test`` runs on (3.12 and 3.13) installs the wheel
with no extra into a fresh venv and runs ``infra/core_check.py`` there (``--version``, a
conditional append, a deep check, a transaction, the errors that name a missing extra). On
the last Python it installs ``icelog[airflow]`` as well, imports every DAG module and, when the
wheel declares an Airflow provider entry point, checks that ``airflow providers list`` shows icelog.

Versions: on the first Python (3.12) the core install takes the lowest versions pyproject.toml's
ranges allow for icelog's own dependencies (``uv pip install --resolution lowest-direct``), so a
lower bound that is too low fails here. Every other install is constrained by
``requirements.lock`` (``uv pip install -c``), the set ``make test`` runs, resolved for 3.11 and
installable on 3.12 and 3.13 as it stands; packages the lock does not name are resolved within
the ranges. Airflow's own constraints files are not used (they live outside the package
registries).

Usage: python -m infra.wheel_smoke [--python 3.12 --python 3.13] [--airflow-on 3.13] (make smoke)
"""

from __future__ import annotations

import argparse
import configparser
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UV = str(Path(sys.executable).with_name("uv"))
PYTHONS = ("3.12", "3.13")
PROVIDER_GROUP = "apache_airflow_provider"


def find_python(version: str) -> str:
    """The newest pyenv build of ``version`` (where CI machines have them), else ``pythonX.Y`` on PATH."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    builds = sorted(
        glob.glob(f"{root}/versions/{version}.*/bin/python"),
        key=lambda p: tuple(int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()),
    )
    found = builds[-1] if builds else shutil.which(f"python{version}")
    if not found:
        raise SystemExit(f"wheel smoke: no Python {version} (looked in {root}/versions and PATH)")
    return found


def step(what: str, command: list[str], **kwargs) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    print(f"--- {what}", flush=True)
    done = subprocess.run(command, **kwargs)
    print(f"--- {what}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"wheel smoke failed: {what}")
    return done


def build(dist: Path) -> Path:
    step("build sdist and wheel", [UV, "build", "-q", "-o", str(dist), str(ROOT)])
    (wheel,) = dist.glob("icelog-*.whl")
    return wheel


def provider_declared(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        for name in names:
            parser.read_string(archive.read(name).decode())
    return parser.has_section(PROVIDER_GROUP)


def venv(python: str, where: Path, requirement: str, *, lowest: bool = False) -> Path:
    """A fresh venv with ``requirement`` installed: constrained by the lock, or at the lowest
    versions the core's ranges allow (``lowest``: they are named as direct requirements)."""
    step(f"venv on {python}", [UV, "venv", "-q", "--python", python, str(where)])
    bin_python = where / "bin" / "python"
    install = [UV, "pip", "install", "-q", "--python", str(bin_python)]
    if lowest:
        core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        step(
            f"install {Path(requirement).name} at the lowest versions of {', '.join(core)}",
            [*install, "--resolution", "lowest-direct", *core, requirement],
        )
        step("installed versions", [UV, "pip", "list", "--python", str(bin_python)])
    else:
        step(
            f"install {Path(requirement).name} (requirements.lock as constraints)",
            [*install, "-c", str(ROOT / "requirements.lock"), requirement],
        )
    return bin_python


def core_check(python: Path, version: str, *, core: bool, home: Path) -> None:
    # -I: nothing of the checkout (or the working directory) on sys.path, only the installed icelog.
    command = [str(python), "-I", str(ROOT / "infra" / "core_check.py"), "--expect-version", version]
    command += ["--expect-location", str(python.parents[1])] + (["--core"] if core else [])
    step(f"core check ({'core install' if core else 'with extras'})", command, cwd=home)


# Every DAG file parses with icelog[airflow] alone (Spark and GX load inside the tasks that use them).
DAG_IMPORTS = """
import importlib, pkgutil, icelog.dags
names = [m.name for m in pkgutil.iter_modules(icelog.dags.__path__)]
for name in names:
    importlib.import_module(f"icelog.dags.{name}")
print(f"imported {len(names)} DAG modules: {', '.join(names)}")
"""


def airflow_dags(python: Path, home: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(home / "airflow")}
    step("import the DAG modules", [str(python), "-I", "-c", DAG_IMPORTS], env=env, cwd=home)


def airflow_providers(python: Path, home: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(home / "airflow")}
    done = step(
        "airflow providers list",
        [str(python.with_name("airflow")), "providers", "list", "--output", "json"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
    )
    if "icelog" not in done.stdout:
        print(done.stdout, done.stderr, sep="\n")
        raise SystemExit("wheel smoke failed: airflow providers list does not show icelog")
    print("airflow providers list shows icelog")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="a Python version to smoke (default: 3.12 and 3.13)")
    parser.add_argument("--airflow-on", help="the version that also gets icelog[airflow] (default: the last)")
    args = parser.parse_args(argv)
    versions = args.python or list(PYTHONS)
    airflow_on = args.airflow_on or versions[-1]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="icelog-wheel-smoke-") as tmp:
        work = Path(tmp)
        wheel = build(work / "dist")
        version = wheel.name.split("-")[1]
        print(f"built {wheel.name}")
        for python_version in versions:
            python = find_python(python_version)
            home = work / f"home-{python_version}"
            home.mkdir()
            lowest = python_version == versions[0] and len(versions) > 1
            core = venv(python, work / f"core-{python_version}", str(wheel), lowest=lowest)
            core_check(core, version, core=True, home=home)
            if python_version != airflow_on:
                continue
            with_airflow = venv(python, work / f"airflow-{python_version}", f"{wheel}[airflow]")
            core_check(with_airflow, version, core=False, home=home)
            airflow_dags(with_airflow, home)
            if provider_declared(wheel):
                airflow_providers(with_airflow, home)
            else:
                print(f"--- airflow providers list: skipped, the wheel declares no {PROVIDER_GROUP} entry point")
    print(f"wheel smoke passed on Python {', '.join(versions)} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

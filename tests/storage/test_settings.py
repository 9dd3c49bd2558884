"""One settings object: every ``ICELOG_*`` variable read in ``storage.settings`` only, typed,
with one precedence and a typed error naming a malformed variable."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from icelog.storage import settings as settings_module
from icelog.storage.errors import InvalidInput, InvalidSetting
from icelog.storage.settings import VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("storage", "pipelines", "validations", "dags", "infra", "icelog")
SETTINGS_MODULE = ROOT / "storage" / "settings.py"
ENV_READS = {"get", "getenv", "pop", "setdefault"}


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "ICELOG_..."`` strings (a read through a constant counts too)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def environment_reads(path: Path) -> list[str]:
    """Where ``path`` reads an ``ICELOG_*`` variable: ``X.get/getenv/pop/setdefault("ICELOG_...")``,
    ``X["ICELOG_..."]`` (a read), ``"ICELOG_..." in X``, or Click's ``envvar="ICELOG_..."`` (a
    keyword or a dict's key)."""
    tree = ast.parse(path.read_text(), str(path))
    constants = _constants(tree)

    def icelog_name(node: ast.AST) -> str | None:
        value = node.value if isinstance(node, ast.Constant) else constants.get(node.id) if isinstance(node, ast.Name) else None
        return value if isinstance(value, str) and value.startswith("ICELOG_") else None

    reads = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in ENV_READS and node.args:
                name = icelog_name(node.args[0])
            for keyword in node.keywords:
                if keyword.arg == "envvar":
                    name = name or icelog_name(keyword.value)
        elif isinstance(node, ast.Dict):  # Click options declared as dicts: {"envvar": "ICELOG_..."}
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "envvar":
                    name = name or icelog_name(value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = icelog_name(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            name = icelog_name(node.left)
        if name:
            reads.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {name}")
    return reads


def source_files() -> list[Path]:
    return [p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py")) if p != SETTINGS_MODULE]


def test_only_the_settings_module_reads_icelog_variables():
    reads = [r for path in source_files() for r in environment_reads(path)]
    assert reads == []


def test_the_walk_finds_each_kind_of_read(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "m.py"
    module.write_text(
        "import os, click\n"
        'VAR = "ICELOG_X"\n'
        'a = os.environ.get("ICELOG_A")\n'
        'b = os.environ["ICELOG_B"]\n'
        "c = VAR in os.environ\n"
        'd = os.getenv("ICELOG_D")\n'
        'e = click.option("--e", envvar="ICELOG_E")\n'
        'f = {"envvar": "ICELOG_F"}\n'
        'os.environ["ICELOG_W"] = "written, not read"\n'
    )
    assert [r.split(" reads ")[1] for r in environment_reads(module)] == [
        "ICELOG_A",
        "ICELOG_B",
        "ICELOG_X",
        "ICELOG_D",
        "ICELOG_E",
        "ICELOG_F",
    ]


def test_every_variable_named_in_the_source_is_a_setting():
    known = {v.name for v in VARIABLES}
    named = set()
    for path in source_files():
        named |= set(re.findall(r"\bICELOG_[A-Z_]*[A-Z]\b", path.read_text()))
    # ICELOG_PAUSE: a prefix (tests drop every ICELOG_PAUSE* variable), not a variable.
    assert named - known - {"ICELOG_PAUSE"} == set()


def test_every_variable_is_documented_with_its_default():
    page = (ROOT / "docs" / "configuration.md").read_text()
    for variable in VARIABLES:
        assert f"`{variable.name}`" in page, variable.name
        if variable.default is not None:
            assert f"`{variable.default}`" in page, (variable.name, variable.default)


def test_defaults_are_the_ones_each_module_had(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.load({})
    assert s.home == tmp_path / ".icelog" and s.expectations == tmp_path / "expectations"
    assert (s.catalog, s.log_level, s.principal, s.landing, s.mirror_catalog, s.web_assets) == (None,) * 6
    assert s.tables == ("demo.flights",) and s.mirror_threads == 8
    assert (s.spark_master, s.spark_shuffle_partitions, s.spark_driver_memory, s.spark_log_level) == ("local[*]", 8, "2g", "WARN")
    assert s.gx_spark_rows == 2_000_000
    assert (s.airflow_host, s.airflow_port) == ("127.0.0.1", 8080)
    assert (s.pause_at, s.pause_file, s.delay_at) == (None, None, None)


def test_precedence_explicit_then_environment_then_the_entry_points_default_then_the_variables(tmp_path):
    env = {"ICELOG_CATALOG": "from-env", "ICELOG_HOME": str(tmp_path / "env")}
    assert Settings.load(env, catalog="explicit").catalog == "explicit"
    assert Settings.load(env, catalog=None).catalog == "from-env"  # None: not given
    assert Settings.load(env, defaults={"home": tmp_path / "demo"}).home == tmp_path / "env"
    assert Settings.load({}, defaults={"home": tmp_path / "demo"}).home == tmp_path / "demo"
    assert Settings.load({"ICELOG_CATALOG": ""}).catalog is None  # empty: unset
    assert Settings.load({"ICELOG_TABLES": ""}).tables == ()  # empty: no tables
    assert Settings.load({"ICELOG_TABLES": " a.b , ,c.d"}).tables == ("a.b", "c.d")
    assert Settings.load({"ICELOG_AIRFLOW_HOST": ""}).airflow_host == ""  # empty: every interface
    assert Settings.load({"ICELOG_DELAY_AT": "after_metadata_write:0.5"}).delay_at == {"after_metadata_write": 0.5}
    with pytest.raises(TypeError, match="no such setting: homes"):
        Settings.load({}, homes=tmp_path)


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("ICELOG_MIRROR_THREADS", "eight", "whole number"),
        ("ICELOG_MIRROR_THREADS", "0", "1 or more"),
        ("ICELOG_AIRFLOW_PORT", "http", "whole number, in 1..65535"),
        ("ICELOG_AIRFLOW_PORT", "70000", "in 1..65535"),
        ("ICELOG_SPARK_SHUFFLE_PARTITIONS", "auto", "whole number"),
        ("ICELOG_GX_SPARK_ROWS", "many", "row count"),
        ("ICELOG_DELAY_AT", "after_metadata_write", "<point>:<seconds>"),
        ("ICELOG_DELAY_AT", "after_metadata_write:-1", "finite and >= 0"),
        ("ICELOG_DELAY_AT", "after_metadata_write:soon", "must be a number"),
    ],
)
def test_a_malformed_value_is_a_typed_error_naming_the_variable(variable, value, reason):
    with pytest.raises(InvalidSetting) as raised:
        Settings.load({variable: value})
    error = raised.value
    assert isinstance(error, InvalidInput) and isinstance(error, ValueError)
    assert (error.variable, error.value) == (variable, value) and reason in error.reason
    assert variable in str(error)


def test_the_settings_module_imports_only_the_standard_library_and_errors():
    tree = ast.parse(SETTINGS_MODULE.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    project = {m for m in imported if m.startswith("icelog")}
    assert project == {"icelog.storage.errors"}
    assert all(m.split(".")[0] in sys.stdlib_module_names or m.startswith("icelog") or m == "__future__" for m in imported)
    assert settings_module.Settings.load.__doc__


def test_the_cli_refuses_a_malformed_variable_with_exit_2_naming_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "icelog.pipelines.cli", "--output", "json", "topics", "list"],
        env={"PATH": "/usr/bin:/bin", "ICELOG_HOME": str(tmp_path), "ICELOG_MIRROR_THREADS": "many"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)
    assert doc["error"] == "InvalidSetting" and doc["variable"] == "ICELOG_MIRROR_THREADS", doc
    assert not (tmp_path / "catalog.db").exists()

"""The house: imports point down, and no module imports itself back through others.

Walks the source with ``ast`` (every import, at module or function level), so a circle hidden
by a lazy import fails here as well as one Python would trip over.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("storage", "validations", "pipelines", "dags")

# storage's floors: a package may import its own floor (other modules of the same package) and
# the floors below it. groups and ingest share a floor and never import each other.
STORAGE_FLOORS = {
    "storage.errors": 0,
    "storage.properties": 1,
    "storage.extras": 1,
    "storage.settings": 1,
    "storage.core": 2,
    "storage.log": 3,
    "storage.ingest": 4,
    # The Kafka-shaped consumer commits its output and offsets through a transaction where the
    # catalog cannot swap tables at once: a client of producers, above them (listed first: it wins).
    "storage.groups.consumer": 6,
    "storage.groups": 4,
    "storage.producers": 5,
    "storage.replication": 6,
    "storage.admin": 7,
}
# The Airflow provider (icelog/provider) sits on pipelines; the project's DAGs are built on it.
LAYERS = {"storage": 0, "validations": 1, "pipelines": 2, "provider": 3, "dags": 4}


def module_name(path: Path) -> str:
    """The name under which icelog's code imports it, without the ``icelog.`` every name shares."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unprefixed(name: str) -> str:
    return name.removeprefix("icelog.")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[module_name(path)] = path
    for path in (ROOT / "icelog" / "provider").rglob("*.py"):
        found[unprefixed(module_name(path))] = path
    return found


def imports(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """``(module, line, at function level)`` for every import of a project module in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [unprefixed(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from icelog.storage.log import schema`` imports storage.log.schema
            module = unprefixed(node.module)
            names = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.append((name, node.lineno, id(node) in nested))
    return found


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = modules()
    return {name: [i for i in imports(path, set(known)) if i[0] != name] for name, path in known.items()}


def floor(module: str) -> tuple[str, int] | None:
    for prefix, level in STORAGE_FLOORS.items():
        if module == prefix or module.startswith(prefix + "."):
            return prefix, level
    return None


def test_no_import_circle():
    edges = {m: {t for t, _, _ in targets if not t.endswith("__init__")} for m, targets in graph().items()}
    # A package's __init__ that only hands names on is part of the walk like any module.
    seen: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                circles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node)
    assert circles == []


def test_imports_point_down():
    upward = []
    for module, targets in graph().items():
        layer = LAYERS[module.split(".")[0]]
        for target, line, _ in targets:
            if LAYERS[target.split(".")[0]] > layer:
                upward.append(f"{module}:{line} imports {target}")
                continue
            mine, theirs = floor(module), floor(target)
            if mine and theirs and theirs[0] != mine[0] and theirs[1] >= mine[1]:
                upward.append(f"{module}:{line} imports {target} (floor {theirs[1]} from floor {mine[1]})")
    assert upward == []


def test_no_function_level_imports_of_project_modules():
    """They hid order problems. What stays lazy is a heavy optional package (pyspark, great_expectations),
    and the CLI's commands and the DAG files, which import what they use when they run (start-up and DAG
    parse time)."""
    lazy_by_design = ("pipelines.cli", "dags", "provider")  # provider: operators import their task at run time
    heavy = {"validations.quality"}  # imports great_expectations (about 14 s)
    hidden = [
        f"{m}:{line} imports {t}"
        for m, targets in graph().items()
        if not m.startswith(lazy_by_design)
        for t, line, nested in targets
        if nested and t not in heavy
    ]
    assert hidden == []


def test_the_core_holds_no_concept_state():
    """The commit core knows tables, not logs: the log's, the producers' and the journal's state
    live in their own packages (``storage.log.state``, ``storage.log.producer_state``,
    ``storage.producers.journal_state``)."""
    concept_state = ("LogState", "Watermarks", "Producers", "ProducerEntry", "JournalState", "TransactionalIdState")
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "storage" / "core").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        for name in concept_state
        if (isinstance(node, ast.ClassDef) and node.name == name)
        or (isinstance(node, (ast.ImportFrom, ast.Import)) and name in {a.asname or a.name for a in node.names})
    ]
    assert found == []


@pytest.mark.parametrize(
    "package",
    sorted(p for p in STORAGE_FLOORS if not p.endswith(("errors", "properties", "extras", "settings", "groups.consumer"))),
)
def test_each_storage_package_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text()))
    assert doc and "May import" in doc


def test_every_import_of_icelog_code_goes_through_the_icelog_namespace():
    """The folders are mapped under ``icelog`` when installed (``pyproject.toml``): a bare
    ``import storage`` would find a team's own ``storage`` package, or a second copy of ours."""
    roots = [*PACKAGES, "icelog", "infra", "tests"]
    bare = []
    for root in roots:
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                bare += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert bare == []

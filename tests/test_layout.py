"""The tests' own house: test support is a package, and a test module never imports
another test module.

Helpers, workers and fault tools live in ``tests/support/``; fixtures live in a ``conftest.py``
(``tests/conftest.py`` for the whole suite, one per folder for a folder's own). A test module
that imports another one runs the other's module code, drags its fixtures into its namespace
and breaks when the other is renamed or split. Walks ``tests/`` with ``ast``: every import, at
module or function level, and every ``tests.…test_*`` module named in a string (``python -m``,
``python -c``, a ``--transform``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# At the top of tests/: the suite-wide conftest, the package marker and test modules only.
TOP_LEVEL = {"conftest.py", "__init__.py"}
NAMED_IN_A_STRING = re.compile(r"\btests(?:\.\w+)*\.test_\w+")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_module(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_")


def imported(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` for every module ``path`` imports or names in a string; ``from
    package import name`` counts as importing ``package`` and ``package.name``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upward
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(base, node.lineno)] + [(f"{base}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(m.group(0), node.lineno) for m in NAMED_IN_A_STRING.finditer(node.value)]
    return found


def test_no_module_under_tests_imports_a_test_module():
    """A test module never imports another test module; support, conftest and the runners
    (``tests.bench``, ``tests.chaos``) never import one either."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        me = module_name(path)
        for name, line in imported(path):
            if name.startswith("tests.") and is_test_module(name) and name != me:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == [], "move what is shared to tests/support/ (helpers) or a conftest.py (fixtures):\n" + "\n".join(wrong)


def test_nothing_but_test_modules_and_conftest_at_the_top_of_tests():
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in TOP_LEVEL and not p.name.startswith("test_"))
    assert loose == [], f"helpers and workers belong in tests/support/: {loose}"


def test_every_test_folder_is_a_package():
    """``python -m tests.support.workers.…`` and ``from tests.support import …`` need packages;
    a folder without ``__init__.py`` would also give two test modules of one name a clash."""
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []

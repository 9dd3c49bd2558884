"""A module run as a script executes top to bottom: whatever is defined after its
``if __name__ == "__main__":`` block does not exist yet when that block runs. (``make demo`` once
failed with a NameError this way, while every in-process test passed.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("infra", "pipelines", "storage", "validations", "dags", "tests")


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
    )


def test_the_main_guard_is_the_last_statement_of_every_script():
    late = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            body = ast.parse(path.read_text(), str(path)).body
            guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
            if guards and guards[-1] != len(body) - 1:
                late.append(f"{path.relative_to(ROOT)}:{body[guards[-1] + 1].lineno}")
    assert not late, f"defined after the main guard: {late}"

"""The Python examples of the documentation run as they are.

Every ```python block of a page below runs, in order, in one fresh process with its own
ICELOG_HOME and working folder, as a reader would paste them; a ```py block is an excerpt that
needs more around it (a SparkSession, say) and is left out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["python-api.md", "transactions.md", "consumer-groups.md", "mirror.md", "duckdb.md", "quality.md", "configuration.md"]


def examples(page: Path) -> str:
    return "\n".join(re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M))


@pytest.mark.parametrize("name", PAGES)
def test_the_pages_python_examples_run(name, tmp_path):
    code = examples(ROOT / "docs" / name)
    assert code.strip(), f"docs/{name} has no python example"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICELOG_", "PYICEBERG_CATALOG__"))}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, "ICELOG_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"docs/{name}:\n{done.stderr[-4000:]}"


def test_every_page_with_python_examples_is_run():
    """A page that gains a runnable example is run here too (or marks it ```py)."""
    with_examples = {p.name for p in (ROOT / "docs").glob("*.md") if examples(p).strip()}
    assert with_examples <= set(PAGES)

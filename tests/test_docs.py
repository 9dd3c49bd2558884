"""The documentation lives in the repository: the site builds offline with ``mkdocs build
--strict``, every link in README.md and docs/ resolves inside the repository (or to a public
reference), and code comments cite nothing a reader of the repository cannot open.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Public references a page may link to; anything else absolute is a local path or a private host.
PUBLIC_HOSTS = (
    "iceberg.apache.org",
    "py.iceberg.apache.org",
    "kafka.apache.org",
    "cwiki.apache.org",
    "issues.apache.org",
    "airflow.apache.org",
    "spark.apache.org",
    "duckdb.org",
    "docs.greatexpectations.io",
    "www.apache.org",
    "pulsar.apache.org",
    "github.com",
    "www.mkdocs.org",
    "squidfunk.github.io",
    "docs.astral.sh",
    "pypi.org",
)

# mkdocs run with every outgoing connection refused: the build must not need the network.
NO_NETWORK = """
import socket, sys
def refuse(*args, **kwargs):
    sys.stderr.write(f"NETWORK ATTEMPT {args!r}\\n")
    raise OSError("tests/test_docs.py: the docs build must not use the network")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from mkdocs.__main__ import cli
sys.exit(cli())
"""


def test_the_site_builds_strict_without_the_network(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-c", NO_NETWORK, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "NETWORK ATTEMPT" not in done.stderr
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    assert {"index.html", "guarantees.html", "cli.html", "testing.html"} <= pages
    # Nothing the pages load at view time comes from outside the site either (fonts, scripts, styles).
    loads = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["'](https?:)?//""")
    remote = [p for p in pages if loads.search((site / p).read_text())]
    assert remote == []


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<a\s[^>]*href=\"([^\"]+)\"")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # code blocks are not links
    return [a or b for a, b in LINK.findall(text)] + REFERENCE.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_stays_in_the_repository_or_goes_to_a_public_reference(page):
    wrong = []
    for target in links(page):
        url = urlparse(target)
        if url.scheme in ("http", "https"):
            if url.hostname not in PUBLIC_HOSTS:
                wrong.append(f"{target}: not a known public reference")
        elif url.scheme == "mailto":
            continue
        elif url.scheme or target.startswith("/"):
            wrong.append(f"{target}: an absolute or local path")
        elif url.path:
            resolved = (page.parent / url.path).resolve()
            if not resolved.is_relative_to(ROOT):
                wrong.append(f"{target}: outside the repository")
            elif not resolved.exists():
                wrong.append(f"{target}: no such file")
    assert wrong == []


# Built in two pieces so that this file does not match itself.
HISTORY = re.compile(r"[Ii]ssue [0-9]+|" + "DESI" + r"GN\b|§[0-9]")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_names_a_note_outside_the_repository(page):
    """Not even as text: a reader of the repository cannot open the notes it was built from."""
    text = page.read_text()
    assert re.findall(r"\.\./shared\b|/work/\w+", text) == []
    assert HISTORY.findall(text) == []


CODE = ("storage", "pipelines", "validations", "dags", "icelog", "infra", "tests")


def test_code_cites_no_issue_numbers_or_design_sections():
    """Comments and docstrings say why in words, or point to docs/: an issue number or a section of a
    design note outside the repository means nothing to a reader of it. KIP-/KAFKA- numbers are public."""
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*")):
            if "node_modules" in path.parts or path.suffix not in (".py", ".sh", ".cfg", ".properties", ".json", ".toml"):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if HISTORY.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for name in ("Makefile", "pyproject.toml", "mkdocs.yml", ".ci/run"):
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []

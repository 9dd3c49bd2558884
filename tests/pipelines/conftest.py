"""Fixtures of the pipeline tests: the catalog as the Spark jobs and the CLI find it (through the
environment), and the CLI on it."""

from __future__ import annotations

import pytest

from tests.support.cli import Cli


@pytest.fixture
def env_catalog(sqlite_spec, monkeypatch):
    """The SQLite catalog, reachable by name through ``ICELOG_CATALOG`` and ``PYICEBERG_CATALOG__*``
    (set for this test only)."""
    for key, value in sqlite_spec.env().items():
        monkeypatch.setenv(key, value)
    return sqlite_spec


@pytest.fixture
def icelog(sqlite_spec) -> Cli:
    return Cli(sqlite_spec)

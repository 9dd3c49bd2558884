"""Fixtures of the pipeline tests: the catalog as the Spark jobs and the CLI find it (through the
environment), and the CLI on it."""

from __future__ import annotations

import pytest

from tests.support.catalogs import CatalogSpec
from tests.support.cli import Cli


@pytest.fixture
def env_catalog(sqlite_spec, monkeypatch):
    """The SQLite catalog, reachable by name through ``ICELOG_CATALOG`` and ``PYICEBERG_CATALOG__*``
    (set for this test only)."""
    for key, value in sqlite_spec.env().items():
        monkeypatch.setenv(key, value)
    return sqlite_spec


@pytest.fixture
def rest_env(rest_spec, monkeypatch):
    """The SeaweedFS REST catalog, reachable by name through the environment (this test only)."""
    for key, value in rest_spec.env().items():
        monkeypatch.setenv(key, value)
    return rest_spec


@pytest.fixture
def icelog(sqlite_spec) -> Cli:
    return Cli(sqlite_spec)


@pytest.fixture
def target_spec(tmp_path) -> CatalogSpec:
    """A second SQLite catalog, ``drcat``: a mirror's target."""
    (tmp_path / "tw").mkdir()
    return CatalogSpec("sqlite", "drcat", f"sqlite:///{tmp_path / 'dr.db'}", f"file://{tmp_path / 'tw'}")


@pytest.fixture
def mirror_cli(sqlite_spec, target_spec) -> Cli:
    """The CLI on the SQLite catalog, with the target catalog ``drcat`` configured too."""
    return Cli(sqlite_spec, **{k: v for k, v in target_spec.env().items() if k.startswith("PYICEBERG_CATALOG__DRCAT")})

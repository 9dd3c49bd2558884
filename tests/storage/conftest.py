"""Fixtures of the storage tests: the mirror's source and target catalogs (every mirror test
runs SQLite -> SQLite and SQLite -> PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest

from icelog.storage.replication.acls import add_acl
from tests.support.catalogs import CatalogSpec
from tests.support.mirror import PRINCIPAL


@pytest.fixture
def source_spec(sqlite_spec) -> CatalogSpec:
    return sqlite_spec


@pytest.fixture(params=["sqlite", "postgres"])
def target_spec(request, tmp_path) -> CatalogSpec:
    warehouse = tmp_path / "target-warehouse"
    warehouse.mkdir()
    if request.param == "sqlite":
        return CatalogSpec("sqlite", "mirrorcat", f"sqlite:///{tmp_path / 'target.db'}", f"file://{warehouse}")
    base = request.getfixturevalue("postgres_server")
    return CatalogSpec("postgres", f"pg{uuid.uuid4().hex[:10]}", base, f"file://{warehouse}")


@pytest.fixture
def source(source_spec):
    return source_spec.open()


@pytest.fixture
def target(target_spec):
    catalog = target_spec.open()
    add_acl(catalog, PRINCIPAL, "logs.*")
    return catalog

from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # infra/ is not an installed package

from tests.catalogs import CatalogSpec  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server for the session (Debian's postgresql binaries)."""
    from infra import postgres

    directory = Path(tempfile.mkdtemp(prefix="icelog-pg-"))
    uri = postgres.start(directory)
    yield uri
    postgres.stop(directory)


def _spec(kind: str, tmp_path: Path, request) -> CatalogSpec:
    warehouse = f"file://{tmp_path / 'warehouse'}"
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    if kind == "sqlite":
        return CatalogSpec("sqlite", "testcat", f"sqlite:///{tmp_path / 'catalog.db'}", warehouse)
    base = request.getfixturevalue("postgres_server")
    # A fresh catalog name per test keeps tests apart on one server.
    return CatalogSpec("postgres", f"pg{uuid.uuid4().hex[:10]}", base, warehouse)


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_spec(request, tmp_path) -> CatalogSpec:
    return _spec(request.param, tmp_path, request)


@pytest.fixture
def sqlite_spec(request, tmp_path) -> CatalogSpec:
    return _spec("sqlite", tmp_path, request)


@pytest.fixture
def catalog(catalog_spec):
    return catalog_spec.open()


@pytest.fixture
def sqlite_catalog(sqlite_spec):
    return sqlite_spec.open()

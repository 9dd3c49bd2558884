from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # infra/ is not an installed package

# The helpers in tests/support assert like the tests that call them: pytest rewrites their asserts
# too (as it did when they lived in test modules), so a failed check shows the values it compared.
pytest.register_assert_rewrite("tests.support")

from tests.support.catalogs import CatalogSpec  # noqa: E402
from tests.support.lakehouse import BUCKET, LakehouseSpec, lakehouse_spec  # noqa: E402
from tests.support.spark import local_session  # noqa: E402

# Variables that choose or configure a catalog; a test sets the ones it needs itself.
CATALOG_VARIABLES = ("ICELOG_CATALOG", "ICELOG_HOME")
CATALOG_PREFIX = "PYICEBERG_CATALOG__"


@pytest.fixture(scope="session")
def pyiceberg_home(tmp_path_factory) -> Path:
    """A PYICEBERG_HOME whose .pyiceberg.yaml configures nothing.

    pyiceberg reads the first *non-empty* .pyiceberg.yaml of PYICEBERG_HOME, ~ and the
    working directory, so an empty directory would still fall through to ~/.pyiceberg.yaml:
    this file holds one key pyiceberg ignores, and stops the search.
    """
    home = tmp_path_factory.mktemp("pyiceberg-home")
    (home / ".pyiceberg.yaml").write_text("# tests/conftest.py: isolates tests from ~/.pyiceberg.yaml\nicelog-tests: isolated\n")
    return home


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, pyiceberg_home):
    """No test sees the user's catalog configuration, and no test's leaks into the next.

    Every change goes through monkeypatch, so it is undone after the test.
    """
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    monkeypatch.setenv("PYICEBERG_HOME", str(pyiceberg_home))
    for name in list(os.environ):
        if name in CATALOG_VARIABLES or name.upper().startswith(CATALOG_PREFIX):
            monkeypatch.delenv(name)
    # load_catalog() merges a Config read once at import time: read it again, isolated.
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server for the session (Debian's postgresql binaries)."""
    from infra import postgres

    directory = Path(tempfile.mkdtemp(prefix="icelog-pg-"))
    uri = postgres.start(directory)
    yield uri
    postgres.stop(directory)


def _spec(kind: str, tmp_path: Path, request) -> CatalogSpec:
    if kind == "rest":
        config = dict(request.getfixturevalue("rest_tables"))
        return CatalogSpec("rest", "resttest", config.pop("uri"), config.pop("warehouse"), tuple(sorted(config.items())))
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def heavy_spec(request, tmp_path) -> CatalogSpec:
    """``catalog_spec`` for the longest multi-process tests: their SQLite run is the short
    version in ``make test``, their PostgreSQL run is ``slow`` (the suite's time budget). The
    exactly-one-winner race and the kill -9 mid-commit and producer tests run on both catalogs in
    ``make test``; retention's and compaction's kill -9 tests on PostgreSQL are ``slow``."""
    return _spec(request.param, tmp_path, request)


@pytest.fixture
def sqlite_spec(request, tmp_path) -> CatalogSpec:
    return _spec("sqlite", tmp_path, request)


@pytest.fixture
def postgres_spec(request, tmp_path) -> CatalogSpec:
    return _spec("postgres", tmp_path, request)


@pytest.fixture(scope="session")
def spark():
    """One ``local[2]`` SparkSession for the whole run (Spark keeps one per process), stopped at the end."""
    session = local_session()
    yield session
    session.stop()


@pytest.fixture
def catalog(catalog_spec):
    return catalog_spec.open()


@pytest.fixture
def sqlite_catalog(sqlite_spec):
    return sqlite_spec.open()


# --- I8: bad input changes nothing ----------------------------------------------------------


def table_fingerprint(log_table) -> tuple:
    """What any change to a log table would move: the metadata pointer (every commit moves
    it, property-only ones too), the current snapshot, the icelog state version, watermarks,
    producer state and the rows themselves."""
    table = log_table.table()
    props = table.metadata.properties
    rows = table.scan().to_arrow().sort_by([("log_partition", "ascending"), ("log_offset", "ascending")])
    return (
        table.metadata_location,
        table.metadata.current_snapshot_id,
        props.get("icelog.version"),
        props.get("icelog.watermarks"),
        props.get("icelog.producers"),
        rows.num_rows,
        rows.select(["log_partition", "log_offset"]).to_pylist(),
    )


def catalog_fingerprint(catalog) -> tuple:
    """Namespaces and the tables in each."""
    namespaces = sorted(catalog.list_namespaces())
    return tuple((ns, tuple(sorted(catalog.list_tables(ns)))) for ns in namespaces)


@pytest.fixture
def unchanged():
    """``with unchanged(log_table): ...`` asserts the block left the table exactly as it was.

    ``with unchanged(catalog=catalog): ...`` asserts no namespace or table appeared or went.
    """

    @contextlib.contextmanager
    def check(log_table=None, *, catalog=None):
        before = table_fingerprint(log_table) if log_table is not None else None
        catalog_before = catalog_fingerprint(catalog) if catalog is not None else None
        yield
        if log_table is not None:
            assert table_fingerprint(log_table) == before, "the table changed"
        if catalog is not None:
            assert catalog_fingerprint(catalog) == catalog_before, "the catalog changed"

    return check


@contextlib.contextmanager
def _throwaway_seaweedfs():
    """A SeaweedFS server in a new directory: ``(directory, configuration)``; stopped and removed after."""
    import shutil

    from infra import seaweedfs

    directory = Path(tempfile.mkdtemp(prefix="icelog-sw-"))
    try:
        yield directory, seaweedfs.start(directory)
    finally:
        seaweedfs.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def seaweedfs_server():
    """One throwaway SeaweedFS server for the session: its pyiceberg ``rest`` catalog configuration
    (``load_catalog(name, **seaweedfs_server)``), an Iceberg REST catalog over its S3 store."""
    with _throwaway_seaweedfs() as (_, config):
        yield config


@pytest.fixture
def own_seaweedfs():
    """A SeaweedFS server of the test's own, for tests that kill it (the session's is shared): its
    directory (``infra.seaweedfs.catalog_config``, ``stop``, ``start``)."""
    with _throwaway_seaweedfs() as (directory, _):
        yield directory


@pytest.fixture
def rest_tables(seaweedfs_server):
    """The session's SeaweedFS REST catalog, emptied after the test (tests share its one bucket)."""
    yield seaweedfs_server
    from pyiceberg.catalog import load_catalog

    cat = load_catalog("cleanup", **seaweedfs_server)
    for namespace in cat.list_namespaces():
        for table in cat.list_tables(namespace):
            cat.purge_table(table)
        cat.drop_namespace(namespace)


@pytest.fixture
def rest_spec(request, tmp_path) -> CatalogSpec:
    return _spec("rest", tmp_path, request)


@pytest.fixture
def rest_catalog(rest_spec):
    return rest_spec.open()


@pytest.fixture
def lakehouse(seaweedfs_server, postgres_server, monkeypatch) -> LakehouseSpec:
    """A fresh PostgreSQL + S3 catalog, reachable by name through the environment (this test only)."""
    spec = lakehouse_spec(seaweedfs_server, postgres_server)
    for key, value in spec.env().items():
        monkeypatch.setenv(key, value)
    return spec


@pytest.fixture
def s3_landing(lakehouse) -> str:
    """An empty landing prefix of this test in the lakehouse bucket (``s3://lakehouse/landing/...``)."""
    return f"s3://{BUCKET}/landing/{uuid.uuid4().hex[:8]}"

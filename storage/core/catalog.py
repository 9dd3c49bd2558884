"""Catalogs: the embedded default and any pyiceberg catalog named by configuration.

Precedence follows pyiceberg (``storage.settings``): an explicit name, else ``ICELOG_CATALOG``, is
resolved from ``PYICEBERG_CATALOG__<NAME>__...`` variables and ``.pyiceberg.yaml``.
With no name, the embedded default is used: a SQLite SQL catalog and a local warehouse
under ``$ICELOG_HOME`` (default ``./.icelog``). Opening it for a write creates the home;
opening it for a read (``create=False``) never does: a home that does not exist is
:class:`CatalogNotFound`, so a read started outside a project leaves no empty home behind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import requests
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import ServerError, ServiceUnavailableError

from icelog.storage.core import faults
from icelog.storage.core.catalog_config import (  # noqa: F401 (re-exported: callers import them from here)
    EMBEDDED_DATABASE,
    EMBEDDED_NAME,
    CatalogNotConfigured,
    CatalogNotFound,
    choose_catalog,
    embedded_layout,
    icelog_home,
)
from icelog.storage.errors import CatalogUnavailable
from icelog.storage.extras import require
from icelog.storage.settings import Settings

# The FileIO of icelog's catalogs (storage.core.fileio: small S3 files in one request), unless
# the configuration names one (``py-io-impl``): configuration wins, as everywhere in pyiceberg.
FILE_IO = {"py-io-impl": "icelog.storage.core.fileio.LogFileIO"}

ATTEMPTS = 5  # about 0.75 s of back-off: rides out a busy or restarting catalog


def retrying(request: Callable[[], Any], unreachable: tuple[type[BaseException], ...], table: str) -> Any:
    """``request()`` (a read, or a write that is safe to repeat), again with back-off while it
    raises ``unreachable``; then :class:`CatalogUnavailable`."""
    for attempt in range(ATTEMPTS):
        try:
            return request()
        except unreachable as e:
            if attempt == ATTEMPTS - 1:
                raise CatalogUnavailable(table=table, reason=repr(e)) from e
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


class LogSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog with a fault point between metadata write and pointer swap.

    Connections are tested on checkout (``pool_pre_ping``): a pooled connection may predate a
    restart of the database server, and the first read after an outage must not fail on it.
    """

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **{"pool_pre_ping": "true", **properties})

    def load_table(self, identifier: Any) -> Any:
        """pyiceberg's ``load_table``; a database that stays unreachable is :class:`CatalogUnavailable`."""
        from sqlalchemy.exc import InterfaceError, OperationalError

        return retrying(
            lambda: super(LogSqlCatalog, self).load_table(identifier), (OperationalError, InterfaceError), str(identifier)
        )

    def _write_metadata(self, *args: Any, **kwargs: Any) -> None:
        super()._write_metadata(*args, **kwargs)
        faults.checkpoint(faults.AFTER_METADATA_WRITE)


# What a REST catalog's client raises while its server is down or restarting: no connection,
# a timeout, or a response cut off mid-body (ChunkedEncodingError: urllib3's IncompleteRead when
# the server dies while it sends). Other requests errors (a bad URL) are the caller's.
REST_UNREACHABLE = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
    ServerError,
    ServiceUnavailableError,
)


class LogRestCatalog(RestCatalog):
    """pyiceberg's REST catalog; a server that stays unreachable is :class:`CatalogUnavailable`,
    as for :class:`LogSqlCatalog` (a commit's swap that fails so is an unknown outcome in the core)."""

    def __init__(self, name: str, **properties: str) -> None:
        # The constructor fetches the server's /v1/config.
        retrying(lambda: super(LogRestCatalog, self).__init__(name, **properties), REST_UNREACHABLE, f"(catalog {name})")

    def load_table(self, identifier: Any) -> Any:
        return retrying(lambda: super(LogRestCatalog, self).load_table(identifier), REST_UNREACHABLE, str(identifier))

    # The other reads icelog makes outside a commit (opening a table, listing, system tables).
    def table_exists(self, identifier: Any) -> bool:
        return retrying(lambda: super(LogRestCatalog, self).table_exists(identifier), REST_UNREACHABLE, str(identifier))

    def list_tables(self, namespace: Any) -> Any:
        return retrying(lambda: super(LogRestCatalog, self).list_tables(namespace), REST_UNREACHABLE, str(namespace))

    def list_namespaces(self, namespace: Any = ()) -> Any:
        return retrying(lambda: super(LogRestCatalog, self).list_namespaces(namespace), REST_UNREACHABLE, "(namespaces)")

    def namespace_exists(self, namespace: Any) -> bool:
        return retrying(lambda: super(LogRestCatalog, self).namespace_exists(namespace), REST_UNREACHABLE, str(namespace))


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists; safe when processes race to create it.

    Racing creators see more than ``NamespaceAlreadyExistsError``. pyiceberg's SQL catalog
    checks, then inserts: the loser gets the database's integrity error. SeaweedFS's REST
    catalog answers 500 ("attribute not found") while another client's namespace is half
    created. Creating a namespace is idempotent, so those are asked again, as a read would be.
    """
    from pyiceberg.exceptions import NamespaceAlreadyExistsError
    from sqlalchemy.exc import IntegrityError

    def create() -> None:
        try:
            catalog.create_namespace(namespace)
        except (NamespaceAlreadyExistsError, IntegrityError):
            if not catalog.namespace_exists(namespace):
                raise

    retrying(create, REST_UNREACHABLE, namespace)


def embedded_properties(home: Path | None = None) -> dict[str, str]:
    """:func:`embedded_layout`, with its warehouse folder created (the catalog is about to open)."""
    home = home or icelog_home()
    (home / "warehouse").mkdir(parents=True, exist_ok=True)
    return embedded_layout(home)


def open_catalog(
    name: str | Catalog | None = None, *, create: bool = True, settings: Settings | None = None, **properties: str
) -> Catalog:
    """Open a catalog.

    Args:
        name: A pyiceberg catalog name; ``None`` means the settings' catalog
            (``$ICELOG_CATALOG``) or, if none, the embedded default under their home
            (``$ICELOG_HOME``). A catalog already open (one an Airflow connection opened, say)
            is returned as it is: callers take either.
        create: Create the embedded catalog (its home, SQLite file and warehouse folder) if it
            does not exist. False for reads: they open an existing one or fail, creating nothing.
        settings: An entry point's settings (default: loaded now, ``Settings.load()``).
        properties: Extra catalog properties, overriding configuration.

    Returns:
        The catalog. SQL catalogs (SQLite, PostgreSQL) come back as :class:`LogSqlCatalog`.

    Raises:
        CatalogNotConfigured: ``name`` has no configuration.
        CatalogNotFound: ``create`` is False and the embedded catalog does not exist.
        InvalidSetting: no ``settings`` given and an ``ICELOG_*`` variable is malformed.
        MissingExtra: the catalog needs a driver that is not installed (``icelog[postgres]``, ``icelog[s3]``).
    """
    if isinstance(name, Catalog):
        return name
    choice = choose_catalog(name, settings or Settings.load(), must_exist=not create, configured=bool(properties))
    if choice.embedded:
        layout = embedded_properties(choice.home) if create else choice.properties
        return LogSqlCatalog(EMBEDDED_NAME, **{**FILE_IO, **layout, **properties})
    name, conf = choice.name, {**choice.properties, **properties}
    uri = str(conf.get("uri", ""))
    if uri.startswith(("postgresql://", "postgresql+psycopg2://")):  # SQLAlchemy's default PostgreSQL driver
        require("psycopg2", f"the PostgreSQL catalog {name!r}")
    if str(conf.get("rest.sigv4-enabled", "")).lower() == "true":  # pyiceberg signs with botocore
        require("boto3", f"the SigV4-signed REST catalog {name!r}")
    if conf.get("type", "sql") == "sql" and uri.startswith(("sqlite", "postgresql")):
        return LogSqlCatalog(name, **{**FILE_IO, **{k: str(v) for k, v in conf.items() if k != "type"}})
    if conf.get("type") == "rest" and "py-catalog-impl" not in conf:
        return LogRestCatalog(name, **{**FILE_IO, **{k: str(v) for k, v in conf.items()}})
    return load_catalog(name, **conf)  # conf: the environment as it is now (pyiceberg reads it once, at import)


_NOW_MS_SQL = {
    # julianday('now') is the host's clock: every process of one SQLite catalog shares it.
    "sqlite": "SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    # clock_timestamp(), not now(): now() stays fixed for the whole database transaction.
    "postgresql": "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
}


def database_clock(catalog: Catalog) -> Callable[[], int]:
    """Milliseconds now by the catalog database's clock: one clock for every client.

    Deadlines that several processes judge (a transaction's timeout) must not depend on
    each host's clock: a fast one would expire every other client's work, a slow one its
    own. Catalogs without a SQL database (which refuse transactions anyway) use this host's.
    """
    engine = getattr(catalog, "engine", None) if isinstance(catalog, SqlCatalog) else None
    query = _NOW_MS_SQL.get(engine.dialect.name) if engine is not None else None
    if query is None:
        return lambda: int(time.time() * 1000)
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    def now_ms() -> int:
        try:
            with engine.connect() as connection:
                return int(connection.execute(text(query)).scalar_one())
        except SQLAlchemyError as e:
            raise CatalogUnavailable(table="(database clock)", reason=repr(e)) from e

    return now_ms

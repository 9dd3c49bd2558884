"""A table's current metadata, and the catalog's table names, read without pyiceberg's catalogs.

A read-only command that needs only what a table's metadata file holds (``icelog offsets``,
``snapshots``, ``topics describe``, ``topics list``) reads the catalog's pointer and the file
itself: pyiceberg's catalog and table layers, SQLAlchemy, requests, pyarrow and pandas are never
imported, which was most of such a command's time. Per catalog:

- SQLite: pyiceberg's ``iceberg_tables`` row, with ``sqlite3``, the database opened read-only;
- PostgreSQL: the same row, with psycopg2 (SQLAlchemy's driver for ``postgresql://``) directly,
  in a read-only session;
- REST: ``loadTable``'s answer, which holds the metadata itself
  (:mod:`icelog.storage.core.rest_pointer`).

A metadata file is read from the local file system, or from S3 with one signed GET when the
catalog names the endpoint and keys (:mod:`icelog.storage.core.signed_get`).

Anything else (another catalog, a property these reads do not honour, a row or file they cannot
find or read, an unreachable server) answers None, and the caller opens the catalog as usual,
which also raises the typed errors. Nothing is written.

It reads the table pyiceberg's SQL catalog keeps its pointers in (``iceberg_tables``, as of
pyiceberg 0.12); ``tests/storage/core/test_pointer.py`` holds it to pyiceberg's own model.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import quote, unquote, urlsplit

from icelog.storage.core.rest_pointer import RestReader
from icelog.storage.core.signed_get import Signer, get

TABLES = "iceberg_tables"  # pyiceberg.catalog.sql.IcebergTables
TABLE_TYPE = "TABLE"  # pyiceberg.catalog.sql's ICEBERG_TABLE_TYPE: rows of other types are views
POSTGRES_SCHEMES = ("postgresql://", "postgresql+psycopg2://")  # SQLAlchemy's psycopg2 URIs
# S3 properties that change how pyiceberg's FileIO reaches an object: the light read leaves those to it.
S3_OTHERWISE = (
    "s3.profile-name",
    "s3.anonymous",
    "s3.proxy-uri",
    "s3.signer",
    "s3.signer.uri",
    "s3.role-arn",
    "s3.force-virtual-addressing",
    "py-io-impl",
)
LIGHT_FILE_IO = ("icelog.storage.core.fileio.LogFileIO", "pyiceberg.io.pyarrow.PyArrowFileIO")


def sqlite_file(properties: Mapping[str, Any]) -> Path | None:
    """The SQLite database of a SQL catalog (SQLAlchemy's ``sqlite:///path``), or None."""
    uri = str(properties.get("uri", ""))
    if str(properties.get("type", "sql")) != "sql" or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path else None


def postgres_dsn(properties: Mapping[str, Any]) -> str | None:
    """The libpq URI of a SQL catalog on PostgreSQL through psycopg2, or None."""
    uri = str(properties.get("uri", ""))
    if str(properties.get("type", "sql")) != "sql" or not uri.startswith(POSTGRES_SCHEMES):
        return None
    return "postgresql://" + uri.split("://", 1)[1]


# --- SQL catalogs: pyiceberg's iceberg_tables ------------------------------------------------------


def _rows(execute: Callable[[str, tuple], list], where: str, args: tuple, columns: str) -> list:
    """``columns`` of the table rows (not views) matching ``where``; a catalog made before pyiceberg
    added ``iceberg_type`` has no views (``execute`` raises LookupError for a missing column)."""
    try:
        return execute(
            f"SELECT {columns} FROM {TABLES} WHERE {where} AND (iceberg_type = %s OR iceberg_type IS NULL)",
            (*args, TABLE_TYPE),
        )
    except LookupError:
        return execute(f"SELECT {columns} FROM {TABLES} WHERE {where}", args)


@contextlib.contextmanager
def _sql(properties: Mapping[str, Any]):
    """A read-only query function on the SQL catalog's database, or None where none applies.

    The function takes ``%s`` placeholders and raises LookupError for a missing column."""
    database, dsn = sqlite_file(properties), postgres_dsn(properties)
    if database is not None:
        if not database.is_file():  # sqlite3 would create it
            yield None
            return
        with contextlib.closing(sqlite3.connect(f"{database.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:

            def execute(query: str, args: tuple) -> list:
                try:
                    return con.execute(query.replace("%s", "?"), args).fetchall()
                except sqlite3.OperationalError as e:
                    if "no such column" in str(e):
                        raise LookupError(str(e)) from e
                    raise

            yield execute
        return
    if dsn is None:
        yield None
        return
    import psycopg2
    import psycopg2.errors

    with contextlib.closing(psycopg2.connect(dsn, connect_timeout=5)) as con:
        con.set_session(readonly=True, autocommit=True)

        def execute(query: str, args: tuple) -> list:
            with con.cursor() as cursor:
                try:
                    cursor.execute(query, args)
                except psycopg2.errors.UndefinedColumn as e:
                    raise LookupError(str(e)) from e
                return cursor.fetchall()

        yield execute


def _sql_errors() -> tuple[type[BaseException], ...]:
    psycopg2 = sys.modules.get("psycopg2")  # imported only if a PostgreSQL catalog was read
    return (sqlite3.Error,) + ((psycopg2.Error,) if psycopg2 is not None else ())


# --- metadata files ---------------------------------------------------------------------------------


def _local(location: str) -> Path | None:
    parts = urlsplit(location)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(location) if not parts.scheme else None


def _s3_object(location: str, properties: Mapping[str, Any]) -> bytes | None:
    """An S3 object by one signed path-style GET, where the catalog names the endpoint and keys."""
    props = {k: str(v) for k, v in properties.items()}
    parts = urlsplit(location)
    endpoint = props.get("s3.endpoint")
    key_id = props.get("s3.access-key-id") or props.get("client.access-key-id")
    secret = props.get("s3.secret-access-key") or props.get("client.secret-access-key")
    region = props.get("s3.region") or props.get("client.region") or "us-east-1"
    io_impl = props.get("py-io-impl")
    if parts.scheme not in ("s3", "s3a", "s3n") or not (endpoint and key_id and secret):
        return None
    if (io_impl and io_impl not in LIGHT_FILE_IO) or any(props.get(k) for k in S3_OTHERWISE if k != "py-io-impl"):
        return None
    token = props.get("s3.session-token") or props.get("client.session-token") or None
    url = f"{endpoint.rstrip('/')}/{parts.netloc}/{quote(parts.path.lstrip('/'), safe='/~')}"
    return get(url, signer=Signer(key_id, secret, region, "s3", token))


def read_metadata_file(location: str, properties: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parsed metadata file at ``location`` (gzip or not), or None where it is not read here.

    Raises:
        OSError: it could not be read; ValueError: it is not JSON.
    """
    path = _local(location)
    raw = path.read_bytes() if path is not None else _s3_object(location, properties)
    if raw is None:
        return None
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


# --- the reads --------------------------------------------------------------------------------------


def current_metadata(catalog: str, properties: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any] | None:
    """The parsed current metadata of ``namespace.name`` in the catalog ``catalog`` (its
    ``properties``); None when this light read does not apply or finds nothing."""
    try:
        if RestReader.applies(properties):
            return RestReader(properties).metadata(namespace, name)
        with _sql(properties) as execute:
            if execute is None:
                return None
            where = "catalog_name = %s AND table_namespace = %s AND table_name = %s"
            rows = _rows(execute, where, (catalog, namespace, name), "metadata_location")
        return read_metadata_file(rows[0][0], properties) if rows and rows[0][0] else None
    except (OSError, ValueError, KeyError, TypeError, ImportError, *_sql_errors()):
        return None  # the full read decides, and names the error


def table_names(catalog: str, properties: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """Every (namespace, table) in the catalog's top-level namespaces, as pyiceberg's
    ``list_namespaces`` and ``list_tables`` give them; None when this light read does not apply."""
    try:
        if RestReader.applies(properties):
            return RestReader(properties).table_names()
        with _sql(properties) as execute:
            if execute is None:
                return None
            rows = _rows(execute, "catalog_name = %s", (catalog,), "table_namespace, table_name")
        return sorted({(ns, t) for ns, t in rows if "." not in ns})  # nested namespaces are not top-level
    except (OSError, ValueError, KeyError, TypeError, ImportError, *_sql_errors()):
        return None

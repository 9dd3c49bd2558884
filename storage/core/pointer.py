"""A table's current metadata on a SQLite catalog, read with the standard library alone.

A read-only command that needs only a table's properties (``icelog offsets``) reads the
catalog's row and the metadata file itself: pyiceberg's catalog and table layers, SQLAlchemy,
pyarrow and pandas are never imported, which was most of such a command's time. Anything else
(another database, a REST server, a metadata file on an object store, a row it cannot find or
read) answers None, and the caller opens the catalog as usual, which also raises the typed
errors. Nothing is written: the database is opened read-only.

It reads the table pyiceberg's SQL catalog keeps its pointers in (``iceberg_tables``, as of
pyiceberg 0.12); ``tests/storage/core/test_pointer.py`` holds it to pyiceberg's own model.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlsplit

TABLES = "iceberg_tables"  # pyiceberg.catalog.sql.IcebergTables
TABLE_TYPE = "TABLE"  # pyiceberg.catalog.sql's ICEBERG_TABLE_TYPE: rows of other types are views


def sqlite_file(properties: Mapping[str, Any]) -> Path | None:
    """The SQLite database of a SQL catalog (SQLAlchemy's ``sqlite:///path``), or None."""
    uri = str(properties.get("uri", ""))
    if str(properties.get("type", "sql")) != "sql" or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path else None


def _pointer(con: sqlite3.Connection, catalog: str, namespace: str, name: str) -> str | None:
    where = "catalog_name = ? AND table_namespace = ? AND table_name = ?"
    try:
        rows = con.execute(
            f"SELECT metadata_location FROM {TABLES} WHERE {where} AND (iceberg_type = ? OR iceberg_type IS NULL)",
            (catalog, namespace, name, TABLE_TYPE),
        ).fetchall()
    except sqlite3.OperationalError:  # a catalog made before pyiceberg added iceberg_type
        rows = con.execute(f"SELECT metadata_location FROM {TABLES} WHERE {where}", (catalog, namespace, name)).fetchall()
    return rows[0][0] if rows else None


def _local(location: str) -> Path | None:
    parts = urlsplit(location)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(location) if not parts.scheme else None


def current_metadata(catalog: str, properties: Mapping[str, Any], namespace: str, name: str) -> dict[str, Any] | None:
    """The parsed current metadata file of ``namespace.name`` in the SQLite catalog
    ``catalog`` (its ``properties``); None when this light read does not apply or finds nothing."""
    database = sqlite_file(properties)
    if database is None or not database.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{database.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            location = _pointer(con, catalog, namespace, name)
        path = _local(location) if location else None
        if path is None:
            return None
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (sqlite3.Error, OSError, ValueError):
        return None  # the full read decides, and names the error

"""``IcelogHook``: an icelog catalog from an Airflow connection of type ``icelog``.

Connection fields (``docs/provider.md`` has examples in JSON and URI form):

* extra ``catalog_type``: ``sql`` (SQLite or PostgreSQL, the default) or ``rest``;
* the catalog URI: extra ``uri`` as it is (``sqlite:////data/catalog.db``,
  ``postgresql+psycopg2://db:5432/catalog``, ``http://127.0.0.1:8181``), else built from host,
  port and schema (``postgresql+psycopg2://host:port/schema`` for sql, ``http://host:port/schema``
  for rest; extra ``driver`` or ``scheme`` changes the first part);
* login and password: the database's user and password (sql, put into the URI unless it has
  a user already); for rest, login and password are OAuth2 client credentials
  (``credential``), a password alone is a bearer ``token``;
* extra ``warehouse``; ``s3_endpoint``, ``s3_region``, ``s3_access_key_id``,
  ``s3_secret_access_key``: the warehouse's object store;
* extra ``properties``: any further pyiceberg catalog properties, as they are (they win);
* extra ``catalog_name``: the catalog's name (Assets, logs), default the connection id.

Without a connection (``icelog_conn_id=None``) the hook opens icelog's own default catalog:
``$ICELOG_CATALOG``, ``.pyiceberg.yaml``, or the embedded one under ``$ICELOG_HOME``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseHook

from icelog.provider import CONN_TYPE
from icelog.provider.assets import default_catalog_name
from icelog.storage.errors import InvalidConnection

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from icelog.storage.log.table import LogTable

CATALOG_TYPES = ("sql", "rest")
# Friendly extra names -> pyiceberg's FileIO properties.
S3_EXTRAS = {
    "s3_endpoint": "s3.endpoint",
    "s3_region": "s3.region",
    "s3_access_key_id": "s3.access-key-id",
    "s3_secret_access_key": "s3.secret-access-key",
}


def _extra(conn: Any) -> dict[str, Any]:
    """The connection's extra as a dict; the UI's form stores fields as ``extra__icelog__<name>``."""
    raw = conn.extra_dejson if hasattr(conn, "extra_dejson") else json.loads(conn.extra or "{}")
    prefix = f"extra__{CONN_TYPE}__"
    return {**{k.removeprefix(prefix): v for k, v in raw.items() if k.startswith(prefix)}, **raw}


def catalog_properties(conn: Any) -> tuple[str, dict[str, str]]:
    """``(catalog name, pyiceberg properties)`` of an ``icelog`` connection.

    Raises:
        InvalidConnection: another connection type, an unknown catalog type, no URI.
    """
    conn_id = conn.conn_id
    if conn.conn_type != CONN_TYPE:
        raise InvalidConnection(
            conn_id=conn_id, reason=f"it is of type {conn.conn_type!r}, not {CONN_TYPE!r} (an icelog catalog connection)"
        )
    try:
        extra = _extra(conn)
    except ValueError as e:
        raise InvalidConnection(conn_id=conn_id, reason=f"its extra is not a JSON object ({e})") from e
    kind = str(extra.get("catalog_type") or "sql").lower()
    if kind not in CATALOG_TYPES:
        raise InvalidConnection(conn_id=conn_id, reason=f"catalog_type {kind!r} is not one of {', '.join(CATALOG_TYPES)}")
    uri = extra.get("uri") or _uri_from_fields(conn, kind, extra)
    if not uri:
        raise InvalidConnection(conn_id=conn_id, reason="no catalog URI: set the host (and port, schema) or extra 'uri'")
    props: dict[str, str] = {"type": kind}
    if kind == "sql":
        props["uri"] = _with_user(uri, conn.login, conn.password)
    else:
        props["uri"] = uri
        if conn.login and conn.password:
            props["credential"] = f"{conn.login}:{conn.password}"
        elif conn.password:
            props["token"] = conn.password
    if extra.get("warehouse"):
        props["warehouse"] = str(extra["warehouse"])
    props.update({key: str(extra[name]) for name, key in S3_EXTRAS.items() if extra.get(name) not in (None, "")})
    more = extra.get("properties") or {}
    if not isinstance(more, dict):
        raise InvalidConnection(conn_id=conn_id, reason=f"extra 'properties' must be an object, not {more!r}")
    props.update({str(k): str(v) for k, v in more.items()})
    return str(extra.get("catalog_name") or conn_id), props


def _uri_from_fields(conn: Any, kind: str, extra: dict[str, Any]) -> str | None:
    if not conn.host:
        return None
    port = f":{conn.port}" if conn.port else ""
    path = f"/{conn.schema}" if conn.schema else ""
    if kind == "sql":
        return f"{extra.get('driver') or 'postgresql+psycopg2'}://{conn.host}{port}{path}"
    return f"{extra.get('scheme') or 'http'}://{conn.host}{port}{path}"


def _with_user(uri: str, login: str | None, password: str | None) -> str:
    """A SQL catalog URI with the connection's login and password, unless it names a user."""
    parts = urlsplit(uri)
    if not login or parts.username or not parts.netloc:  # sqlite:///path has no netloc
        return uri
    user = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "")
    return parts._replace(netloc=f"{user}@{parts.netloc}").geturl()


class IcelogHook(BaseHook):
    """Opens an icelog catalog from an Airflow connection of type ``icelog``.

    Args:
        icelog_conn_id: The connection (default ``icelog_default``); ``None``: icelog's own
            default catalog (``$ICELOG_CATALOG``, ``.pyiceberg.yaml``, the embedded one).
    """

    conn_name_attr = "icelog_conn_id"
    default_conn_name = "icelog_default"
    conn_type = CONN_TYPE
    hook_name = "icelog (Iceberg log tables)"

    def __init__(self, icelog_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.icelog_conn_id = icelog_conn_id
        self._catalog: Catalog | None = None
        self._name: str | None = None

    def catalog_config(self) -> tuple[str, dict[str, str]]:
        """``(catalog name, pyiceberg properties)`` from the connection.

        Raises:
            InvalidConnection: the connection is not defined, or not an icelog catalog.
        """
        if self.icelog_conn_id is None:
            return default_catalog_name(), {}
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.icelog_conn_id)
        except AirflowNotFoundException as e:
            raise InvalidConnection(
                conn_id=self.icelog_conn_id,
                reason=f"not defined (add it under Admin > Connections, or set AIRFLOW_CONN_{self.icelog_conn_id.upper()})",
            ) from e
        return catalog_properties(conn)

    @property
    def catalog_name(self) -> str:
        """The catalog's name: the connection's ``catalog_name`` extra, else its id (the Asset URIs' catalog)."""
        if self._name is None:
            self._name = self.catalog_config()[0]
        return self._name

    def get_conn(self) -> Catalog:
        """The catalog (opened once per hook), through ``storage.core.catalog.open_catalog``."""
        if self._catalog is None:
            from icelog.storage.core.catalog import open_catalog

            name, props = self.catalog_config()
            self._name = name
            self._catalog = open_catalog(name, **props) if props else open_catalog(None)
        return self._catalog

    get_catalog = get_conn

    def get_log_table(self, table: str) -> LogTable:
        """The log table ``table`` in this catalog.

        Raises:
            UnknownTable: no such table; NotALogTable: an Iceberg table icelog did not create.
        """
        from icelog.storage.log.table import LogTable

        return LogTable.open(self.get_conn(), table)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's Test button: open the catalog and list its namespaces."""
        try:
            namespaces = self.get_conn().list_namespaces()
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
        return True, f"catalog {self.catalog_name!r} answers: {len(namespaces)} namespaces"

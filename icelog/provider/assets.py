"""Assets of log tables: ``icelog://<catalog>/<namespace>/<table>``.

The catalog segment names where the table lives, so that a table and its mirror in another
catalog are two Assets: an Airflow connection's ``catalog_name`` extra, else its connection
id; without a connection, the pyiceberg catalog name (``$ICELOG_CATALOG``, else ``icelog``,
the embedded catalog). Only the standard library, ``airflow.sdk`` and icelog's settings are imported here: DAG
files build Assets at parse time.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import SplitResult

from airflow.sdk import Asset

from icelog.storage.settings import Settings

SCHEME = "icelog"
EMBEDDED_CATALOG = "icelog"  # storage.core.catalog.EMBEDDED_NAME, without importing pyiceberg
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def default_catalog_name() -> str:
    """The catalog icelog opens without a connection: ``$ICELOG_CATALOG``, else the embedded one."""
    return Settings.load().catalog or EMBEDDED_CATALOG


def asset_uri(table: str, catalog: str | None = None) -> str:
    """``icelog://<catalog>/<namespace>/<table>`` of ``namespace.table`` (a bare name: namespace ``logs``,
    as icelog names tables)."""
    namespace, _, name = table.rpartition(".")
    parts = (catalog or default_catalog_name(), namespace or "logs", name)
    bad = [p for p in parts if not _NAME.match(p)]
    if bad:
        raise ValueError(f"cannot name an icelog Asset for table {table!r} in catalog {parts[0]!r}: {bad[0]!r} is not a name")
    return f"{SCHEME}://{parts[0]}/{parts[1]}/{parts[2]}"


def icelog_asset(table: str, catalog: str | None = None, **kwargs: Any) -> Asset:
    """The Asset of log table ``table`` in ``catalog``: tasks that write it list it in ``outlets``, and
    DAGs scheduled on it (or on an ``AssetWatcher`` with :class:`~icelog.provider.triggers.IcelogLogTrigger`,
    passed as ``watchers=[...]``) run when it changes. Its name is the URI: one catalog's
    ``demo.flights`` is not another's."""
    uri = asset_uri(table, catalog)
    return Asset(name=uri, uri=uri, group="icelog", **kwargs)


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's check of an ``icelog://`` Asset URI (the provider's ``asset-uris`` handler):
    exactly a catalog, a namespace and a table."""
    segments = uri.path.strip("/").split("/") if uri.path.strip("/") else []
    if not uri.netloc or len(segments) != 2:
        raise ValueError(f"an icelog Asset URI is icelog://<catalog>/<namespace>/<table>, not {uri.geturl()!r}")
    return uri

"""Which catalog a name means and its properties, decided without opening it.

Precedence follows pyiceberg: an explicit name, else ``ICELOG_CATALOG``, is resolved from
``PYICEBERG_CATALOG__<NAME>__...`` variables and ``.pyiceberg.yaml`` (pyiceberg's own
``Config``). With no name, the embedded default: a SQLite SQL catalog and a local warehouse
under ``$ICELOG_HOME``. Only pyiceberg's configuration reader is imported here, not its
catalogs, so ``icelog catalog`` and the light read of ``icelog offsets`` stay light;
:func:`icelog.storage.core.catalog.open_catalog` opens what this chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.utils.config import Config

from icelog.storage.errors import InvalidInput, TerminalError
from icelog.storage.settings import Settings

EMBEDDED_NAME = "icelog"
EMBEDDED_DATABASE = "catalog.db"  # the embedded catalog's SQLite file, in $ICELOG_HOME
SYSTEM_NAMESPACE = "icelog_system"  # icelog's own tables in any catalog (storage.core.commit)


class CatalogNotConfigured(InvalidInput):
    catalog: str
    reason = "catalog not configured"
    message = "catalog {catalog!r} is not configured: set {variable} (and __WAREHOUSE) or add it to .pyiceberg.yaml"

    @property
    def variable(self) -> str:
        return f"PYICEBERG_CATALOG__{self.catalog.upper()}__URI"


class CatalogNotFound(TerminalError):
    """A read found no embedded catalog under the home: nothing was created."""

    catalog: str
    home: str
    uri: str
    message = (
        "no catalog {catalog!r} in ICELOG_HOME={home} (no catalog.db there; reads create nothing): set "
        "ICELOG_HOME to your project's home, or --catalog / ICELOG_CATALOG to a catalog configured by "
        "PYICEBERG_CATALOG__<NAME>__URI or .pyiceberg.yaml; a write (icelog topics create) creates this one"
    )


def icelog_home() -> Path:
    """``$ICELOG_HOME`` (default ``./.icelog``), for a caller that was given no settings."""
    return Settings.load().home


def embedded_layout(home: Path | None = None) -> dict[str, str]:
    """The embedded catalog's properties under ``home`` (default ``$ICELOG_HOME``); creates nothing."""
    home = home or icelog_home()
    return {
        "uri": f"sqlite:///{home / EMBEDDED_DATABASE}",
        "warehouse": f"file://{home / 'warehouse'}",
    }


@dataclass(frozen=True)
class CatalogChoice:
    """A catalog chosen by name: the embedded default (``properties`` its layout) or one
    configured for pyiceberg (``properties`` as configured, values as the configuration has them)."""

    name: str
    properties: dict[str, Any]
    embedded: bool
    home: Path


def choose_catalog(name: str | None, settings: Settings, *, must_exist: bool = False, configured: bool = False) -> CatalogChoice:
    """The catalog ``name`` means (None: the settings' catalog, else the embedded default).

    Args:
        must_exist: A read: the embedded catalog must exist already (SQLite would create it).
        configured: The caller brings properties of its own: an unconfigured name is not an error.

    Raises:
        CatalogNotConfigured: ``name`` has no configuration (and ``configured`` is False).
        CatalogNotFound: ``must_exist`` and the embedded catalog does not exist.
    """
    name = name or settings.catalog or None
    conf = Config().get_catalog_config(name) if name else None
    if name is None or (name == EMBEDDED_NAME and not conf):
        layout = embedded_layout(settings.home)
        if must_exist and not (settings.home / EMBEDDED_DATABASE).is_file():
            raise CatalogNotFound(catalog=EMBEDDED_NAME, home=str(settings.home), uri=layout["uri"])
        return CatalogChoice(EMBEDDED_NAME, layout, True, settings.home)
    if not conf and not configured:
        raise CatalogNotConfigured(catalog=name)
    return CatalogChoice(name, dict(conf or {}), False, settings.home)

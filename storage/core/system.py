"""System tables (``icelog_system.*``): property-only tables in the same catalog as the data.

They hold catalog-wide state (producer ids, group offsets, the transaction coordinator's
state) that must change atomically with the data it describes: each is committed through
the same commit core, alone or inside a multi-table commit.
"""

from __future__ import annotations

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, NestedField

from icelog.storage.core.catalog import ensure_namespace
from icelog.storage.properties import HEAD, VERSION

NAMESPACE = "icelog_system"
PROPERTIES = {
    VERSION: "0",
    HEAD: "",
    "commit.retry.num-retries": "0",
    "write.metadata.delete-after-commit.enabled": "false",
}


def ensure_system_table(catalog: Catalog, identifier: str, properties: dict[str, str] | None = None) -> None:
    """Create a property-only system table unless it exists; safe when processes race."""
    try:
        catalog.load_table(identifier)
        return
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, identifier.split(".")[0])
    try:
        catalog.create_table(
            identifier,
            schema=Schema(NestedField(1, "unused", IntegerType(), required=False)),
            properties={**PROPERTIES, **(properties or {})},
        )
    except TableAlreadyExistsError:
        pass

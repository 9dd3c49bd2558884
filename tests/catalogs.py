"""Catalog descriptions that cross process boundaries (for worker processes and the CLI)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogSpec:
    kind: str  # "sqlite" | "postgres"
    name: str
    uri: str
    warehouse: str

    def open(self):
        from storage.catalog import LogSqlCatalog

        return LogSqlCatalog(self.name, uri=self.uri, warehouse=self.warehouse)

    def env(self) -> dict[str, str]:
        """Environment that makes ``icelog --catalog NAME`` (or ICELOG_CATALOG) reach this catalog."""
        key = self.name.upper()
        return {
            **os.environ,
            "ICELOG_CATALOG": self.name,
            f"PYICEBERG_CATALOG__{key}__URI": self.uri,
            f"PYICEBERG_CATALOG__{key}__WAREHOUSE": self.warehouse,
        }

"""Catalog descriptions that cross process boundaries (for worker processes and the CLI)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogSpec:
    kind: str  # "sqlite" | "postgres" | "rest"
    name: str
    uri: str
    warehouse: str
    rest: tuple[tuple[str, str], ...] = ()  # a REST catalog's further pyiceberg properties

    def open(self):
        if self.kind == "rest":
            from icelog.storage.core.catalog import open_catalog

            return open_catalog(self.name, **self.properties())
        from icelog.storage.core.catalog import LogSqlCatalog

        return LogSqlCatalog(self.name, uri=self.uri, warehouse=self.warehouse)

    def properties(self) -> dict[str, str]:
        return {"uri": self.uri, "warehouse": self.warehouse, **dict(self.rest)}

    def env(self) -> dict[str, str]:
        """Environment that makes ``icelog --catalog NAME`` (or ICELOG_CATALOG) reach this catalog:
        pyiceberg reads ``PYICEBERG_CATALOG__NAME__KEY``, ``__`` for a dot and ``_`` for a dash."""
        key = self.name.upper()
        return {
            **os.environ,
            "ICELOG_CATALOG": self.name,
            **{
                f"PYICEBERG_CATALOG__{key}__{k.replace('.', '__').replace('-', '_').upper()}": v
                for k, v in self.properties().items()
            },
        }


def forwarding_catalog(inner):
    """A catalog that creates, loads and commits one table at a time (through a SQL catalog)
    but has no atomic multi-table swap: what a REST or Glue catalog is to icelog."""
    from pyiceberg.catalog.noop import NoopCatalog

    class ForwardingCatalog(NoopCatalog):
        def load_table(self, identifier):
            return inner.load_table(identifier)

        def commit_table(self, table, requirements, updates):
            return inner.commit_table(table, requirements, updates)

        def create_namespace(self, namespace, properties=None):
            return inner.create_namespace(namespace, properties or {})

        def namespace_exists(self, namespace):
            return inner.namespace_exists(namespace)

        def create_table(self, *args, **kwargs):
            return inner.create_table(*args, **kwargs)

        def table_exists(self, identifier):
            return inner.table_exists(identifier)

        def drop_table(self, identifier):
            return inner.drop_table(identifier)

        def list_tables(self, namespace):
            return inner.list_tables(namespace)

        def list_namespaces(self, namespace=()):
            return inner.list_namespaces(namespace)

    return ForwardingCatalog("proxy")

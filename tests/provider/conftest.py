"""Catalogs for the provider's tests: SQLite catalogs reached through Airflow connections."""

from __future__ import annotations

import pytest


@pytest.fixture
def lake(tmp_path):
    """A SQLite catalog named ``lake``, its spec (for processes) and its connection's JSON."""
    from icelog.storage.core.catalog import LogSqlCatalog

    spec = {
        "name": "lake",
        "uri": f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}",
        "warehouse": f"file://{tmp_path / 'lake' / 'wh'}",
    }
    (tmp_path / "lake").mkdir()
    catalog = LogSqlCatalog("lake", uri=spec["uri"], warehouse=spec["warehouse"])
    return catalog, spec

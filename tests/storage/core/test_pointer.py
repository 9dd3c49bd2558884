"""The light read of a table's current metadata on a SQLite catalog (storage.core.pointer), and
``icelog offsets`` on it: the same answer as through pyiceberg, without importing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from icelog.storage.core.catalog import open_catalog
from icelog.storage.core.pointer import current_metadata
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.storage.settings import Settings


def embedded(tmp_path):
    settings = Settings.load({"ICELOG_HOME": str(tmp_path / "home")})
    return open_catalog(None, settings=settings), settings


def test_the_light_read_is_the_metadata_pyiceberg_loads(tmp_path):
    catalog, _ = embedded(tmp_path)
    t = LogTable.create(catalog, "db.events", 3)
    t.append({0: [{"key": "a", "value": "1"}], 2: [{"key": "b", "value": "2"}, {"key": "c", "value": "3"}]})
    loaded = t.table().metadata
    light = current_metadata(catalog.name, catalog.properties, "db", "events")
    assert light["properties"] == loaded.properties and light["current-snapshot-id"] == loaded.current_snapshot_id
    assert LogState.from_properties(light["properties"], light["location"], None).watermarks == t.state().watermarks


def test_the_light_read_answers_none_where_it_does_not_apply(tmp_path):
    catalog, _ = embedded(tmp_path)
    LogTable.create(catalog, "db.events", 1)
    assert current_metadata(catalog.name, catalog.properties, "db", "missing") is None
    assert current_metadata("another", catalog.properties, "db", "events") is None  # rows are per catalog name
    rest = {"type": "rest", "uri": "http://127.0.0.1:1"}
    assert current_metadata(catalog.name, rest, "db", "events") is None
    gone = {"uri": f"sqlite:///{tmp_path / 'nowhere.db'}"}
    assert current_metadata(catalog.name, gone, "db", "events") is None and not (tmp_path / "nowhere.db").exists()


CHECK_IMPORTS = """
import sys
from icelog.pipelines.cli import main
sys.argv = ["icelog", "--output", "json"] + sys.argv[1:]
try:
    main()
except SystemExit:
    pass
heavy = [m for m in ("pyarrow", "pandas", "sqlalchemy", "pyiceberg.catalog.sql", "pyiceberg.table") if m in sys.modules]
print(json.dumps(heavy), file=sys.stderr)
"""


def test_icelog_offsets_on_sqlite_answers_without_pyiceberg_tables_sqlalchemy_or_pyarrow(tmp_path):
    catalog, _ = embedded(tmp_path)
    t = LogTable.create(catalog, "db.events", 2)
    t.append({1: [{"key": "a", "value": "1"}]})
    env = {**os.environ, "ICELOG_HOME": str(tmp_path / "home")}
    env.pop("ICELOG_CATALOG", None)

    def run(*args):
        out = subprocess.run(
            [sys.executable, "-c", "import json\n" + CHECK_IMPORTS, *args], env=env, capture_output=True, text=True, timeout=120
        )
        return out.stdout, json.loads(out.stderr.strip().splitlines()[-1])

    doc, heavy = run("offsets", "db.events")
    assert json.loads(doc) == {"table": "db.events", "partitions": {"0": {"start": 0, "end": 0}, "1": {"start": 0, "end": 1}}}
    assert heavy == []
    # Not a log table, or not there: the full read decides and names it, as before.
    catalog.create_table("db.plain", schema=t.table().schema())
    doc, heavy = run("offsets", "db.plain")
    assert json.loads(doc)["error"] == "NotALogTable" and "pyiceberg.catalog.sql" in heavy
    doc, _ = run("offsets", "db.missing")
    assert json.loads(doc)["error"] == "UnknownTable"

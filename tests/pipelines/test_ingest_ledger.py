"""The ingest ledger: each source file exactly once per table, at any age (COPY INTO semantics)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from icelog.pipelines import tasks
from icelog.pipelines.cli import cli
from icelog.pipelines.ingest import ingest
from icelog.storage.errors import SourceFileChanged
from icelog.storage.ingest.ledger import LEDGER_TABLE, entries
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.ingest import table_rows, write_landing


def landing_day(root, table: str, day: str, files: int, rows: int = 50, tag: str = "") -> None:
    folder = root / table / f"date={day}"
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        data = [{"key": f"k{i % 11}", "value": f"{day}{tag}-{f}-{i}"} for i in range(rows)]
        pq.write_table(pa.Table.from_pylist(data), folder / f"part{tag}-{f}.parquet")


def ledger_of(catalog, table: str) -> list:
    return [e for es in entries(catalog.load_table(LEDGER_TABLE), table).values() for e in es]


def test_i4_reruns_write_nothing_after_every_producer_expired(spark, env_catalog, tmp_path):
    cat = env_catalog.open()
    t = LogTable.create(cat, "db.events", partitions=3)
    landing = tmp_path / "landing"
    landing_day(landing, "db.events", "2024-01-01", files=2)
    landing_day(landing, "db.events", "2024-01-02", files=1)
    first = tasks.ingest_day("db.events", "2024-01-01", landing=str(landing), catalog=env_catalog.name)
    assert first["rows"] == 100 and len(first["loaded"]) == 2
    # Every producer expires at once: dedupe must not depend on producer state.
    with t.table().transaction() as txn:
        txn.set_properties({"icelog.producer.expiry-ms": "1"})
    again = tasks.ingest_day("db.events", "2024-01-01", landing=str(landing), catalog=env_catalog.name)
    assert again["rows"] == 0 and again["duplicate"] and len(again["skipped"]) == 2
    filled = tasks.backfill("db.events", "2024-01-01", "2024-01-02", landing=str(landing), catalog=env_catalog.name)
    assert (filled["rows_written"], filled["files_loaded"], filled["files_skipped"]) == (50, 1, 2)
    before = (t.table().metadata.current_snapshot_id, table_rows(t))
    assert (
        tasks.backfill("db.events", "2024-01-01", "2024-01-02", landing=str(landing), catalog=env_catalog.name)["rows_written"]
        == 0
    )
    assert (t.table().metadata.current_snapshot_id, table_rows(t)) == before
    assert sum(len(v) for v in before[1].values()) == 150
    assert check_contiguity(t.table(), deep=True).ok


def test_i4_late_file_loads_once_changed_file_is_refused_and_the_ledger_tiles_the_log(spark, env_catalog, tmp_path, unchanged):
    cat = env_catalog.open()
    t = LogTable.create(cat, "db.events", partitions=3)
    folder = tmp_path / "landing"
    write_landing(folder, files=2, rows=40)
    ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name)
    # A late file lands in the folder that was already ingested: the re-run loads just it.
    pq.write_table(pa.Table.from_pylist([{"key": f"late{i}", "value": f"late-{i}"} for i in range(7)]), folder / "late.parquet")
    late = ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name)
    assert [os.path.basename(f["path"]) for f in late.loaded] == ["late.parquet"] and late.rows == 7
    assert sorted(os.path.basename(s["path"]) for s in late.skipped) == ["part-0.parquet", "part-1.parquet"]
    assert ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name).duplicate
    # Touched, same content: skipped, and the reason says so.
    os.utime(folder / "part-0.parquet", ns=(1, 1))
    touched = ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name)
    assert touched.rows == 0 and "touched" in next(s["reason"] for s in touched.skipped if s["path"].endswith("part-0.parquet"))
    # Changed content after loading: refused with a typed error naming the file; nothing changes.
    pq.write_table(pa.Table.from_pylist([{"key": "x", "value": "changed"}]), folder / "part-1.parquet")
    with unchanged(t):
        with pytest.raises(SourceFileChanged) as refused:
            ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name)
    assert refused.value.path.endswith("part-1.parquet")
    reloaded = ingest(spark, "db.events", str(folder), "day", catalog_name=env_catalog.name, reload_changed=True)
    assert reloaded.rows == 1 and [os.path.basename(f["path"]) for f in reloaded.loaded] == ["part-1.parquet"]
    # Every ledger entry's offsets hold exactly that file's rows, and together they tile the log.
    book = ledger_of(cat, "db.events")
    assert len(book) == 4
    seen: dict[int, list[tuple[int, int]]] = {}
    for e in book:
        for p, spans in e.ranges.items():
            seen.setdefault(int(p), []).extend((a, b) for a, b in spans)
        assert e.rows == sum(b - a for spans in e.ranges.values() for a, b in spans)
    for p, w in t.watermarks().items():
        spans = sorted(seen.get(p, []))
        assert [s for pair in spans for s in pair][1:-1:2] == [s for pair in spans for s in pair][2::2]  # adjacent
        assert (spans[0][0] if spans else 0, spans[-1][1] if spans else 0) == (w.start, w.end)
    late_entry = next(e for e in book if e.path.endswith("late.parquet"))
    values = {
        r["log_offset"]: r["value"]
        for p, spans in late_entry.ranges.items()
        for a, b in spans
        for r in t.read(int(p), a, b).to_pylist()
    }
    assert sorted(values.values()) == sorted(f"late-{i}" for i in range(7))
    assert check_contiguity(t.table(), deep=True).ok


def test_cli_ingest_reports_loaded_and_skipped_files_as_json(spark, env_catalog, tmp_path):
    LogTable.create(env_catalog.open(), "db.events", partitions=2)
    write_landing(tmp_path / "landing", files=2, rows=10)
    runner = CliRunner()
    args = ["--output", "json", "ingest", "db.events", str(tmp_path / "landing")]
    first = runner.invoke(cli, args, env=env_catalog.env(), catch_exceptions=False)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout.strip().splitlines()[-1])
    assert doc["rows"] == 20 and len(doc["loaded"]) == 2 and doc["skipped"] == []
    again = json.loads(runner.invoke(cli, args, env=env_catalog.env()).stdout.strip().splitlines()[-1])
    assert again["rows"] == 0 and [s["reason"] for s in again["skipped"]] == ["already loaded"] * 2
    ledger_rows = runner.invoke(
        cli,
        ["--output", "json", "sql", "select count(*) as n, sum(rows) as r from icelog_system.ingest_ledger"],
        env=env_catalog.env(),
    )
    assert json.loads(ledger_rows.stdout.strip().splitlines()[-1])["rows"] == [[2, 20]]
    bad = runner.invoke(cli, [*args, "--partitions", "x"], env=env_catalog.env())
    assert bad.exit_code == 2 and json.loads(bad.stdout.strip().splitlines()[-1])["error"] == "InvalidInput"

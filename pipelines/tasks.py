"""What the Airflow DAGs run: plain functions with typed parameters (testable without Airflow).

Each function logs what it did at INFO on the ``icelog.tasks`` logger (key=value context:
table, day, partition): the files it loaded and the offsets their rows got, the checks it ran
and their outcome, "nothing to do" when a re-run writes nothing. Airflow's task log shows
these lines; the return value (XCom) holds the same facts for downstream tasks.

Landing layout: ``<landing>/<table>/date=YYYY-MM-DD/*.parquet`` (or csv / jsonl), the landing
root a local folder or an object store's URI (``s3://bucket/prefix``, read with the table's
FileIO settings: the lakehouse profile keeps landing files in its bucket). Each source
file is loaded once, whatever run loads it (the ingest ledger, ``storage.ingest.ledger``): scheduled
ingests, backfills and Airflow's own backfills of days already ingested write nothing twice,
however long ago the day was loaded, and load a late file that landed since.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyiceberg.catalog import Catalog

from icelog.pipelines.fanout import fanout as run_fanout
from icelog.pipelines.ingest import IngestResult, ingest, source_files
from icelog.pipelines.spark import is_local, spark_session
from icelog.storage.admin.maintenance import maintain as run_maintenance
from icelog.storage.core.catalog import CatalogNotFound, open_catalog
from icelog.storage.errors import IcelogError, InvalidInput, UnknownTable, span
from icelog.storage.log.table import LogTable
from icelog.storage.settings import Settings
from icelog.storage.telemetry import get_logger, quiet_libraries
from icelog.validations.checks import run_checks
from icelog.validations.report import build_report
from icelog.validations.verdict import OK, WARNINGS, Verdict, severity_of

log = get_logger("tasks")
quiet_libraries()  # Airflow shows INFO in task logs: pyiceberg's and GX's would bury icelog's lines


class ValidationFailed(IcelogError):
    """A validation failed its gate: check violations or failed expectations of severity error
    (the Airflow task fails; the report names them; ``validations.verdict``)."""

    table: str
    findings: str
    first: str
    message = "{table}: {findings}, first: {first}"


def landing_root(landing: str | None = None, settings: Settings | None = None) -> Path | str:
    """The landing root: ``landing``, else the settings' (``$ICELOG_LANDING``), else
    ``$ICELOG_HOME/landing`` (``settings``: default loaded now).

    A local folder is a :class:`~pathlib.Path` (``file:`` URIs too); an object store's URI
    (``s3://bucket/prefix``) stays a string, listed and read through the table's FileIO.
    """
    settings = settings or Settings.load()
    root = str(landing or settings.landing or settings.home / "landing")
    if not is_local(root):
        return root.rstrip("/")
    return Path(unquote(urlparse(root).path) if root.startswith("file:") else root)


def day_folder(landing: str | None, table: str, day: str, settings: Settings | None = None) -> Path | str:
    root = landing_root(landing, settings)
    return root / table / f"date={day}" if isinstance(root, Path) else f"{root}/{table}/date={day}"


def run_key(table: str, day: str) -> str:
    return f"{table}:{day}"


def ingest_day(
    table: str,
    day: str,
    *,
    landing: str | None = None,
    fmt: str = "parquet",
    key_column: str | None = None,
    catalog: str | Catalog | None = None,
    partitions: list[int] | None = None,
    reload_changed: bool = False,
) -> dict[str, Any]:
    """Ingest one day's landing folder: the files not loaded yet (each file exactly once)."""
    dt.date.fromisoformat(day)
    settings = Settings.load()  # this task's one read of the environment
    folder = day_folder(landing, table, day, settings)
    if isinstance(folder, Path) and not source_files(str(folder)):
        # Nothing landed that day: no Spark, and the catalog only read (make airflow on a fresh
        # home runs today's ingest at once, before make demo created the table).
        empty = IngestResult(table, run_key(table, day), 0).to_dict()
        log_ingest(empty, day)
        try:
            LogTable.open(open_catalog(catalog, create=False, settings=settings), table)
        except (CatalogNotFound, UnknownTable) as e:
            log.warning("no such log table yet", table=table, day=day, reason=str(e))
        return empty
    result = ingest(
        spark_session(app_name=f"icelog-ingest-{table}", settings=settings),
        table,
        str(folder),
        run_key(table, day),
        fmt=fmt,
        key_column=key_column,
        catalog_name=catalog,
        only_partitions=partitions,
        reload_changed=reload_changed,
    )
    log_ingest(result.to_dict(), day)
    return result.to_dict()


def log_ingest(result: dict[str, Any], day: str) -> None:
    """One line per file loaded, per log partition written, and the outcome of one day."""
    context = {"table": result["table"], "day": day}
    for f in result["loaded"]:
        spans = {p: " ".join(span(a, b) for a, b in s) for p, s in f["ranges"].items()}
        log.info("loaded file", **context, file=f["path"], rows=f["rows"], offsets=spans)
    for p, (first, end) in sorted(result["ranges"].items()):
        log.info("committed offsets", **context, partition=p, first=first, end=end, rows=end - first)
    if result["loaded"]:
        log.info(
            "day loaded",
            **context,
            files=len(result["loaded"]),
            rows=result["rows"],
            skipped=len(result["skipped"]),
            snapshot_id=result["snapshot_id"],
        )
    elif result["skipped"]:
        log.info("nothing to do: every landing file was loaded before", **context, skipped=len(result["skipped"]))
    else:
        log.info("nothing to do: no landing files", **context)


def backfill(
    table: str,
    start: str,
    end: str,
    *,
    landing: str | None = None,
    fmt: str = "parquet",
    key_column: str | None = None,
    catalog: str | Catalog | None = None,
    partitions: list[int] | None = None,
    reload_changed: bool = False,
) -> dict[str, Any]:
    """Ingest every day in ``[start, end]`` (inclusive), in order; each file exactly once."""
    first, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    if last < first:
        raise InvalidInput(reason=f"backfill end {end} is before start {start}")
    LogTable.open(open_catalog(catalog), table)  # UnknownTable now, even if no day has landing files
    days, rows, loaded, skipped = [], 0, 0, 0
    day = first
    while day <= last:
        outcome = ingest_day(
            table,
            day.isoformat(),
            landing=landing,
            fmt=fmt,
            key_column=key_column,
            catalog=catalog,
            partitions=partitions,
            reload_changed=reload_changed,
        )
        days.append(
            {
                "day": day.isoformat(),
                "rows": outcome["rows"],
                "files_loaded": len(outcome["loaded"]),
                "files_skipped": len(outcome["skipped"]),
            }
        )
        rows += outcome["rows"]
        loaded += len(outcome["loaded"])
        skipped += len(outcome["skipped"])
        day += dt.timedelta(days=1)
    log.info("backfill done", table=table, start=start, end=end, days=len(days), rows=rows, files=loaded, skipped=skipped)
    return {"table": table, "days": days, "rows_written": rows, "files_loaded": loaded, "files_skipped": skipped}


def validate(
    table: str, *, deep: bool = True, catalog: str | Catalog | None = None, report: bool = True, full: bool = False
) -> dict[str, Any]:
    """Run every registered check on ``table`` and publish its report (HTML, GX Data Docs)
    under ``$ICELOG_HOME/reports/<table>``; raise :class:`ValidationFailed` when the gate fails
    (check violations, failed expectations of severity error); warnings are logged at WARNING.

    Great Expectations validates only the rows committed since its last pass (``full``: all),
    on Spark when the scope is large (``$ICELOG_GX_SPARK_ROWS``)."""
    settings = Settings.load()  # this task's one read of the environment
    log_table = LogTable.open(open_catalog(catalog, settings=settings), table)
    iceberg = log_table.table()
    checks = run_checks(iceberg, ("contiguity-deep" if deep else "contiguity", "producers", "transactions"))
    summary = checks.to_dict()
    log.info(
        "checks passed" if checks.ok else "checks failed",
        table=table,
        checks=",".join(checks.checks),
        snapshot_id=checks.snapshot_id,
        rows=checks.rows,
        violations=len(checks.violations),
    )
    for v in checks.violations[:20]:  # the rest are in the report
        log.warning("violation", table=table, check=v.check, kind=v.kind, partition=v.partition, detail=v.detail)
    quality = None
    if report:
        page = build_report(
            iceberg,
            settings.home / "reports" / log_table.identifier,
            full=full,
            spark=lambda: spark_session(app_name=f"icelog-validate-{table}", settings=settings),
        )
        summary["report"] = str(page)
        quality = json.loads((page.parent / "report.json").read_text())["quality"]
        summary["quality_ok"] = quality["success"] if quality else None
        summary["quality_scope"] = quality["scope"] if quality else None
        log.info(
            "report published",
            table=table,
            report=str(page),
            quality_ok=summary["quality_ok"],
            quality_scope=summary["quality_scope"],
        )
    for f in (quality or {}).get("failed", []):
        word = "expectation warning" if severity_of(f) == "warn" else "expectation failed"
        log.warning(word, table=table, expectation=f["expectation"], kwargs=f["kwargs"], unexpected=f["unexpected_count"])
    verdict = Verdict.of(summary, quality)
    summary["status"] = verdict.status
    # One verdict on every surface: the task fails when the gate fails and warns on findings.
    level = {OK: logging.INFO, WARNINGS: logging.WARNING}.get(verdict.status, logging.ERROR)
    log.log(level, "validation " + verdict.describe(), table=table, snapshot_id=checks.snapshot_id)
    if not verdict.ok:
        first = checks.violations[0].detail if checks.violations else _first_failure(quality)
        raise ValidationFailed(table=table, findings=verdict.findings(), first=first)
    return summary


def _first_failure(quality: dict[str, Any]) -> str:
    f = next(f for f in quality["failed"] if severity_of(f) == "error")
    return f"{f['expectation']} {json.dumps(f['kwargs'])}: {f['unexpected_count']} unexpected"


def maintain(table: str, *, catalog: str | Catalog | None = None) -> dict[str, Any]:
    cat = open_catalog(catalog)
    report = run_maintenance(cat, LogTable.open(cat, table).identifier)
    log.info("maintained", **{"table": table, **{k: v for k, v in report.items() if k not in ("table", "started")}})
    return report


def fanout(
    source: str,
    group: str,
    routes: dict[str, str],
    *,
    route_column: str = "key",
    key_column: str = "key",
    catalog: str | Catalog | None = None,
) -> dict[str, Any]:
    """Copy a log table's new records to the routed tables in one transaction (exactly once)."""
    if (
        not isinstance(routes, dict)
        or not routes
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in routes.items())
    ):
        raise InvalidInput(reason=f"routes must be a non-empty {{value: table}} mapping, not {routes!r}")
    settings = Settings.load()
    result = run_fanout(
        spark_session(app_name=f"icelog-fanout-{source}", settings=settings),
        source,
        group,
        routes,
        route_column=route_column,
        key_column=key_column,
        catalog_name=catalog,
    )
    for target, spans in sorted(result.written.items()):
        log.info("fanned out", source=source, group=group, target=target, offsets=spans)
    if result.rows:
        log.info("fanout committed", source=source, group=group, rows=result.rows, read=result.read)
    else:
        log.info("nothing to do: no new records", source=source, group=group)
    return result.to_dict()

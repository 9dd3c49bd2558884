"""``icelog validate`` and ``icelog report``: the checks, and the HTML report that shows them."""

from __future__ import annotations

import json
import sys

import click

from icelog.pipelines.cli.app import EXIT_VIOLATIONS, SNAPSHOT_ID, Context, LazyChoice, plural, status_line


def _check_names() -> list[str]:
    """The checks the validator runs, from its registry (``validations.checks.CHECKS``)."""
    from icelog.validations.checks import CHECKS

    return list(CHECKS)


@click.command()
@click.argument("table")
@click.option("--deep", is_flag=True, help="Read every offset with DuckDB (default: manifests only).")
@click.option(
    "--check",
    "check_names",
    multiple=True,
    type=LazyChoice(_check_names),
    help="Run this check (repeatable) instead of the default: contiguity, or contiguity-deep with --deep.",
)
@click.option(
    "--snapshot",
    "snapshot_id",
    type=SNAPSHOT_ID,
    default=None,
    help="Check an older snapshot (watermarks are only kept for the current one).",
)
@click.pass_obj
def validate(ctx: Context, table: str, deep: bool, check_names: tuple[str, ...], snapshot_id: int | None) -> None:
    """Check I1 contiguity and watermarks (and more with --check); exit 1 on any violation."""
    from icelog.storage.log.table import LogTable
    from icelog.validations.checks import run_checks

    names = check_names or (("contiguity-deep",) if deep else ("contiguity",))
    report = run_checks(LogTable.open(ctx.catalog, table).table(), names, snapshot_id)

    def text(d: dict) -> None:
        click.echo(
            f"{d['table']}: {'OK' if d['ok'] else 'VIOLATIONS'} ({plural(d['rows'], 'row')}, {', '.join(d['checks'])}, {d['seconds']} s)"
        )
        for v in d["violations"]:
            click.echo(f"  [{v['kind']}] partition {v.get('partition')}: {v['detail']}")

    ctx.emit(report.to_dict(), text)
    if not report.ok:
        sys.exit(EXIT_VIOLATIONS)


@click.command()
@click.argument("table", required=False)
@click.option("--all", "all_tables", is_flag=True, help="Report every log table, plus an index page with each table's status.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for index.html (default: $ICELOG_HOME/reports/TABLE, or $ICELOG_HOME/reports with --all).",
)
@click.option("--no-gx", is_flag=True, help="Skip the Great Expectations suite.")
@click.option(
    "--full", is_flag=True, help="Re-validate every row (default: only rows committed since the last validation that passed)."
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "pandas", "spark"]),
    default="auto",
    show_default=True,
    help="GX engine; auto picks Spark above $ICELOG_GX_SPARK_ROWS rows in scope.",
)
@click.option(
    "--expectations",
    type=click.Path(dir_okay=False),
    default=None,
    help="Payload expectations file (default: expectations/TABLE.json).",
)
@click.pass_obj
def report(
    ctx: Context,
    table: str | None,
    all_tables: bool,
    out: str | None,
    no_gx: bool,
    full: bool,
    engine: str,
    expectations: str | None,
) -> None:
    """Write an HTML report: partitions, files, freshness, history charts, validation, GX Data Docs.

    Prints the verdict (OK, WARNINGS: findings only, VIOLATIONS: the gate failed) and exits 1
    when the gate failed: a check violation or a failed expectation of severity error. With
    --all: ATTENTION (exit 1) when a table failed the gate or its report, else WARNINGS or OK."""
    from icelog.pipelines.spark import spark_session
    from icelog.storage.log.table import LogTable
    from icelog.validations.report import build_index, build_report

    if bool(table) == all_tables:
        raise click.UsageError("name one TABLE, or --all")
    options = {
        "gx": not no_gx,
        "full": full,
        "engine": engine,
        "spark": lambda: spark_session(app_name="icelog-report", settings=ctx.settings),
    }
    if all_tables:
        with status_line(ctx, "building the report of every log table"):
            index = build_index(ctx.catalog, out or str(ctx.settings.home / "reports"), **options)
        tables = json.loads((index.parent / "index.json").read_text())
        doc = {"ok": all(t.get("ok") for t in tables), "report": str(index), "tables": tables}
        # The index page's badge in one word: a table with warnings only is not "OK".
        word = "ATTENTION" if not doc["ok"] else "WARNINGS" if any(t.get("status") == "WARNINGS" for t in tables) else "OK"
        ctx.emit(doc, lambda d: click.echo(f"{word}: {plural(len(d['tables']), 'table')}, file://{d['report']}"))
        if not doc["ok"]:  # a table failed the gate or its report: as for one table, exit 1
            sys.exit(EXIT_VIOLATIONS)
        return
    log_table = LogTable.open(ctx.catalog, table)
    target = out or str(ctx.settings.home / "reports" / log_table.identifier)
    with status_line(ctx, f"building the report of {log_table.identifier}"):
        page = build_report(log_table.table(), target, expectations_file=expectations, **options)
    doc = json.loads((page.parent / "report.json").read_text())
    ctx.emit(
        {"table": log_table.identifier, "ok": doc["ok"], "report": str(page), "quality_scope": doc["quality_scope"]},
        lambda d: click.echo(f"{doc['verdict']}: file://{d['report']}"),
    )
    if not doc["ok"]:  # the gate failed: the same verdict as the report's badge and the Airflow task
        sys.exit(EXIT_VIOLATIONS)

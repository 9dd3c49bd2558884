"""``icelog ingest``: load source files into a log table with Spark, each file once."""

from __future__ import annotations

import click

from icelog.pipelines.cli.app import Context, plural, status_line, text_value
from icelog.storage.errors import InvalidInput


@click.command()
@click.argument("table")
@click.argument("source")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv", "jsonl"]),
    default="parquet",
    show_default=True,
    help="Format of the source files.",
)
@click.option(
    "--key-column", default=None, help="Route rows by the hash of this column (default: the table's icelog.key-column, else key)."
)
@click.option("--partitions", default=None, help="Only these log partitions, e.g. 0,3,5 (default: all).")
@click.option("--run-key", default=None, help="A label for this run, kept in the ingest ledger.")
@click.option(
    "--reload-changed",
    is_flag=True,
    help="Load files whose content changed since they were loaded again, as new rows (default: refuse them).",
)
@click.option("--verify", is_flag=True, help="Fingerprint every listed file, not only new or changed-looking ones.")
@click.pass_obj
def ingest(
    ctx: Context,
    table: str,
    source: str,
    fmt: str,
    key_column: str | None,
    partitions: str | None,
    run_key: str | None,
    reload_changed: bool,
    verify: bool,
) -> None:
    """Load the files under SOURCE (a file, folder or glob) into TABLE with Spark, each file once.

    The same job the ingest DAGs run, without Airflow. Files already loaded, however long
    ago, are skipped and listed with the reason; a file whose content changed since it was
    loaded is refused (SourceFileChanged, exit 2) unless --reload-changed.
    """
    from icelog.pipelines.ingest import ingest as run
    from icelog.pipelines.ingest import require_source
    from icelog.pipelines.spark import spark_session

    require_source(source)
    only = None
    if partitions is not None:
        try:
            only = sorted({int(p) for p in partitions.split(",") if p.strip()})
        except ValueError as e:
            raise InvalidInput(reason=f"--partitions takes comma-separated integers, not {partitions!r}") from e
    with status_line(ctx, f"ingest {source} -> {table}") as progress:
        progress("starting Spark")
        result = run(
            spark_session(app_name=f"icelog-ingest-{table}"),
            table,
            source,
            run_key,
            fmt=fmt,
            key_column=key_column,
            catalog_name=ctx.catalog_name,
            only_partitions=only,
            reload_changed=reload_changed,
            verify=verify,
            progress=progress,
        )

    def text(d: dict) -> None:
        loaded, rows, skipped = plural(len(d["loaded"]), "file"), plural(d["rows"], "row"), plural(len(d["skipped"]), "file")
        click.echo(f"{d['table']}: loaded {loaded}, {rows}; skipped {skipped}")
        for f in d["loaded"]:
            click.echo(f"  loaded  {f['path']} ({plural(f['rows'], 'row')})")
        for f in d["skipped"]:
            click.echo(f"  skipped {f['path']}: {f['reason']} at {text_value(f['loaded_at'])}")

    ctx.emit(result.to_dict(), text)

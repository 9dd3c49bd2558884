"""``icelog maintain`` and ``icelog repair``: a log table's upkeep, and its repair after a foreign commit."""

from __future__ import annotations

import json

import click

from icelog.pipelines.cli.app import INT32_MAX, POSITIVE_INT64, Context, FiniteFloatRange, jsonable, plural, status_line


@click.command()
@click.argument("table")
@click.option(
    "--retention-ms",
    type=POSITIVE_INT64,
    default=None,
    help="Drop files whose newest row is older (default: table property icelog.retention.ms).",
)
@click.option("--retention-bytes", type=POSITIVE_INT64, default=None, help="Keep at most this many bytes per partition.")
@click.option(
    "--keep-snapshots",
    type=click.IntRange(1, INT32_MAX),
    default=5,
    show_default=True,
    help="Expire all but this many snapshots.",
)
@click.option(
    "--orphan-age-s",
    type=FiniteFloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Only delete unreferenced files older than this.",
)
@click.pass_obj
def maintain(
    ctx: Context, table: str, retention_ms: int | None, retention_bytes: int | None, keep_snapshots: int, orphan_age_s: float
) -> None:
    """Retention, compaction, snapshot expiry and orphan cleanup for TABLE."""
    from icelog.storage.admin.maintenance import maintain as run
    from icelog.storage.log.table import LogTable

    name = LogTable.open(ctx.catalog, table).identifier
    with status_line(ctx, f"maintaining {name}: retention, compaction, expiry, orphans"):
        report = run(
            ctx.catalog,
            name,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            keep_snapshots=keep_snapshots,
            orphan_age_s=orphan_age_s,
        )
    ctx.emit(report, lambda d: click.echo(json.dumps(jsonable(d), indent=2)))


@click.command()
@click.argument("table")
@click.option(
    "--mode",
    type=click.Choice(["auto", "adopt", "rollback"]),
    default="auto",
    show_default=True,
    help="auto: adopt foreign rows that extend the log exactly, else roll back.",
)
@click.pass_obj
def repair(ctx: Context, table: str, mode: str) -> None:
    """Repair TABLE after a foreign (non-icelog) commit: adopt it, or roll back to icelog's last snapshot.

    A default partition spec another tool set is put back to identity(log_partition) as well.
    """
    from icelog.storage.log.repair import repair as run

    report = run(ctx.catalog, table, mode)  # type: ignore[arg-type]

    def text(d: dict) -> None:
        if "partition_spec" in d:
            spec = d["partition_spec"]
            click.echo(
                f"{d['table']}: default partition spec set back from {spec['foreign']} (another writer's) "
                f"to {spec['restored']}, identity(log_partition)"
            )
        if d["action"] == "none":
            click.echo(f"{d['table']}: nothing to repair")
        elif d["action"] == "adopted":
            click.echo(
                f"{d['table']}: adopted {plural(len(d['foreign_snapshots']), 'foreign snapshot')}, rows per partition {d['rows']}"
            )
        elif d["action"] == "rolled_back":
            to = f"snapshot {d['icelog_snapshot_id']}" if d["icelog_snapshot_id"] is not None else "the empty table"
            click.echo(
                f"{d['table']}: rolled back to {to}, dropped {plural(d['dropped_rows'], 'row')}, restored {plural(d['restored_rows'], 'row')} ({d['reason']})"
            )

    ctx.emit(report, text)

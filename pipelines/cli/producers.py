"""``icelog producers``: idempotent producers' ids, epochs and sequences."""

from __future__ import annotations

import click

from icelog.pipelines.cli.app import Context, plural, print_table


@click.group()
def producers() -> None:
    """Idempotent producers: ids, epochs (fencing), sequences."""


@producers.command("init")
@click.argument("table")
@click.option("--client-id", default=None, help="Stable identity: re-init bumps the epoch and fences older instances.")
@click.pass_obj
def producers_init(ctx: Context, table: str, client_id: str | None) -> None:
    """Get a producer id and epoch for writing TABLE idempotently (produce --producer-id --epoch --sequence)."""
    from icelog.storage.producers.idempotent import init_producer

    identity = init_producer(ctx.catalog, table, client_id)
    ctx.emit(identity.to_dict(), lambda d: click.echo(f"producer_id={d['producer_id']} epoch={d['epoch']}"))


@producers.command("list")
@click.argument("table")
@click.pass_obj
def producers_list(ctx: Context, table: str) -> None:
    """TABLE's producers: id, client id, epoch, and last sequence per partition."""
    from icelog.storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    doc = {"table": log_table.identifier, "producers": {pid: e.to_dict() for pid, e in log_table.state().producers.items()}}
    ctx.emit(
        doc,
        lambda d: print_table(
            [
                [pid, e["client"], e["epoch"], ", ".join(f"{p}:{s['last_seq']}" for p, s in e["partitions"].items())]
                for pid, e in sorted(d["producers"].items(), key=lambda kv: int(kv[0]))
            ],
            ["producer_id", "client_id", "epoch", "last sequence per partition"],
            d["table"],
            empty="producers",
        ),
    )


@producers.command("rebuild")
@click.argument("table")
@click.pass_obj
def producers_rebuild(ctx: Context, table: str) -> None:
    """Recompute producer state from the rows (they carry producer id, epoch, sequence)."""
    from icelog.storage.log.table import LogTable
    from icelog.storage.producers.idempotent import rebuild

    name = LogTable.open(ctx.catalog, table).identifier
    state = rebuild(ctx.catalog, name)
    ctx.emit(
        {"table": name, "producers": {pid: e.to_dict() for pid, e in state.items()}},
        lambda d: click.echo(f"rebuilt state of {plural(len(d['producers']), 'producer')}"),
    )

"""``icelog transactions``: the transaction coordinator's open transactions, recovery and journal."""

from __future__ import annotations

import json

import click

from icelog.pipelines.cli.app import Context, clip, plural, print_table
from icelog.storage.errors import InvalidInput


@click.group()
def transactions() -> None:
    """The transaction coordinator: open transactions, recovery, the journal."""


@transactions.command("list")
@click.pass_obj
def transactions_list(ctx: Context) -> None:
    """Every transactional id with its producer id, epoch and open transaction."""
    from icelog.storage.producers.journal import transactional_ids

    state = transactional_ids(ctx.catalog)
    rows = [
        {
            "transactional_id": tid,
            "producer_id": e.producer_id,
            "epoch": e.epoch,
            "txn_id": e.txn.id if e.txn else None,
            "state": e.txn.state if e.txn else None,
            # Decided by the journal, its tables rolling forward (a catalog without atomic multi-table commits).
            "decided": bool(e.txn and e.txn.prepared and e.txn.prepared.decided),
        }
        for tid, e in sorted(state.items())
    ]
    ctx.emit(
        {"transactional_ids": rows},
        lambda d: print_table(
            [[*list(r.values())[:4], f"{r['state']} (decided)" if r["decided"] else r["state"]] for r in d["transactional_ids"]],
            ["transactional_id", "producer_id", "epoch", "open txn", "state"],
            empty="transactional ids",
        ),
    )


@transactions.command("describe")
@click.argument("txn_id")
@click.pass_obj
def transactions_describe(ctx: Context, txn_id: str) -> None:
    """The journal records of one transaction (BEGIN ... COMMITTED or ABORTED)."""
    from icelog.validations.sql import connect

    if not txn_id.isalnum() or len(txn_id) > 64:
        raise InvalidInput(reason=f"a transaction id is up to 64 letters and digits, not {clip(txn_id)!r}")
    from icelog.storage.producers.journal_state import JOURNAL

    rows = []
    if ctx.catalog.table_exists(JOURNAL):  # a read creates nothing: without a journal there is no transaction
        con = connect(ctx.catalog, only=JOURNAL)
        rows = con.execute(
            "SELECT log_offset, log_timestamp, transactional_id, txn_producer_id, txn_epoch, txn_state, detail FROM icelog_system.transactions WHERE txn_id = $id ORDER BY log_offset",
            {"id": txn_id},
        ).fetchall()
    if not rows:
        raise InvalidInput(reason=f"no transaction {txn_id} in the journal")
    records = [
        {
            "offset": r[0],
            "time": r[1],
            "transactional_id": r[2],
            "producer_id": r[3],
            "epoch": r[4],
            "state": r[5],
            "detail": json.loads(r[6]),
        }
        for r in rows
    ]
    ctx.emit(
        {"txn_id": txn_id, "records": records},
        lambda d: print_table(
            [[r["offset"], r["time"], r["state"], json.dumps(r["detail"])] for r in d["records"]],
            ["offset", "time", "state", "detail"],
            txn_id,
        ),
    )


@transactions.command("recover")
@click.pass_obj
def transactions_recover(ctx: Context) -> None:
    """Roll forward prepared transactions, abort those idle past their timeout (idempotent).

    A transaction it cannot finish does not stop the others: RecoveryIncomplete (exit 2) names
    each one with its error after the rest are done."""
    from icelog.storage.producers.transactional import recover

    report = recover(ctx.catalog)
    ctx.emit(
        report,
        lambda d: click.echo(
            f"rolled forward {plural(len(d['rolled_forward']), 'transaction')}, aborted {plural(len(d['aborted']), 'transaction')}"
        ),
    )


@transactions.command("abort")
@click.argument("transactional_id")
@click.option(
    "--missing-files",
    is_flag=True,
    help="Also abort a prepared transaction whose staged files are gone (PreparedFilesMissing); refused while they all exist.",
)
@click.pass_obj
def transactions_abort(ctx: Context, transactional_id: str, missing_files: bool) -> None:
    """Abort TRANSACTIONAL_ID's open transaction (a prepared one cannot be aborted: it will commit)."""
    from icelog.storage.producers.transactional import abort

    report = abort(ctx.catalog, transactional_id, missing_files=missing_files)
    ctx.emit(report, lambda d: click.echo(f"aborted {d['aborted']}" if d["aborted"] else "no open transaction"))

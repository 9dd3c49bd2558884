"""``icelog consume`` and ``icelog groups``: consumer groups with range commits.

Offsets on the command line follow two conventions, both shown by ``groups describe``:
the *stable offset* is the last offset done (inclusive, the seed's), the *committed
offset* is the next offset to read (Kafka's).
"""

from __future__ import annotations

import time

import click

from pipelines.cli.app import PARTITION, Context, dumps, print_table
from storage.errors import InvalidInput


def _parse_range(text: str) -> tuple[int, int]:
    try:
        first, last = (int(x) for x in text.split("-"))
    except ValueError:
        raise InvalidInput(reason=f"a range is FIRST-LAST (inclusive offsets), not {text!r}") from None
    return first, last


@click.command()
@click.argument("table")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--partition", type=PARTITION, default=None, help="One partition (default: all).")
@click.option("--key-range", default=None, metavar="LO:HI", help="Only keys whose hash is in LO..HI (of 0..65535).")
@click.option("--max-records", type=click.IntRange(1, None), default=None, help="Stop after N records.")
@click.option("--follow", is_flag=True, help="Keep polling at the log end.")
@click.option(
    "--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True, help="Records per poll, and per commit."
)
@click.pass_obj
def consume(
    ctx: Context,
    table: str,
    group: str,
    partition: int | None,
    key_range: str | None,
    max_records: int | None,
    follow: bool,
    batch_size: int,
) -> None:
    """Print TABLE's records not yet done by GROUP as JSON Lines (system columns included),
    committing each printed batch as ranges. Stops at the log end unless --follow."""
    from storage.groups.consumer import Consumer, parse_key_range
    from storage.log.table import LogTable

    hashes = parse_key_range(key_range) if key_range is not None else None
    log_table = LogTable.open(ctx.catalog, table)
    partitions = sorted(log_table.watermarks()) if partition is None else [partition]
    consumer = Consumer(ctx.catalog, group)
    consumer.assign(log_table.identifier, partitions, key_range=hashes)
    printed = 0
    while max_records is None or printed < max_records:
        want = batch_size if max_records is None else min(batch_size, max_records - printed)
        batches = consumer.poll(want)
        if not batches:
            if not follow:
                break
            time.sleep(1.0)
            continue
        for batch in batches:
            for row in batch.to_pylist():
                click.echo(dumps(row))
            printed += batch.num_rows
        consumer.commit()


@click.group()
def groups() -> None:
    """Consumer groups: offsets, individually committed ranges, members."""


@groups.command("list")
@click.pass_obj
def groups_list(ctx: Context) -> None:
    """Every consumer group with committed offsets, ranges or members."""
    from storage.groups.offsets import list_groups

    names = list_groups(ctx.catalog)
    ctx.emit({"groups": names}, lambda d: click.echo("\n".join(d["groups"]) or "no consumer groups"))


@groups.command("describe")
@click.option("--group", default=None, help="Consumer group id (required).")
@click.argument("old_group", required=False, metavar="[GROUP]", deprecated="Use --group GROUP.")
@click.pass_obj
def groups_describe(ctx: Context, group: str | None, old_group: str | None) -> None:
    """Per partition: stable offset (last done), committed offset (next to read), IC ranges,
    lag, owners and draining ranges; then members and generation.

    The group is named by --group, as in every groups command (and kafka-consumer-groups);
    the older positional GROUP still works."""
    from storage.groups.offsets import describe_group

    if group is not None and old_group is not None and group != old_group:
        raise click.UsageError(f"two groups named ({group!r}, {old_group!r}): give one, as --group GROUP")
    if group is None and old_group is None:
        raise click.UsageError("Missing option '--group'.")
    doc = describe_group(ctx.catalog, group or old_group)

    def text(d: dict) -> None:
        rows = [
            [
                e["table"],
                e["partition"],
                e["stable_offset"],
                e["committed_offset"],
                " ".join(f"{first}-{last}" for first, last in e["ranges"]) or "-",
                f"{e['log_start']}..{e['log_end']}",
                e["lag"],
                " ".join(f"{m}:{'+'.join(f'{lo}:{hi}' for lo, hi in rs)}" for m, rs in e["owners"].items()) or "-",
                " ".join(f"{x['lo']}:{x['hi']}<-{x['from']}" for x in e["draining"]) or "-",
            ]
            for e in d["partitions"]
        ]
        print_table(
            rows,
            ["table", "partition", "stable (last done)", "committed (next)", "IC ranges", "log", "lag", "owners", "draining"],
            title=f"group {d['group']} generation {d['generation']}",
        )
        for e in d["partitions"]:
            if "note" in e:
                click.echo(f"{e['table']} partition {e['partition']}: {e['note']}")
        if d["members"]:
            print_table(
                [[m["member"], m["generation"], m["live"], m["heartbeat_age_ms"], m["session_ms"]] for m in d["members"]],
                ["member", "generation", "live", "heartbeat age ms", "session ms"],
            )

    ctx.emit(doc, text)


@groups.command("commit")
@click.argument("table")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--partition", type=PARTITION, required=True, help="The partition the ranges are offsets of.")
@click.option("--range", "ranges", required=True, multiple=True, metavar="FIRST-LAST", help="Inclusive offsets; repeatable.")
@click.pass_obj
def groups_commit(ctx: Context, table: str, group: str, partition: int, ranges: tuple[str, ...]) -> None:
    """Commit offset ranges by hand (refused while the group has live members)."""
    from storage.groups.offsets import commit_ranges

    parsed = [_parse_range(r) for r in ranges]
    result = commit_ranges(ctx.catalog, group, {(table, partition): parsed})

    def text(d: dict) -> None:
        for where, p in d["partitions"].items():
            shown = " ".join(f"{first}-{last}" for first, last in p["ranges"]) or "none"
            click.echo(f"{d['group']} {where}: stable offset {p['stable']} (committed {p['committed']}), IC ranges {shown}")

    ctx.emit(result, text)


@groups.command("reset")
@click.argument("table")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--to", "to", required=True, help="earliest, latest, or an offset (the next to read).")
@click.option("--partition", type=PARTITION, default=None, help="One partition (default: all).")
@click.pass_obj
def groups_reset(ctx: Context, table: str, group: str, to: str, partition: int | None) -> None:
    """Move GROUP's position on TABLE and drop its IC ranges (refused while members are live)."""
    from storage.groups.offsets import reset_group

    result = reset_group(ctx.catalog, group, table, to, None if partition is None else [partition])
    ctx.emit(result, lambda d: click.echo(" ".join(f"{k}->{v}" for k, v in d["reset"].items())))

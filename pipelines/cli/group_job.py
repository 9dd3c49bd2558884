"""``icelog consume-produce``: run one member of a group's consume–transform–produce Spark job."""

from __future__ import annotations

import importlib

import click

from icelog.pipelines.cli.app import PARTITION, Context, plural
from icelog.storage.errors import InvalidInput, span


def load_transform(spec: str):
    """``MODULE:FUNCTION`` -> the function (DataFrame -> DataFrame)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise InvalidInput(reason=f"a transform is MODULE:FUNCTION, not {spec!r}")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise InvalidInput(reason=f"cannot load the transform {spec!r}: {e}") from e
    if not callable(function):
        raise InvalidInput(reason=f"the transform {spec!r} is not callable")
    return function


@click.command("consume-produce")
@click.argument("source")
@click.argument("target")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--member", default=None, help="This member's id; keep it stable across runs (default: random).")
@click.option("--partition", type=PARTITION, default=None, help="One source partition (default: all).")
@click.option("--key-range", default=None, metavar="LO:HI", help="Read this hash range without joining the group.")
@click.option(
    "--mode",
    type=click.Choice(["key", "chunks"]),
    default="key",
    show_default=True,
    help="How members share a partition: key-hash ranges (per-key order kept) or offset chunks.",
)
@click.option(
    "--key-column",
    default=None,
    help="The column whose hash places a record, and whose CRC-32 picks the target partition (default: the source's icelog.key-column, else key).",
)
@click.option(
    "--chunk-size", type=click.IntRange(1, None), default=100, show_default=True, help="Offsets per chunk (--mode chunks)."
)
@click.option("--max-records", type=click.IntRange(1, None), default=None, help="Consume at most N records.")
@click.option(
    "--transform", "transform_spec", default=None, metavar="MODULE:FUNCTION", help="DataFrame -> DataFrame (default: copy)."
)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(1, 86_400_000),
    default=60_000,
    show_default=True,
    help="A member not heard from for this long is dropped from the group.",
)
@click.option("--leave", is_flag=True, help="Leave the group when done.")
@click.pass_obj
def consume_produce(
    ctx: Context,
    source: str,
    target: str,
    group: str,
    member: str | None,
    partition: int | None,
    key_range: str | None,
    mode: str,
    key_column: str | None,
    chunk_size: int,
    max_records: int | None,
    transform_spec: str | None,
    session_timeout_ms: int,
    leave: bool,
) -> None:
    """Consume this member's share of SOURCE (its key-hash ranges of GROUP, records not yet
    committed), transform it, and append it to TARGET: the output and the consumed offsets
    (as ranges) land in one atomic commit, exactly once."""
    from icelog.pipelines.group_job import check_catalog, group_job
    from icelog.pipelines.spark import spark_session

    # Refused before Spark starts (tens of seconds) or the group is joined.
    transform = None if transform_spec is None else load_transform(transform_spec)
    check_catalog(ctx.catalog, source, target)
    result = group_job(
        spark_session(app_name=f"icelog-consume-produce-{group}"),
        source,
        target,
        group,
        member_id=member,
        partitions=None if partition is None else [partition],
        key_range=key_range,
        transform=transform,
        mode=mode,
        key_column=key_column,
        chunk_size=chunk_size,
        max_records=max_records,
        session_timeout_ms=session_timeout_ms,
        leave=leave,
        catalog_name=ctx.catalog_name,
    )

    def text(d: dict) -> None:
        who = f"member {d['member']} (generation {d['generation']})" if d["member"] else "explicit ranges"
        consumed = (
            "; ".join(
                f"p{p}: {plural(len(rs), 'range')} within {span(rs[0][0], rs[-1][1] + 1)}" for p, rs in d["consumed"].items()
            )
            or "nothing new"
        )
        click.echo(f"{d['group']} {who}: consumed {plural(d['rows'], 'record')} of {d['source']} ({consumed})")
        written = ", ".join(f"p{p} {span(a, b)}" for p, (a, b) in d["written"].items()) or "nothing"
        click.echo(f"wrote {written} to {d['target']} in {d['seconds']:.1f} s")

    ctx.emit(result.to_dict(), text)

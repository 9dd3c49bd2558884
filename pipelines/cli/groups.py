"""``icelog consume`` and ``icelog groups``: consumer groups with range commits.

Offsets on the command line follow two conventions, both shown by ``groups describe``:
the *stable offset* is the last offset done (inclusive, as in cooperative consumption), the *committed
offset* is the next offset to read (Kafka's).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Iterator

import click

from icelog.pipelines.cli.app import (
    EXIT_INTERRUPTED,
    INT64_MAX,
    OFFSET,
    PARTITION,
    Context,
    LogTime,
    dumps,
    echo_list,
    jsonable,
    print_table,
)
from icelog.storage.errors import InvalidInput, span


def _parse_range(text: str) -> tuple[int, int]:
    try:
        first, last = (int(x) for x in text.split("-"))
    except ValueError:
        raise InvalidInput(reason=f"a range is FIRST-LAST (inclusive offsets), not {text!r}") from None
    return first, last


RECORD_FIELDS = ("partition", "offset", "timestamp", "key", "value")


def _print_fields(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """``--print`` values (repeatable, each a comma-separated list) as fields in their fixed order."""
    if not values:
        return RECORD_FIELDS
    asked = {name.strip() for value in values for name in value.split(",") if name.strip()}
    unknown = sorted(asked - set(RECORD_FIELDS))
    if unknown or not asked:
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}: choose from {', '.join(RECORD_FIELDS)}", ctx, param)
    return tuple(f for f in RECORD_FIELDS if f in asked)


@click.command()
@click.argument("table")
@click.option("--group", default=None, help="Consumer group id; without it nothing is committed (a --from-* start is needed).")
@click.option("--partition", type=PARTITION, default=None, help="One partition (default: all).")
@click.option("--offset", "start_offset", type=OFFSET, default=None, help="Without --group: start at this offset of --partition.")
@click.option("--from-beginning", is_flag=True, help="Without --group: start at each partition's log start.")
@click.option(
    "--from-time",
    "from_us",
    default=None,
    type=LogTime(),
    metavar="TIME",
    help="Without --group: start at each partition's first offset whose log_timestamp >= TIME (ISO 8601 or epoch ms).",
)
@click.option(
    "--key-range", default=None, metavar="LO:HI", help="Only keys whose hash is in LO..HI (of 0..65535); needs --group."
)
@click.option("--max-records", type=click.IntRange(1, None), default=None, help="Stop after N records.")
@click.option("--follow", is_flag=True, help="Keep polling at the log end.")
@click.option(
    "--batch-size", type=click.IntRange(1, 100_000), default=500, show_default=True, help="Records per poll, and per commit."
)
@click.option(
    "--print",
    "fields",
    multiple=True,
    metavar="FIELDS",
    callback=_print_fields,
    help="The fields of each record to print, comma-separated, always in the order partition, offset, "
    "timestamp, key, value (kafka-console-consumer's print.*): --print value, --print key,value. Default: all five.",
)
@click.option(
    "--format",
    "records_format",
    type=click.Choice(["tsv", "jsonl"]),
    default="tsv",
    show_default=True,
    help="Text output: one tab-separated line per record, or JSON Lines (one object per record, streamed); "
    "--output json keeps its one document.",
)
@click.pass_obj
def consume(
    ctx: Context,
    table: str,
    group: str | None,
    partition: int | None,
    start_offset: int | None,
    from_beginning: bool,
    from_us: int | None,
    key_range: str | None,
    max_records: int | None,
    follow: bool,
    batch_size: int,
    fields: tuple[str, ...],
    records_format: str,
) -> None:
    """Print TABLE's records: partition, offset, timestamp, key, value (or the --print fields).
    With --group: those not yet done by GROUP, committing each printed batch as ranges. Without:
    from --offset, --from-beginning or --from-time (else from the log end, as
    kafka-console-consumer), committing nothing. Stops at the log end unless --follow.

    With or without a group a record prints the same way. --output json prints one document at the end,
    {"table", "group", "records": [...]}, so --follow needs --max-records there; --format jsonl
    streams the same record objects, one per line."""
    chosen = {"--offset": start_offset is not None, "--from-beginning": from_beginning, "--from-time": from_us is not None}
    starts = [name for name, given in chosen.items() if given]
    if group is not None and starts:
        raise click.UsageError(f"{starts[0]} is for consuming without --group (move a group with 'groups reset')")
    if len(starts) > 1:
        raise click.UsageError(f"{starts[0]} and {starts[1]} both choose where to start: give one")
    if follow and max_records is None and ctx.output == "json":
        raise click.UsageError(
            "--follow with --output json never ends its one document: add --max-records, or use --format jsonl"
        )
    if group is None:
        if key_range is not None:
            raise click.UsageError("--key-range needs --group")
        _consume_without_group(
            ctx, table, partition, start_offset, from_beginning, from_us, max_records, follow, batch_size, fields, records_format
        )
        return
    from icelog.storage.groups.consumer import Consumer, parse_key_range
    from icelog.storage.log.table import LogTable

    hashes = parse_key_range(key_range) if key_range is not None else None
    log_table = LogTable.open(ctx.catalog, table)
    partitions = sorted(log_table.watermarks()) if partition is None else [partition]
    consumer = Consumer(ctx.catalog, group)
    consumer.assign(log_table.identifier, partitions, key_range=hashes)
    out = _RecordPrinter(ctx, log_table, fields, records_format)
    with out.interruptible(group):
        while max_records is None or out.printed < max_records:
            want = batch_size if max_records is None else min(batch_size, max_records - out.printed)
            batches = consumer.poll(want)
            if not batches:
                if not follow:
                    break
                time.sleep(1.0)
                continue
            for batch in batches:
                for row in batch.to_pylist():
                    out.add(row)
            consumer.commit()  # after the batch is added: every committed record is in the output
    out.finish(group)


def _start_positions(
    log_table: Any, partition: int | None, start_offset: int | None, from_beginning: bool, from_us: int | None
) -> dict[int, int]:
    """Where a group-less consume starts, per partition (refusing a bad choice before any read)."""
    from icelog.storage.errors import InvalidOffset, UnknownPartition

    marks = log_table.watermarks()
    if partition is not None and partition not in marks:
        raise UnknownPartition(table=log_table.identifier, partition=partition, partitions=len(marks))
    if start_offset is not None and partition is None:
        if len(marks) > 1:
            raise click.UsageError(f"--offset needs --partition: {log_table.identifier} has {len(marks)} partitions")
        partition = 0
    partitions = sorted(marks) if partition is None else [partition]
    if start_offset is not None:
        mark = marks[partition]
        if not mark.start <= start_offset <= mark.end:
            reason = f"the log holds {span(mark.start, mark.end)}: start at {mark.start} up to its end {mark.end}"
            raise InvalidOffset(partition=partition, offset=start_offset, reason=reason)
        return {partition: start_offset}
    if from_beginning:
        return {p: marks[p].start for p in partitions}
    if from_us is not None:
        return {p: e.offset for p, e in log_table.offsets_for_time(from_us, partitions).items()}
    return {p: marks[p].end for p in partitions}


class _RecordPrinter:
    """Prints a table's rows as kafka-console-consumer shows records, the same with or without a
    group: the key column is the key; the value is the ``value`` column of a key/value payload,
    else an object of the other payload columns. Only the chosen ``fields`` are shown.

    Text output prints each record as it comes (tab-separated, or JSON Lines); JSON output
    collects them for one document at :meth:`finish`."""

    def __init__(self, ctx: Context, log_table: Any, fields: tuple[str, ...], records_format: str) -> None:
        from icelog.storage.log import schema as cols

        iceberg = log_table.table()
        payload = [f.name for f in iceberg.schema().fields if f.name not in cols.SYSTEM_COLUMNS]
        declared = cols.declared_key_column(iceberg.metadata.properties)
        self.key_column = declared if declared in payload else None
        self.value_columns = [c for c in payload if c != self.key_column]
        self.ctx, self.table, self.fields, self.format = ctx, log_table.identifier, fields, records_format
        self.records: list[dict[str, Any]] = []
        self.printed = 0

    def record(self, row: dict[str, Any]) -> dict[str, Any]:
        from icelog.storage.log import schema as cols

        value = row["value"] if self.value_columns == ["value"] else {c: row[c] for c in self.value_columns}
        whole = {
            "partition": row[cols.PARTITION],
            "offset": row[cols.OFFSET],
            "timestamp": row[cols.TIMESTAMP],
            "key": None if self.key_column is None else row[self.key_column],
            "value": value,
        }
        return {f: whole[f] for f in self.fields}

    def add(self, row: dict[str, Any]) -> None:
        record = self.record(row)
        self.printed += 1
        if self.ctx.output == "json":
            self.records.append(record)
        elif self.format == "jsonl":
            click.echo(dumps(record))
        else:
            click.echo("\t".join(v if isinstance(v, str) else dumps(v) for v in map(jsonable, record.values())))

    def finish(self, group: str | None, interrupted: bool = False) -> None:
        if self.ctx.output == "json":
            doc = {"table": self.table, "group": group, "records": self.records}
            click.echo(dumps({**doc, "interrupted": True} if interrupted else doc))

    @contextlib.contextmanager
    def interruptible(self, group: str | None) -> Iterator[None]:
        """Ctrl-C: text output has printed every record already (the CLI then reports the
        interrupt); JSON output prints its one document now, with what was read (and, with a
        group, committed), marked ``"interrupted": true``, and exits 130 as the CLI does."""
        try:
            yield
        except KeyboardInterrupt:
            if self.ctx.output != "json":
                raise
            self.finish(group, interrupted=True)
            sys.exit(EXIT_INTERRUPTED)


def _consume_without_group(
    ctx: Context,
    table: str,
    partition: int | None,
    start_offset: int | None,
    from_beginning: bool,
    from_us: int | None,
    max_records: int | None,
    follow: bool,
    batch_size: int,
    fields: tuple[str, ...],
    records_format: str,
) -> None:
    """Read from the chosen start to the log end (or on, with ``follow``); commits nothing."""
    from icelog.storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    positions = _start_positions(log_table, partition, start_offset, from_beginning, from_us)
    out = _RecordPrinter(ctx, log_table, fields, records_format)
    if start_offset is None and not from_beginning and from_us is None and not follow and ctx.output == "text":
        click.echo("consume: no --offset, --from-beginning or --from-time: starting at the log end", err=True)
    with out.interruptible(None):
        while True:
            marks = log_table.watermarks()
            moved = False
            for p, position in positions.items():
                while position < marks[p].end and (max_records is None or out.printed < max_records):
                    want = batch_size if max_records is None else min(batch_size, max_records - out.printed)
                    upto = min(position + want, marks[p].end)
                    for row in log_table.read(p, position, upto).to_pylist():
                        out.add(row)
                    position = positions[p] = upto
                    moved = True
            if not follow or (max_records is not None and out.printed >= max_records):
                break
            if not moved:
                time.sleep(1.0)
    out.finish(None)


@click.group()
def groups() -> None:
    """Consumer groups: offsets, individually committed ranges, members."""


@groups.command("list")
@click.pass_obj
def groups_list(ctx: Context) -> None:
    """Every consumer group with committed offsets, ranges or members."""
    from icelog.storage.groups.offsets import list_groups

    names = list_groups(ctx.catalog)
    ctx.emit({"groups": names}, lambda d: echo_list(d["groups"], "consumer groups"))


@groups.command("describe")
@click.option("--group", default=None, help="Consumer group id (required).")
@click.argument("old_group", required=False, metavar="[GROUP]", deprecated="Use --group GROUP.")
@click.pass_obj
def groups_describe(ctx: Context, group: str | None, old_group: str | None) -> None:
    """Per partition: stable offset (last done), committed offset (next to read), IC ranges,
    lag, owners and draining ranges; then members and generation.

    The group is named by --group, as in every groups command (and kafka-consumer-groups);
    the older positional GROUP still works."""
    if group is not None and old_group is not None and group != old_group:
        raise click.UsageError(f"two groups named ({group!r}, {old_group!r}): give one, as --group GROUP")
    if group is None and old_group is None:
        raise click.UsageError("Missing option '--group'.")
    doc = _light_describe(ctx, group or old_group)
    if doc is None:
        from icelog.storage.groups.offsets import describe_group

        doc = describe_group(ctx.catalog, group or old_group)

    def text(d: dict) -> None:
        rows = [
            [
                e["table"],
                e["partition"],
                e["stable_offset"],
                e["committed_offset"],
                " ".join(span(first, last + 1) for first, last in e["ranges"]) or "-",  # inclusive in JSON
                span(e["log_start"], e["log_end"]),
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
            empty="offsets, ranges or owners",
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


class _NotLight(Exception):
    """A source table the light read cannot answer for: the full read decides."""


def _light_describe(ctx: Context, group: str) -> dict[str, Any] | None:
    """``groups describe`` from the metadata of the group offsets table and of the groups' source
    tables, read without opening the catalog (:meth:`Context.light_metadata`); None: read it
    through the catalog."""
    from icelog.storage.errors import IcelogError
    from icelog.storage.groups.group_state import GROUPS_TABLE, GroupOffsetsState, describe
    from icelog.storage.log.plain_metadata import current_snapshot_id
    from icelog.storage.log.state import LogState

    stored = ctx.light_metadata(GROUPS_TABLE, log_table=False)
    if stored is None:
        return None
    metadata = stored[1]
    state = GroupOffsetsState.from_properties(metadata.get("properties") or {}, current_snapshot_id(metadata))

    def bounds(source: str) -> dict[int, tuple[int, int]]:
        try:
            light = ctx.light_metadata(source, log_table=False)
            if light is None:
                raise _NotLight(source)
            table_metadata = light[1]
            marks = LogState.from_properties(table_metadata.get("properties") or {}, table_metadata["location"], None).watermarks
        except IcelogError:  # not a log table, an unknown format, a malformed name: as LogTable.open's errors
            return {}
        return {p: (w.start, w.end) for p, w in marks.items()}

    try:
        return describe(state, group, bounds, int(time.time() * 1000))
    except _NotLight:
        return None


@groups.command("commit")
@click.argument("table")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--partition", type=PARTITION, required=True, help="The partition the ranges are offsets of.")
@click.option("--range", "ranges", required=True, multiple=True, metavar="FIRST-LAST", help="Inclusive offsets; repeatable.")
@click.pass_obj
def groups_commit(ctx: Context, table: str, group: str, partition: int, ranges: tuple[str, ...]) -> None:
    """Commit offset ranges by hand (refused while the group has live members)."""
    from icelog.storage.groups.offsets import commit_ranges

    parsed = [_parse_range(r) for r in ranges]
    result = commit_ranges(ctx.catalog, group, {(table, partition): parsed})

    def text(d: dict) -> None:
        for where, p in d["partitions"].items():
            shown = " ".join(f"{first}-{last}" for first, last in p["ranges"]) or "none"
            click.echo(f"{d['group']} {where}: stable offset {p['stable']} (committed {p['committed']}), IC ranges {shown}")

    ctx.emit(result, text)


@groups.command("delete")
@click.option("--group", required=True, help="Consumer group id.")
@click.pass_obj
def groups_delete(ctx: Context, group: str) -> None:
    """Delete GROUP: its committed offsets, IC ranges and membership (kafka-consumer-groups
    --delete). Refused while members are live (StaleGeneration, exit 3); an unknown group is
    UnknownGroup (exit 2)."""
    from icelog.storage.groups.offsets import delete_group

    result = delete_group(ctx.catalog, group)
    ctx.emit(result, lambda d: click.echo(f"deleted group {d['group']} (offsets on {', '.join(d['tables']) or 'no table'})"))


@groups.command("reset")
@click.argument("table")
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--to", "to", default=None, help="earliest, latest, or an offset (the next to read).")
@click.option(
    "--to-datetime",
    "to_time_us",
    type=LogTime(),
    default=None,
    metavar="TIME",
    help="Per partition, the earliest offset whose log_timestamp >= TIME (ISO 8601 or epoch ms), else the log end.",
)
@click.option(
    "--shift-by",
    type=click.IntRange(-INT64_MAX, INT64_MAX),
    default=None,
    metavar="N",
    help="Move each committed offset by N (negative: back), clamped to the log [start, end].",
)
@click.option("--partition", type=PARTITION, default=None, help="One partition (default: all).")
@click.option("--dry-run", is_flag=True, help="Print the plan (partition, current and new committed offset); change nothing.")
@click.pass_obj
def groups_reset(
    ctx: Context,
    table: str,
    group: str,
    to: str | None,
    to_time_us: int | None,
    shift_by: int | None,
    partition: int | None,
    dry_run: bool,
) -> None:
    """Move GROUP's committed offsets on TABLE (kafka-consumer-groups --reset-offsets) and drop
    its IC ranges there; refused while members are live. Give exactly one of --to,
    --to-datetime and --shift-by. A partition with no committed offset counts as at its log start."""
    from icelog.storage.groups.offsets import reset_group

    given = [name for name, value in (("--to", to), ("--to-datetime", to_time_us), ("--shift-by", shift_by)) if value is not None]
    if len(given) != 1:
        chosen = " and ".join(given) if given else "none"
        raise click.UsageError(f"give exactly one of --to, --to-datetime and --shift-by (got {chosen})")
    result = reset_group(
        ctx.catalog,
        group,
        table,
        to,
        None if partition is None else [partition],
        to_time_us=to_time_us,
        shift_by=shift_by,
        dry_run=dry_run,
    )

    def text(d: dict) -> None:
        print_table(
            [[r["table"], r["partition"], r["current"], r["new"]] for r in d["partitions"]],
            ["table", "partition", "current (next to read)", "new"],
            f"group {d['group']}: {'plan (dry run, nothing changed)' if d['dry_run'] else 'reset'}",
            empty="partitions",
        )

    ctx.emit(result, text)

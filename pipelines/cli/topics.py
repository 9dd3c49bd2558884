"""``icelog topics`` and ``icelog offsets``: log tables, their partitions and offsets."""

from __future__ import annotations

import datetime as dt
import json

import click

from pipelines.cli.app import MAX_PARTITIONS, PARTITION_COUNT, Context, LogTime, print_table
from storage.errors import InvalidInput, MalformedInput


@click.group()
def topics() -> None:
    """Create, list and describe log tables."""


def read_schema_file(path: str) -> list[dict]:
    """A payload schema file: a JSON list of columns, or ``{"fields": [...]}``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidInput(reason=f"cannot read schema file {path}: {e.strerror or e}") from e
    try:
        doc = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise MalformedInput(reason=f"schema file {path} is not UTF-8 (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise MalformedInput(reason=f"schema file {path}: not JSON: {e.msg}", line=e.lineno) from e
    except RecursionError as e:
        raise MalformedInput(reason=f"schema file {path}: nested too deeply") from e
    fields = doc["fields"] if isinstance(doc, dict) and "fields" in doc else doc
    if not isinstance(fields, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("type"), str) for c in fields
    ):
        raise InvalidInput(reason=f'schema file {path}: a payload schema is a list of {{"name": str, "type": str}} objects')
    return fields


@topics.command("create")
@click.argument("table")
@click.option("--partitions", type=PARTITION_COUNT, required=True, help=f"Number of partitions, 1..{MAX_PARTITIONS}.")
@click.option("--schema", "schema_file", type=click.Path(dir_okay=False), help="JSON payload schema: [{name, type, required?}].")
@click.pass_obj
def topics_create(ctx: Context, table: str, partitions: int, schema_file: str | None) -> None:
    """Create TABLE with N partitions (payload default: key, value strings)."""
    from storage.log.table import LogTable

    payload = read_schema_file(schema_file) if schema_file else None
    log_table = LogTable.create(ctx.catalog, table, partitions, payload)
    ctx.emit(log_table.describe(), lambda d: click.echo(f"created {d['table']} with {d['partitions']} partitions"))


@topics.command("list")
@click.option("--system", is_flag=True, help="Also list icelog's own system tables (icelog_system.*).")
@click.pass_obj
def topics_list(ctx: Context, system: bool) -> None:
    """List the log tables of the catalog (icelog's system tables with --system)."""
    from storage.core.commit import is_system_table
    from storage.log.table import list_log_tables

    names = [n for n in list_log_tables(ctx.catalog) if system or not is_system_table(n)]
    ctx.emit({"tables": names}, lambda d: click.echo("\n".join(d["tables"]) or "(no log tables)"))


@topics.command("describe")
@click.argument("table")
@click.pass_obj
def topics_describe(ctx: Context, table: str) -> None:
    """TABLE's partitions, payload columns, location, current snapshot and offsets per partition."""
    from storage.log.table import LogTable

    doc = LogTable.open(ctx.catalog, table).describe()

    def text(d: dict) -> None:
        click.echo(f"{d['table']}  partitions={d['partitions']}  snapshot={d['snapshot_id']}  location={d['location']}")
        click.echo("payload: " + ", ".join(f"{c['name']} {c['type']}" for c in d["payload"]))
        print_table(
            [[p, o["start"], o["end"], o["end"] - o["start"]] for p, o in d["offsets"].items()],
            ["partition", "start", "end", "rows"],
        )

    ctx.emit(doc, text)


@topics.command("add-partitions")
@click.argument("table")
@click.option(
    "--count", type=PARTITION_COUNT, required=True, help=f"The new total number of partitions, at most {MAX_PARTITIONS}."
)
@click.pass_obj
def topics_add_partitions(ctx: Context, table: str, count: int) -> None:
    """Grow TABLE to COUNT partitions (never shrinks)."""
    from storage.log.table import LogTable

    LogTable.open(ctx.catalog, table).add_partitions(count)
    ctx.emit(LogTable.open(ctx.catalog, table).describe(), lambda d: click.echo(f"{d['table']} has {d['partitions']} partitions"))


@click.command()
@click.argument("table")
@click.option(
    "--at",
    "at_us",
    type=LogTime(),
    default=None,
    metavar="TIME",
    help="Per partition, the earliest offset whose log_timestamp >= TIME (ISO 8601 or epoch ms), else the log end.",
)
@click.pass_obj
def offsets(ctx: Context, table: str, at_us: int | None) -> None:
    """Log start and end offset of every partition of TABLE; with --at, the offset for a time
    (kafka-get-offsets --time)."""
    from storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    if at_us is not None:
        at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=at_us)
        found = log_table.offsets_for_time(at_us)
        doc = {
            "table": log_table.identifier,
            "at": at,
            "partitions": {str(p): {"offset": e.offset, "timestamp": e.timestamp} for p, e in found.items()},
        }
        ctx.emit(
            doc,
            lambda d: print_table(
                [[p, e["offset"], "-" if e["timestamp"] is None else e["timestamp"]] for p, e in d["partitions"].items()],
                ["partition", "offset", "timestamp"],
                f"{d['table']} at {d['at'].isoformat()}",
            ),
        )
        return
    marks = log_table.watermarks()
    doc = {"table": log_table.identifier, "partitions": {str(p): {"start": w.start, "end": w.end} for p, w in marks.items()}}
    ctx.emit(
        doc,
        lambda d: print_table(
            [[p, o["start"], o["end"]] for p, o in d["partitions"].items()], ["partition", "start", "end"], d["table"]
        ),
    )

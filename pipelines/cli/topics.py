"""``icelog topics`` and ``icelog offsets``: log tables, their partitions and offsets."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import click

from icelog.pipelines.cli.app import MAX_PARTITIONS, PARTITION_COUNT, Context, LogTime, clip, echo_list, print_table, text_value
from icelog.storage.errors import ConfirmationRequired, InvalidInput, MalformedInput


@click.group()
def topics() -> None:
    """Create, list, describe, alter, grow and delete log tables.

    Offsets per partition are half-open: [start, end) holds start up to, not including, end.
    """


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
    from icelog.storage.log.table import LogTable

    payload = read_schema_file(schema_file) if schema_file else None
    log_table = LogTable.create(ctx.catalog, table, partitions, payload)
    ctx.emit(log_table.describe(), lambda d: click.echo(f"created {d['table']} with {d['partitions']} partitions"))


@topics.command("list")
@click.option("--system", is_flag=True, help="Also list icelog's own system tables (icelog_system.*).")
@click.pass_obj
def topics_list(ctx: Context, system: bool) -> None:
    """List the log tables of the catalog (and icelog's own system tables with --system)."""
    names = None if system else _light_log_tables(ctx)
    if names is not None:
        ctx.emit({"tables": names}, lambda d: echo_list(d["tables"], "log tables"))
        return
    from icelog.storage.core.commit import is_system_table, system_tables
    from icelog.storage.log.table import list_log_tables

    names = [n for n in list_log_tables(ctx.catalog) if not is_system_table(n)]
    if system:  # every table icelog keeps its state in, log tables or not (the ingest ledger)
        names = sorted(names + system_tables(ctx.catalog))
    ctx.emit({"tables": names}, lambda d: echo_list(d["tables"], "log tables"))


def _light_log_tables(ctx: Context) -> list[str] | None:
    """``topics list`` from the catalog's pointers and the metadata alone, as ``list_log_tables``
    answers it (system tables left out); None: read it through the catalog."""
    from icelog.storage.core.catalog_config import SYSTEM_NAMESPACE
    from icelog.storage.core.pointer import current_metadata, table_names
    from icelog.storage.properties import FORMAT

    if ctx.opened:
        return None
    choice = ctx.light_catalog()
    found = table_names(choice.name, choice.properties)
    if found is None:
        return None
    names = []
    for namespace, name in found:
        if namespace.lower() == SYSTEM_NAMESPACE:
            continue
        metadata = current_metadata(choice.name, choice.properties, namespace, name)
        if metadata is None:
            return None  # unreadable, or dropped meanwhile: the full read decides
        if FORMAT in (metadata.get("properties") or {}):
            names.append(f"{namespace}.{name}")
    return sorted(names)


@topics.command("describe")
@click.argument("table")
@click.option(
    "--all-properties", is_flag=True, help="Also every other table property (Iceberg's, and icelog's own state), as stored."
)
@click.pass_obj
def topics_describe(ctx: Context, table: str, all_properties: bool) -> None:
    """TABLE's partitions, payload columns, location, uuid, format version, partition spec, refs
    (branches and tags with their snapshots), current snapshot, offsets per partition and
    icelog's table properties (value, default, whether set; change them with 'topics alter')."""
    from icelog.storage import properties
    from icelog.storage.log import plain_metadata

    light = ctx.light_metadata(table)
    doc = plain_metadata.describe(*light) if light is not None else None
    if doc is not None:
        stored = light[1]["properties"]  # type: ignore[index]
    else:
        from icelog.storage.log.table import LogTable

        log_table = LogTable.open(ctx.catalog, table)
        doc = log_table.describe()
        iceberg = log_table.table()
        doc.update(_iceberg_identity(iceberg))
        stored = iceberg.metadata.properties
    doc["properties"] = properties.effective(stored)
    if all_properties:
        doc["all_properties"] = dict(sorted(stored.items()))

    def text(d: dict) -> None:
        snapshot = d["snapshot_id"] if d["snapshot_id"] is not None else "none (nothing committed yet)"
        click.echo(f"{d['table']}  partitions={d['partitions']}  snapshot={snapshot}")
        click.echo(f"location: {d['location']}")
        click.echo(f"uuid: {d['uuid']}  format-version: {d['format_version']}")
        spec = ", ".join(f"{f['transform']}({f['source']}) as {f['name']}" for f in d["spec"]["fields"]) or "unpartitioned"
        click.echo(f"spec {d['spec']['spec_id']}: {spec}")
        refs = [f"{name} ({r['type']}) -> {r['snapshot_id']}" for name, r in d["refs"].items()]
        click.echo("refs: " + (", ".join(refs) or "none (no snapshot yet)"))
        click.echo("payload: " + ", ".join(f"{c['name']} {c['type']}" for c in d["payload"]))
        print_table(
            [[p, o["start"], o["end"], o["end"] - o["start"]] for p, o in d["offsets"].items()],
            ["partition", "start", "end", "rows"],
        )
        invalid = any("invalid" in e for e in d["properties"].values())
        print_table(
            [
                [key, "no limit" if e["value"] is None else e["value"], "set" if e["set"] else "default"]
                + ([e.get("invalid", "")] if invalid else [])
                for key, e in d["properties"].items()
            ],
            ["property", "value", "from"] + (["invalid"] if invalid else []),
        )
        if "all_properties" in d:
            print_table([[k, clip(v, 100)] for k, v in d["all_properties"].items()], ["table property", "stored value"])

    ctx.emit(doc, text)


def _iceberg_identity(iceberg: Any) -> dict[str, Any]:
    """What Iceberg's own tools show of a table beside its data: uuid, format version, the
    current partition spec and the refs (branches and tags, each with its snapshot id)."""
    metadata = iceberg.metadata
    schema = iceberg.schema()
    spec = iceberg.spec()
    return {
        "uuid": str(metadata.table_uuid),
        "format_version": metadata.format_version,
        "spec": {
            "spec_id": spec.spec_id,
            "fields": [
                {
                    "source": schema.find_column_name(f.source_id),
                    "field_id": f.field_id,
                    "transform": str(f.transform),
                    "name": f.name,
                }
                for f in spec.fields
            ],
        },
        "refs": {
            name: {"type": str(ref.snapshot_ref_type.value), "snapshot_id": ref.snapshot_id}
            for name, ref in sorted(metadata.refs.items())
        },
    }


def _key_value(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        if key.strip() in pairs:
            raise click.BadParameter(f"{key.strip()} is given twice", ctx, param)
        pairs[key.strip()] = value
    return pairs


@topics.command("alter")
@click.argument("table")
@click.option(
    "--set",
    "updates",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_key_value,
    help="Set an icelog knob (icelog.retention.ms=86400000) or an Iceberg property (commit.manifest.target-size-bytes=262144); repeatable.",
)
@click.option("--unset", "removals", multiple=True, metavar="KEY", help="Remove a property: back to its default; repeatable.")
@click.pass_obj
def topics_alter(ctx: Context, table: str, updates: dict[str, str], removals: tuple[str, ...]) -> None:
    """Change TABLE's properties in one commit (kafka-configs --alter): icelog's knobs, each value
    checked against its bounds, and any Iceberg property outside icelog.* (its state is icelog's
    own); on any error nothing changes.
    'topics describe' lists them with their values and defaults."""
    from icelog.storage.log.maintenance import alter_properties

    if not updates and not removals:
        raise click.UsageError("nothing to change: give --set KEY=VALUE or --unset KEY")
    result = alter_properties(ctx.catalog, table, updates, [k.strip() for k in removals])

    def text(d: dict) -> None:
        changes = [f"{k}={v}" for k, v in d["set"].items()] + [f"-{k}" for k in d["unset"]]
        click.echo(f"{d['table']}: " + (", ".join(changes) if changes else "unchanged (already so)"))

    ctx.emit(result, text)


@topics.command("add-partitions")
@click.argument("table")
@click.option(
    "--count", type=PARTITION_COUNT, required=True, help=f"The new total number of partitions, at most {MAX_PARTITIONS}."
)
@click.pass_obj
def topics_add_partitions(ctx: Context, table: str, count: int) -> None:
    """Grow TABLE to COUNT partitions (never shrinks)."""
    from icelog.storage.log.table import LogTable

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
    help="Per partition, the earliest offset whose append time (log_timestamp) >= TIME (ISO 8601 or epoch ms), else the log end.",
)
@click.option(
    "--event-time",
    is_flag=True,
    help="With --at: by the table's event-time column (its one timestamp payload column, UTC) instead of append time.",
)
@click.pass_obj
def offsets(ctx: Context, table: str, at_us: int | None, event_time: bool) -> None:
    """Log start and end offset of every partition of TABLE; with --at, the offset for a time
    (kafka-get-offsets --time), by append time or, with --event-time, by event time."""
    if event_time and at_us is None:
        raise click.UsageError("--event-time goes with --at TIME")
    light = _light_offsets(ctx, table) if at_us is None else None
    if light is not None:
        ctx.emit(light, _print_offsets)
        return
    from icelog.storage.log import schema as cols
    from icelog.storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    if at_us is not None:
        at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=at_us)
        found = log_table.offsets_for_time(at_us, event_time=event_time)
        doc = {
            "table": log_table.identifier,
            "at": at,
            "by": cols.event_time_column(log_table.table().schema()) if event_time else cols.TIMESTAMP,
            "partitions": {str(p): {"offset": e.offset, "timestamp": e.timestamp} for p, e in found.items()},
        }
        ctx.emit(
            doc,
            lambda d: print_table(
                [[p, e["offset"], "-" if e["timestamp"] is None else e["timestamp"]] for p, e in d["partitions"].items()],
                ["partition", "offset", d["by"]],
                f"{d['table']} at {text_value(d['at'])} by {d['by']}",
            ),
        )
        return
    ctx.emit(_offsets_doc(log_table.identifier, log_table.watermarks()), _print_offsets)


def _offsets_doc(identifier: str, marks: Any) -> dict[str, Any]:
    return {"table": identifier, "partitions": {str(p): {"start": w.start, "end": w.end} for p, w in marks.items()}}


def _print_offsets(doc: dict[str, Any]) -> None:
    print_table([[p, o["start"], o["end"]] for p, o in doc["partitions"].items()], ["partition", "start", "end"], doc["table"])


def _light_offsets(ctx: Context, table: str) -> dict[str, Any] | None:
    """``offsets`` from the catalog's pointer and the metadata alone (:meth:`Context.light_metadata`);
    None: read it through the catalog."""
    from icelog.storage.log.state import LogState

    light = ctx.light_metadata(table)
    if light is None:
        return None
    identifier, metadata = light
    return _offsets_doc(
        identifier, LogState.from_properties(metadata["properties"], metadata.get("location", ""), None).watermarks
    )


def _interactive() -> bool:
    """Whether a person can be asked: stdin is a terminal (never in CI, cron or a pipe)."""
    return sys.stdin.isatty()


def transactions_on(catalog: Any, table: str) -> tuple[list[str], list[str]]:
    """The transactional ids whose open transaction writes ``table`` (or commits offsets of it):
    (prepared ones, still ongoing ones)."""
    from icelog.storage.producers.journal import transactional_ids

    prepared, ongoing = [], []
    for tid, entry in sorted(transactional_ids(catalog).items()):
        txn = entry.txn
        if txn is None:
            continue
        tables = set(txn.partitions)
        if txn.prepared is not None:
            tables |= set(txn.prepared.sends)
            if txn.prepared.offsets is not None:
                tables |= {t for t, _, _ in txn.prepared.offsets.offsets}
        if table in tables:
            (prepared if txn.prepared is not None else ongoing).append(tid)
    return prepared, ongoing


@topics.command("delete")
@click.argument("table")
@click.option("--yes", "-y", "confirmed", is_flag=True, help="Do not ask: needed where no terminal can answer (scripts, CI).")
@click.option(
    "--force",
    is_flag=True,
    help="Delete even while ongoing transactions or consumer groups use TABLE (its group offsets go too).",
)
@click.option(
    "--purge",
    is_flag=True,
    help="Also delete the files its retained snapshots reference; without it every file stays and can be re-registered.",
)
@click.pass_obj
def topics_delete(ctx: Context, table: str, confirmed: bool, force: bool, purge: bool) -> None:
    """Delete TABLE from the catalog (kafka-topics --delete), after a confirmation or --yes.

    Refused, changing nothing: icelog's system tables (icelog_system.*), always; a table a
    prepared transaction commits to, always (run 'transactions recover' first); a table an
    ongoing transaction writes or a consumer group has offsets, ranges or members on, unless
    --force. With --force, those groups' offsets and ranges on TABLE are dropped first, so a
    table created again under the name starts clean; an ongoing transaction then fails at
    commit. Without --purge the data and metadata files stay (the output names the metadata
    file to re-register); with it they are deleted. The ingest ledger keeps its entries under
    the name: 'ingest' into a table created again under it skips the files it loaded before."""
    from icelog.storage.core.commit import is_system_table
    from icelog.storage.errors import InvalidIdentifier, TableInUse
    from icelog.storage.groups.offsets import forget_table, groups_on
    from icelog.storage.log.table import LogTable

    log_table = LogTable(ctx.catalog, table)
    name = log_table.identifier
    if is_system_table(name):
        raise InvalidIdentifier(identifier=name, reason="icelog_system.* holds icelog's own state and is never deleted")
    log_table.table()  # UnknownTable, NotALogTable
    prepared, ongoing = transactions_on(ctx.catalog, name)
    if prepared:
        raise TableInUse(
            table=name,
            users=[f"prepared transactions of {', '.join(prepared)}"],
            hint="a prepared transaction is decided and must land: run 'icelog transactions recover' first (--force does not skip this)",
        )
    groups = groups_on(ctx.catalog, name)
    users = []
    if ongoing:
        users.append(f"ongoing transactions of {', '.join(ongoing)}")
    if groups:
        users.append(f"consumer groups {', '.join(groups)}")
    if users and not force:
        raise TableInUse(table=name, users=users, hint="give --force to delete it anyway (the groups' offsets on it go too)")
    if not confirmed:
        what = f"topics delete {name}"
        if not _interactive():
            raise ConfirmationRequired(action=what, reason="no terminal to ask on: give --yes")
        files = "and delete its files" if purge else "(its files stay)"
        try:
            agreed = click.confirm(f"Delete {name} from the catalog {files}?", err=True)
        except click.Abort:  # Ctrl-C or end of input at the prompt: a "no", with its exit code
            agreed = False
        if not agreed:
            raise ConfirmationRequired(action=what, reason="not confirmed")
    forgotten = forget_table(ctx.catalog, name) if groups else []
    metadata_location = log_table.drop(purge=purge)
    doc = {"table": name, "deleted": True, "purged": purge, "metadata_location": metadata_location, "groups_forgotten": forgotten}

    def text(d: dict) -> None:
        kept = "its files deleted" if d["purged"] else f"files kept; re-register with metadata {d['metadata_location']}"
        click.echo(f"deleted {d['table']} ({kept})")
        if d["groups_forgotten"]:
            click.echo(f"dropped the offsets of groups {', '.join(d['groups_forgotten'])} on it")

    ctx.emit(doc, text)

"""The ``icelog`` command line: one Click group, ``--output text|json``, typed exit codes.

Exit codes: 0 success; 1 validation found violations; 2 bad input or usage;
3 conflict (offset mismatch, fenced producer, lost commit races); 4 other icelog errors.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable, TextIO

import click

from storage.errors import ConflictError, IcelogError, InvalidInput, MalformedInput, TerminalError

EXIT_VIOLATIONS, EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_OTHER = 1, 2, 3, 4


def exit_code(error: IcelogError) -> int:
    if isinstance(error, ConflictError):
        return EXIT_CONFLICT
    if isinstance(error, InvalidInput) or isinstance(error, TerminalError):
        return EXIT_BAD_INPUT
    return EXIT_OTHER


class Context:
    def __init__(self, catalog_name: str | None, output: str) -> None:
        self.catalog_name = catalog_name
        self.output = output
        self._catalog = None

    @property
    def catalog(self):
        if self._catalog is None:
            from storage.catalog import open_catalog

            self._catalog = open_catalog(self.catalog_name)
        return self._catalog

    def emit(self, doc: Any, text: Callable[[Any], None] | None = None) -> None:
        if self.output == "json" or text is None:
            click.echo(json.dumps(doc, default=str))
        else:
            text(doc)


def handled(fn: Callable) -> Callable:
    """Turn icelog errors into output plus the exit code their type implies."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx: Context = click.get_current_context().find_object(Context)
        try:
            return fn(*args, **kwargs)
        except IcelogError as e:
            if ctx.output == "json":
                click.echo(json.dumps(e.to_dict(), default=str))
            else:
                click.echo(f"error: {type(e).__name__}: {e}", err=True)
            sys.exit(exit_code(e))

    return wrapper


@click.group()
@click.option("--catalog", "catalog_name", envvar="ICELOG_CATALOG", default=None, help="pyiceberg catalog name (default: the embedded SQLite catalog under $ICELOG_HOME).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def cli(ctx: click.Context, catalog_name: str | None, output: str) -> None:
    """icelog: Kafka partition-log guarantees on Apache Iceberg tables."""
    ctx.obj = Context(catalog_name, output)


def _table(rows: list[list[Any]], headers: list[str], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    table = RichTable(*headers, title=title)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    Console().print(table)


# --- topics -----------------------------------------------------------------------------------


@cli.group()
def topics() -> None:
    """Create, list and describe log tables."""


@topics.command("create")
@click.argument("table")
@click.option("--partitions", type=int, required=True)
@click.option("--schema", "schema_file", type=click.Path(dir_okay=False), help="JSON payload schema: [{name, type, required?}].")
@click.pass_obj
@handled
def topics_create(ctx: Context, table: str, partitions: int, schema_file: str | None) -> None:
    """Create TABLE with N partitions (payload default: key, value strings)."""
    from storage.log import LogTable
    from storage.schema import load_payload_spec

    payload = load_payload_spec(schema_file) if schema_file else None
    log_table = LogTable.create(ctx.catalog, table, partitions, payload)
    ctx.emit(log_table.describe(), lambda d: click.echo(f"created {d['table']} with {d['partitions']} partitions"))


@topics.command("list")
@click.pass_obj
@handled
def topics_list(ctx: Context) -> None:
    from storage.log import list_log_tables

    names = list_log_tables(ctx.catalog)
    ctx.emit({"tables": names}, lambda d: click.echo("\n".join(d["tables"]) or "(no log tables)"))


@topics.command("describe")
@click.argument("table")
@click.pass_obj
@handled
def topics_describe(ctx: Context, table: str) -> None:
    from storage.log import LogTable

    doc = LogTable.open(ctx.catalog, table).describe()

    def text(d: dict) -> None:
        click.echo(f"{d['table']}  partitions={d['partitions']}  snapshot={d['snapshot_id']}  location={d['location']}")
        click.echo("payload: " + ", ".join(f"{c['name']} {c['type']}" for c in d["payload"]))
        _table([[p, o["start"], o["end"], o["end"] - o["start"]] for p, o in d["offsets"].items()], ["partition", "start", "end", "rows"])

    ctx.emit(doc, text)


@topics.command("add-partitions")
@click.argument("table")
@click.option("--count", type=int, required=True, help="The new total number of partitions.")
@click.pass_obj
@handled
def topics_add_partitions(ctx: Context, table: str, count: int) -> None:
    """Grow TABLE to COUNT partitions (never shrinks)."""
    from storage.log import LogTable

    LogTable.open(ctx.catalog, table).add_partitions(count)
    ctx.emit(LogTable.open(ctx.catalog, table).describe(), lambda d: click.echo(f"{d['table']} has {d['partitions']} partitions"))


# --- produce / offsets --------------------------------------------------------------------------


def read_json_lines(stream: TextIO) -> list[dict]:
    """Parse JSON Lines: one object per non-blank line, or :class:`MalformedInput` with the line."""
    rows = []
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MalformedInput(line=number, reason=f"not JSON: {e.msg}") from e
        if not isinstance(row, dict):
            raise MalformedInput(line=number, reason="each line must be a JSON object")
        rows.append(row)
    return rows


def rows_to_arrow(table: str, rows: list[dict]):
    import pyarrow as pa

    from storage.errors import SchemaMismatch

    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    try:
        return pa.table({n: pa.array([row.get(n) for row in rows]) for n in names}) if names else pa.table({})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SchemaMismatch(table=table, reason=str(e)) from e


@cli.command()
@click.argument("table")
@click.option("--partition", type=int, required=True)
@click.option("--expected-offset", type=int, default=None, help="Commit only if the partition's log end offset is this (KIP-27).")
@click.option("--input", "input_file", type=click.File("r"), default="-", help="JSON Lines file (default: stdin).")
@click.option("--producer-id", type=int, default=None)
@click.option("--epoch", type=int, default=None)
@click.option("--sequence", type=int, default=None, help="First sequence number of this batch.")
@click.pass_obj
@handled
def produce(ctx: Context, table: str, partition: int, expected_offset: int | None, input_file: TextIO, producer_id: int | None, epoch: int | None, sequence: int | None) -> None:
    """Append JSON Lines rows to one partition of TABLE."""
    from storage.log import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    rows = rows_to_arrow(log_table.identifier, read_json_lines(input_file))
    expected = {partition: expected_offset} if expected_offset is not None else None
    producer = None
    ids = (producer_id, epoch, sequence)
    if any(v is not None for v in ids):
        if any(v is None for v in ids):
            raise InvalidInput(reason="--producer-id, --epoch and --sequence go together")
        from storage.producers import ProducerBatch

        producer = ProducerBatch(producer_id, epoch, {partition: sequence})
    result = log_table.append({partition: rows}, expected, producer=producer)
    base, nxt = result.ranges[partition]
    doc = {"table": result.table, "partition": partition, "base_offset": base, "next_offset": nxt, "snapshot_id": result.snapshot_id}
    if producer is not None:
        doc["duplicate"] = result.duplicate
    ctx.emit(doc, lambda d: click.echo(f"{d['table']}[{partition}] offsets {base}..{nxt - 1} ({nxt - base} rows)" + (" (duplicate, not written)" if result.duplicate else "")))


@cli.command()
@click.argument("table")
@click.pass_obj
@handled
def offsets(ctx: Context, table: str) -> None:
    """Log start and end offset of every partition of TABLE."""
    from storage.log import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    marks = log_table.watermarks()
    doc = {"table": log_table.identifier, "partitions": {str(p): {"start": w.start, "end": w.end} for p, w in marks.items()}}
    ctx.emit(doc, lambda d: _table([[p, o["start"], o["end"]] for p, o in d["partitions"].items()], ["partition", "start", "end"], d["table"]))


# --- producers ---------------------------------------------------------------------------------


@cli.group()
def producers() -> None:
    """Idempotent producers: ids, epochs (fencing), sequences."""


@producers.command("init")
@click.argument("table")
@click.option("--client-id", default=None, help="Stable identity: re-init bumps the epoch and fences older instances.")
@click.pass_obj
@handled
def producers_init(ctx: Context, table: str, client_id: str | None) -> None:
    from storage.producers import init_producer

    identity = init_producer(ctx.catalog, table, client_id)
    ctx.emit(identity.to_dict(), lambda d: click.echo(f"producer_id={d['producer_id']} epoch={d['epoch']}"))


@producers.command("list")
@click.argument("table")
@click.pass_obj
@handled
def producers_list(ctx: Context, table: str) -> None:
    from storage.log import LogTable

    state = LogTable.open(ctx.catalog, table).state()
    doc = {"table": table, "producers": state.producers}
    ctx.emit(doc, lambda d: _table(
        [[pid, e["client"], e["epoch"], ", ".join(f"{p}:{s['last_seq']}" for p, s in e["partitions"].items())] for pid, e in sorted(d["producers"].items(), key=lambda kv: int(kv[0]))],
        ["producer_id", "client_id", "epoch", "last sequence per partition"], table))


@producers.command("rebuild")
@click.argument("table")
@click.pass_obj
@handled
def producers_rebuild(ctx: Context, table: str) -> None:
    """Recompute producer state from the rows (they carry producer id, epoch, sequence)."""
    from storage.producers import rebuild

    state = rebuild(ctx.catalog, table)
    ctx.emit({"table": table, "producers": state}, lambda d: click.echo(f"rebuilt state of {len(d['producers'])} producers"))


# --- validate / sql / maintain --------------------------------------------------------------


@cli.command()
@click.argument("table")
@click.option("--deep", is_flag=True, help="Read every offset with DuckDB (default: manifests only).")
@click.option("--check", "check_names", multiple=True, help="Run these checks (repeatable): contiguity, contiguity-deep, producers.")
@click.option("--snapshot", "snapshot_id", type=int, default=None, help="Check an older snapshot (watermarks are only kept for the current one).")
@click.pass_obj
@handled
def validate(ctx: Context, table: str, deep: bool, check_names: tuple[str, ...], snapshot_id: int | None) -> None:
    """Check I1 contiguity and watermarks (and more with --check); exit 1 on any violation."""
    from storage.log import LogTable
    from validations.checks import run_checks

    names = check_names or (("contiguity-deep",) if deep else ("contiguity",))
    report = run_checks(LogTable.open(ctx.catalog, table).table(), names, snapshot_id)

    def text(d: dict) -> None:
        click.echo(f"{d['table']}: {'OK' if d['ok'] else 'VIOLATIONS'} ({d['rows']} rows, {', '.join(d['checks'])}, {d['seconds']} s)")
        for v in d["violations"]:
            click.echo(f"  [{v['kind']}] partition {v.get('partition')}: {v['detail']}")

    ctx.emit(report.to_dict(), text)
    if not report.ok:
        sys.exit(EXIT_VIOLATIONS)


@cli.command()
@click.argument("table")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Folder for index.html (default: $ICELOG_HOME/reports/TABLE).")
@click.option("--no-gx", is_flag=True, help="Skip the Great Expectations suite.")
@click.option("--expectations", type=click.Path(dir_okay=False), default=None, help="Payload expectations file (default: expectations/TABLE.json).")
@click.pass_obj
@handled
def report(ctx: Context, table: str, out: str | None, no_gx: bool, expectations: str | None) -> None:
    """Write an HTML report: partitions, commit history chart, validation, GX Data Docs."""
    from storage.catalog import icelog_home
    from storage.log import LogTable
    from validations.report import build_report

    log_table = LogTable.open(ctx.catalog, table)
    target = out or str(icelog_home() / "reports" / log_table.identifier)
    with _progress(ctx, f"building the report of {log_table.identifier}"):
        page = build_report(log_table.table(), target, gx=not no_gx, expectations_file=expectations)
    doc = json.loads((page.parent / "report.json").read_text())
    ctx.emit({"table": log_table.identifier, "ok": doc["ok"], "report": str(page)}, lambda d: click.echo(f"{'OK' if d['ok'] else 'VIOLATIONS'}: file://{d['report']}"))


def _progress(ctx: Context, what: str):
    """A spinner on stderr for long work in text mode (JSON output stays clean)."""
    import contextlib

    if ctx.output == "json":
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(what)


@cli.command()
@click.argument("query")
@click.option("--snapshot", "snapshot_id", type=int, default=None, help="Time travel to this snapshot (needs --table).")
@click.option("--as-of", "as_of", default=None, help="Time travel: every table as it was at this ISO-8601 time.")
@click.option("--table", "only", default=None, help="Expose only this table.")
@click.pass_obj
@handled
def sql(ctx: Context, query: str, snapshot_id: int | None, as_of: str | None, only: str | None) -> None:
    """Run a DuckDB QUERY with every log table as a view (e.g. select count(*) from db.events)."""
    import duckdb

    con = _duckdb(ctx, snapshot_id, as_of, only)
    try:
        cursor = con.execute(query)
    except duckdb.Error as e:
        raise InvalidInput(reason=f"query failed: {e}") from e
    columns = [d[0] for d in cursor.description or []]
    rows = cursor.fetchall()
    ctx.emit({"columns": columns, "rows": [list(r) for r in rows]}, lambda d: _table(d["rows"], d["columns"]))


@cli.command("duckdb")
@click.option("--snapshot", "snapshot_id", type=int, default=None)
@click.option("--as-of", "as_of", default=None)
@click.option("--table", "only", default=None)
@click.pass_obj
@handled
def duckdb_shell(ctx: Context, snapshot_id: int | None, as_of: str | None, only: str | None) -> None:
    """An interactive DuckDB prompt with every log table as a view (end with Ctrl-D)."""
    import duckdb

    con = _duckdb(ctx, snapshot_id, as_of, only)
    click.echo("icelog duckdb: log tables are views (try: show all tables). End with Ctrl-D.", err=True)
    buffer = ""
    while True:
        try:
            line = input("duckdb> " if not buffer else "   ...> ")
        except EOFError:
            break
        buffer += line + "\n"
        if not buffer.strip().endswith(";"):
            continue
        try:
            result = con.sql(buffer)
            if result is not None:
                click.echo(str(result))
        except duckdb.Error as e:
            click.echo(f"error: {e}", err=True)
        buffer = ""


def _duckdb(ctx: Context, snapshot_id: int | None, as_of: str | None, only: str | None):
    from datetime import datetime, timezone

    from validations.sql import connect

    if snapshot_id is not None and not only:
        raise InvalidInput(reason="--snapshot names one table's snapshot: add --table")
    as_of_ms = None
    if as_of is not None:
        try:
            moment = datetime.fromisoformat(as_of)
        except ValueError as e:
            raise InvalidInput(reason=f"--as-of: not an ISO-8601 time: {as_of!r}") from e
        as_of_ms = int((moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp() * 1000)
    return connect(ctx.catalog, snapshot_id=snapshot_id, as_of_ms=as_of_ms, only=only)


@cli.command()
@click.argument("table")
@click.option("--retention-ms", type=int, default=None, help="Drop files whose newest row is older (default: table property icelog.retention.ms).")
@click.option("--retention-bytes", type=int, default=None, help="Keep at most this many bytes per partition.")
@click.option("--keep-snapshots", type=int, default=5, show_default=True)
@click.option("--orphan-age-s", type=float, default=3600.0, show_default=True, help="Only delete unreferenced files older than this.")
@click.pass_obj
@handled
def maintain(ctx: Context, table: str, retention_ms: int | None, retention_bytes: int | None, keep_snapshots: int, orphan_age_s: float) -> None:
    """Retention, compaction, snapshot expiry and orphan cleanup for TABLE."""
    from storage.log import LogTable
    from storage.maintenance import maintain as run

    name = LogTable.open(ctx.catalog, table).identifier
    with _progress(ctx, f"maintaining {name}: retention, compaction, expiry, orphans"):
        report = run(ctx.catalog, name, retention_ms=retention_ms, retention_bytes=retention_bytes, keep_snapshots=keep_snapshots, orphan_age_s=orphan_age_s)
    ctx.emit(report, lambda d: click.echo(json.dumps(d, indent=2, default=str)))


def main() -> None:
    cli(prog_name="icelog")


if __name__ == "__main__":
    main()

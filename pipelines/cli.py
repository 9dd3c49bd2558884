"""The ``icelog`` command line: one Click group, ``--output text|json``, typed exit codes.

Exit codes: 0 success; 1 validation found violations; 2 bad input or usage;
3 conflict (offset mismatch, fenced producer, lost commit races); 4 any other error;
5 not authorized (a missing permission, ``icelog acls``).

The code follows from the error's type (``storage.errors``): a :class:`ConflictError` is 3,
an :class:`InvalidInput` or another :class:`TerminalError` is 2, anything else is 4, an
unexpected exception included. With ``--output json`` every run prints exactly one JSON
document on stdout, errors included (``{"error": "<Type>", "message": ..., <fields>}``);
in text mode an error is one line on stderr. ``ICELOG_LOG_LEVEL=debug`` adds the traceback
on stderr.

JSON values: dates and times are ISO 8601 strings (``timestamptz`` with its offset, UTC),
binary values are base64 strings (RFC 4648, as Kafka's REST proxy does), decimals are
strings (exact), and non-finite floats are the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import decimal
import json
import math
import numbers
import os
import re
import sys
import traceback
from typing import Any, BinaryIO, Callable, Iterator

import click

from storage.errors import (
    AuthorizationFailed,
    ConflictError,
    IcelogError,
    InvalidInput,
    MalformedInput,
    SchemaMismatch,
    TerminalError,
)

EXIT_VIOLATIONS, EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_OTHER, EXIT_UNAUTHORIZED = 1, 2, 3, 4, 5

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_PARTITIONS = 100_000


def exit_code(error: BaseException) -> int:
    """The exit code an error's type implies."""
    if isinstance(error, AuthorizationFailed):
        return EXIT_UNAUTHORIZED
    if isinstance(error, ConflictError):
        return EXIT_CONFLICT
    if isinstance(error, (InvalidInput, TerminalError)):
        return EXIT_BAD_INPUT
    return EXIT_OTHER


# --- JSON output ---------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (see the module docstring for the mapping)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f):
            return f
        return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return f"PT{value.total_seconds():g}S"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def dumps(doc: Any) -> str:
    return json.dumps(jsonable(doc), allow_nan=False)


def _debug() -> bool:
    return os.environ.get("ICELOG_LOG_LEVEL", "").strip().lower() == "debug"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- context, errors, the group ------------------------------------------------------------


class Context:
    def __init__(self, catalog_name: str | None, output: str) -> None:
        self.catalog_name = catalog_name
        self.output = output
        self._catalog = None

    @property
    def catalog(self):
        if self._catalog is None:
            from storage.core.catalog import open_catalog

            self._catalog = open_catalog(self.catalog_name)
        return self._catalog

    def emit(self, doc: Any, text: Callable[[Any], None] | None = None) -> None:
        if self.output == "json" or text is None:
            click.echo(dumps(doc))
        else:
            text(doc)


def _json_requested(args: list[str]) -> bool:
    """Whether the global options (before the command name) ask for ``--output json``."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if arg == "--output":
            if i + 1 < len(args) and args[i + 1] == "json":
                return True
            i += 2
            continue
        if arg == "--output=json":
            return True
        i += 2 if arg == "--catalog" else 1
    return False


def _json_mode(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    if obj is not None:
        return obj.output == "json"
    return bool(ctx.meta.get("icelog.json"))


def _usage_error(e: click.ClickException, json_mode: bool) -> None:
    """Click's own errors (usage, bad option values): exit 2, and JSON in JSON mode."""
    if e.exit_code == EXIT_VIOLATIONS:  # e.g. click.FileError: 1 means "violations" here
        e.exit_code = EXIT_BAD_INPUT
    if not json_mode:
        return
    doc: dict[str, Any] = {"error": type(e).__name__, "message": e.format_message()}
    param = getattr(e, "param", None)
    if param is not None and param.name:
        doc["param"] = param.name
    e.show = lambda file=None: click.echo(dumps(doc))  # type: ignore[method-assign]


def _fail(ctx: click.Context, error: BaseException) -> None:
    code = exit_code(error)
    if isinstance(error, IcelogError):
        doc = error.to_dict()
    else:
        doc = {"error": type(error).__name__, "message": str(error) or repr(error)}
    if _debug():
        traceback.print_exception(error, file=sys.stderr)
    if _json_mode(ctx):
        click.echo(dumps(doc))
    else:
        hint = "" if isinstance(error, IcelogError) or _debug() else " (ICELOG_LOG_LEVEL=debug shows the traceback)"
        click.echo(f"error: {doc['error']}: {_one_line(str(doc['message']))}{hint}", err=True)
    sys.exit(code)


class IcelogGroup(click.Group):
    """The top-level group: one place that turns every error into output and an exit code."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any) -> click.Context:
        wants_json = _json_requested(list(args))
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as e:
            _usage_error(e, wants_json)
            raise
        ctx.meta["icelog.json"] = wants_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, BrokenPipeError):
            raise
        except click.ClickException as e:
            _usage_error(e, _json_mode(ctx))
            raise
        except Exception as e:  # noqa: BLE001 - every error leaves as output plus an exit code
            _fail(ctx, e)


EPILOG = """\b
Exit codes: 0 ok, 1 violations, 2 bad input or usage, 3 conflict, 4 any other error, 5 not authorized.
--output json prints one JSON document per run, errors included: {"error", "message", ...}.
JSON values: times ISO 8601, binary base64, decimals strings, NaN/Infinity strings.
"""


@click.group(cls=IcelogGroup, epilog=EPILOG)
@click.option("--catalog", "catalog_name", envvar="ICELOG_CATALOG", default=None, help="pyiceberg catalog name (default: the embedded SQLite catalog under $ICELOG_HOME).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def cli(ctx: click.Context, catalog_name: str | None, output: str) -> None:
    """icelog: Kafka partition-log guarantees on Apache Iceberg tables."""
    ctx.obj = Context(catalog_name, output)


# --- option types --------------------------------------------------------------------------


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also rejects NaN and infinity (NaN compares false to every bound)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


PARTITION_COUNT = click.IntRange(1, MAX_PARTITIONS)
PARTITION = click.IntRange(0, MAX_PARTITIONS - 1)
OFFSET = click.IntRange(0, INT64_MAX)
SNAPSHOT_ID = click.IntRange(1, INT64_MAX)
PRODUCER_ID = click.IntRange(0, INT64_MAX)
INT32 = click.IntRange(0, INT32_MAX)
POSITIVE_INT64 = click.IntRange(1, INT64_MAX)


def _text(value: Any) -> Any:
    """A cell for rich: plain text (never markup), binary as base64 like the JSON output."""
    from rich.text import Text

    if isinstance(value, (bytes, bytearray, memoryview)):
        value = jsonable(value)
    return Text(str(value))


def _table(rows: list[list[Any]], headers: list[str], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    table = RichTable(title=title)
    for header in headers:
        table.add_column(_text(header))
    for row in rows:
        table.add_row(*(_text(c) for c in row))
    # Piped output keeps every column whole instead of squeezing it into 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
    console.print(table)


# --- topics -----------------------------------------------------------------------------------


@cli.group()
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
        raise InvalidInput(reason=f"schema file {path}: a payload schema is a list of {{\"name\": str, \"type\": str}} objects")
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
@click.pass_obj
def topics_list(ctx: Context) -> None:
    from storage.log.table import list_log_tables

    names = list_log_tables(ctx.catalog)
    ctx.emit({"tables": names}, lambda d: click.echo("\n".join(d["tables"]) or "(no log tables)"))


@topics.command("describe")
@click.argument("table")
@click.pass_obj
def topics_describe(ctx: Context, table: str) -> None:
    from storage.log.table import LogTable

    doc = LogTable.open(ctx.catalog, table).describe()

    def text(d: dict) -> None:
        click.echo(f"{d['table']}  partitions={d['partitions']}  snapshot={d['snapshot_id']}  location={d['location']}")
        click.echo("payload: " + ", ".join(f"{c['name']} {c['type']}" for c in d["payload"]))
        _table([[p, o["start"], o["end"], o["end"] - o["start"]] for p, o in d["offsets"].items()], ["partition", "start", "end", "rows"])

    ctx.emit(doc, text)


@topics.command("add-partitions")
@click.argument("table")
@click.option("--count", type=PARTITION_COUNT, required=True, help=f"The new total number of partitions, at most {MAX_PARTITIONS}.")
@click.pass_obj
def topics_add_partitions(ctx: Context, table: str, count: int) -> None:
    """Grow TABLE to COUNT partitions (never shrinks)."""
    from storage.log.table import LogTable

    LogTable.open(ctx.catalog, table).add_partitions(count)
    ctx.emit(LogTable.open(ctx.catalog, table).describe(), lambda d: click.echo(f"{d['table']} has {d['partitions']} partitions"))


# --- produce / offsets --------------------------------------------------------------------------


class _NotInt64(ValueError):
    pass


class _NotFinite(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # before int(): no 4300-digit conversions
        raise _NotInt64(text)
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _NotInt64(text)
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e999: JSON numbers never overflow into infinity here
        raise _NotFinite(text)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(row: dict) -> bool:
    """Whether a key or string value holds an unpaired UTF-16 surrogate (not encodable)."""
    stack: list[Any] = [row]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def read_json_lines(stream: BinaryIO) -> list[tuple[int, dict]]:
    """Parse JSON Lines bytes: ``(line number, object)`` per non-blank line (see :func:`iter_json_lines`)."""
    return list(iter_json_lines(stream))


def iter_json_lines(stream: BinaryIO, skip: int = 0) -> Iterator[tuple[int, dict]]:
    """Parse JSON Lines bytes lazily: ``(line number, object)`` per non-blank line.

    The first ``skip`` non-blank lines are passed over without being parsed.

    Raises:
        MalformedInput: with the line number, for a line that is not UTF-8, not JSON, not an
            object, nested too deeply, or holds an integer outside 64 bits, a number that
            overflows a double, or an unpaired surrogate.
    """
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise MalformedInput(line=number, reason=f"not UTF-8 (byte {e.start} of the line: {raw[e.start:e.start + 1]!r})") from e
        if not line.strip():
            continue
        if skip:
            skip -= 1
            continue
        try:
            row = json.loads(line, parse_int=_parse_int, parse_float=_parse_float)
        except json.JSONDecodeError as e:
            raise MalformedInput(line=number, reason=f"not JSON: {e.msg} (column {e.colno})") from e
        except RecursionError as e:
            raise MalformedInput(line=number, reason="nested too deeply") from e
        except _NotInt64 as e:
            raise MalformedInput(line=number, reason=f"integer {_clip(str(e))} does not fit in 64 bits") from e
        except _NotFinite as e:
            raise MalformedInput(line=number, reason=f"number {_clip(str(e))} overflows a double") from e
        if not isinstance(row, dict):
            raise MalformedInput(line=number, reason="each line must be a JSON object")
        if _SURROGATE_ESCAPE.search(line) and _lone_surrogate(row):
            raise MalformedInput(line=number, reason="a string holds an unpaired UTF-16 surrogate escape")
        yield number, row


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def rows_to_arrow(table: str, rows: list[tuple[int, dict]], payload: Any = None):
    """Rows as an Arrow table; binary payload columns take base64 strings."""
    import pyarrow as pa

    binary = {f.name for f in payload if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)} if payload is not None else set()
    names: dict[str, None] = {}
    for _, row in rows:
        names.update(dict.fromkeys(row))
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for number, row in rows:
        for n in names:
            value = row.get(n)
            if n in binary and isinstance(value, str):
                try:
                    value = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError) as e:
                    raise MalformedInput(line=number, reason=f"column {n!r} is binary: give a base64 string ({e})") from e
            columns[n].append(value)
    try:
        return pa.table({n: pa.array(v) for n, v in columns.items()}) if names else pa.table({})
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise SchemaMismatch(table=table, reason=str(e)) from e


@cli.command()
@click.argument("table")
@click.option("--partition", type=PARTITION, required=True)
@click.option("--expected-offset", type=OFFSET, default=None, help="Line i (0-based, blank lines not counted) lands at offset K+i, each batch a conditional append (KIP-27); the log must end at K.")
@click.option("--load-id", default=None, help="Names a resumable load (needs --expected-offset): re-run with the same id, it continues after its batches already committed.")
@click.option("--input", "input_file", type=click.File("rb"), default="-", help="JSON Lines file, UTF-8 (default: stdin).")
@click.option("--batch-size", type=click.IntRange(1, 10_000_000), default=10_000, show_default=True, help="Lines per commit (bounds memory).")
@click.option("--producer-id", type=PRODUCER_ID, default=None)
@click.option("--epoch", type=INT32, default=None)
@click.option("--sequence", type=INT32, default=None, help="First sequence number of this batch.")
@click.pass_obj
def produce(ctx: Context, table: str, partition: int, expected_offset: int | None, load_id: str | None, input_file: BinaryIO, batch_size: int, producer_id: int | None, epoch: int | None, sequence: int | None) -> None:
    """Append JSON Lines rows to one partition of TABLE (binary columns take base64 strings).

    The input streams in batches of --batch-size lines, one commit each. With
    --expected-offset K line i lands at offset K + i, and a log that does not end at K is an
    OffsetMismatch (exit 3). With --load-id as well the load is resumable: killed and run
    again with the same arguments, it continues after its own batches (found by commit id,
    never by content), and every line lands exactly once. Another writer appending meanwhile
    stops it with OffsetMismatch (exit 3): it never interleaves.
    """
    from storage.ingest.bulk import bulk_load
    from storage.log.table import LogTable

    ids = (producer_id, epoch, sequence)
    if any(v is not None for v in ids) and any(v is None for v in ids):
        raise InvalidInput(reason="--producer-id, --epoch and --sequence go together")
    log_table = LogTable.open(ctx.catalog, table)
    payload = log_table.payload_schema()

    def batches(skip: int) -> Iterator[Any]:
        pending: list[tuple[int, dict]] = []
        for item in iter_json_lines(input_file, skip):
            pending.append(item)
            if len(pending) == batch_size:
                yield rows_to_arrow(log_table.identifier, pending, payload)
                pending = []
        if pending or not skip:
            yield rows_to_arrow(log_table.identifier, pending, payload)

    with _progress(ctx, "producing") as progress:
        result = bulk_load(log_table, partition, batches, expected_offset, load_id=load_id, producer=(producer_id, epoch, sequence) if producer_id is not None else None, progress=progress)
    doc = {"table": log_table.identifier, "partition": partition, **result, **({"load_id": load_id} if load_id is not None else {})}
    if producer_id is None:
        doc.pop("duplicate", None)
    base, nxt = doc["base_offset"], doc["next_offset"]
    resumed = f", resumed after {doc['resumed_lines']} lines already in the log" if doc.get("resumed_lines") else ""
    if nxt == base:
        ctx.emit(doc, lambda d: click.echo(f"{d['table']}[{partition}] nothing to write{resumed}"))
    else:
        ctx.emit(doc, lambda d: click.echo(f"{d['table']}[{partition}] offsets {base}..{nxt - 1} ({nxt - base} rows in {d['batches']} batches{resumed})" + (" (duplicate, not written)" if d.get("duplicate") else "")))


@cli.command()
@click.argument("table")
@click.pass_obj
def offsets(ctx: Context, table: str) -> None:
    """Log start and end offset of every partition of TABLE."""
    from storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    marks = log_table.watermarks()
    doc = {"table": log_table.identifier, "partitions": {str(p): {"start": w.start, "end": w.end} for p, w in marks.items()}}
    ctx.emit(doc, lambda d: _table([[p, o["start"], o["end"]] for p, o in d["partitions"].items()], ["partition", "start", "end"], d["table"]))


@cli.command()
@click.argument("table")
@click.argument("source")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "jsonl"]), default="parquet", show_default=True)
@click.option("--key-column", default=None, help="Route rows by the hash of this column (default: the table's icelog.key-column, else key).")
@click.option("--partitions", default=None, help="Only these log partitions, e.g. 0,3,5 (default: all).")
@click.option("--run-key", default=None, help="A label for this run, kept in the ingest ledger.")
@click.option("--reload-changed", is_flag=True, help="Load files whose content changed since they were loaded again, as new rows (default: refuse them).")
@click.option("--verify", is_flag=True, help="Fingerprint every listed file, not only new or changed-looking ones.")
@click.pass_obj
def ingest(ctx: Context, table: str, source: str, fmt: str, key_column: str | None, partitions: str | None, run_key: str | None, reload_changed: bool, verify: bool) -> None:
    """Load the files under SOURCE (a file, folder or glob) into TABLE with Spark, each file once.

    The same job the ingest DAGs run, without Airflow. Files already loaded, however long
    ago, are skipped and listed with the reason; a file whose content changed since it was
    loaded is refused (SourceFileChanged, exit 2) unless --reload-changed.
    """
    from pipelines.ingest import ingest as run
    from pipelines.ingest import require_source
    from pipelines.spark import spark_session

    require_source(source)
    only = None
    if partitions is not None:
        try:
            only = sorted({int(p) for p in partitions.split(",") if p.strip()})
        except ValueError as e:
            raise InvalidInput(reason=f"--partitions takes comma-separated integers, not {partitions!r}") from e
    with _progress(ctx, f"ingest {source} -> {table}") as progress:
        progress("starting Spark")
        result = run(
            spark_session(app_name=f"icelog-ingest-{table}"), table, source, run_key,
            fmt=fmt, key_column=key_column, catalog_name=ctx.catalog_name, only_partitions=only,
            reload_changed=reload_changed, verify=verify, progress=progress,
        )

    def text(d: dict) -> None:
        click.echo(f"{d['table']}: loaded {len(d['loaded'])} files, {d['rows']:,} rows; skipped {len(d['skipped'])} files")
        for f in d["loaded"]:
            click.echo(f"  loaded  {f['path']} ({f['rows']:,} rows)")
        for f in d["skipped"]:
            click.echo(f"  skipped {f['path']}: {f['reason']} at {f['loaded_at']}")

    ctx.emit(result.to_dict(), text)


# --- producers ---------------------------------------------------------------------------------


@cli.group()
def producers() -> None:
    """Idempotent producers: ids, epochs (fencing), sequences."""


@producers.command("init")
@click.argument("table")
@click.option("--client-id", default=None, help="Stable identity: re-init bumps the epoch and fences older instances.")
@click.pass_obj
def producers_init(ctx: Context, table: str, client_id: str | None) -> None:
    from storage.producers.idempotent import init_producer

    identity = init_producer(ctx.catalog, table, client_id)
    ctx.emit(identity.to_dict(), lambda d: click.echo(f"producer_id={d['producer_id']} epoch={d['epoch']}"))


@producers.command("list")
@click.argument("table")
@click.pass_obj
def producers_list(ctx: Context, table: str) -> None:
    from storage.log.table import LogTable

    log_table = LogTable.open(ctx.catalog, table)
    doc = {"table": log_table.identifier, "producers": dict(log_table.state().producers)}
    ctx.emit(doc, lambda d: _table(
        [[pid, e["client"], e["epoch"], ", ".join(f"{p}:{s['last_seq']}" for p, s in e["partitions"].items())] for pid, e in sorted(d["producers"].items(), key=lambda kv: int(kv[0]))],
        ["producer_id", "client_id", "epoch", "last sequence per partition"], d["table"]))


@producers.command("rebuild")
@click.argument("table")
@click.pass_obj
def producers_rebuild(ctx: Context, table: str) -> None:
    """Recompute producer state from the rows (they carry producer id, epoch, sequence)."""
    from storage.log.table import LogTable
    from storage.producers.idempotent import rebuild

    name = LogTable.open(ctx.catalog, table).identifier
    state = rebuild(ctx.catalog, name)
    ctx.emit({"table": name, "producers": state}, lambda d: click.echo(f"rebuilt state of {len(d['producers'])} producers"))


# --- validate / sql / maintain --------------------------------------------------------------


@cli.command()
@click.argument("table")
@click.option("--deep", is_flag=True, help="Read every offset with DuckDB (default: manifests only).")
@click.option("--check", "check_names", multiple=True, help="Run these checks (repeatable): contiguity, contiguity-deep, producers.")
@click.option("--snapshot", "snapshot_id", type=SNAPSHOT_ID, default=None, help="Check an older snapshot (watermarks are only kept for the current one).")
@click.pass_obj
def validate(ctx: Context, table: str, deep: bool, check_names: tuple[str, ...], snapshot_id: int | None) -> None:
    """Check I1 contiguity and watermarks (and more with --check); exit 1 on any violation."""
    from storage.log.table import LogTable
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
@click.argument("table", required=False)
@click.option("--all", "all_tables", is_flag=True, help="Report every log table, plus an index page with each table's status.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Folder for index.html (default: $ICELOG_HOME/reports/TABLE, or $ICELOG_HOME/reports with --all).")
@click.option("--no-gx", is_flag=True, help="Skip the Great Expectations suite.")
@click.option("--full", is_flag=True, help="Re-validate every row (default: only rows committed since the last validation that passed).")
@click.option("--engine", type=click.Choice(["auto", "pandas", "spark"]), default="auto", show_default=True, help="GX engine; auto picks Spark above $ICELOG_GX_SPARK_ROWS rows in scope.")
@click.option("--expectations", type=click.Path(dir_okay=False), default=None, help="Payload expectations file (default: expectations/TABLE.json).")
@click.pass_obj
def report(ctx: Context, table: str | None, all_tables: bool, out: str | None, no_gx: bool, full: bool, engine: str, expectations: str | None) -> None:
    """Write an HTML report: partitions, files, freshness, history charts, validation, GX Data Docs."""
    from pipelines.spark import spark_session
    from storage.core.catalog import icelog_home
    from storage.log.table import LogTable
    from validations.report import build_index, build_report

    if bool(table) == all_tables:
        raise click.UsageError("name one TABLE, or --all")
    options = {"gx": not no_gx, "full": full, "engine": engine, "spark": lambda: spark_session(app_name="icelog-report")}
    if all_tables:
        with _progress(ctx, "building the report of every log table"):
            index = build_index(ctx.catalog, out or str(icelog_home() / "reports"), **options)
        tables = json.loads((index.parent / "index.json").read_text())
        doc = {"ok": all(t.get("ok") for t in tables), "report": str(index), "tables": tables}
        ctx.emit(doc, lambda d: click.echo(f"{'OK' if d['ok'] else 'ATTENTION'}: {len(d['tables'])} tables, file://{d['report']}"))
        return
    log_table = LogTable.open(ctx.catalog, table)
    target = out or str(icelog_home() / "reports" / log_table.identifier)
    with _progress(ctx, f"building the report of {log_table.identifier}"):
        page = build_report(log_table.table(), target, expectations_file=expectations, **options)
    doc = json.loads((page.parent / "report.json").read_text())
    ctx.emit({"table": log_table.identifier, "ok": doc["ok"], "report": str(page), "quality_scope": doc["quality_scope"]}, lambda d: click.echo(f"{'OK' if d['ok'] else 'VIOLATIONS'}: file://{d['report']}"))


@contextlib.contextmanager
def _progress(ctx: Context, what: str) -> Iterator[Callable[[str], None]]:
    """A status line on stderr for long work in text mode (JSON output stays clean).

    Yields a function that updates the line with the latest progress.
    """
    if ctx.output == "json":
        yield lambda line: None
        return
    from rich.console import Console

    with Console(stderr=True).status(what) as status:
        yield lambda line: status.update(f"{what}: {line}")


def _query_failed(e: Exception) -> bool:
    """A DuckDB error caused by the query (exit 2), not by the machine or a bug (exit 4)."""
    import duckdb

    internal = tuple(
        getattr(duckdb, n) for n in ("IOException", "InternalException", "OutOfMemoryException", "FatalException", "HTTPException") if hasattr(duckdb, n)
    )
    if "Required module" in str(e):  # a Python package DuckDB needs is missing: not the query's fault
        return False
    return isinstance(e, duckdb.Error) and not isinstance(e, internal)


@cli.command()
@click.argument("query")
@click.option("--snapshot", "snapshot_id", type=SNAPSHOT_ID, default=None, help="Time travel to this snapshot (needs --table).")
@click.option("--as-of", "as_of", default=None, help="Time travel: every table as it was at this ISO-8601 time (UTC unless it has an offset).")
@click.option("--table", "only", default=None, help="Expose only this table.")
@click.option("--consistent/--no-consistent", default=True, show_default=True, help="Read every table at one catalog instant (never half a transaction), or one by one as a plain reader does.")
@click.pass_obj
def sql(ctx: Context, query: str, snapshot_id: int | None, as_of: str | None, only: str | None, consistent: bool) -> None:
    """Run a DuckDB QUERY with every log table as a view (e.g. select count(*) from db.events)."""
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable command-line bytes arrive as lone surrogates
        raise InvalidInput(reason=f"the query is not UTF-8 (character {e.start})") from e
    con = _duckdb(snapshot_id, as_of, only, ctx, consistent)
    try:
        cursor = con.execute(query)
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall()
    except Exception as e:
        if _query_failed(e):
            raise InvalidInput(reason=f"query failed: {e}") from e
        raise
    ctx.emit({"columns": columns, "rows": [list(r) for r in rows]}, lambda d: _table(d["rows"], d["columns"]))


def _read_statements(ctx: Context):
    """Yield ``(line number, text)`` of each line of the shell's input; prompts only on a terminal."""
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    interactive = sys.stdin.isatty()
    number = 0
    while True:
        number += 1
        if interactive and ctx.output == "text":
            try:
                yield number, input("duckdb> ")
            except EOFError:
                return
            continue
        if interactive:
            click.echo("duckdb> ", err=True, nl=False)
        raw = stdin.readline()
        if not raw:
            return
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedInput(line=number, reason=f"not UTF-8 (byte {e.start} of the line)") from e


@cli.command("duckdb")
@click.option("--snapshot", "snapshot_id", type=SNAPSHOT_ID, default=None, help="Time travel to this snapshot (needs --table).")
@click.option("--as-of", "as_of", default=None, help="Time travel: every table as it was at this ISO-8601 time.")
@click.option("--table", "only", default=None, help="Expose only this table.")
@click.pass_obj
def duckdb_shell(ctx: Context, snapshot_id: int | None, as_of: str | None, only: str | None) -> None:
    """A DuckDB prompt with every log table as a view; statements end with ';' (end with Ctrl-D).

    Reads standard input too (``icelog duckdb < queries.sql``). With ``--output json`` it
    prints one document at the end: ``{"results": [{"statement", "columns", "rows"} or
    {"statement", "error", "message"}]}``. Exit code 2 if any statement failed.
    """
    con = _duckdb(snapshot_id, as_of, only, ctx)
    if sys.stdin.isatty():
        click.echo("icelog duckdb: log tables are views (try: show all tables;). End with Ctrl-D.", err=True)
    results: list[dict[str, Any]] = []
    buffer = ""

    def run(statement: str) -> None:
        try:
            cursor = con.execute(statement)
            columns = [d[0] for d in cursor.description or []]
            rows = cursor.fetchall() if columns else []
        except Exception as e:
            if not _query_failed(e):
                raise
            results.append({"statement": statement.strip(), "error": type(e).__name__, "message": str(e)})
            if ctx.output == "text":
                click.echo(f"error: {_one_line(str(e))}", err=True)
            return
        results.append({"statement": statement.strip(), "columns": columns, "rows": [list(r) for r in rows]})
        if ctx.output == "text" and columns:
            _table([list(r) for r in rows], columns)

    for _, line in _read_statements(ctx):
        buffer += line if line.endswith("\n") else line + "\n"
        if buffer.strip().endswith(";"):
            run(buffer)
            buffer = ""
    if buffer.strip():
        run(buffer)  # the last statement may omit its ';'
    if ctx.output == "json":
        click.echo(dumps({"results": results}))
    if any("error" in r for r in results):
        sys.exit(EXIT_BAD_INPUT)


def _duckdb(snapshot_id: int | None, as_of: str | None, only: str | None, ctx: Context, consistent: bool = True):
    from validations.sql import connect

    if snapshot_id is not None and not only:
        raise InvalidInput(reason="--snapshot names one table's snapshot: add --table")
    if snapshot_id is not None and as_of is not None:
        raise InvalidInput(reason="time travel takes --snapshot or --as-of, not both")
    as_of_ms = parse_as_of(as_of) if as_of is not None else None
    return connect(ctx.catalog, snapshot_id=snapshot_id, as_of_ms=as_of_ms, only=only, consistent=consistent)


def parse_as_of(text: str) -> int:
    """An ISO-8601 time as epoch milliseconds (a time without an offset is UTC)."""
    try:
        moment = dt.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.timezone.utc)
        return int(moment.timestamp() * 1000)
    except (ValueError, OverflowError) as e:
        raise InvalidInput(reason=f"--as-of: not an ISO-8601 time: {_clip(text)!r}") from e


@cli.command()
@click.argument("table")
@click.option("--retention-ms", type=POSITIVE_INT64, default=None, help="Drop files whose newest row is older (default: table property icelog.retention.ms).")
@click.option("--retention-bytes", type=POSITIVE_INT64, default=None, help="Keep at most this many bytes per partition.")
@click.option("--keep-snapshots", type=click.IntRange(1, INT32_MAX), default=5, show_default=True)
@click.option("--orphan-age-s", type=FiniteFloatRange(min=0), default=3600.0, show_default=True, help="Only delete unreferenced files older than this.")
@click.pass_obj
def maintain(ctx: Context, table: str, retention_ms: int | None, retention_bytes: int | None, keep_snapshots: int, orphan_age_s: float) -> None:
    """Retention, compaction, snapshot expiry and orphan cleanup for TABLE."""
    from storage.log.maintenance import maintain as run
    from storage.log.table import LogTable

    name = LogTable.open(ctx.catalog, table).identifier
    with _progress(ctx, f"maintaining {name}: retention, compaction, expiry, orphans"):
        report = run(ctx.catalog, name, retention_ms=retention_ms, retention_bytes=retention_bytes, keep_snapshots=keep_snapshots, orphan_age_s=orphan_age_s)
    ctx.emit(report, lambda d: click.echo(json.dumps(jsonable(d), indent=2)))


# --- repair / transactions ---------------------------------------------------------------------


@cli.command()
@click.argument("table")
@click.option("--mode", type=click.Choice(["auto", "adopt", "rollback"]), default="auto", show_default=True, help="auto: adopt foreign rows that extend the log exactly, else roll back.")
@click.pass_obj
def repair(ctx: Context, table: str, mode: str) -> None:
    """Repair TABLE after a foreign (non-icelog) commit: adopt it, or roll back to icelog's last snapshot."""
    from storage.log.repair import repair as run

    report = run(ctx.catalog, table, mode)  # type: ignore[arg-type]

    def text(d: dict) -> None:
        if d["action"] == "none":
            click.echo(f"{d['table']}: nothing to repair")
        elif d["action"] == "adopted":
            click.echo(f"{d['table']}: adopted {len(d['foreign_snapshots'])} foreign snapshots, rows per partition {d['rows']}")
        else:
            to = f"snapshot {d['icelog_snapshot_id']}" if d["icelog_snapshot_id"] is not None else "the empty table"
            click.echo(f"{d['table']}: rolled back to {to}, dropped {d['dropped_rows']} rows, restored {d['restored_rows']} rows ({d['reason']})")

    ctx.emit(report, text)


@cli.group()
def transactions() -> None:
    """The transaction coordinator: open transactions, recovery, the journal."""


@transactions.command("list")
@click.pass_obj
def transactions_list(ctx: Context) -> None:
    """Every transactional id with its producer id, epoch and open transaction."""
    from storage.producers.journal import transactional_ids

    state = transactional_ids(ctx.catalog)
    rows = [
        {"transactional_id": tid, "producer_id": e["producer_id"], "epoch": e["epoch"], "txn_id": (e.get("txn") or {}).get("id"), "state": (e.get("txn") or {}).get("state")}
        for tid, e in sorted(state.items())
    ]
    ctx.emit({"transactional_ids": rows}, lambda d: _table([list(r.values()) for r in d["transactional_ids"]], ["transactional_id", "producer_id", "epoch", "open txn", "state"]))


@transactions.command("describe")
@click.argument("txn_id")
@click.pass_obj
def transactions_describe(ctx: Context, txn_id: str) -> None:
    """The journal records of one transaction (BEGIN ... COMMITTED or ABORTED)."""
    from validations.sql import connect

    if not txn_id.isalnum() or len(txn_id) > 64:
        raise InvalidInput(reason=f"a transaction id is up to 64 letters and digits, not {_clip(txn_id)!r}")
    from storage.core.staging import JOURNAL
    from storage.producers.journal import ensure_journal

    ensure_journal(ctx.catalog)
    con = connect(ctx.catalog, only=JOURNAL)
    rows = con.execute(
        "SELECT log_offset, log_timestamp, transactional_id, txn_producer_id, txn_epoch, txn_state, detail FROM icelog_system.transactions WHERE txn_id = $id ORDER BY log_offset",
        {"id": txn_id},
    ).fetchall()
    if not rows:
        raise InvalidInput(reason=f"no transaction {txn_id} in the journal")
    records = [{"offset": r[0], "time": r[1], "transactional_id": r[2], "producer_id": r[3], "epoch": r[4], "state": r[5], "detail": json.loads(r[6])} for r in rows]
    ctx.emit({"txn_id": txn_id, "records": records}, lambda d: _table([[r["offset"], r["time"], r["state"], json.dumps(r["detail"])] for r in d["records"]], ["offset", "time", "state", "detail"], txn_id))


@transactions.command("recover")
@click.pass_obj
def transactions_recover(ctx: Context) -> None:
    """Roll forward prepared transactions, abort those idle past their timeout (idempotent).

    A transaction it cannot finish does not stop the others: RecoveryIncomplete (exit 2) names
    each one with its error after the rest are done."""
    from storage.producers.transactional import recover

    report = recover(ctx.catalog)
    ctx.emit(report, lambda d: click.echo(f"rolled forward {len(d['rolled_forward'])}, aborted {len(d['aborted'])}"))


@transactions.command("abort")
@click.argument("transactional_id")
@click.option("--missing-files", is_flag=True, help="Also abort a prepared transaction whose staged files are gone (PreparedFilesMissing); refused while they all exist.")
@click.pass_obj
def transactions_abort(ctx: Context, transactional_id: str, missing_files: bool) -> None:
    """Abort TRANSACTIONAL_ID's open transaction (a prepared one cannot be aborted: it will commit)."""
    from storage.producers.transactional import abort

    report = abort(ctx.catalog, transactional_id, missing_files=missing_files)
    ctx.emit(report, lambda d: click.echo(f"aborted {d['aborted']}" if d["aborted"] else "no open transaction"))


# Command groups kept in their own modules register on import (they import ``cli`` from here).
from pipelines import cli_group_job, cli_groups, cli_mirror  # noqa: E402,F401


def main() -> None:
    cli(prog_name="icelog")


if __name__ == "__main__":
    main()

"""The ``icelog`` command line: one Click group, ``--output text|json``, typed exit codes.

Exit codes: 0 success; 1 validation found violations; 2 bad input or usage;
3 conflict (offset mismatch, fenced producer, lost commit races); 4 any other error;
5 not authorized (a missing permission, ``icelog acls``).

The code follows from the error's type (``storage.errors``): a :class:`ConflictError` is 3,
an :class:`InvalidInput` or another :class:`TerminalError` is 2, anything else is 4, an
unexpected exception included. With ``--output json`` every run prints exactly one JSON
document on stdout, errors included (``{"error": "<Type>", "message": ..., <fields>}``);
in text mode an error is one line on stderr, ``error: <Type>: <message>``. Click's usage
errors print the same way (no usage block), with ``(see icelog CMD --help)`` in text and
``"help"`` in JSON. ``ICELOG_LOG_LEVEL=debug`` adds the traceback on stderr.

JSON values: dates and times are ISO 8601 strings (``timestamptz`` with its offset, UTC),
binary values are base64 strings (RFC 4648, as Kafka's REST proxy does), decimals are
strings (exact), and non-finite floats are the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"``.

This module is the floor of the package: the command modules beside it import it, and it
imports none of them (``pipelines.cli`` adds their commands to :data:`cli`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import decimal
import json
import math
import numbers
import sys
import traceback
from typing import Any, Callable, Iterable, Iterator

import click

from icelog.storage.errors import AuthorizationFailed, ConflictError, IcelogError, InvalidInput, InvalidSetting, TerminalError
from icelog.storage.settings import LOG_LEVEL, Settings
from icelog.validations.verdict import plural  # noqa: F401 - the one plural rule, for every command

EXIT_VIOLATIONS, EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_OTHER, EXIT_UNAUTHORIZED = 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C (click's Abort exits 1: "violations" here)

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_PARTITIONS = 100_000


def exit_code(error: BaseException) -> int:
    """The exit code an error's type implies."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
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


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    # Before the group's callback (a usage error, malformed settings): the one variable, which never is.
    level = obj.settings.log_level if obj is not None else LOG_LEVEL.read()
    return (level or "").lower() == "debug"


def one_line(text: str) -> str:
    return " ".join(text.split())


# --- context, errors, the group ------------------------------------------------------------


# The commands that can write into an empty catalog: on a missing embedded home they create it.
# Every other command opens an existing home only, so a read started outside a project creates
# nothing and names the home it looked for (CatalogNotFound); a write that needs a table would find
# none in a new home anyway. ingest, consume-produce and a mirror's target open their catalogs
# themselves, as writers.
CREATES_HOME = frozenset({"topics create", "acls add"})


class Context:
    """What the global options chose (the catalog, the output format) and the settings read at
    start (``storage.settings``), shared by every command."""

    def __init__(self, settings: Settings, output: str) -> None:
        self.settings = settings
        self.catalog_name = settings.catalog
        self.output = output
        self._catalog = None

    def override(self, name: str, value: Any) -> None:
        """A global option given again after the command name: that value wins."""
        setattr(self, name, value)
        if name == "catalog_name":
            self._catalog = None

    @property
    def catalog(self):
        if self._catalog is None:
            from icelog.storage.core.catalog import open_catalog

            self._catalog = open_catalog(self.catalog_name, create=self.command in CREATES_HOME, settings=self.settings)
        return self._catalog

    @property
    def opened(self) -> bool:
        """Whether the catalog is open already (a command that reads it lightly then uses it)."""
        return self._catalog is not None

    def light_metadata(self, table: str, *, log_table: bool = True) -> tuple[str, dict[str, Any]] | None:
        """``table``'s qualified name and current metadata (parsed JSON), read without opening the
        catalog (:mod:`icelog.storage.core.pointer`) while it is not open yet; None when that read
        does not apply or finds no table (no log table, unless ``log_table`` is False): the command
        then reads through the catalog, which also names any error."""
        from icelog.storage.core.pointer import current_metadata
        from icelog.storage.log.names import parse_identifier, qualified
        from icelog.storage.properties import FORMAT

        if self.opened:
            return None
        choice = self.light_catalog()
        identifier = qualified(table)
        metadata = current_metadata(choice.name, choice.properties, *parse_identifier(identifier))
        if metadata is None or (log_table and FORMAT not in (metadata.get("properties") or {})):
            return None
        return identifier, metadata

    def light_catalog(self) -> Any:
        """The catalog the options chose, decided without opening it (its errors are
        ``open_catalog``'s: a read's home must exist)."""
        from icelog.storage.core.catalog_config import choose_catalog

        return choose_catalog(self.catalog_name, self.settings, must_exist=self.command not in CREATES_HOME)

    @property
    def command(self) -> str:
        """The running command's name below ``icelog`` (``"topics create"``), or ``""``."""
        click_ctx = click.get_current_context(silent=True)
        return " ".join(click_ctx.command_path.split()[1:]) if click_ctx is not None else ""

    def emit(self, doc: Any, text: Callable[[Any], None] | None = None) -> None:
        if self.output == "json" or text is None:
            click.echo(dumps(doc))
        else:
            text(doc)


def _json_requested(args: list[str]) -> bool:
    """Whether the command line asks for ``--output json`` (before or after the command name;
    the last one given wins, as in Click). Read before parsing, so that a usage error found
    anywhere is reported in the format asked for."""
    wanted = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--output" and i + 1 < len(args):
            wanted = args[i + 1]
        elif arg.startswith("--output="):
            wanted = arg.partition("=")[2]
    return wanted == "json"


def _json_mode(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    if obj is not None:
        return obj.output == "json"
    return bool(ctx.meta.get("icelog.json"))


def help_command(ctx: click.Context | None) -> str | None:
    """``icelog topics list --help`` for the command ``ctx`` runs: the hint a usage error ends with.
    Named ``icelog`` whatever the program name Click was given (a test runner calls it ``cli``)."""
    if ctx is None:
        return None
    return " ".join(["icelog", *ctx.command_path.split()[1:], "--help"])


def error_line(kind: str, message: str, hint: str = "") -> str:
    """An error as text mode prints it, on one line of stderr: ``error: <Type>: <message><hint>``."""
    return f"error: {kind}: {one_line(message)}{hint}"


def _usage_error(e: click.ClickException, json_mode: bool) -> None:
    """Click's own errors (usage, bad option values) written as icelog writes its typed errors:
    ``error: <Type>: <message> (see icelog CMD --help)`` on stderr, or in JSON mode one document
    ``{"error", "message", "param", "help"}``; exit 2. Click's usage block is not printed."""
    if e.exit_code == EXIT_VIOLATIONS:  # e.g. click.FileError: 1 means "violations" here
        e.exit_code = EXIT_BAD_INPUT
    usage_ctx = getattr(e, "ctx", None)
    if isinstance(e, click.exceptions.NoArgsIsHelpError):
        if not json_mode:
            return  # a group named alone (`icelog topics`): its help is the answer, on stderr
        doc: dict[str, Any] = {"error": "UsageError", "message": "Missing command."}
    else:
        doc = {"error": type(e).__name__, "message": e.format_message()}
    param = getattr(e, "param", None)
    if param is not None and param.name:
        doc["param"] = param.name
    help_hint = help_command(usage_ctx) if isinstance(e, click.UsageError) else None
    if help_hint:
        doc["help"] = help_hint
    if json_mode:
        e.show = lambda file=None: click.echo(dumps(doc))  # type: ignore[method-assign]
    else:
        line = error_line(doc["error"], doc["message"], f" (see {help_hint})" if help_hint else "")
        e.show = lambda file=None: click.echo(line, err=True)  # type: ignore[method-assign]


def _fail(ctx: click.Context, error: BaseException) -> None:
    code = exit_code(error)
    if isinstance(error, IcelogError):
        doc = error.to_dict()
    elif isinstance(error, KeyboardInterrupt):
        doc = {
            "error": "Interrupted",
            "message": "stopped by Ctrl-C; what was committed before it stays, nothing after it was written",
        }
    else:
        doc = {"error": type(error).__name__, "message": str(error) or repr(error)}
    if _debug(ctx):
        traceback.print_exception(error, file=sys.stderr)
    if _json_mode(ctx):
        click.echo(dumps(doc))
    else:
        known = isinstance(error, (IcelogError, KeyboardInterrupt))
        hint = "" if known or _debug(ctx) else " (ICELOG_LOG_LEVEL=debug shows the traceback)"
        click.echo(error_line(doc["error"], str(doc["message"]), hint), err=True)
    sys.exit(code)


# The global options, declared once. The group takes them before the command name, with their
# defaults; IcelogGroup.add_command gives every command them again, without defaults, so that
# `icelog topics list --output json` works as `icelog --output json topics list` does. A value
# given after the command name wins (its callback runs after the group's).
GLOBAL_OPTIONS: list[tuple[list[str], dict[str, Any], dict[str, Any]]] = [
    # (declarations, attributes, attributes on the group only)
    (
        ["--catalog", "catalog_name"],
        {
            "metavar": "NAME",
            "help": "pyiceberg catalog name (default: $ICELOG_CATALOG, else the embedded SQLite catalog under $ICELOG_HOME).",
        },
        {"default": None},  # then $ICELOG_CATALOG: Settings.load
    ),
    (
        ["--output"],
        {"type": click.Choice(["text", "json"]), "help": "text for people; json prints one JSON document per run."},
        {"default": "text", "show_default": True},
    ),
]


def _override(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    obj = ctx.find_object(Context)
    if value is not None and obj is not None and param.name:
        obj.override(param.name, value)


def _group_options(f: Callable) -> Callable:
    for decls, attrs, on_group in reversed(GLOBAL_OPTIONS):
        f = click.option(*decls, **attrs, **on_group)(f)
    return f


def add_global_options(command: click.Command) -> None:
    """Give ``command`` (every command under it, for a group) the global options."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)
        return
    if any(getattr(p, "callback", None) is _override for p in command.params):
        return  # already given (a command registered twice)
    mine = [
        click.Option(decls, **attrs, default=None, expose_value=False, callback=_override) for decls, attrs, _ in GLOBAL_OPTIONS
    ]
    clash = {opt for p in command.params for opt in p.opts} & {opt for o in mine for opt in o.opts}
    if clash:
        raise RuntimeError(f"{command.name}: {sorted(clash)} are global options")
    command.params.extend(mine)


class IcelogGroup(click.Group):
    """The top-level group: one place that turns every error into output and an exit code, and
    that gives every command the global options."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        add_global_options(cmd)
        super().add_command(cmd, name)

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
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
            # a usage error after the command name may come before its --output was parsed
            _usage_error(e, bool(ctx.meta.get("icelog.json")))
            raise
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every error leaves as output plus an exit code
            _fail(ctx, e)


EPILOG = """\b
Exit codes: 0 ok, 1 violations, 2 bad input or usage, 3 conflict, 4 any other error, 5 not authorized,
130 interrupted (Ctrl-C).
--output json prints one JSON document per run, errors included: {"error", "message", ...};
--format only shapes text output (consume --format jsonl streams JSON Lines).
Offset ranges are half-open, as Kafka's log start and end offsets: [0, 164) is offsets 0 to 163, 164 records.
Times are ISO 8601 (UTC) in text and JSON output; numbers have no thousands separators.
JSON values: times ISO 8601, binary base64, decimals strings, NaN/Infinity strings.
"""


@click.group(cls=IcelogGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@_group_options
@click.version_option(package_name="icelog", prog_name="icelog", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, catalog_name: str | None, output: str) -> None:
    """icelog: Kafka partition-log guarantees on Apache Iceberg tables.

    The global options --catalog and --output go before or after the command name.
    """
    # The settings main() read, else read now (cli invoked in-process); --catalog wins over them.
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings.load()
    ctx.obj = Context(dataclasses.replace(settings, catalog=catalog_name) if catalog_name else settings, output)


def main() -> None:
    """The ``icelog`` script: the settings read once, logging as ``ICELOG_LOG_LEVEL`` asks, then the command line."""
    try:
        settings: Settings | None = Settings.load()
    except InvalidSetting:
        settings = None  # cli reads them again and reports the error, in the output format asked for
    if settings is not None and settings.log_level:
        # Only when asked: structlog costs a fifth of a second at start-up, and unconfigured
        # Python already shows warnings on stderr. Never in ``cli``: tests invoke it in-process.
        from icelog.storage.telemetry import configure

        configure(settings.log_level)
    cli(prog_name="icelog", obj=settings)


# --- option types --------------------------------------------------------------------------


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also rejects NaN and infinity (NaN compares false to every bound)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


class LazyChoice(click.Choice):
    """A Choice whose choices a function gives when first needed (parsing a value, the help),
    so that the list can stay in its one home however heavy that module is to import: the
    command's module imports nothing at start-up, only ``-h`` and the command itself do."""

    def __init__(self, load: Callable[[], Iterable[str]]) -> None:
        self._load = load
        self._loaded: tuple[str, ...] | None = None
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        if self._loaded is None:
            self._loaded = tuple(self._load())
        return self._loaded

    @choices.setter
    def choices(self, value: Iterable[str]) -> None:
        pass  # Choice.__init__ sets them; they come from ``load``


class LogTime(click.ParamType):
    """A time on the command line: ISO 8601 (UTC without an offset) or epoch milliseconds >= 0,
    within the dates a ``log_timestamp`` reads back as (years 1 to 9999).

    Converts to epoch microseconds, the precision of ``log_timestamp``.
    """

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):  # converted already
            return value
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        text = str(value).strip()
        if text[:1] == "-" and text[1:].isdigit():
            self.fail(f"{clip(text)}: epoch milliseconds are >= 0; give a time before 1970 in ISO 8601.", param, ctx)
        try:
            if text.isdigit():
                if len(text) > 20:  # before int(): no 4300-digit conversions
                    raise OverflowError(text)
                at_us = int(text) * 1000
            else:
                moment = dt.datetime.fromisoformat(text)
                at_us = (moment.replace(tzinfo=moment.tzinfo or dt.UTC) - epoch) // dt.timedelta(microseconds=1)
            epoch + dt.timedelta(microseconds=at_us)  # a date in UTC, as the answer shows it
        except ValueError:
            self.fail(f"{clip(text)!r} is neither an ISO 8601 time nor epoch milliseconds.", param, ctx)
        except OverflowError:
            self.fail(f"{clip(text)!r} is beyond any date (years 1 to 9999 in UTC).", param, ctx)
        return at_us


PARTITION_COUNT = click.IntRange(1, MAX_PARTITIONS)
PARTITION = click.IntRange(0, MAX_PARTITIONS - 1)
OFFSET = click.IntRange(0, INT64_MAX)
SNAPSHOT_ID = click.IntRange(1, INT64_MAX)
PRODUCER_ID = click.IntRange(0, INT64_MAX)
INT32 = click.IntRange(0, INT32_MAX)
POSITIVE_INT64 = click.IntRange(1, INT64_MAX)


# --- text output ---------------------------------------------------------------------------


# Every command writes values, counts and empty lists one way in its text output:
# - times ISO 8601 with "T" and their offset, as in the JSON output (2026-11-01T00:00:00+00:00);
# - numbers without thousands separators (3981, never 3,981), as a script reads them back;
# - a count with its noun in the right number (1 row, 2 rows: plural);
# - an empty list as "no <things>" on one line (echo_list, print_table's ``empty``).


def text_value(value: Any) -> str:
    """``value`` as text output writes it: times ISO 8601 with ``T`` and their offset, binary
    base64, decimals exact, booleans and null as in JSON, numbers without separators."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time, bytes, bytearray, memoryview, decimal.Decimal)):
        return jsonable(value)
    return str(value)


def echo_list(items: Iterable[str], what: str) -> None:
    """One item per line, or ``no <what>`` for none."""
    click.echo("\n".join(items) or f"no {what}")


def _text(value: Any) -> Any:
    """A cell for rich: plain text (never markup), written as :func:`text_value` writes it."""
    from rich.text import Text  # rich loads only when text output needs it, not at start-up

    return Text(text_value(value))


def print_table(rows: list[list[Any]], headers: list[str], title: str | None = None, empty: str | None = None) -> None:
    """``rows`` as a table; with ``empty`` and no rows, the line ``<title>: no <empty>`` instead."""
    from rich.table import Table as RichTable

    from icelog.pipelines.progress import console

    if empty is not None and not rows:
        click.echo(f"{title}: no {empty}" if title else f"no {empty}")
        return
    table = RichTable(title=title)
    for header in headers:
        table.add_column(_text(header))
    for row in rows:
        table.add_row(*(_text(c) for c in row))
    # Piped output keeps every column whole instead of squeezing it into 80 columns.
    console().print(table)


@contextlib.contextmanager
def status_line(ctx: Context, what: str) -> Iterator[Callable[[str], None]]:
    """A status line on stderr for long work in text mode (JSON output stays clean); where
    stderr is not a terminal, a plain progress line every ``ICELOG_PROGRESS_INTERVAL_S`` seconds.

    Yields a function that updates the line with the latest progress.
    """
    if ctx.output == "json":
        yield lambda line: None
        return
    from icelog.pipelines.progress import console, progress

    with progress(console(stderr=True), what, ctx.settings.progress_interval_s) as update:
        yield update


def clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"

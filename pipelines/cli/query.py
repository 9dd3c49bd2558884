"""``icelog sql`` and ``icelog duckdb``: DuckDB over every log table, with time travel."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click

from icelog.pipelines.cli.app import EXIT_BAD_INPUT, SNAPSHOT_ID, Context, clip, dumps, jsonable, one_line, print_table
from icelog.storage.errors import InvalidInput, MalformedInput


def _query_failed(e: Exception) -> bool:
    """A DuckDB error caused by the query (exit 2), not by the machine or a bug (exit 4)."""
    import duckdb

    internal = tuple(
        getattr(duckdb, n)
        for n in ("IOException", "InternalException", "OutOfMemoryException", "FatalException", "HTTPException")
        if hasattr(duckdb, n)
    )
    if "Required module" in str(e):  # a Python package DuckDB needs is missing: not the query's fault
        return False
    return isinstance(e, duckdb.Error) and not isinstance(e, internal)


SHOW_TABLES = re.compile(r"\s*show\s+tables\s*;?\s*", re.IGNORECASE)  # DuckDB's, made to list the log tables


@click.command()
@click.argument("query")
@click.option("--snapshot", "snapshot_id", type=SNAPSHOT_ID, default=None, help="Time travel to this snapshot (needs --table).")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    help="Time travel: every table as it was at this ISO-8601 time (UTC unless it has an offset).",
)
@click.option("--table", "only", default=None, help="Expose only this table.")
@click.option(
    "--consistent/--no-consistent",
    default=True,
    show_default=True,
    help="Read every table as one moment (never half a transaction), or one by one as a plain reader does.",
)
@click.option(
    "--format",
    "rows_format",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Text output as a table, CSV with a header, or a JSON array of row objects (--output json keeps its one document).",
)
@click.pass_obj
def sql(
    ctx: Context, query: str, snapshot_id: int | None, as_of: str | None, only: str | None, consistent: bool, rows_format: str
) -> None:
    """Run a DuckDB QUERY with every log table as a view (e.g. select count(*) from db.events)."""
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable command-line bytes arrive as lone surrogates
        raise InvalidInput(reason=f"the query is not UTF-8 (character {e.start})") from e
    con = _duckdb(snapshot_id, as_of, only, ctx, consistent)
    if SHOW_TABLES.fullmatch(query):
        # DuckDB's own SHOW TABLES lists the default schema only; the log tables are views in
        # their namespaces' schemas.
        query = (  # (an empty table's view reads a registered placeholder: not a table)
            "SELECT schema_name || '.' || view_name AS name FROM duckdb_views() "
            "WHERE NOT internal AND NOT starts_with(view_name, '__empty_') ORDER BY name"
        )
    try:
        cursor = con.execute(query)
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall()
    except Exception as e:
        if _query_failed(e):
            raise InvalidInput(reason=f"query failed: {e}") from e
        raise
    ctx.emit({"columns": columns, "rows": [list(r) for r in rows]}, ROW_FORMATS[rows_format])


def _print_csv(doc: dict[str, Any]) -> None:
    """RFC 4180 CSV with a header; values as the JSON output maps them, null as an empty field."""
    import csv
    import io
    import json

    def cell(value: Any) -> Any:
        value = jsonable(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, dict)):
            return json.dumps(value)
        return "" if value is None else value

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(doc["columns"])
    writer.writerows([cell(v) for v in row] for row in doc["rows"])
    click.echo(buffer.getvalue(), nl=False)


def _print_json_rows(doc: dict[str, Any]) -> None:
    click.echo(dumps([dict(zip(doc["columns"], row, strict=True)) for row in doc["rows"]]))


ROW_FORMATS = {
    "table": lambda d: print_table(d["rows"], d["columns"]),
    "csv": _print_csv,
    "json": _print_json_rows,
}


PROMPT, CONTINUE = "duckdb> ", "   ...> "  # the second until a statement ends with ';', as DuckDB's own shell
HISTORY_FILE = "duckdb_history"  # in $ICELOG_HOME, as DuckDB's shell keeps ~/.duckdb_history
HISTORY_LENGTH = 1000

DOT_COMMANDS = [
    [".tables", "the tables to query: every log table is a view named namespace.table"],
    [".schema [TABLE]", "the columns and types of TABLE (namespace.table, or just table), or of every table"],
    [".mode [table|csv|json]", "how results print (as sql --format); without an argument, the current mode"],
    [".output [FILE]", "write results to FILE (replaced), or back to the screen without FILE"],
    [".timer on|off", "after each statement, its run time on stderr"],
    [".read FILE", "run the statements and dot commands of FILE"],
    [".help", "this list"],
    [".quit, .exit", "leave the shell (Ctrl-D too); Ctrl-C drops the statement being typed or stops a running query"],
]

# DuckDB's own catalog of the connection: the views connect() made, and whatever the session created.
_TABLES_SQL = """
select schema_name || '.' || view_name as name from duckdb_views()
where database_name = current_database() and not internal
union all
select schema_name || '.' || table_name from duckdb_tables()
where database_name = current_database() and not internal
order by name
"""
_SCHEMA_SQL = """
select schema_name || '.' || table_name as "table", column_name as "column", data_type as "type"
from duckdb_columns()
where database_name = current_database() and not internal
  and ($name is null or schema_name || '.' || table_name = $name or table_name = $name)
order by schema_name, table_name, column_index
"""


def _complete(statement: str) -> bool:
    return statement.strip().endswith(";")


class _Shell:
    """One ``icelog duckdb`` session on ``con``: SQL statements and dot commands.

    Text output shows each result as it comes (errors as one line on stderr); JSON output
    collects them in ``results`` for one document at the end.
    """

    def __init__(self, con: Any, ctx: Context, *, interactive: bool) -> None:
        self.con = con
        self.ctx = ctx
        self.interactive = interactive
        self.results: list[dict[str, Any]] = []
        self.failed = False
        self.mode = "table"  # text output only: JSON output collects every result whole
        self.output: Any = None  # the file .output names; None: stdout
        self.timer = False
        self.reading: list[str] = []  # the .read files being run, outermost first (no file reads itself)

    def run(self, statement: str, sql: str | None = None, params: dict[str, Any] | None = None, empty: str = "") -> None:
        """Run ``statement`` (or a dot command's ``sql``) and show its result; no rows is the error ``empty`` if given."""
        import duckdb

        def query() -> tuple[list[str], list[list[Any]]]:
            cursor = self.con.execute(sql or statement, params)
            columns = [d[0] for d in cursor.description or []]
            return columns, [list(r) for r in cursor.fetchall()] if columns else []

        started = time.perf_counter()
        try:
            columns, rows = self._interruptible(query) if self.interactive else query()
        except Exception as e:
            # A person's shell outlives any DuckDB error; a script stops on one that is not the query's fault (exit 4).
            if not (_query_failed(e) or (self.interactive and isinstance(e, duckdb.Error))):
                raise
            self.error(statement, type(e).__name__, str(e))
            return
        finally:
            if self.timer and self.ctx.output == "text":
                click.echo(f"run time: {time.perf_counter() - started:.3f} s", err=True)
        if empty and not rows:
            self.error(statement, "NotFound", empty)
            return
        self.show(statement, columns, rows)

    def _interruptible(self, work: Callable[[], Any]) -> Any:
        """``work()`` in a thread, so that Ctrl-C interrupts DuckDB: Python handles the signal
        only in this main thread, and never while DuckDB's C++ code runs here."""
        outcome: dict[str, Any] = {}
        done = threading.Event()  # not Thread.join: a join that Ctrl-C interrupts can lose track of the thread

        def target() -> None:
            try:
                outcome["value"] = work()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread as it is
                outcome["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, name="icelog-duckdb-query", daemon=True).start()
        while not done.is_set():
            try:
                done.wait(0.1)
            except KeyboardInterrupt:  # the query ends with DuckDB's InterruptException: one error line
                self.con.interrupt()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def show(self, statement: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.ctx.output == "json":
            self.results.append({"statement": statement.strip(), "columns": columns, "rows": rows})
        elif columns:
            with contextlib.redirect_stdout(self.output) if self.output is not None else contextlib.nullcontext():
                ROW_FORMATS[self.mode]({"columns": columns, "rows": rows})

    def error(self, statement: str, kind: str, message: str) -> None:
        self.failed = True
        if self.ctx.output == "json":
            self.results.append({"statement": statement.strip(), "error": kind, "message": message})
        else:
            click.echo(f"error: {one_line(message)}", err=True)

    def dot(self, line: str) -> bool:
        """Run a dot command; False for ``.quit`` and ``.exit``."""
        command, *args = line.split()
        if command in (".quit", ".exit") and not args:
            return False
        if command == ".help" and not args:
            self.show(line, ["command", "what it shows"], DOT_COMMANDS)
        elif command == ".tables" and not args:
            self.run(line, _TABLES_SQL)
        elif command == ".schema" and len(args) <= 1:
            name = args[0].replace('"', "") if args else None
            self.run(line, _SCHEMA_SQL, {"name": name}, empty=f"no table {name!r} (.tables lists them)" if name else "")
        elif command == ".mode" and not args:
            self.show(line, ["mode"], [[self.mode]])
        elif command == ".mode" and len(args) == 1 and args[0] in ROW_FORMATS:
            self.mode = args[0]
        elif command == ".timer" and len(args) == 1 and args[0] in ("on", "off"):
            self.timer = args[0] == "on"
        elif command == ".output" and len(args) <= 1:
            self._redirect(line, args[0] if args else None)
        elif command == ".read" and len(args) == 1:
            self._read(line, args[0])
        else:
            self.error(line, "UnknownCommand", f"unknown command {line!r} (.help lists them)")
        return True

    def _redirect(self, line: str, path: str | None) -> None:
        """``.output FILE``: results go to FILE from now on (replaced); ``.output``: to stdout again."""
        try:
            target = open(path, "w", encoding="utf-8") if path is not None else None  # noqa: SIM115 - kept open until the next .output
        except OSError as e:
            self.error(line, "InvalidInput", f"cannot write {path}: {e.strerror or e}")
            return
        self.close()
        self.output = target

    def close(self) -> None:
        if self.output is not None:
            self.output.close()
            self.output = None

    def _read(self, line: str, path: str) -> None:
        """``.read FILE``: FILE's statements and dot commands, as a script."""
        where = str(Path(path).resolve())
        if where in self.reading:
            self.error(line, "InvalidInput", f"{path} is already being read (a .read loop)")
            return
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError as e:
            self.error(line, "InvalidInput", f"cannot read {path}: {e.strerror or e}")
            return
        except UnicodeDecodeError as e:
            self.error(line, "MalformedInput", f"{path} is not UTF-8 (byte {e.start})")
            return
        self.reading.append(where)
        try:
            self.script(text.splitlines(keepends=True))
        finally:
            self.reading.pop()

    def script(self, lines: Iterable[str]) -> None:
        """Statements from a script or a pipe: no prompt, no history; a last statement may omit its ';'."""
        buffer = ""
        for line in lines:
            if not buffer.strip() and line.lstrip().startswith("."):
                if not self.dot(line.strip()):
                    return
                continue
            buffer += line if line.endswith("\n") else line + "\n"
            if _complete(buffer):
                self.run(buffer)
                buffer = ""
        if buffer.strip():
            self.run(buffer)

    def prompt(self, history: Path | None) -> None:
        """The interactive shell: readline editing, one history entry per statement, kept in ``history``."""
        readline = _line_editing(history)
        lines: list[str] = []
        try:
            while True:
                try:
                    if not self._step(readline, lines):
                        return
                except KeyboardInterrupt:
                    # Ctrl-C: drop the statement being typed (or cut a printing result short), keep
                    # the shell. Caught around the whole step: the signal can land between two
                    # input() calls as well as inside one.
                    click.echo()
                    lines.clear()
        finally:
            if readline is not None and history is not None:
                with contextlib.suppress(OSError):
                    readline.write_history_file(history)

    def _step(self, readline: Any, lines: list[str]) -> bool:
        """Read one line and act on it; ``lines`` holds the statement typed so far. False: leave."""
        try:
            line = input(CONTINUE if lines else PROMPT)
            line.encode("utf-8")  # bytes that are not UTF-8 arrive as lone surrogates
        except EOFError:  # Ctrl-D: leave; a statement not ended with ';' is dropped
            click.echo()
            return False
        except UnicodeError as e:  # not decodable, or decoded to surrogates: DuckDB takes neither
            self.error("", "MalformedInput", f"not UTF-8 (at {e.start} in the line); the statement is dropped")
            lines.clear()
            return True
        if not lines and line.lstrip().startswith("."):
            if readline is not None:
                readline.add_history(line.strip())
            return self.dot(line.strip())
        if lines or line.strip():
            lines.append(line)
        if not lines or not _complete("\n".join(lines)):
            return True
        statement = "\n".join(lines)
        lines.clear()
        if readline is not None:  # one line, to recall and edit the whole statement
            readline.add_history(" ".join(part.strip() for part in statement.splitlines()))
        self.run(statement)  # Ctrl-C while it runs: DuckDB's one error line
        return True


def _line_editing(history: Path | None) -> Any:
    """The ``readline`` module for ``input()`` (editing, history), with ``history`` loaded; None without it."""
    try:
        import readline
    except ImportError:  # a Python built without readline: input() still works, unedited
        return None
    readline.set_auto_history(False)  # the shell adds one entry per statement, not one per line typed
    readline.set_history_length(HISTORY_LENGTH)
    if history is not None and history.is_file():
        with contextlib.suppress(OSError):
            readline.read_history_file(history)
    return readline


def _script_lines(prompt: bool) -> Iterator[str]:
    """The lines of standard input, read as bytes and decoded strictly (a bad byte is MalformedInput)."""
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    number = 0
    while True:
        number += 1
        if prompt:  # a terminal, but JSON output or no terminal for the results: prompts on stderr
            click.echo(PROMPT, err=True, nl=False)
        raw = stdin.readline()
        if not raw:
            return
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedInput(line=number, reason=f"not UTF-8 (byte {e.start} of the line)") from e


@click.command("duckdb")
@click.option("--snapshot", "snapshot_id", type=SNAPSHOT_ID, default=None, help="Time travel to this snapshot (needs --table).")
@click.option("--as-of", "as_of", default=None, help="Time travel: every table as it was at this ISO-8601 time.")
@click.option("--table", "only", default=None, help="Expose only this table.")
@click.pass_obj
def duckdb_shell(ctx: Context, snapshot_id: int | None, as_of: str | None, only: str | None) -> None:
    """A DuckDB shell with every log table as a view; statements end with ';'.

    On a terminal: line editing and history ($ICELOG_HOME/duckdb_history), dot commands
    (.tables, .schema [TABLE], .mode table|csv|json, .output [FILE], .timer on|off, .read FILE,
    .help, .quit); Ctrl-C drops the statement being typed or
    interrupts the running one, Ctrl-D leaves. Reads standard input too (``icelog duckdb <
    queries.sql``). With ``--output json`` it prints one document at the end: ``{"results":
    [{"statement", "columns", "rows"} or {"statement", "error", "message"}]}``. Exit code 2 if
    any statement failed.
    """
    con = _duckdb(snapshot_id, as_of, only, ctx)
    terminal = sys.stdin.isatty()
    shell = _Shell(con, ctx, interactive=terminal)
    if terminal and sys.stdout.isatty() and ctx.output == "text":
        home = ctx.settings.home
        history = home / HISTORY_FILE if home.is_dir() else None  # a read creates no home, not even for this
        kept = f"history in {history}" if history else f"no history kept ({home} does not exist)"
        click.echo(
            f"icelog duckdb on catalog {ctx.catalog.name!r}, {kept}.\n"
            "Log tables are views: .tables lists them, .help the commands. End statements with ';'; Ctrl-D exits.",
            err=True,
        )
        shell.prompt(history)
    else:
        if terminal:
            click.echo(f"icelog duckdb on catalog {ctx.catalog.name!r}: end statements with ';', Ctrl-D exits.", err=True)
        shell.script(_script_lines(prompt=terminal))
    shell.close()
    if ctx.output == "json":
        click.echo(dumps({"results": shell.results}))
    if shell.failed:
        sys.exit(EXIT_BAD_INPUT)


def _duckdb(snapshot_id: int | None, as_of: str | None, only: str | None, ctx: Context, consistent: bool = True):
    from icelog.validations.sql import connect  # DuckDB and pyiceberg: only the query commands load them

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
            moment = moment.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    except (ValueError, OverflowError) as e:
        raise InvalidInput(reason=f"--as-of: not an ISO-8601 time: {clip(text)!r}") from e

"""``icelog sql`` and ``icelog duckdb``: DuckDB over every log table, with time travel."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import click

from pipelines.cli.app import EXIT_BAD_INPUT, SNAPSHOT_ID, Context, clip, dumps, jsonable, one_line, print_table
from storage.errors import InvalidInput, MalformedInput


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
    help="Read every table at one catalog instant (never half a transaction), or one by one as a plain reader does.",
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


@click.command("duckdb")
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
                click.echo(f"error: {one_line(str(e))}", err=True)
            return
        results.append({"statement": statement.strip(), "columns": columns, "rows": [list(r) for r in rows]})
        if ctx.output == "text" and columns:
            print_table([list(r) for r in rows], columns)

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
    from validations.sql import connect  # DuckDB and pyiceberg: only the query commands load them

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

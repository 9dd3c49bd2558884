"""``icelog produce``: JSON Lines (or ``key<SEP>value`` lines) into one partition or routed by
key, batch by batch, and the line parsers."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
from typing import Any, BinaryIO, Callable, Iterator

import click

from icelog.pipelines.cli.app import (
    INT32,
    INT64_MAX,
    INT64_MIN,
    OFFSET,
    PARTITION,
    PRODUCER_ID,
    Context,
    clip,
    plural,
    status_line,
)
from icelog.storage.errors import InvalidInput, MalformedInput, SchemaMismatch, span


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
            raise MalformedInput(
                line=number, reason=f"not UTF-8 (byte {e.start} of the line: {raw[e.start : e.start + 1]!r})"
            ) from e
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
            raise MalformedInput(line=number, reason=f"integer {clip(str(e))} does not fit in 64 bits") from e
        except _NotFinite as e:
            raise MalformedInput(line=number, reason=f"number {clip(str(e))} overflows a double") from e
        if not isinstance(row, dict):
            raise MalformedInput(line=number, reason="each line must be a JSON object")
        if _SURROGATE_ESCAPE.search(line) and _lone_surrogate(row):
            raise MalformedInput(line=number, reason="a string holds an unpaired UTF-16 surrogate escape")
        yield number, row


def iter_key_value_lines(stream: BinaryIO, skip: int = 0, *, separator: str, key_column: str) -> Iterator[tuple[int, dict]]:
    """Parse ``KEY<separator>VALUE`` text lines lazily, as kafka-console-producer does with
    ``parse.key``: ``(line number, {key_column: KEY, "value": VALUE})`` per non-blank line,
    split at the first separator. The first ``skip`` non-blank lines are passed over.

    Raises:
        MalformedInput: with the line number, for a line that is not UTF-8 or has no separator.
    """
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise MalformedInput(line=number, reason=f"not UTF-8 (byte {e.start} of the line)") from e
        if not line.strip():
            continue
        if skip:
            skip -= 1
            continue
        key, found, value = line.partition(separator)
        if not found:
            raise MalformedInput(line=number, reason=f"no key separator {separator!r} in the line")
        yield number, {key_column: key, "value": value}


def rows_to_arrow(table: str, rows: list[tuple[int, dict]], payload: Any = None):
    """Rows as an Arrow table; binary payload columns take base64 strings."""
    import pyarrow as pa

    binary = (
        {f.name for f in payload if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)}
        if payload is not None
        else set()
    )
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
    arrays = {}
    for n, values in columns.items():
        try:
            arrays[n] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:  # e.g. text in one line, an object in another
            raise SchemaMismatch(table=table, reason=f"column {n!r}: {e}") from e
    return pa.table(arrays) if names else pa.table({})


@click.command()
@click.argument("table")
@click.option(
    "--partition",
    type=PARTITION,
    default=None,
    help="The partition to append to (default: each line goes to the partition of its key, hashed as ingest does).",
)
@click.option(
    "--key-separator",
    default=None,
    metavar="SEP",
    help="Lines are KEY SEP VALUE text, not JSON (kafka-console-producer's parse.key); '\\t' is a tab.",
)
@click.option(
    "--expected-offset",
    type=OFFSET,
    default=None,
    help="Line i (0-based, blank lines not counted) lands at offset K+i, each batch a conditional append (KIP-27); the log must end at K.",
)
@click.option(
    "--load-id",
    default=None,
    help="Names a resumable load (needs --expected-offset): re-run with the same id, it continues after its batches already committed.",
)
@click.option("--input", "input_file", type=click.File("rb"), default="-", help="JSON Lines file, UTF-8 (default: stdin).")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000_000),
    default=10_000,
    show_default=True,
    help="Lines per commit (bounds memory).",
)
@click.option(
    "--producer-id",
    type=PRODUCER_ID,
    default=None,
    help="Idempotent producer id (from producers init); goes with --epoch and --sequence.",
)
@click.option("--epoch", type=INT32, default=None, help="The producer's epoch (from producers init); an older one is fenced.")
@click.option("--sequence", type=INT32, default=None, help="First sequence number of this batch.")
@click.pass_obj
def produce(
    ctx: Context,
    table: str,
    partition: int | None,
    key_separator: str | None,
    expected_offset: int | None,
    load_id: str | None,
    input_file: BinaryIO,
    batch_size: int,
    producer_id: int | None,
    epoch: int | None,
    sequence: int | None,
) -> None:
    """Append JSON Lines rows to TABLE (binary columns take base64 strings), to one --partition
    or each row to the partition of its key.

    Without --partition a row goes where its key (the table's key column, icelog.key-column,
    default key) hashes, as ingest routes: CRC-32 of the key modulo the partition count. With
    --key-separator SEP each line is KEY SEP VALUE text, split at the first SEP, for the key
    column and value. The input streams in batches of --batch-size lines, one commit each
    (routed by key: one atomic commit across the batch's partitions). With
    --expected-offset K line i lands at offset K + i, and a log that does not end at K is an
    OffsetMismatch (exit 3). With --load-id as well the load is resumable: killed and run
    again with the same arguments, it continues after its own batches (found by commit id,
    never by content), and every line lands exactly once. Another writer appending meanwhile
    stops it with OffsetMismatch (exit 3): it never interleaves.
    """
    from icelog.storage.ingest.bulk import bulk_load, keyed_load
    from icelog.storage.log.schema import declared_key_column
    from icelog.storage.log.table import LogTable

    ids = (producer_id, epoch, sequence)
    if any(v is not None for v in ids) and any(v is None for v in ids):
        raise InvalidInput(reason="--producer-id, --epoch and --sequence go together")
    if partition is None and (expected_offset is not None or load_id is not None or producer_id is not None):
        raise InvalidInput(reason="--expected-offset, --load-id and --producer-id name one partition's offsets: add --partition")
    log_table = LogTable.open(ctx.catalog, table)
    lines = iter_json_lines
    if key_separator is not None:
        separator = "\t" if key_separator == "\\t" else key_separator
        if not separator:
            raise InvalidInput(reason="--key-separator must not be empty")
        key_column = declared_key_column(log_table.table().metadata.properties)
        lines = functools.partial(iter_key_value_lines, separator=separator, key_column=key_column)
    batches = _arrow_batches(input_file, batch_size, log_table.identifier, log_table.payload_schema(), lines)
    if partition is None:
        with status_line(ctx, "producing by key") as progress:
            routed = keyed_load(log_table, batches(0), progress=progress)
        ctx.emit({"table": log_table.identifier, **routed}, _routed_text)
        return
    producer = (producer_id, epoch, sequence) if producer_id is not None else None
    with status_line(ctx, "producing") as progress:
        result = bulk_load(log_table, partition, batches, expected_offset, load_id=load_id, producer=producer, progress=progress)
    doc = {
        "table": log_table.identifier,
        "partition": partition,
        **result,
        **({"load_id": load_id} if load_id is not None else {}),
    }
    if producer_id is None:
        doc.pop("duplicate", None)
    ctx.emit(doc, _produced_text)


def _arrow_batches(
    stream: BinaryIO,
    batch_size: int,
    table: str,
    payload: Any,
    lines: Callable[[BinaryIO, int], Iterator[tuple[int, dict]]] = iter_json_lines,
) -> Callable[[int], Iterator[Any]]:
    """The input as Arrow tables of ``batch_size`` lines each, from after the first ``skip`` lines.

    A resumed load passes over the lines its committed batches hold; a load with nothing
    left to skip yields at least one (perhaps empty) table.
    """

    def batches(skip: int) -> Iterator[Any]:
        pending: list[tuple[int, dict]] = []
        for item in lines(stream, skip):
            pending.append(item)
            if len(pending) == batch_size:
                yield rows_to_arrow(table, pending, payload)
                pending = []
        if pending or not skip:
            yield rows_to_arrow(table, pending, payload)

    return batches


def _routed_text(d: dict) -> None:
    written = ", ".join(f"p{p} {span(first, nxt)}" for p, (first, nxt) in d["partitions"].items()) or "nothing"
    click.echo(f"{d['table']} by {d['key_column']}: {written} ({plural(d['rows'], 'row')} in {plural(d['batches'], 'batch')})")


def _produced_text(d: dict) -> None:
    base, nxt = d["base_offset"], d["next_offset"]
    resumed = f", resumed after {d['resumed_lines']} lines already in the log" if d.get("resumed_lines") else ""
    if nxt == base:
        click.echo(f"{d['table']}[{d['partition']}] nothing to write{resumed}")
    else:
        duplicate = " (duplicate, not written)" if d.get("duplicate") else ""
        click.echo(
            f"{d['table']}[{d['partition']}] offsets {span(base, nxt)} "
            f"({plural(nxt - base, 'row')} in {plural(d['batches'], 'batch')}{resumed}){duplicate}"
        )

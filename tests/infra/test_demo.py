"""``make demo``'s own steps on a temporary catalog (the full run, Airflow and Spark included, is ``make demo``)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pyarrow.compute as pc
import pytest
from rich.console import Console

from icelog.pipelines.flights import PARTITIONS, create_table, load_flights, monthly_batches
from infra import demo


@pytest.fixture(scope="module")
def months():
    return monthly_batches(load_flights(), PARTITIONS)


def first_days(batch: dict, days: int) -> dict:
    return {p: rows.filter(pc.less_equal(rows["day"], days)) for p, rows in batch.items()}


def test_the_demo_passes_with_days_the_user_loaded_after_january(sqlite_catalog, months):
    # `make demo`, a backfill of 2013-02-01..02 from the UI, then `make demo` again.
    log_table, _ = create_table(sqlite_catalog)
    log_table.append({p: rows for p, rows in months[0].items() if rows.num_rows})
    log_table.append({p: rows for p, rows in first_days(months[1], 2).items() if rows.num_rows})
    out = io.StringIO()
    assert demo.check_january(Console(file=out, width=200), log_table)
    assert demo.january_flights(log_table) == (27_004, 27_004)
    assert "27004 rows dated January 2013 = the January 2013 flights (27004): yes (28612 rows in all" in out.getvalue()


GROUPED = re.compile(r"\d,\d{3}")  # a thousands separator: what text output never prints


def test_the_demo_summary_prints_numbers_without_thousands_separators(sqlite_catalog, months):
    from icelog.pipelines.flights import print_summary

    log_table, _ = create_table(sqlite_catalog)
    log_table.append({p: rows for p, rows in months[0].items() if rows.num_rows})
    out = io.StringIO()
    console = Console(file=out, width=200)
    assert print_summary(console, log_table) and demo.check_january(console, log_table)
    text = out.getvalue()
    ends = {w.end for w in log_table.watermarks().values()}
    assert all(re.search(rf"│ {end} +│", text) for end in ends), text  # each partition's log end, plain
    assert "(27004 rows in " in text and "27004 rows dated January 2013" in text, text
    assert not GROUPED.search(text), text


def test_validation_findings_print_numbers_without_thousands_separators():
    doc = {
        "snapshot_id": 7,
        "checks": {
            "snapshot_id": 7,
            "checks": ["contiguity"],
            "rows": 28612,
            "violations": [{"check": "contiguity", "kind": "gap", "partition": 0, "detail": "d"}] * 1200,
        },
        "quality": {"evaluated": 3, "failed": [], "scope": {"mode": "incremental", "rows": 1608, "engine": "duckdb"}},
    }
    lines, ok = demo.validation_findings(doc, 7)
    text = "\n".join(lines)
    assert not ok and "verdict: VIOLATIONS: 1200 violations" in text and "over 28612 rows" in text, text
    assert "validation of 1608 rows on duckdb" in text and not GROUPED.search(text), text


def test_the_demo_fails_when_a_january_day_is_missing(sqlite_catalog, months):
    log_table, _ = create_table(sqlite_catalog)
    log_table.append({p: rows for p, rows in first_days(months[0], 30).items() if rows.num_rows})
    log_table.append({p: rows for p, rows in first_days(months[1], 5).items() if rows.num_rows})
    out = io.StringIO()
    assert not demo.check_january(Console(file=out, width=200), log_table)
    assert ": no" in out.getvalue()


def metadata_files(log_table) -> set[str]:
    from pathlib import Path

    from icelog.storage.log.files import local_path

    return {p.name for p in Path(local_path(log_table.table().metadata_location)).parent.glob("*.metadata.json")}


def test_a_rerun_opens_the_table_and_writes_no_metadata_file(sqlite_catalog):
    log_table, created = create_table(sqlite_catalog)
    before = metadata_files(log_table)
    again, created_again = create_table(sqlite_catalog)
    assert (created, created_again) == (True, False)
    assert metadata_files(again) == before  # no orphan 00000-*.metadata.json from a refused create


def test_the_late_file_lands_once(tmp_path):
    from icelog.pipelines.flights import LATE_DAY, land_late_file

    late = land_late_file(tmp_path)
    assert late is not None and late.parent.name == f"date={LATE_DAY}" and late.exists()
    assert land_late_file(tmp_path) is None  # the demo's re-run says nothing landed


def findings(log_table, tmp_path, **report):
    from icelog.validations.report import build_report

    page = build_report(log_table.table(), tmp_path / "report", **report)
    console = Console(file=io.StringIO(), width=300)
    ok = demo.print_validation(console, log_table, page.parent)
    return ok, console.file.getvalue()


def test_the_demo_summary_says_what_validation_found(sqlite_catalog, tmp_path):
    from icelog.storage.log.table import LogTable

    t = LogTable.create(sqlite_catalog, "db.events", partitions=2)
    t.append({0: [{"key": "a"}] * 3, 1: [{"key": "b"}] * 2})
    ok, out = findings(t, tmp_path, gx=False)
    assert ok
    assert "5 checks (contiguity-deep, watermark, producer-sequences, producer-state, transactions), 5 passed" in out
    assert "over 5 rows: all passed" in out and "data quality (Great Expectations): not run" in out
    assert f"validation of snapshot {t.table().metadata.current_snapshot_id}:" in out

    t.append({1: [{"key": "c"}]})  # committed after the validation: the demo must not call it validated
    out = io.StringIO()
    assert not demo.print_validation(Console(file=out, width=300), t, tmp_path / "report")
    assert "not validated since" in out.getvalue()


def test_the_demo_summary_names_the_violations(sqlite_catalog, tmp_path):
    from icelog.storage.log.table import LogTable
    from tests.support.planting import plant

    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    t.append({0: [{"key": "a"}] * 3})
    plant(t, 0, [7])  # a foreign writer leaves offsets 3..6 missing
    ok, out = findings(t, tmp_path, gx=False)
    assert not ok
    assert "2 violations in" in out and "offsets 3..6 missing" in out and "all passed" not in out
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    failing = {v["check"] for v in doc["checks"]["violations"]}
    passed = len([c for c in doc["checks"]["checks"] if c not in failing])
    assert f", {passed} passed," in out and passed < len(doc["checks"]["checks"])


@pytest.mark.integration
def test_the_demo_summary_gives_the_data_quality_result_and_its_scope(sqlite_catalog, tmp_path):
    from icelog.storage.log.table import LogTable

    t = LogTable.create(sqlite_catalog, "db.events", partitions=2)
    t.append({0: [{"key": "a"}] * 3, 1: [{"key": "b"}] * 2})
    ok, out = findings(t, tmp_path, docs_root=tmp_path / "gx")
    evaluated = json.loads((tmp_path / "report" / "report.json").read_text())["quality"]["evaluated"]
    assert ok and evaluated >= 6
    assert (
        f"data quality (Great Expectations): {evaluated} of {evaluated} expectations passed (a full validation of 5 rows on pandas)"
        in out
    )
    ok, out = findings(t, tmp_path, docs_root=tmp_path / "gx")  # `make demo; make demo`: nothing new
    assert ok and f"{evaluated} of {evaluated} expectations passed (nothing new since the last run" in out


def test_the_demo_table_keeps_the_history_of_its_first_runs(sqlite_catalog, months):
    from icelog.storage.properties import SNAPSHOTS_KEEP

    log_table, _ = create_table(sqlite_catalog)
    assert demo.keep_demo_history(log_table) and not demo.keep_demo_history(log_table)  # a re-run commits nothing
    assert log_table.table().metadata.properties[SNAPSHOTS_KEEP.key] == str(demo.DEMO_SNAPSHOTS_KEEP)
    days = months[0]
    for day in range(1, 32):  # the first `make demo` commits once per January day, and more
        log_table.append({p: rows.filter(pc.equal(rows["day"], day)) for p, rows in days.items() if rows.num_rows})
    assert len(log_table.table().metadata.snapshots) >= 31  # the default (20) would have expired the first 11


def test_a_keep_the_user_set_stays(sqlite_catalog):
    from icelog.storage.log.table import LogTable

    t = LogTable.create(sqlite_catalog, "demo.flights", partitions=1, properties={"icelog.snapshots.keep": "7"})
    assert not demo.keep_demo_history(t)
    assert t.table().metadata.properties["icelog.snapshots.keep"] == "7"


def test_the_lakehouse_demo_has_a_home_of_its_own(tmp_path, monkeypatch):
    from icelog.pipelines.tasks import landing_root
    from icelog.storage.core.catalog import icelog_home

    def paths(home: Path) -> set[Path]:
        monkeypatch.setenv("ICELOG_HOME", str(home))
        return {icelog_home(), landing_root(), icelog_home() / "reports", icelog_home() / "quality"}

    monkeypatch.delenv("ICELOG_LANDING", raising=False)
    embedded = paths(demo.demo_home(tmp_path, lakehouse=False))
    lakehouse = paths(demo.demo_home(tmp_path, lakehouse=True))
    assert embedded.isdisjoint(lakehouse)
    assert all(p.is_relative_to(tmp_path / "lakehouse") for p in lakehouse)
    assert not any(p.is_relative_to(tmp_path / "lakehouse") for p in embedded)

    # Its closing lines point at what it wrote (the lakehouse catalog's report under its home),
    # not at make airflow and the CLI's default, which show the embedded catalog.
    home = demo.demo_home(tmp_path, lakehouse=True)
    closing = "\n".join(demo.next_steps(home, lakehouse=True))
    assert f"file://{home / 'reports' / 'demo.flights' / 'index.html'}" in closing and "make demo-lakehouse" in closing
    assert "opens the Airflow UI on these DAGs" not in closing and 'icelog sql "' not in closing
    assert "make airflow" in "\n".join(demo.next_steps(tmp_path, lakehouse=False))


FEBRUARY_1_2 = 1_608  # flights dated 2013-02-01 and 02 (28,612 - 27,004)


@pytest.fixture(scope="module")
def landing(tmp_path_factory):
    from icelog.pipelines.flights import stage_landing

    root = tmp_path_factory.mktemp("landing")
    stage_landing(root)
    return root


@pytest.mark.integration
def test_the_demo_holds_after_a_backfill_of_february_through_the_backfill_task(
    spark, sqlite_spec, months, landing, tmp_path, monkeypatch
):
    """`make demo`; a backfill of 2013-02-01..02 (the task icelog_backfill runs: Spark ingest of
    the landing files); the validation icelog_validate runs; `make demo` again; the same backfill
    again writes nothing, and a third `make demo` still passes. January is appended directly
    here (the full Airflow run is the slow test below)."""
    from icelog.pipelines import tasks

    for key, value in sqlite_spec.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "home"))
    log_table, _ = create_table(sqlite_spec.open())
    log_table.append({p: rows for p, rows in months[0].items() if rows.num_rows})  # the first `make demo`

    def demo_again() -> str:
        out = io.StringIO()
        assert demo.summarize(Console(file=out, width=300), log_table), out.getvalue()
        return out.getvalue()

    def backfill() -> dict:
        return tasks.backfill(log_table.identifier, "2013-02-01", "2013-02-02", landing=str(landing), catalog=sqlite_spec.name)

    loaded = backfill()
    assert loaded["rows_written"] == FEBRUARY_1_2 and loaded["files_loaded"] == 2
    # A lakehouse catalog loaded from the shared landing folder (before the lakehouse demo had a
    # home of its own) keeps it as its source: the ledger knows the files by path.
    assert demo.earlier_landing(landing) == landing and demo.earlier_landing(tmp_path / "lakehouse" / "landing") is None
    tasks.validate(log_table.identifier, catalog=sqlite_spec.name)  # raises on a violation
    second = demo_again()
    total = 27_004 + FEBRUARY_1_2
    assert f"27004 rows dated January 2013 = the January 2013 flights (27004): yes ({total} rows in all" in second
    assert f"over {total} rows: all passed" in second and "expectations passed" in second
    again = backfill()
    assert (again["rows_written"], again["files_skipped"]) == (0, 2)
    untimed = re.compile(r"in [0-9.]+ s\)")
    assert untimed.sub("", demo_again()) == untimed.sub("", second)  # nothing committed: the same verdict


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(3600)  # three full demos; one takes 5-15 min on a loaded 2-core machine
def test_make_demo_three_times_with_a_backfill_from_the_ui_between(tmp_path, monkeypatch):
    """`make demo` three times in a row, with the UI's backfill of 2013-02-01..02 (a
    run of icelog_backfill with that conf, as the Trigger form sends it) between runs."""
    from icelog.pipelines.flights import TABLE
    from icelog.storage.core.catalog import open_catalog
    from icelog.storage.log.table import LogTable
    from infra.airflow import airflow_env, dags_test

    for key in ("ICELOG_CATALOG", "ICELOG_LANDING", "AIRFLOW_HOME", "ICELOG_TABLES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "home"))
    env = airflow_env()
    outputs = []
    for run in range(3):
        out = io.StringIO()
        assert demo.run(Console(file=out, width=300), env) == 0, out.getvalue()
        outputs.append(out.getvalue())
        if run == 0:
            dags_test(env, "icelog_backfill", None, {"table": TABLE, "start": "2013-02-01", "end": "2013-02-02"})
            dags_test(env, "icelog_validate")
    total = 27_004 + FEBRUARY_1_2
    assert "(27004): yes" in outputs[0] and "rows in all" not in outputs[0]
    for later in outputs[1:]:
        assert f"(27004): yes ({total} rows in all" in later and f"over {total} rows: all passed" in later
        assert "nothing written (every file was already in the ingest ledger)" in later
    log_table = LogTable.open(open_catalog(), TABLE)
    assert sum(w.end - w.start for w in log_table.watermarks().values()) == total
    # --as-of reaches the first run: its first commit is still a snapshot (icelog.snapshots.keep).
    assert len(log_table.table().metadata.snapshots) > 20

"""The HTML report and the Data Docs, rendered in a real headless Chromium (Debian's) with the
network blocked: every request that is not a local file is aborted and counted as a failure.
Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from icelog.storage.log.table import LogTable
from icelog.validations.report import build_index, build_report
from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from tests.support.planting import plant


class OfflineBrowser:
    """One Chromium page that may only load file:// URLs; records every failed request."""

    def __init__(self, p) -> None:
        self.browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        self.context = self.browser.new_context(viewport={"width": 1100, "height": 1300})
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.blocked_local: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(120_000)  # a loaded 2-core machine (other suites, Spark) is slow to paint
        self.page.on("requestfailed", lambda r: self.failed.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route) -> None:
        url = route.request.url
        if not url.startswith("file:") or any(part in url for part in self.blocked_local):
            route.abort()  # shows up in requestfailed
        else:
            route.continue_()

    def open(self, path: Path, ready: str = "document.readyState === 'complete'") -> None:
        self.page.goto(path.as_uri())
        self.page.wait_for_function(ready)
        self.page.wait_for_load_state("networkidle")

    def shot(self, name: str) -> bytes:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        return self.page.screenshot(path=str(ARTIFACTS / name), full_page=False)

    def difference(self, a: bytes, b: bytes) -> float:
        """Fraction of pixels that differ between two screenshots (decoded by Chromium itself)."""
        self.page.set_content("<canvas id=a></canvas><canvas id=b></canvas>")
        return self.page.evaluate(
            """async ([a, b]) => {
                const load = src => new Promise(ok => { const i = new Image(); i.onload = () => ok(i); i.src = src; });
                const [ia, ib] = await Promise.all([load(a), load(b)]);
                const px = img => { const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
                    const g = c.getContext('2d'); g.drawImage(img, 0, 0); return g.getImageData(0, 0, img.width, img.height).data; };
                const [da, db] = [px(ia), px(ib)];
                let differ = 0;
                for (let i = 0; i < Math.min(da.length, db.length); i += 4)
                    if (Math.abs(da[i] - db[i]) + Math.abs(da[i+1] - db[i+1]) + Math.abs(da[i+2] - db[i+2]) > 30) differ++;
                return differ / (Math.min(da.length, db.length) / 4);
            }""",
            [f"data:image/png;base64,{base64.b64encode(x).decode()}" for x in (a, b)],
        )

    def close(self) -> None:
        self.browser.close()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = OfflineBrowser(p)
        yield b
        b.close()


def report_facts(page) -> dict:
    return page.evaluate("""() => ({
        status: document.querySelector('#status').innerText,
        dots: document.querySelectorAll('#commit-history circle').length,
        partitionBars: document.querySelectorAll('#partitions-rows rect').length,
        fileBars: document.querySelectorAll('#partitions-files rect').length,
        dayBars: document.querySelectorAll('#rows-per-day rect').length,
        axisTitles: [...document.querySelectorAll('.axis-title')].map(t => t.textContent),
        charts: document.body.dataset.charts,
        partitions: document.querySelectorAll('#partitions tr').length - 1,
        violations: document.querySelector('#violations').innerText,
        freshness: document.querySelector('#freshness b').innerText,
        compaction: document.querySelector('#compaction-note').innerText,
        docs: document.querySelectorAll('#data-docs').length,
    })""")


@pytest.mark.integration
def test_report_and_data_docs_render_offline_with_no_failed_request(sqlite_catalog, tmp_path, browser):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=3)
    for i in range(4):
        t.append({i % 3: [{"key": f"k{i}", "value": "v"}] * (i + 1)})
    page = build_report(t.table(), tmp_path / "report", docs_root=tmp_path / "gx")
    browser.open(page, "document.body.dataset.rendered !== undefined")
    seen = report_facts(browser.page)
    browser.shot("report-ok.png")
    assert browser.failed == [] and browser.errors == []
    assert seen["status"] == "OK" and seen["dots"] == 4 and seen["charts"] == "4"
    assert seen["partitionBars"] == 3 and seen["fileBars"] == 6 and seen["dayBars"] == 1
    assert {
        "partition",
        "rows",
        "data files",
        "day appended (UTC)",
        "rows added",
        "commit time (UTC)",
        "rows appended (cumulative)",
    } <= set(seen["axisTitles"])
    assert seen["partitions"] == 3 and "no check violations" in seen["violations"] and seen["docs"] == 1

    # Data Docs: the index's validation table is built by bootstrap-table (jQuery + Bootstrap
    # loaded), Font Awesome's font is loaded, and the local Vega stack draws a chart.
    browser.open(tmp_path / "report" / "data-docs" / "index.html")
    docs = browser.page.evaluate("""async () => {
        const spec = {$schema: 'https://vega.github.io/schema/vega-lite/v5.json', data: {values: [{a: 'x', b: 3}, {a: 'y', b: 5}]},
                      mark: 'bar', encoding: {x: {field: 'a', type: 'nominal'}, y: {field: 'b', type: 'quantitative'}}};
        const div = document.createElement('div'); document.body.appendChild(div);
        await vegaEmbed(div, spec, {renderer: 'svg', actions: false});
        const faces = await document.fonts.load('900 16px "Font Awesome 6 Free"');
        return {table: document.querySelectorAll('.bootstrap-table').length, rows: document.querySelectorAll('.bootstrap-table tbody tr').length,
                navbar: getComputedStyle(document.querySelector('nav.navbar')).display,
                vegaBars: div.querySelectorAll('svg .mark-rect path').length,
                fontAwesome: faces.length};
    }""")
    styled = browser.shot("data-docs-offline.png")
    assert browser.failed == [] and browser.errors == []
    assert (
        docs["table"] >= 1
        and docs["rows"] >= 1
        and docs["navbar"] == "flex"
        and docs["vegaBars"] == 2
        and docs["fontAwesome"] >= 1
    )
    validation = next((tmp_path / "report" / "data-docs" / "validations").rglob("*.html"))
    browser.open(validation)
    assert browser.failed == [] and browser.errors == []
    assert browser.page.evaluate("getComputedStyle(document.querySelector('nav.navbar')).display") == "flex"
    browser.shot("data-docs-validation-offline.png")

    # By screenshot: the same page without its local assets (what the CDN version showed here) differs.
    browser.blocked_local.append("/static/offline/")
    browser.open(tmp_path / "report" / "data-docs" / "index.html")
    bare = browser.shot("data-docs-without-assets.png")
    assert browser.failed  # the blocked assets did fail: the check above could see a failure
    assert browser.difference(styled, bare) > 0.05


@pytest.mark.integration
def test_a_rerun_report_shows_the_last_quality_result_and_what_it_covered(sqlite_catalog, tmp_path, browser):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=2)
    t.append({0: [{"key": "a"}] * 3, 1: [{"key": "b"}] * 2})
    first = build_report(t.table(), tmp_path / "first", docs_root=tmp_path / "gx")
    again = build_report(t.table(), tmp_path / "again", docs_root=tmp_path / "gx")  # `make demo; make demo`
    card = "() => ({status: document.querySelector('#quality-status').innerText, card: document.querySelector('#quality-status').parentElement.innerText, scope: document.querySelector('#quality-scope').innerText, tile: document.querySelector('#tile-quality').innerText})"
    browser.open(first, "document.body.dataset.rendered !== undefined")
    before = browser.page.evaluate(card)
    browser.open(again, "document.body.dataset.rendered !== undefined")
    seen = browser.page.evaluate(card)
    browser.shot("report-quality-rerun.png")
    assert browser.failed == [] and browser.errors == []
    evaluated = json.loads((first.parent / "report.json").read_text())["quality"]["evaluated"]
    assert evaluated >= 6 and f"{evaluated} expectations" in before["card"]
    assert seen["status"] == "passed" and f"{evaluated} expectations" in seen["card"]
    assert "none validation" not in seen["scope"] and "on none" not in seen["scope"]
    assert (
        "Nothing committed since validated snapshot" in seen["scope"] and "a full validation of 5 rows on pandas" in seen["scope"]
    )
    assert "full, 5 rows (last run)" in seen["tile"]


@pytest.mark.integration
def test_report_shows_the_latest_violations(sqlite_catalog, tmp_path, browser):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    t.append({0: [{"key": "a"}] * 3})
    plant(t, 0, [7])
    page = build_report(t.table(), tmp_path / "report", gx=False)
    browser.open(page, "document.body.dataset.rendered !== undefined")
    seen = report_facts(browser.page)
    browser.shot("report-violations.png")
    assert browser.failed == [] and browser.errors == []
    assert seen["status"] == "VIOLATIONS"
    assert "offsets 3..6 missing" in seen["violations"]


def test_report_small_files_compaction_note_and_freshness(sqlite_catalog, tmp_path):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=2)
    for _ in range(8):  # COMPACT_MIN_FILES one-batch files in partition 0
        t.append({0: [{"key": "a"}] * 2})
    t.append({1: [{"key": "b"}]})
    last = t.table().metadata.last_updated_ms
    page = build_report(t.table(), tmp_path / "report", gx=False, now_ms=last + 2 * 3_600_000)
    doc = json.loads((page.parent / "report.json").read_text())
    assert [(p["partition"], p["files"], p["small_files"], p["compaction_due"]) for p in doc["partition_files"]] == [
        (0, 8, 8, True),
        (1, 1, 1, False),
    ]
    assert doc["compaction_due"] == [0] and doc["small_files"] == 9
    assert doc["freshness_ms"] == 2 * 3_600_000
    text = page.read_text()
    assert "Compaction is due in partition 0:" in text and "2.0 h" in text


def test_commit_history_outlives_snapshot_expiry(sqlite_catalog, tmp_path):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=2, properties={"icelog.snapshots.keep": "3"})
    for i in range(12):
        t.append({i % 2: [{"key": "a"}] * (i + 1)})
    assert len(t.table().metadata.snapshots) == 3
    page = build_report(t.table(), tmp_path / "report", gx=False)
    doc = json.loads((page.parent / "report.json").read_text())
    appends = [h for h in doc["history"] if h["rows"]]
    assert [h["rows"] for h in appends] == list(range(1, 13))
    assert all(h["timestamp_ms"] for h in appends)
    assert [h["timestamp_ms"] for h in appends] == sorted(h["timestamp_ms"] for h in appends)
    assert page.read_text().count("<circle") == 12
    assert sum(d["rows"] for d in doc["rows_per_day"]) == 78


@pytest.mark.integration
def test_report_all_writes_an_index_with_each_tables_status(sqlite_catalog, tmp_path, browser):
    good = LogTable.create(sqlite_catalog, "db.good", partitions=1)
    good.append({0: [{"key": "a"}] * 3})
    bad = LogTable.create(sqlite_catalog, "db.bad", partitions=1)
    bad.append({0: [{"key": "a"}] * 3})
    plant(bad, 0, [7])
    index = build_index(sqlite_catalog, tmp_path / "reports", gx=False)
    listed = {e["table"]: e for e in json.loads((index.parent / "index.json").read_text())}
    assert set(listed) == {"db.good", "db.bad"} and listed["db.good"]["ok"] and not listed["db.bad"]["ok"]
    browser.open(index, "document.body.dataset.rendered !== undefined")
    rows = browser.page.evaluate(
        "[...document.querySelectorAll('#tables tr')].slice(1).map(r => [r.querySelector('a').getAttribute('href'), r.querySelector('.status').innerText])"
    )
    assert browser.failed == [] and browser.errors == []
    assert sorted(rows) == [["db.bad/index.html", "VIOLATIONS"], ["db.good/index.html", "OK"]]
    assert browser.page.locator("#status").inner_text() == "1 need attention"
    browser.page.locator("a[href='db.bad/index.html']").click()
    browser.page.wait_for_function("document.body.dataset.rendered !== undefined")
    assert browser.page.locator("#status").inner_text() == "VIOLATIONS" and browser.failed == []
    browser.shot("report-index.png")


def test_report_all_leaves_out_system_tables_unless_named(sqlite_catalog, tmp_path):
    from icelog.storage.producers.transactional import TransactionalProducer

    LogTable.create(sqlite_catalog, "db.good", partitions=1)
    producer = TransactionalProducer(sqlite_catalog, "copier")
    producer.init_transactions()
    with producer.transaction():  # creates icelog_system.transactions, a log table of icelog's own
        producer.send("db.good", 0, [{"key": "x"}])
    index = build_index(sqlite_catalog, tmp_path / "reports", gx=False)
    assert [e["table"] for e in json.loads((index.parent / "index.json").read_text())] == ["db.good"]
    named = build_index(sqlite_catalog, tmp_path / "named", gx=False, tables=["icelog_system.transactions"])
    assert [e["table"] for e in json.loads((named.parent / "index.json").read_text())] == ["icelog_system.transactions"]


def test_rows_per_day_with_a_payload_column_named_day(sqlite_catalog):
    from icelog.validations.history import rows_per_day

    t = LogTable.create(sqlite_catalog, "db.days", 1, payload=[{"name": "day", "type": "int"}, {"name": "key", "type": "string"}])
    t.append({0: [{"day": d, "key": "k"} for d in (1, 2, 3)]})
    per_day = rows_per_day(t.table())
    assert len(per_day) == 1 and per_day[0]["rows"] == 3


def events_with_event_time(catalog, name: str = "db.flights"):
    """Rows appended today whose event times fall on three days of 2013, one without a time."""
    from datetime import UTC, datetime

    t = LogTable.create(
        catalog, name, 2, payload=[{"name": "key", "type": "string"}, {"name": "time_hour", "type": "timestamptz"}]
    )
    at = [datetime(2013, 1, d, h, tzinfo=UTC) for d, h in ((1, 5), (1, 23), (2, 0), (31, 12), (31, 13), (31, 14))]
    t.append({0: [{"key": "a", "time_hour": w} for w in at[:3]], 1: [{"key": "b", "time_hour": w} for w in at[3:]]})
    t.append({1: [{"key": "c", "time_hour": None}]})
    return t


def test_rows_per_day_by_event_time_where_the_table_has_one(sqlite_catalog):
    from icelog.validations.history import event_time_column, rows_per_day

    t = events_with_event_time(sqlite_catalog)
    assert event_time_column(t.table()) == "time_hour"
    assert rows_per_day(t.table(), event_time="time_hour") == [
        {"day": "2013-01-01", "rows": 2},
        {"day": "2013-01-02", "rows": 1},
        {"day": "2013-01-31", "rows": 3},
        {"day": None, "rows": 1},
    ]
    (by_append,) = rows_per_day(t.table())  # all appended today
    assert by_append["rows"] == 7 and by_append["day"] > "2013-01-31"

    two = LogTable.create(
        sqlite_catalog,
        "db.two",
        1,
        payload=[
            {"name": "key", "type": "string"},
            {"name": "sent", "type": "timestamp"},
            {"name": "seen", "type": "timestamptz"},
        ],
    )
    assert event_time_column(two.table()) is None  # which one is the event's time is not guessed
    assert event_time_column(LogTable.create(sqlite_catalog, "db.plain", 1).table()) is None


@pytest.mark.integration
def test_report_counts_rows_per_day_by_event_time_and_says_so(sqlite_catalog, tmp_path, browser):
    t = events_with_event_time(sqlite_catalog)
    page = build_report(t.table(), tmp_path / "report", gx=False)
    plain = LogTable.create(sqlite_catalog, "db.plain", partitions=1)
    plain.append({0: [{"key": "a"}] * 2})
    plain_page = build_report(plain.table(), tmp_path / "plain", gx=False)
    facts = """() => ({
        title: document.querySelector('#rows-per-day-title').innerText,
        by: document.querySelector('#rows-per-day-by').innerText,
        bars: [...document.querySelectorAll('#rows-per-day rect title')].map(t => t.textContent),
        labels: [...document.querySelectorAll('#rows-per-day text.tick')].map(t => t.textContent),
        axes: [...document.querySelectorAll('#rows-per-day .axis-title')].map(t => t.textContent),
    })"""
    browser.open(page, "document.body.dataset.rendered !== undefined")
    seen = browser.page.evaluate(facts)
    browser.shot("report-rows-per-day-event-time.png")
    browser.open(plain_page, "document.body.dataset.rendered !== undefined")
    plain_seen = browser.page.evaluate(facts)
    assert browser.failed == [] and browser.errors == []
    assert seen["title"] == "Rows per day, by event time"
    assert "time_hour (UTC), not by when it was loaded" in seen["by"] and "1 row without a time_hour not shown" in seen["by"]
    assert seen["bars"] == ["2013-01-01: 2 rows", "2013-01-02: 1 rows", "2013-01-31: 3 rows"]
    assert {"2013-01-01", "2013-01-31"} <= set(seen["labels"])
    assert seen["axes"] == ["day of time_hour (UTC)", "rows"]
    assert plain_seen["title"] == "Rows added per day, by append time" and plain_seen["axes"] == [
        "day appended (UTC)",
        "rows added",
    ]
    assert len(plain_seen["bars"]) == 1 and not plain_seen["bars"][0].startswith("2013")
    doc = json.loads((page.parent / "report.json").read_text())
    assert doc["rows_per_day_by"] == "time_hour" and doc["rows_per_day"][-1] == {"day": None, "rows": 1}


def test_report_all_with_a_warning_says_so_in_the_index_badge_and_the_cli(sqlite_spec, tmp_path):
    """A table whose only finding is a warning: its row says WARNINGS, and so do the index's
    badge and the CLI's one word (they said "all OK" and "OK" beside it)."""
    from tests.support.cli import Cli

    suite = tmp_path / "expectations" / "db.events.json"
    suite.parent.mkdir()
    expectation = {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "key", "value_set": ["a"]}}
    suite.write_text(json.dumps({"expectations": [{**expectation, "severity": "warn"}]}))
    icelog = Cli(sqlite_spec, ICELOG_HOME=str(tmp_path / "home"), ICELOG_EXPECTATIONS=str(suite.parent))
    LogTable.create(sqlite_spec.open(), "db.events", 1).append({0: [{"key": "a"}, {"key": "z"}]})
    result = icelog.raw("report", "--all", json_output=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)  # warnings pass the gate
    assert result.stdout.startswith("WARNINGS: 1 table, file://"), result.stdout
    index = Path(result.stdout.strip().split("file://", 1)[1])
    (entry,) = json.loads((index.parent / "index.json").read_text())
    assert (entry["status"], entry["ok"]) == ("WARNINGS", True)
    assert '<span id="status" class="badge warn">1 with warnings</span>' in index.read_text()


def test_report_all_exits_1_when_a_table_fails_the_gate(sqlite_spec, tmp_path):
    from tests.support.cli import Cli

    icelog = Cli(sqlite_spec, ICELOG_HOME=str(tmp_path / "home"))
    good = LogTable.create(sqlite_spec.open(), "db.good", 1)
    good.append({0: [{"key": "a"}]})
    bad = LogTable.create(sqlite_spec.open(), "db.bad", 1)
    bad.append({0: [{"key": "a"}] * 3})
    plant(bad, 0, [7])
    result = icelog.raw("report", "--all", "--no-gx", json_output=False)
    assert result.exit_code == 1 and result.stdout.startswith("ATTENTION: 2 tables, file://"), (result.stdout, result.stderr)
    doc = icelog("report", "--all", "--no-gx", code=1)
    assert doc["ok"] is False and {t["table"]: t["ok"] for t in doc["tables"]} == {"db.good": True, "db.bad": False}

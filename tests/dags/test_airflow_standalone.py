"""make airflow (infra.airflow standalone): loopback by default, the login printed last, the demo's DAGs unpaused."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra.airflow import REPO, airflow_env, free_port, generated_passwords, login_banner, standalone_env, ui_url


def test_standalone_binds_loopback_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("ICELOG_AIRFLOW_HOST", raising=False)
    monkeypatch.delenv("ICELOG_AIRFLOW_PORT", raising=False)
    env = standalone_env(airflow_env(tmp_path / "airflow", {"ICELOG_HOME": str(tmp_path)}))
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__PORT"] == "8080"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    assert ui_url(env) == "http://127.0.0.1:8080"

    everywhere = standalone_env(
        airflow_env(
            tmp_path / "airflow", {"ICELOG_HOME": str(tmp_path), "ICELOG_AIRFLOW_HOST": "0.0.0.0", "ICELOG_AIRFLOW_PORT": "8793"}
        )
    )
    assert everywhere["AIRFLOW__API__HOST"] == "0.0.0.0" and everywhere["AIRFLOW__API__PORT"] == "8793"
    # Tasks still reach the execution API on loopback; the UI link names this machine.
    assert everywhere["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8793/execution/"
    assert "AIRFLOW__API__BASE_URL" not in everywhere
    assert ui_url(everywhere).endswith(":8793") and "0.0.0.0" not in ui_url(everywhere)


def test_login_banner_ends_with_url_user_and_password(tmp_path):
    (tmp_path / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": "s3cret"}))
    env = {"AIRFLOW_HOME": str(tmp_path)}
    banner = login_banner("http://127.0.0.1:8080", generated_passwords(env), tmp_path / "standalone.log")
    lines = banner.strip().splitlines()
    assert lines[0] == "Airflow is ready: http://127.0.0.1:8080"
    assert lines[1:3] == ["  user: admin", "  password: s3cret"]
    assert generated_passwords({**env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}) == {}
    assert generated_passwords({"AIRFLOW_HOME": str(tmp_path / "elsewhere")}) is None
    assert f"user and password: in {tmp_path}" in login_banner("http://127.0.0.1:8080", None, tmp_path / "standalone.log")


def test_standalone_refuses_a_taken_port_before_starting_anything(tmp_path, capsys):
    from infra.airflow import standalone

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = airflow_env(tmp_path / "airflow", {"ICELOG_HOME": str(tmp_path), "ICELOG_AIRFLOW_PORT": str(port)})
        assert standalone(env) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "ICELOG_AIRFLOW_PORT" in err, err
    assert not (tmp_path / "airflow" / "standalone.log").exists()  # airflow standalone never started


# A task process's call to the execution API, made with Airflow's own client (its retries, timeouts).
EXECUTION_API_CALL = """
import sys, time
from airflow.sdk.api.client import Client

client = Client(base_url=sys.argv[1], token="a-task-token")
print("calling", flush=True)
began = time.monotonic()
response = client.get("health")
print(response.json()["status"], f"{time.monotonic() - began:.0f}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_task_waits_for_an_api_server_that_starts_late_and_is_slow_to_answer_its_first_request(tmp_path):
    """On a busy 2-core machine the scheduler runs a task before the API server listens (it
    starts in 25-35 s there), and the API server's first execution API request builds that API
    with its one event loop blocked (7-30 s). The task's client must outlast both: here the
    server listens 18 s after the first call (Airflow's default client gives up within 15 s)
    and holds its first request 7 s, longer than Airflow's default timeout of 5 s."""
    import http.server
    import threading

    class Slow(http.server.BaseHTTPRequestHandler):
        held = False

        def do_GET(self):
            if not Slow.held:  # one request at a time: later ones wait in the backlog meanwhile
                Slow.held = True
                time.sleep(7)
            body = json.dumps({"status": "healthy"}).encode()
            with contextlib.suppress(OSError):  # a client that timed out has gone
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    # Bound but not listening: connections are refused, and no one else takes the port.
    server = http.server.HTTPServer(("127.0.0.1", 0), Slow, bind_and_activate=False)  # one thread, like one event loop
    server.server_bind()
    env = airflow_env(tmp_path / "airflow", {"ICELOG_HOME": str(tmp_path)})
    task = subprocess.Popen(
        [sys.executable, "-c", EXECUTION_API_CALL, f"http://127.0.0.1:{server.server_address[1]}/execution/"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    serving = None
    try:
        for line in task.stdout:  # Airflow logs to stdout too
            if line.strip() == "calling":
                break
        else:
            raise AssertionError(task.stderr.read()[-3000:])
        time.sleep(18)
        server.server_activate()
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        out, err = task.communicate(timeout=240)
    finally:
        task.kill()
        if serving:
            server.shutdown()
        server.server_close()
    assert task.returncode == 0 and "healthy" in [line.split()[0] for line in out.splitlines() if line.strip()], (
        out,
        err[-3000:],
    )


@pytest.mark.integration
@pytest.mark.slow  # airflow standalone's four components start in about 60-150 s on 2 cores
@pytest.mark.timeout(600)
def test_make_airflow_listens_on_loopback_only_and_prints_the_login_last(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ICELOG_AIRFLOW"))} | {
        "ICELOG_HOME": str(tmp_path),
        "ICELOG_AIRFLOW_PORT": str(port),
    }
    out = tmp_path / "console.txt"
    with open(out, "wb") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.airflow", "standalone"],
            cwd=REPO,
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 480
        while "Ctrl-C stops it." not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(2)
        printed = out.read_text()
        assert "Ctrl-C stops it." in printed, printed[-3000:]
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
        addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines() if line.strip()}
        assert addresses == {"127.0.0.1"}, listening
        time.sleep(3)  # nothing may follow the banner on the console
        lines = out.read_text().strip().splitlines()
        assert lines[-1] == "Ctrl-C stops it." and lines[-5] == f"Airflow is ready: http://127.0.0.1:{port}", lines
        user, password = (re.match(r"\s+(user|password): (\S+)$", line)[2] for line in lines[-4:-2])
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/auth/token",
            data=json.dumps({"username": user, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:  # the printed password logs in
            assert json.loads(response.read())["access_token"]
        # A DAG test of a 2013 day, as make demo runs them (no landing files here: it is skipped at
        # once). The UI once showed such runs lasting "5067d 15h".
        subprocess.run(
            [sys.executable, "-m", "infra.airflow", "test", "icelog_ingest", "2013-01-05"],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        check_the_ui_in_chromium(f"http://127.0.0.1:{port}", user, password)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout.strip()
    assert Path(tmp_path / "airflow" / "standalone.log").stat().st_size > 0


def check_the_ui_in_chromium(url: str, user: str, password: str) -> None:
    """What a user sees in the Airflow UI, in a real Chromium: the printed login works,
    the demo's DAGs are unpaused and the others paused, and icelog_backfill's Trigger form is
    complete with its defaults (an empty required param once kept Trigger disabled). The page may
    load nothing but the UI itself: every asset is served by the local API server."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    outside: list[str] = []  # requests to anywhere but the UI: blocked, and a failure
    failed: list[str] = []  # the UI's own requests that failed (a navigation's cancelled ones aside)

    def route(route) -> None:
        if route.request.url.startswith(url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    def request_failed(request) -> None:
        if request.url.startswith(url) and request.failure != "net::ERR_ABORTED":
            failed.append(f"{request.url}: {request.failure}")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.route("**/*", route)
        page = context.new_page()
        page.set_default_timeout(120_000)  # a loaded 2-core machine is slow to paint
        page.on("requestfailed", request_failed)
        try:
            page.goto(f"{url}/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_url(lambda u: "/auth/login" not in u)

            page.goto(f"{url}/dags")
            page.wait_for_selector("[data-testid=toggle-pause]")
            page.wait_for_load_state("networkidle")
            # Each pause switch belongs to the DAG named by the nearest link around it.
            active = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('[data-testid=toggle-pause]')].map(t => {
                let row = t.parentElement;
                while (row && !row.querySelector('a[href^="/dags/"]')) row = row.parentElement;
                const dag = row.querySelector('a[href^="/dags/"]').getAttribute('href').split('/')[2];
                return [dag, t.dataset.state === 'checked'];
            }))""")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "airflow-dags.png"))
            assert active == {
                "icelog_backfill": True,
                "icelog_ingest": True,
                "icelog_validate": True,
                "icelog_fanout": False,
                "icelog_maintenance": False,
                "icelog_mirror": False,
            }, active

            page.goto(f"{url}/dag_runs")
            page.wait_for_selector("table tbody tr")
            runs = page.evaluate("""() => {
                const head = [...document.querySelectorAll('table th')].map(t => t.innerText);
                return [...document.querySelectorAll('table tbody tr')].map(r =>
                    Object.fromEntries([...r.querySelectorAll('td')].map((td, i) => [head[i], td.innerText])));
            }""")
            page.screenshot(path=str(ARTIFACTS / "airflow-dag-runs.png"))
            (past,) = [r for r in runs if r["Triggering User"] == "dag_test"]  # the run of 2013-01-05
            assert re.fullmatch(r"00:0\d:\d\d(\.\d+)?", past["Duration"]), runs  # minutes, not 5067 days

            page.goto(f"{url}/dags/icelog_backfill")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Run Parameters").wait_for()
            page.screenshot(path=str(ARTIFACTS / "airflow-trigger-backfill.png"))
            assert dialog.locator("input[value='demo.flights']").count() == 1  # the table param's default
            trigger = dialog.get_by_role("button", name="Trigger", exact=True)
            assert trigger.is_enabled()
        finally:
            browser.close()
    assert outside == [] and failed == [], (outside, failed)

"""Airflow on one machine: an Airflow home with SQLite under $ICELOG_HOME, with icelog's DAGs.

    python -m infra.airflow migrate            # create/upgrade the metadata database (idempotent)
    python -m infra.airflow test DAG_ID [DATE] [CONF_JSON]
    python -m infra.airflow standalone         # the UI on http://127.0.0.1:8080 (make airflow)

``standalone`` starts what ``airflow standalone`` would, the API server first and the other
components once it answers, their output in ``$AIRFLOW_HOME/standalone/<component>.log``; waits
until every component reports healthy, and prints the URL, the user and the password last.
Nothing listens beyond loopback: the scheduler and triggerer serve no logs (``--skip-serve-logs``). It binds ``$ICELOG_AIRFLOW_HOST`` (default 127.0.0.1: only this machine) on
``$ICELOG_AIRFLOW_PORT`` (default 8080); ``ICELOG_AIRFLOW_HOST=0.0.0.0`` serves every interface.

The components (scheduler, DAG processor, API server, triggerer) run as separate ``airflow``
processes with the LocalExecutor, which works on SQLite; task processes reach the API server's
execution API. :func:`services` starts them the way ``airflow standalone`` does, for tests.

For a cluster, point AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at PostgreSQL and choose the Celery
or Kubernetes executor in the usual Airflow way; the DAGs do not change.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from icelog.storage.settings import Settings

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the virtualenv's bin (not resolved: that would leave the venv)
# What `airflow standalone` runs; a DAG run needs the first three (no deferrable tasks here).
COMPONENTS = ("scheduler", "dag-processor", "api-server", "triggerer")
# Their log servers would listen on every interface (Airflow binds them to host "", ports 8793
# and 8794, whatever the API server's host): the API server reads the task logs from the files
# they write on this machine instead.
COMPONENT_ARGS = {"scheduler": ("--skip-serve-logs",), "triggerer": ("--skip-serve-logs",)}
# How task processes call the API server's execution API ([workers] execution_api_*). The
# scheduler runs a task before the API server listens (it starts in 25-35 s on a busy 2-core
# machine), and the API server builds the execution API on its first request with its one event
# loop blocked (7-30 s there). Airflow's defaults (5 s a request, 5 tries within about 15 s)
# fail such a task; these give it minutes: 60 s a request, 10 tries at least 5 s apart.
EXECUTION_API_CLIENT = {"TIMEOUT": "60", "RETRIES": "10", "RETRY_WAIT_MIN": "5"}


def airflow_env(home: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    icelog_home = Settings.load(defaults={"home": REPO / ".icelog"}).home
    airflow_home = home or Path(os.environ.get("AIRFLOW_HOME", icelog_home / "airflow"))
    airflow_home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        # `airflow standalone` and the executors start components and tasks by the command name
        # `airflow`: it must resolve to this virtualenv's, also when the venv is not activated.
        "PATH": os.pathsep.join([str(BIN), *[p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != str(BIN)]]),
        "ICELOG_HOME": str(icelog_home),
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": os.environ.get("AIRFLOW__CORE__UNIT_TEST_MODE", "False"),
        # INFO: a task log shows what icelog did (pipelines.tasks logs it at INFO); the
        # components' own INFO goes to their log files, not to make airflow's console.
        "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": os.environ.get(
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{airflow_home / 'airflow.db'}"
        ),
        "NO_PROXY": "*",
        **{
            f"AIRFLOW__WORKERS__EXECUTION_API_{key}": os.environ.get(f"AIRFLOW__WORKERS__EXECUTION_API_{key}", value)
            for key, value in EXECUTION_API_CLIENT.items()
        },
    }
    if env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite"):
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", "icelog.pipelines.airflow_db.SQLITE_CONNECT_ARGS")
    env.update(extra or {})
    return env


def api_env(port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Settings for an API server on ``host:port``; task processes reach its execution API there."""
    url = f"http://{host}:{port}"
    return {
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
    }


WILDCARDS = ("0.0.0.0", "::", "")


def standalone_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the API server on ``$ICELOG_AIRFLOW_HOST:$ICELOG_AIRFLOW_PORT`` (default 127.0.0.1:8080)."""
    settings = Settings.load(env)
    host, port = settings.airflow_host, settings.airflow_port
    if host in WILDCARDS:
        # Every interface: task processes still reach the execution API on loopback, and the
        # UI builds its links from the address the browser used (no fixed base URL).
        settings = {k: v for k, v in api_env(port).items() if k != "AIRFLOW__API__BASE_URL"}
        return {**{k: v for k, v in env.items() if k != "AIRFLOW__API__BASE_URL"}, **settings, "AIRFLOW__API__HOST": host}
    return {**env, **api_env(port, host)}


def ui_url(env: dict[str, str]) -> str:
    host, port = env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"]
    return f"http://{socket.gethostname() if host in WILDCARDS else host}:{port}"


def login_banner(url: str, passwords: dict[str, str] | None, log: Path) -> str:
    """What ``make airflow`` prints last: where the UI is and how to log in (``passwords``
    None: not found, ``{}``: no login)."""
    lines = ["", f"Airflow is ready: {url}"]
    if passwords is None:
        lines.append(f"  user and password: in {log}")
    elif passwords:
        lines += [f"  user: {user}\n  password: {password}" for user, password in passwords.items()]
    else:
        lines.append("  no login: every user is an admin (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS)")
    lines += [f"Airflow's output: {log}", "Ctrl-C stops it."]
    return "\n".join(lines)


def generated_passwords(env: dict[str, str]) -> dict[str, str] | None:
    """The simple auth manager's users and the passwords the API server generated for them
    (None: no such file, e.g. another auth manager's users)."""
    if env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "").lower() == "true":
        return {}
    path = env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE") or str(
        Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    )
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def health_url(env: dict[str, str]) -> str:
    host = env["AIRFLOW__API__HOST"]
    return f"http://{'127.0.0.1' if host in WILDCARDS else host}:{env['AIRFLOW__API__PORT']}/api/v2/monitor/health"


def wait_healthy(
    env: dict[str, str],
    procs: dict[str, subprocess.Popen],
    components: tuple[str, ...] = ("scheduler", "dag_processor", "triggerer"),
    timeout: float = 600,
) -> None:
    """Until the API server answers and reports ``components`` healthy (none: it answers at all)."""
    import urllib.request

    url = health_url(env)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while not (exited := [name for name, proc in procs.items() if proc.poll() is not None]):
        try:
            with opener.open(url, timeout=5) as response:
                health = json.loads(response.read())
            if all((health.get(c) or {}).get("status") == "healthy" for c in components):
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"Airflow was not healthy after {timeout:.0f} s ({url})")
        time.sleep(1)
    raise RuntimeError(f"airflow {exited[0]} exited with code {procs[exited[0]].returncode}")


def settle(logs: Path, quiet: float = 2.0, limit: float = 30.0) -> None:
    """Until the ``*.log`` files in ``logs`` stop growing for ``quiet`` seconds (at most ``limit``): start-up output done."""
    deadline, size, since = time.monotonic() + limit, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = sum(f.stat().st_size for f in logs.glob("*.log"))
        if now != size:
            size, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.2)


def standalone(env: dict[str, str]) -> int:
    """Airflow's components in the background, then the login banner; runs until Ctrl-C.

    Started here, not by ``airflow standalone``: the API server first, the other components once
    it answers (a scheduler started with it ran a pending task before the execution API listened,
    and the task failed), and the scheduler and triggerer with ``--skip-serve-logs`` (their log
    servers bind every interface, port 8793 and 8794; the API server reads the task logs from
    the same files on this machine instead).
    """
    env = standalone_env(env)
    host, port = env["AIRFLOW__API__HOST"], int(env["AIRFLOW__API__PORT"])
    try:  # the API server would fail on a taken port while the other components run on
        with socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET):
            pass
    except OSError as taken:
        print(f"cannot serve the Airflow UI on {host}:{port} ({taken.strerror}): set ICELOG_AIRFLOW_PORT", file=sys.stderr)
        return 2
    logs = Path(env["AIRFLOW_HOME"]) / "standalone"
    print(f"starting Airflow (API server, then scheduler, DAG processor, triggerer); their output: {logs}", flush=True)
    try:
        with services(env, logs, ("api-server",)) as api:
            wait_healthy(env, api, components=())
            with services(env, logs, tuple(c for c in COMPONENTS if c != "api-server")) as rest:
                wait_healthy(env, {**api, **rest})
                settle(logs)
                print(login_banner(ui_url(env), generated_passwords(env), logs), flush=True)
                while not any(proc.poll() is not None for proc in {**api, **rest}.values()):
                    time.sleep(1)
                return 1  # a component exited on its own
    except (RuntimeError, TimeoutError) as failure:
        print(f"{failure}; the end of its output in {logs}:\n{_tails(logs)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def _tails(logs: Path, chars: int = 1500) -> str:
    return "\n".join(f"== {f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in sorted(logs.glob("*.log")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def airflow_bin() -> str:
    return str(BIN / "airflow")


def migrate(env: dict[str, str]) -> None:
    subprocess.run([airflow_bin(), "db", "migrate"], env=env, check=True, capture_output=True, text=True)


@contextmanager
def services(env: dict[str, str], logs: Path, components: tuple[str, ...] = COMPONENTS) -> Iterator[dict[str, subprocess.Popen]]:
    """Run Airflow components (``airflow scheduler`` ...) while the block runs; stop them after.

    The scheduler and triggerer serve no logs (:data:`COMPONENT_ARGS`). Each runs in its own process group (its executor workers and their Spark JVMs too), with
    stdout and stderr appended to ``logs/<component>.log``, so no pipe can fill up.
    """
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name in components:
            with open(logs / f"{name}.log", "ab") as out:  # the child keeps its own descriptor
                procs[name] = subprocess.Popen(
                    [airflow_bin(), name, *COMPONENT_ARGS.get(name, ())],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        yield procs
    finally:
        stop(list(procs.values()))


def stop(procs: list[subprocess.Popen], grace: float = 15) -> None:
    """SIGTERM each process group, wait up to ``grace`` seconds, then SIGKILL what is left."""

    def signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the leader's pid
        except (ProcessLookupError, PermissionError):
            pass

    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        signal_group(proc, signal.SIGKILL)  # also stragglers whose leader already exited
        proc.wait()


def dags_test(
    env: dict[str, str], dag_id: str, logical_date: str | None = None, conf: dict | None = None, timeout: float = 1800
) -> subprocess.CompletedProcess:
    """Run one DAG run in-process (``airflow dags test``); raise if any task failed.

    The run's start date is when it was created (see :func:`_dags_test_here`), so the UI shows
    its real duration also for a past logical date.
    """
    args = [sys.executable, "-m", "infra.airflow", "dags-test", dag_id]
    if logical_date:
        args.append(logical_date)
    if conf is not None:
        args += ["--conf", json.dumps(conf)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    failed = (
        done.returncode != 0 or "state=failed" in done.stdout + done.stderr or "DagRunState.FAILED" in done.stdout + done.stderr
    )
    if failed:
        raise RuntimeError(f"airflow dags test {dag_id} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def _dags_test_here(args: list[str]) -> None:
    """``airflow dags test ARGS`` in this process, then the run's start date set to its creation.

    Airflow's DAG.test() starts a run at its logical date, so a run of a past day (the demo's
    2013 days) shows a duration of years ("5067d 15h") in the UI. Its ``run_after`` is the
    moment the run was created, the start it really had; the logical date stays as asked.
    """
    from airflow.__main__ import main

    began = datetime.now(UTC)
    sys.argv = ["airflow", "dags", "test", *args]
    try:
        main()
    finally:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import update

        with create_session() as session:
            session.execute(
                update(DagRun)
                .where(DagRun.dag_id == args[0], DagRun.run_after >= began, DagRun.start_date < DagRun.run_after)
                .values(start_date=DagRun.run_after)
            )


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "dags-test":  # dags_test's runner: needs the Airflow environment already set
        _dags_test_here(args)
        sys.exit(0)
    env = airflow_env()
    if command == "migrate":
        migrate(env)
    elif command == "test":
        migrate(env)
        print(
            dags_test(env, args[0], args[1] if len(args) > 1 else None, json.loads(args[2]) if len(args) > 2 else None).stdout[
                -3000:
            ]
        )
    elif command == "standalone":
        migrate(env)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C: Airflow too
        sys.exit(standalone(env))
    else:
        sys.exit(__doc__)

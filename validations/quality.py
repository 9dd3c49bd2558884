"""Data-quality suites with Great Expectations (1.x, built in code; no hand-edited YAML).

Per log table, one suite: icelog's system columns (non-null, (partition, offset) unique,
sane timestamps) plus the payload expectations the user declares in
``<expectations dir>/<namespace.table>.json`` (``$ICELOG_EXPECTATIONS``, default
``./expectations``), each ``{"type": "expect_...", "kwargs": {...}}``, optionally with a
``"severity"``: ``error`` (the default: a failure fails the gate) or ``warn`` (a failure is a
finding the run reports and passes); a ``"severity"`` beside ``"expectations"`` sets the suite's
default (``validations.verdict``). A ``row_condition`` in the kwargs is GX's engine-neutral
condition, e.g. ``{"type": "nullity", "column": {"name": "dep_time"}, "is_null": true}``. A Checkpoint
validates the rows and rebuilds the Data Docs HTML site under ``$ICELOG_HOME/quality``.

**Engines.** The rows are the Parquet files pyiceberg plans for the snapshot, read by
DuckDB into pandas for small scopes and by Spark (GX's Spark datasource) for large ones:
the scope's row count against ``$ICELOG_GX_SPARK_ROWS`` (default 2,000,000) decides, unless
the caller names the engine. Both engines read the same planned files with the same SQL
predicate. ``validations`` never imports ``pipelines``: the caller hands in a SparkSession
(or a function that makes one), so Spark starts only when the Spark engine is chosen.

**Incremental validation.** By default only the rows committed since the last snapshot that
*passed* are validated: the commit core writes the offset ranges each commit added into its
snapshot summary (``icelog.ranges``), and the parent chain from the current snapshot back to
the validated one names every commit since. Full validation runs instead, and says why, when
there is no record yet, when the validated snapshot has been expired (only the newest
``icelog.snapshots.keep`` are retained), or when a commit in between carries no icelog
lineage (a foreign writer). ``full=True`` (``icelog report --full``) re-validates everything.

**What was validated** is recorded in ``<docs root>/validated/<namespace.table>.json``, not
in the table: a report never writes to the table it reads (I8 fingerprints stay equal, and a
read-only catalog user can run it). The record holds the table's UUID (a recreated table
starts over), the last snapshot that passed and the latest runs (mode, ranges, rows,
engine, outcome, expectations evaluated, failures). The marker advances only when the gate
passes (warnings do not hold it), so an error is re-validated until it is fixed. When nothing was committed since, a run reads no
rows and repeats the latest recorded result at that snapshot, with what it covered.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pyiceberg.table import Table

from icelog.storage.core.catalog import icelog_home
from icelog.storage.errors import InvalidInput
from icelog.storage.extras import require
from icelog.storage.log import schema as cols
from icelog.storage.log.files import local_path
from icelog.storage.log.scan import check_snapshot, parquet_from
from icelog.storage.log.state import LogState
from icelog.storage.properties import COMMIT_ID, RANGES
from icelog.storage.settings import Settings
from icelog.validations.verdict import SEVERITIES, severity_of

ENGINES = ("auto", "pandas", "spark")
KEEP_RUNS = 50
#: Failed expectations kept per recorded run (a re-run with nothing new shows them again).
KEEP_FAILURES = 50
#: A suite's severities as GX names them (Data Docs show them).
GX_SEVERITY = {"error": "critical", "warn": "warning"}


@dataclass(frozen=True)
class ValidationScope:
    """Which rows one validation reads.

    Attributes:
        mode: ``full`` (every row of the snapshot), ``incremental`` (``ranges`` only) or
            ``none`` (nothing committed since the validated snapshot).
        ranges: Per partition, merged ``[start, end)`` offset ranges (incremental only).
        since: The last validated snapshot the increment starts from (incremental/none).
        rows: Rows in scope (from watermarks or ranges; no data read).
        reason: Why this mode (shown in the report).
        last_run: For ``none``, the recorded run whose result still stands (its outcome,
            expectations, mode, rows and time), so a re-run shows that, not an empty pass.
    """

    mode: str
    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    since: int | None = None
    rows: int = 0
    reason: str = ""
    last_run: dict[str, Any] | None = None

    def predicate(self) -> str | None:
        """SQL predicate on the system columns (DuckDB and Spark SQL alike); None for every row."""
        if self.mode == "full":
            return None
        terms = [
            f"({cols.PARTITION} = {p} AND {cols.OFFSET} >= {start} AND {cols.OFFSET} < {end})"
            for p, spans in sorted(self.ranges.items())
            for start, end in spans
        ]
        return " OR ".join(terms) if terms else "FALSE"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "ranges": {str(p): [list(s) for s in spans] for p, spans in sorted(self.ranges.items())},
            "since": self.since,
            "rows": self.rows,
            "reason": self.reason,
            **({"last_run": self.last_run} if self.last_run is not None else {}),
        }


@dataclass
class QualityResult:
    table: str
    success: bool
    evaluated: int
    failed: list[dict[str, Any]] = field(default_factory=list)
    data_docs: str | None = None
    seconds: float = 0.0
    snapshot_id: int | None = None
    engine: str = "pandas"
    scope: dict[str, Any] = field(default_factory=dict)
    #: Why the Data Docs still load CDN assets ("" when they work offline).
    docs_not_offline: str = ""

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def expectations_dir(settings: Settings | None = None) -> Path:
    """``$ICELOG_EXPECTATIONS`` (default ``./expectations``)."""
    return (settings or Settings.load()).expectations


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
    default = doc.get("severity", "error") if isinstance(doc, dict) else "error"
    if default not in SEVERITIES:
        raise InvalidInput(reason=f"{file}: the suite's severity is one of {', '.join(SEVERITIES)}, not {default!r}")
    checked = []
    for entry in entries:
        if not isinstance(entry, dict) or not str(entry.get("type", "")).startswith("expect_"):
            raise InvalidInput(reason=f"{file}: each expectation is {{'type': 'expect_...', 'kwargs': {{...}}}}, not {entry!r}")
        severity = entry.get("severity", default)
        if severity not in SEVERITIES:
            raise InvalidInput(reason=f"{file}: {entry['type']}: severity is one of {', '.join(SEVERITIES)}, not {severity!r}")
        checked.append({**entry, "severity": severity})
    return checked


def system_expectations(now_ms: int) -> list[dict[str, Any]]:
    return [
        *(
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}}
            for c in (cols.PARTITION, cols.OFFSET, cols.TIMESTAMP)
        ),
        {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": [cols.PARTITION, cols.OFFSET]}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": cols.OFFSET, "min_value": 0}},
        # Appended no earlier than 2000 and no later than a day from now (clock skew).
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "log_timestamp_ms", "min_value": 946_684_800_000, "max_value": now_ms + 86_400_000},
        },
    ]


def _expectation(entry: dict[str, Any]):
    import great_expectations as gx

    name = "".join(part.capitalize() for part in entry["type"].split("_"))
    cls = getattr(gx.expectations, name, None)
    if cls is None:
        raise InvalidInput(reason=f"unknown expectation {entry['type']!r}")
    try:
        return cls(**entry.get("kwargs", {}), severity=GX_SEVERITY[entry.get("severity", "error")])
    except Exception as e:  # pydantic validation of the kwargs
        raise InvalidInput(reason=f"{entry['type']}: bad arguments ({e})") from e


# --- what was validated -------------------------------------------------------------------


def _record_path(root: Path, name: str) -> Path:
    return root / "validated" / f"{name}.json"


def validation_record(table: Table, docs_root: Path | None = None) -> dict[str, Any]:
    """The validation record of ``table`` ({} if none, or if it belongs to a dropped table of the same name)."""
    root = docs_root or icelog_home() / "quality"
    path = _record_path(root, _name(table))
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}  # a torn record only costs one full validation
    return record if record.get("table_uuid") == str(table.metadata.table_uuid) else {}


def _write_record(table: Table, root: Path, run: dict[str, Any]) -> None:
    record = validation_record(table, root) or {"table": _name(table), "table_uuid": str(table.metadata.table_uuid)}
    if run["success"]:
        record["validated_snapshot_id"] = run["snapshot_id"]
        record["validated_at_ms"] = run["at_ms"]
    record["runs"] = [*record.get("runs", []), run][-KEEP_RUNS:]
    path = _record_path(root, _name(table))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)  # readers see the old record or the new one, never half


def last_run_at(record: dict[str, Any], snapshot_id: int) -> dict[str, Any] | None:
    """The newest recorded run that read the rows of ``snapshot_id`` and kept its result (None if none did)."""
    for run in reversed(record.get("runs", [])):
        # Records written before the expectation count was kept cannot show a result.
        if run.get("snapshot_id") == snapshot_id and run.get("mode") != "none" and "evaluated" in run:
            return run
    return None


def ranges_since(table: Table, since: int, snapshot_id: int | None = None) -> tuple[dict[int, list[tuple[int, int]]] | None, str]:
    """Offset ranges committed after ``since`` up to ``snapshot_id`` (default current), merged.

    Returns:
        ``(ranges, "")``, or ``(None, reason)`` when lineage cannot say: ``since`` is not an
        ancestor that is still retained, or a commit in between carries no icelog lineage.
    """
    meta = table.metadata
    current = meta.current_snapshot_id if snapshot_id is None else snapshot_id
    spans: dict[int, list[tuple[int, int]]] = {}
    while current != since:
        snapshot = meta.snapshot_by_id(current) if current is not None else None
        if snapshot is None:
            return None, f"the last validated snapshot {since} is no longer retained (or not an ancestor)"
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if COMMIT_ID not in props:
            return None, f"snapshot {current} was written without icelog lineage (a foreign writer)"
        for p, (start, end) in json.loads(props.get(RANGES, "{}")).items():
            if end > start:
                spans.setdefault(int(p), []).append((start, end))
        current = snapshot.parent_snapshot_id
    return {p: _merge(s) for p, s in spans.items()}, ""


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def validation_scope(table: Table, *, full: bool = False, docs_root: Path | None = None) -> ValidationScope:
    """Decide what to validate at the current snapshot (reads metadata and the record only)."""
    state = LogState.from_metadata(table.metadata)
    total = sum(w.end - w.start for w in state.watermarks.values())
    if full:
        return ValidationScope("full", rows=total, reason="full re-validation requested")
    record = validation_record(table, docs_root)
    since = record.get("validated_snapshot_id")
    if since is None:
        return ValidationScope("full", rows=total, reason="no earlier validation passed")
    ranges, why = ranges_since(table, since)
    if ranges is None:
        return ValidationScope("full", rows=total, reason=why + "; validating everything")
    rows = sum(end - start for spans in ranges.values() for start, end in spans)
    if not rows:
        last = last_run_at(record, since)
        if last is None:
            return ValidationScope(
                "full", rows=total, reason=f"the result at snapshot {since} was not recorded; validating everything"
            )
        return ValidationScope("none", since=since, reason=f"nothing committed since validated snapshot {since}", last_run=last)
    return ValidationScope("incremental", ranges, since, rows, f"{rows} rows committed since validated snapshot {since}")


# --- reading the rows ---------------------------------------------------------------------


def _name(table: Table) -> str:
    return ".".join(table.name()[-2:])


def scope_paths(table: Table, scope: ValidationScope, snapshot_id: int | None) -> list[str]:
    """The data files pyiceberg plans for the scope (pruned by partition and offset bounds)."""
    from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, EqualTo, GreaterThanOrEqual, LessThan, Or

    if snapshot_id is None:
        return []
    condition: Any = AlwaysTrue() if scope.mode == "full" else AlwaysFalse()
    for p, spans in scope.ranges.items():
        for start, end in spans:
            condition = Or(
                condition,
                And(EqualTo(cols.PARTITION, p), And(GreaterThanOrEqual(cols.OFFSET, start), LessThan(cols.OFFSET, end))),
            )
    return [local_path(t.file.file_path) for t in table.scan(row_filter=condition, snapshot_id=snapshot_id).plan_files()]


def pick_engine(rows: int, engine: str = "auto", spark_rows: int | None = None) -> str:
    """``pandas`` or ``spark`` for a scope of ``rows`` rows: ``auto`` picks Spark above
    ``spark_rows`` (default ``$ICELOG_GX_SPARK_ROWS``, else 2,000,000)."""
    if engine not in ENGINES:
        raise InvalidInput(reason=f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine != "auto":
        return engine
    threshold = Settings.load().gx_spark_rows if spark_rows is None else spark_rows
    return "spark" if rows > threshold else "pandas"


def _pandas_rows(table: Table, paths: list[str], predicate: str | None):
    import duckdb

    if not paths:
        import pandas as pd

        return pd.DataFrame({f.name: [] for f in table.schema().fields} | {"log_timestamp_ms": []})
    where = f" WHERE {predicate}" if predicate else ""
    with duckdb.connect() as con:
        source = parquet_from(
            con, paths, table.io, "union_by_name = true, hive_partitioning = false"
        )  # folder names are not columns
        return con.execute(f"SELECT *, epoch_ms({cols.TIMESTAMP}) AS log_timestamp_ms FROM {source}{where}").df()


def _spark_rows(spark: Any, table: Table, paths: list[str], predicate: str | None):
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema().as_arrow())
    frame = spark.read.schema(schema).parquet(*paths) if paths else spark.createDataFrame([], schema)
    if predicate:
        frame = frame.where(predicate)
    return frame.withColumn("log_timestamp_ms", F.unix_millis(F.col(cols.TIMESTAMP)))


# --- the suite ----------------------------------------------------------------------------


def run_suite(
    table: Table,
    *,
    expectations_file: str | Path | None = None,
    snapshot_id: int | None = None,
    docs_root: Path | None = None,
    full: bool = False,
    engine: str = "auto",
    spark: Any | Callable[[], Any] | None = None,
) -> QualityResult:
    """Validate a log table with its suite; rebuild Data Docs; record what was validated.

    Args:
        table: The log table.
        expectations_file: Payload expectations (default ``expectations/<table>.json``).
        snapshot_id: Validate this snapshot in full (time travel; nothing recorded).
        docs_root: The GX project folder (default ``$ICELOG_HOME/quality``).
        full: Re-validate every row, not only what was committed since the last pass.
        engine: ``auto`` (by rows in scope), ``pandas`` or ``spark``.
        spark: A SparkSession, or a function that returns one (called only for Spark).

    Returns:
        The outcome: each failed expectation, the scope read, the engine, the Data Docs index.

    Raises:
        InvalidInput: bad expectations, engine, or Spark chosen without a session.
        MissingExtra: Great Expectations or pandas is not installed (``icelog[quality]``).
    """
    for module in ("great_expectations", "pandas"):  # before anything is read or written
        require(module, "the Great Expectations suite (icelog report --no-gx skips it)")
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    root = docs_root or icelog_home() / "quality"
    entries = system_expectations(int(time.time() * 1000)) + payload_expectations(name, expectations_file)
    if snapshot_id is not None:
        check_snapshot(table, snapshot_id)  # a typed UnknownSnapshot, not a planning error
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
        scope = ValidationScope("full", rows=int(summary.get("total-records", 0)), reason=f"snapshot {snapshot_id} requested")
    else:
        scope = validation_scope(table, full=full, docs_root=root)
    at = snapshot_id if snapshot_id is not None else table.metadata.current_snapshot_id
    docs = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    if scope.mode == "none":  # the last result still stands: repeat it, with what it covered
        last = scope.last_run or {}
        return QualityResult(
            name,
            bool(last.get("success")),
            int(last.get("evaluated", 0)),
            list(last.get("failures", [])),
            str(docs) if docs.exists() else None,
            time.perf_counter() - started,
            at,
            str(last.get("engine", "pandas")),
            scope.to_dict(),
        )
    chosen = pick_engine(scope.rows, engine)
    paths = scope_paths(table, scope, at)
    if chosen == "spark":
        session = spark() if callable(spark) else spark
        if session is None:
            raise InvalidInput(reason="the Spark engine needs a SparkSession (pass spark=...)")
        frame = _spark_rows(session, table, paths, scope.predicate())
    else:
        frame = _pandas_rows(table, paths, scope.predicate())
    outcome = _checkpoint(root, name, chosen, [_expectation(e) for e in entries], frame)
    results = [r for run in outcome.run_results.values() for r in run.results]
    failed = [
        {
            "expectation": r.expectation_config.type,
            "kwargs": {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"},
            "unexpected_count": (r.result or {}).get("unexpected_count"),
            "severity": "error" if r.expectation_config.severity == GX_SEVERITY["error"] else "warn",
        }
        for r in results
        if not r.success
    ]
    gate = not any(severity_of(f) == "error" for f in failed)
    try:
        offline_data_docs(docs.parent)
        offline = ""
    except WebAssetsMissing as e:  # validation stands; only the pages need the network then
        offline = e.describe()
    result = QualityResult(
        name,
        gate,
        len(results),
        failed,
        str(docs) if docs.exists() else None,
        time.perf_counter() - started,
        at,
        chosen,
        scope.to_dict(),
        offline,
    )
    if snapshot_id is None:
        _write_record(
            table,
            root,
            {
                "at_ms": int(time.time() * 1000),
                "snapshot_id": at,
                "success": result.success,
                "engine": chosen,
                "evaluated": result.evaluated,
                "failed": len(failed),
                "failures": failed[:KEEP_FAILURES],
                "seconds": round(result.seconds, 3),
                **scope.to_dict(),
            },
        )
    return result


def _checkpoint(root: Path, name: str, engine: str, expectations: list[Any], frame: Any) -> Any:
    """Run the table's checkpoint on ``frame`` (a pandas or Spark DataFrame) and update Data Docs."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no phoning home from a closed network
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction

    context = gx.get_context(mode="file", project_root_dir=str(root))
    _quiet(context)
    key = name.replace(".", "__")
    if engine == "spark":
        source = context.data_sources.add_or_update_spark(name=f"icelog_spark__{key}")
    else:
        source = context.data_sources.add_or_update_pandas(name=f"icelog__{key}")
    asset = source.add_dataframe_asset(name=key) if key not in [a.name for a in source.assets] else source.get_asset(key)
    batch = (
        asset.add_batch_definition_whole_dataframe(f"{key}__snapshot")
        if f"{key}__snapshot" not in [b.name for b in asset.batch_definitions]
        else asset.get_batch_definition(f"{key}__snapshot")
    )
    suite = context.suites.add_or_update(gx.ExpectationSuite(name=f"{key}__suite", expectations=expectations))
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=f"{key}__validation__{engine}", data=batch, suite=suite)
    )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=f"{key}__checkpoint__{engine}",
            validation_definitions=[definition],
            actions=[UpdateDataDocsAction(name="data_docs")],
        )
    )
    return checkpoint.run(batch_parameters={"dataframe": frame})


def _quiet(context: Any) -> None:
    from great_expectations.data_context.types.base import ProgressBarsConfig

    current = context.variables.progress_bars
    globally = current.get("globally") if isinstance(current, dict) else getattr(current, "globally", None)
    if globally is not False:
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()


# --- Data Docs that work offline ----------------------------------------------------------

#: The CDN addresses GX 1.24's Data Docs templates load, and the file of the pinned npm package
#: (infra/web-assets/package.json, installed by ``make setup``) that replaces each.
CDN_ASSETS: tuple[tuple[str, str], ...] = (
    (r"https://maxcdn\.bootstrapcdn\.com/bootstrap/[\d.]+/css/bootstrap\.min\.css", "bootstrap/dist/css/bootstrap.min.css"),
    (r"https://stackpath\.bootstrapcdn\.com/bootstrap/[\d.]+/js/bootstrap\.min\.js", "bootstrap/dist/js/bootstrap.min.js"),
    (
        r"https://cdn\.jsdelivr\.net/npm/@forevolve/bootstrap-dark@[\d.]+/dist/css/bootstrap-prefers-dark\.css",
        "@forevolve/bootstrap-dark/dist/css/bootstrap-prefers-dark.css",
    ),
    (r"https://code\.jquery\.com/jquery-[\d.]+\.min\.js", "jquery/dist/jquery.min.js"),
    (r"https://cdnjs\.cloudflare\.com/ajax/libs/popper\.js/[\d.]+/umd/popper\.min\.js", "popper.js/dist/umd/popper.min.js"),
    (
        r"https://cdnjs\.cloudflare\.com/ajax/libs/font-awesome/[\d.]+/css/all\.min\.css",
        "@fortawesome/fontawesome-free/css/all.min.css",
    ),
    (
        r"https://cdnjs\.cloudflare\.com/ajax/libs/bootstrap-datepicker/[\d.]+/css/bootstrap-datepicker\.min\.css",
        "bootstrap-datepicker/dist/css/bootstrap-datepicker.min.css",
    ),
    (
        r"https://cdnjs\.cloudflare\.com/ajax/libs/bootstrap-datepicker/[\d.]+/js/bootstrap-datepicker\.min\.js",
        "bootstrap-datepicker/dist/js/bootstrap-datepicker.min.js",
    ),
    (r"https://unpkg\.com/bootstrap-table@[\d.]+/dist/bootstrap-table\.min\.css", "bootstrap-table/dist/bootstrap-table.min.css"),
    (r"https://unpkg\.com/bootstrap-table@[\d.]+/dist/bootstrap-table\.min\.js", "bootstrap-table/dist/bootstrap-table.min.js"),
    (
        r"https://unpkg\.com/bootstrap-table@[\d.]+/dist/extensions/filter-control/bootstrap-table-filter-control(\.min)?\.css",
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    (
        r"https://unpkg\.com/bootstrap-table@[\d.]+/dist/extensions/filter-control/bootstrap-table-filter-control\.min\.js",
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    (r"https://cdn\.jsdelivr\.net/npm/vega@5", "vega/build/vega.min.js"),
    (r"https://cdn\.jsdelivr\.net/npm/vega-lite@5", "vega-lite/build/vega-lite.min.js"),
    (r"https://cdn\.jsdelivr\.net/npm/vega-embed@6", "vega-embed/build/vega-embed.min.js"),
)
#: Folders copied whole because a stylesheet loads from them by relative URL.
ASSET_FOLDERS = ("@fortawesome/fontawesome-free/webfonts",)
OFFLINE_DIR = "static/offline"
#: The navbar logo comes from GX's S3 bucket; the site ships the same images in static/images.
GX_IMAGES = r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/([\w.-]+)(\?[^\"']*)?"
#: Subresource-integrity hashes pin the CDN builds; the local copies are other builds.
INTEGRITY = r'\s+(integrity="[^"]*"|crossorigin="[^"]*")'


def web_assets_dir(settings: Settings | None = None) -> Path:
    """Where ``make setup`` installed the npm assets in a checkout (``$ICELOG_WEB_ASSETS`` overrides).

    An installed wheel has no ``infra/`` folder: there ``$ICELOG_WEB_ASSETS`` names them, or Data
    Docs keep loading their assets from the CDNs (the validation result is the same)."""
    default = Path(__file__).resolve().parents[1] / "infra" / "web-assets" / "node_modules"
    return (settings or Settings.load()).web_assets or default


class WebAssetsMissing(InvalidInput):
    message = "offline Data Docs need the pinned web assets: {reason}"


def offline_data_docs(site: Path, assets: Path | None = None) -> list[str]:
    """Make a Data Docs site load local copies of its CDN assets; return the URLs replaced.

    Copies the pinned npm files into ``<site>/static/offline/`` and rewrites every page to
    load them by relative path, so the site renders styled, with its charts, on a machine
    without internet. Idempotent.

    Raises:
        WebAssetsMissing: the npm assets are not installed (run ``make setup``).
    """
    import re
    import shutil

    if not site.exists():
        return []
    assets = assets or web_assets_dir()
    missing = [rel for _, rel in CDN_ASSETS if not (assets / rel).exists()]
    if missing:
        raise WebAssetsMissing(
            reason=f"{assets} lacks {missing[0]}: set ICELOG_WEB_ASSETS to a node_modules folder with the npm packages of "
            "icelog's infra/web-assets/package.json (in a checkout, `make setup` installs them)"
        )
    target = site / OFFLINE_DIR
    for rel in {rel for _, rel in CDN_ASSETS}:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(assets / rel, target / rel)
    for folder in ASSET_FOLDERS:
        shutil.copytree(assets / folder, target / folder, dirs_exist_ok=True)
    replaced: set[str] = set()
    patterns = [(re.compile(pattern), rel) for pattern, rel in CDN_ASSETS]
    for page in site.rglob("*.html"):
        text = original = page.read_text()
        for pattern, rel in patterns:
            local = os.path.relpath(target / rel, page.parent)
            text = pattern.sub(lambda m, local=local: (replaced.add(m.group(0)), local)[1], text)
        images = os.path.relpath(site / "static" / "images", page.parent)
        text = re.sub(GX_IMAGES, lambda m, images=images: (replaced.add(m.group(0)), f"{images}/{m.group(1)}")[1], text)
        text = re.sub(INTEGRITY, "", text)
        if text != original:
            page.write_text(text)
    return sorted(replaced)

"""Operators over icelog's tasks (``icelog.pipelines.tasks``): ingest, backfill, validate,
maintain, mirror, fan out.

Each is a thin wrapper: it opens the catalog of its Airflow connection (``IcelogHook``) and
calls the task function, whose dict result becomes the XCom (what was written: files,
offset ranges, rows, snapshot). ``icelog_conn_id=None`` keeps icelog's own default catalog
(``$ICELOG_CATALOG``, ``.pyiceberg.yaml``, the embedded one) exactly as the task functions use
it. The task functions are imported when a task runs: a DAG file that uses these operators
parses without pyiceberg, pyarrow or Spark.

Bad input fails the task with icelog's typed error (``storage.errors``), before anything is
written: an undefined connection or one of another type (``InvalidConnection``), a table that
does not exist (``UnknownTable``), a malformed argument (``InvalidInput``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from icelog.provider.assets import default_catalog_name, icelog_asset
from icelog.provider.hooks import IcelogHook
from icelog.provider.lineage import Lineage, operator_lineage, path, table


def _literal(value: Any) -> bool:
    """A value known when the DAG is parsed (not a Jinja template)."""
    return isinstance(value, str) and "{{" not in value and "{%" not in value


class IcelogBaseOperator(BaseOperator):
    """What every icelog operator shares: the catalog's connection and the table.

    Args:
        table: The log table (``namespace.table``); templated.
        icelog_conn_id: The catalog's Airflow connection (type ``icelog``); ``None``: icelog's
            default catalog.
    """

    template_fields: Sequence[str] = ("table", "icelog_conn_id")
    ui_color = "#bfe3f5"
    writes_table = False  # its table's Asset is a default outlet

    def __init__(self, *, table: str, icelog_conn_id: str | None = IcelogHook.default_conn_name, **kwargs: Any) -> None:
        if (
            self.writes_table
            and "outlets" not in kwargs
            and _literal(table)
            and (icelog_conn_id is None or _literal(icelog_conn_id))
        ):
            kwargs["outlets"] = [icelog_asset(table, icelog_conn_id)]
        super().__init__(**kwargs)
        self.table = table
        self.icelog_conn_id = icelog_conn_id

    def catalog(self) -> Any:
        """The connection's catalog; ``None`` without a connection: the task functions then open
        icelog's default themselves (a read of a home that does not exist creates nothing)."""
        if self.icelog_conn_id is None:
            return None
        return IcelogHook(self.icelog_conn_id).get_conn()

    def catalog_name(self) -> str:
        """The catalog's name in Asset URIs and lineage datasets."""
        return IcelogHook(self.icelog_conn_id).catalog_name if self.icelog_conn_id else default_catalog_name()

    def execute(self, context: Any) -> dict[str, Any]:
        result = self.run(context)
        self._lineage = self.lineage(result)
        return result

    def run(self, context: Any) -> dict[str, Any]:
        """The task: its dict result is the XCom."""
        raise NotImplementedError

    def lineage(self, result: dict[str, Any]) -> Lineage:
        """What the run read and wrote (OpenLineage), from its result."""
        return Lineage(inputs=(table(self.catalog_name(), self.table),))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Called by Airflow's OpenLineage provider after a successful run (``icelog[lineage]``)."""
        return operator_lineage(getattr(self, "_lineage", None))


class IcelogIngestOperator(IcelogBaseOperator):
    """Ingest one day's landing files (``<landing>/<table>/date=<day>/``), each file exactly once.

    XCom: ``pipelines.ingest.IngestResult.to_dict()``: the files loaded with the offset ranges
    their rows got, the files skipped (loaded before), the ranges per partition, rows, snapshot.

    Args:
        day: ``YYYY-MM-DD`` (default: the run's ``ds``); templated.
        landing: Landing root, a folder or ``s3://bucket/prefix`` (default ``$ICELOG_LANDING``,
            else ``$ICELOG_HOME/landing``); templated.
        fmt: ``parquet``, ``csv`` or ``jsonl``.
        key_column: The column whose hash picks the log partition (default: the table's).
        partitions: Only these log partitions.
        reload_changed: Load a file whose content changed since it was loaded again, as new rows.
        skip_when_empty: No landing files that day: the task is skipped (its Asset gets no event).
    """

    template_fields = ("table", "icelog_conn_id", "day", "landing", "fmt", "key_column", "partitions")
    writes_table = True

    def __init__(
        self,
        *,
        day: str = "{{ ds }}",
        landing: str | None = None,
        fmt: str = "parquet",
        key_column: str | None = None,
        partitions: list[int] | None = None,
        reload_changed: bool = False,
        skip_when_empty: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.day, self.landing, self.fmt = day, landing, fmt
        self.key_column, self.partitions, self.reload_changed = key_column, partitions, reload_changed
        self.skip_when_empty = skip_when_empty

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.tasks import ingest_day

        result = ingest_day(
            self.table,
            self.day,
            landing=self.landing or None,
            fmt=self.fmt,
            key_column=self.key_column,
            catalog=self.catalog(),
            partitions=self.partitions,
            reload_changed=bool(self.reload_changed),
        )
        if self.skip_when_empty and not result["loaded"] and not result["skipped"]:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"nothing to do: no landing files for {self.table} on {self.day}")
        return result

    def lineage(self, result: dict[str, Any]) -> Lineage:
        loaded = [f["path"] for f in result["loaded"]]
        return Lineage(inputs=tuple(map(path, loaded)), outputs=(table(self.catalog_name(), self.table),) if loaded else ())


class IcelogBackfillOperator(IcelogBaseOperator):
    """Ingest every day in ``[start, end]``, in order; each file exactly once (``tasks.backfill``).

    XCom: per day the rows and files loaded and skipped, and the totals.
    """

    template_fields = ("table", "icelog_conn_id", "start", "end", "landing", "fmt", "key_column", "partitions", "reload_changed")
    writes_table = True

    def __init__(
        self,
        *,
        start: str,
        end: str,
        landing: str | None = None,
        fmt: str = "parquet",
        key_column: str | None = None,
        partitions: list[int] | None = None,
        reload_changed: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.start, self.end, self.landing, self.fmt = start, end, landing, fmt
        self.key_column, self.partitions, self.reload_changed = key_column, partitions, reload_changed

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.tasks import backfill

        return backfill(
            self.table,
            self.start,
            self.end,
            landing=self.landing or None,
            fmt=self.fmt,
            key_column=self.key_column,
            catalog=self.catalog(),
            partitions=self.partitions,
            reload_changed=bool(self.reload_changed),
        )

    def lineage(self, result: dict[str, Any]) -> Lineage:
        from icelog.pipelines.tasks import day_folder

        days = [str(day_folder(self.landing or None, self.table, d["day"])) for d in result["days"] if d["files_loaded"]]
        return Lineage(inputs=tuple(map(path, days)), outputs=(table(self.catalog_name(), self.table),) if days else ())


class IcelogValidateOperator(IcelogBaseOperator):
    """Run every check (contiguity, producers, transactions) and the Great Expectations quality
    suite on the rows committed since its last pass, and publish the report; fail on any violation.

    XCom: the checks' summary (snapshot, rows, violations), the report's path and the quality
    suite's outcome (``quality_ok``, ``quality_scope``).

    Args:
        deep: The deep contiguity check (reads the offsets, not only the manifests).
        report: Publish the HTML report and Data Docs (with the quality suite).
        full: Validate every row, not only those since the last pass.
    """

    def __init__(self, *, deep: bool = True, report: bool = True, full: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deep, self.report, self.full = deep, report, full

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.tasks import validate

        return validate(self.table, deep=self.deep, catalog=self.catalog(), report=self.report, full=self.full)


class IcelogMaintainOperator(IcelogBaseOperator):
    """Retention, compaction that keeps every offset, snapshot expiry and orphan cleanup.

    XCom: what each step did (``storage.admin.maintenance.maintain``'s report).
    """

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.tasks import maintain

        return maintain(self.table, catalog=self.catalog())

    def lineage(self, result: dict[str, Any]) -> Lineage:
        return Lineage(inputs=(table(self.catalog_name(), self.table),), outputs=(table(self.catalog_name(), self.table),))


class IcelogMirrorOperator(IcelogBaseOperator):
    """One incremental, resumable mirror step of ``table`` into another catalog, same offsets.

    XCom: the step's result (the offset ranges and files copied per partition).

    Args:
        target_conn_id: The copy's catalog as an Airflow connection; or
        target_catalog: its pyiceberg catalog name (default ``$ICELOG_MIRROR_CATALOG``); templated.
        target_table: The copy's name (default: the source's).
        principal: Needs ``replicator-write`` on the target (default ``$ICELOG_PRINCIPAL``).
    """

    template_fields = ("table", "icelog_conn_id", "target_conn_id", "target_catalog", "target_table")

    def __init__(
        self,
        *,
        target_conn_id: str | None = None,
        target_catalog: str | None = None,
        target_table: str | None = None,
        principal: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.target_conn_id, self.target_catalog = target_conn_id, target_catalog
        self.target_table, self.principal = target_table, principal

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.mirror import mirror_table

        target = IcelogHook(self.target_conn_id).get_conn() if self.target_conn_id else (self.target_catalog or None)
        return mirror_table(self.table, target, self.target_table or None, self.principal, source_catalog=self.catalog())

    def lineage(self, result: dict[str, Any]) -> Lineage:
        from icelog.storage.settings import Settings

        if self.target_conn_id:
            target = IcelogHook(self.target_conn_id).catalog_name
        else:
            target = self.target_catalog or Settings.load().mirror_catalog or ""
        source = table(self.catalog_name(), self.table)
        return Lineage(inputs=(source,), outputs=(table(target, self.target_table or self.table),))


class IcelogFanOutOperator(IcelogBaseOperator):
    """Copy the source table's new records to routed tables in one transaction, with the consumer
    group's new position: each record once, whatever re-runs (``pipelines.fanout``).

    XCom: the offsets written per target, rows read and written, the group's new offsets.

    Args:
        table: The source log table.
        group: The consumer group holding the source position.
        routes: ``{route value: target table}``; templated.
        route_column: The source column whose value picks the target.
        key_column: The column whose hash picks the target partition.
    """

    template_fields = ("table", "icelog_conn_id", "group", "routes", "route_column", "key_column")

    def __init__(
        self, *, group: str, routes: dict[str, str], route_column: str = "key", key_column: str = "key", **kwargs: Any
    ) -> None:
        conn = kwargs.get("icelog_conn_id", IcelogHook.default_conn_name)
        if "outlets" not in kwargs and isinstance(routes, dict) and all(_literal(t) for t in routes.values()):
            if conn is None or _literal(conn):
                kwargs["outlets"] = [icelog_asset(t, conn) for t in dict.fromkeys(routes.values())]
        super().__init__(**kwargs)
        self.group, self.routes, self.route_column, self.key_column = group, routes, route_column, key_column

    def run(self, context: Any) -> dict[str, Any]:
        from icelog.pipelines.tasks import fanout

        return fanout(
            self.table,
            self.group,
            self.routes,
            route_column=self.route_column,
            key_column=self.key_column,
            catalog=self.catalog(),
        )

    def lineage(self, result: dict[str, Any]) -> Lineage:
        catalog = self.catalog_name()
        written = sorted(result.get("written") or {})
        return Lineage(inputs=(table(catalog, self.table),), outputs=tuple(table(catalog, t) for t in written))

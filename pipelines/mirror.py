"""Mirror tasks for Airflow (and the place for a Spark bulk copy): wiring over ``storage.replication.mirror``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pyiceberg.catalog import Catalog

from icelog.pipelines.spark import file_io_properties
from icelog.storage.core.catalog import open_catalog
from icelog.storage.errors import InvalidInput
from icelog.storage.log import schema as cols
from icelog.storage.replication.mirror import copy_files, mirror
from icelog.storage.settings import MIRROR_CATALOG, Settings

MIRROR_CATALOG_ENV = MIRROR_CATALOG.name


def mirror_table(
    source: str,
    target_catalog: str | Catalog | None = None,
    target_table: str | None = None,
    principal: str | None = None,
    *,
    source_catalog: str | Catalog | None = None,
) -> dict[str, Any]:
    """One incremental, resumable mirror step of ``source``.

    Args:
        source: The source log table.
        target_catalog: The copy's catalog, a name or a catalog already open (default
            ``$ICELOG_MIRROR_CATALOG``).
        target_table: The copy's name (default: the source's).
        principal: Needs ``replicator-write`` on the target (default ``$ICELOG_PRINCIPAL``).
        source_catalog: The source's catalog (default: the default catalog).

    Raises:
        InvalidInput: no target catalog named.
        AuthorizationFailed, MirrorGap, MirrorSourceChanged, MirrorPromoted: terminal; see
            ``storage.replication.mirror.mirror``. Transient errors are safe to retry: a step resumes.
    """
    settings = Settings.load()  # this task's one read of the environment
    name = target_catalog or settings.mirror_catalog
    if not name:
        raise InvalidInput(reason=f"no target catalog: pass one or set {MIRROR_CATALOG_ENV}")
    return mirror(
        open_catalog(source_catalog, settings=settings),
        source,
        open_catalog(name, settings=settings),
        target_table,
        principal=principal or settings.principal,
        copy_threads=settings.mirror_threads,
    ).to_dict()


IoProperties = Mapping[str, str] | Callable[[], Mapping[str, str]] | None


def spark_copier(spark: Any, source_io: IoProperties = None, target_io: IoProperties = None) -> Any:
    """A copier for ``storage.replication.mirror.mirror`` that copies the files on Spark's executors, in
    parallel, byte for byte; the driver only plans, reads footers and commits.

    Args:
        spark: A SparkSession.
        source_io: The source table's FileIO settings (``pipelines.spark.file_io_properties`` of
            ``table.io.properties``), or a function returning them; ``None``: local files.
        target_io: The same for the target (a function: resolved at the first copy, when the
            step has created the target).

    Executors build each table's FileIO from these settings: an object store's path is reached
    with its catalog's endpoint and keys, never with pyarrow's defaults (AWS).
    """
    resolved: dict[str, dict[str, str] | None] = {}

    def settings(name: str, given: IoProperties) -> dict[str, str] | None:
        if name not in resolved:
            found = given() if callable(given) else given
            resolved[name] = None if found is None else file_io_properties(found)
        return resolved[name]

    def copy(pairs: Any) -> None:
        pairs = list(pairs)
        if not pairs:
            return
        job = CopySlice(settings("source", source_io), settings("target", target_io))
        slices = min(len(pairs), max(1, spark.sparkContext.defaultParallelism * 4))
        spark.sparkContext.parallelize(pairs, slices).foreachPartition(job)

    return copy


@dataclass(frozen=True)
class CopySlice:
    """On an executor: copy a slice of ``(source, target)`` pairs through FileIOs built from the
    shipped settings (a FileIO itself is not shipped: it holds connections)."""

    source_io: dict[str, str] | None
    target_io: dict[str, str] | None

    def __call__(self, pairs: Any) -> None:
        from pyiceberg.io import load_file_io

        pairs = list(pairs)
        if self.source_io is None or self.target_io is None:
            copy_files(pairs)
            return
        copy_files(pairs, source_io=load_file_io(self.source_io), target_io=load_file_io(self.target_io))


def mirror_bulk(
    spark: Any,
    source_catalog: Any,
    source_table: str,
    target_catalog: Any,
    target_table: str | None = None,
    *,
    principal: str | None = None,
) -> Any:
    """A mirror step whose file copies run on Spark's executors (bulk copies, first mirrors).

    Same guarantees as ``storage.replication.mirror.mirror``: it is the same step with another copier.
    """
    target_id = cols.qualified(target_table or source_table)
    copier = spark_copier(
        spark,
        source_io=lambda: source_catalog.load_table(cols.qualified(source_table)).io.properties,
        target_io=lambda: target_catalog.load_table(target_id).io.properties,
    )
    return mirror(source_catalog, source_table, target_catalog, target_table, principal=principal, copier=copier)

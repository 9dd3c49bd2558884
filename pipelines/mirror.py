"""Mirror tasks for Airflow (and the place for a Spark bulk copy): wiring over ``storage.replication.mirror``."""

from __future__ import annotations

import os
from typing import Any

from storage.core.catalog import open_catalog
from storage.errors import InvalidInput
from storage.replication.mirror import copy_files, mirror

MIRROR_CATALOG_ENV = "ICELOG_MIRROR_CATALOG"


def mirror_table(
    source: str, target_catalog: str | None = None, target_table: str | None = None, principal: str | None = None
) -> dict[str, Any]:
    """One incremental, resumable mirror step of ``source`` (in the default catalog).

    Args:
        source: The source log table.
        target_catalog: The copy's catalog (default ``$ICELOG_MIRROR_CATALOG``).
        target_table: The copy's name (default: the source's).
        principal: Needs ``replicator-write`` on the target (default ``$ICELOG_PRINCIPAL``).

    Raises:
        InvalidInput: no target catalog named.
        AuthorizationFailed, MirrorGap, MirrorSourceChanged, MirrorPromoted: terminal; see
            ``storage.replication.mirror.mirror``. Transient errors are safe to retry: a step resumes.
    """
    name = target_catalog or os.environ.get(MIRROR_CATALOG_ENV)
    if not name:
        raise InvalidInput(reason=f"no target catalog: pass one or set {MIRROR_CATALOG_ENV}")
    return mirror(open_catalog(), source, open_catalog(name), target_table, principal=principal).to_dict()


def spark_copier(spark: Any) -> Any:
    """A copier for ``storage.replication.mirror.mirror`` that copies the files on Spark's executors, in
    parallel, byte for byte; the driver only plans, reads footers and commits."""

    def copy(pairs: Any) -> None:
        pairs = list(pairs)
        if not pairs:
            return
        slices = min(len(pairs), max(1, spark.sparkContext.defaultParallelism * 4))
        spark.sparkContext.parallelize(pairs, slices).foreachPartition(_copy_slice)

    return copy


def _copy_slice(pairs: Any) -> None:
    copy_files(list(pairs))


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
    return mirror(source_catalog, source_table, target_catalog, target_table, principal=principal, copier=spark_copier(spark))

"""``maintain``: retention, compaction, snapshot expiry, orphan and superseded-metadata cleanup.

Each state change is a commit request of its owner (``storage.log.maintenance``) run through
the commit core; the clean-ups list and delete through the table's FileIO.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pyiceberg.catalog import Catalog

from icelog.storage import properties
from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import metadata_files
from icelog.storage.core.commit import commit, load, refuse_read_only
from icelog.storage.errors import InvalidInput
from icelog.storage.log.files import store_reachable
from icelog.storage.log.maintenance import Compaction, Retention, check_positive, expire_snapshots
from icelog.storage.properties import READ_ONLY


def maintain(
    catalog: Catalog,
    identifier: str,
    *,
    retention_ms: int | None = None,
    retention_bytes: int | None = None,
    keep_snapshots: int = 5,
    orphan_age_s: float = 3600.0,
    compact: bool = True,
) -> dict[str, Any]:
    """Run retention, compaction, snapshot expiry, orphan and superseded-metadata cleanup, in that order.

    Retention limits default to the table properties ``icelog.retention.ms`` / ``.bytes``.
    A read-only mirror target gets orphan cleanup alone (a killed mirror step's copies): its
    content follows its source, retention included.

    Raises:
        ReadOnlyTable: explicit retention limits for a read-only mirror target.
        InvalidIdentifier: retention for a system table (``icelog_system.*``).
    """
    check_positive(retention_ms=retention_ms, retention_bytes=retention_bytes, keep_snapshots=keep_snapshots)
    if not isinstance(orphan_age_s, (int, float)) or isinstance(orphan_age_s, bool) or not 0 <= orphan_age_s < float("inf"):
        raise InvalidInput(reason=f"orphan_age_s must be a finite number >= 0, not {orphan_age_s!r}")
    explicit = retention_ms is not None or retention_bytes is not None
    table = load(catalog, identifier)
    props = table.metadata.properties
    retention_ms = retention_ms if retention_ms is not None else properties.read(props, properties.RETENTION_MS, identifier)
    retention_bytes = (
        retention_bytes if retention_bytes is not None else properties.read(props, properties.RETENTION_BYTES, identifier)
    )
    report: dict[str, Any] = {"table": identifier, "started": datetime.now(UTC).isoformat()}
    if props.get(READ_ONLY):
        if explicit:
            refuse_read_only(identifier, table.metadata)
        report["read_only"] = props[READ_ONLY]
        report["orphans_removed"] = len(remove_orphan_files(catalog, identifier, orphan_age_s))
        return report
    if retention_ms is not None or retention_bytes is not None:
        report["retention"] = commit(catalog, identifier, Retention(identifier, retention_ms, retention_bytes)).result
    if compact:
        report["compaction"] = commit(catalog, identifier, Compaction(identifier)).result
    with store_reachable(identifier):  # listings and deletes; the commits above type their own errors
        report["expired_snapshots"] = expire_snapshots(catalog, identifier, keep=keep_snapshots)
        report["orphans_removed"] = len(remove_orphan_files(catalog, identifier, orphan_age_s))
        report["metadata_files_removed"] = len(remove_superseded_metadata(catalog, identifier))
    return report


def remove_superseded_metadata(catalog: Catalog, identifier: str) -> list[str]:
    """Delete metadata files superseded more than ``icelog.metadata.delete-grace-ms`` ago
    (as every commit does), e.g. for a table no commit sweeps any more."""
    table = load(catalog, identifier)
    grace_ms = properties.read(table.metadata.properties, properties.METADATA_DELETE_GRACE_MS, identifier)
    return metadata_files.delete_superseded(table.io, table.metadata, table.metadata_location, grace_ms)

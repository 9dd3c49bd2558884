"""Planning reads of a snapshot: which data files hold its rows (from manifests, no data read)."""

from __future__ import annotations

from pyiceberg.table import Table

from storage.errors import UnknownSnapshot
from storage.log.files import local_path


def check_snapshot(table: Table, snapshot_id: int | None) -> None:
    """Raise :class:`UnknownSnapshot` unless ``snapshot_id`` is None or a retained snapshot."""
    if snapshot_id is not None and table.metadata.snapshot_by_id(snapshot_id) is None:
        retained = [s.snapshot_id for s in sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)]
        raise UnknownSnapshot(table=".".join(table.name()), snapshot_id=snapshot_id, retained=retained)


def planned_paths(table: Table, snapshot_id: int | None = None) -> list[str]:
    """Local paths of the data files of ``snapshot_id`` (default: the current snapshot)."""
    check_snapshot(table, snapshot_id)
    if snapshot_id is None and table.metadata.current_snapshot_id is None:
        return []
    return [local_path(t.file.file_path) for t in table.scan(snapshot_id=snapshot_id).plan_files()]

"""The files under a table, and the files its metadata still needs (computed here, independently
of ``storage.admin.orphans``): what orphan cleanup and kill -9 tests compare."""

from __future__ import annotations

import json
import os

from icelog.storage.log.files import local_path


def files_on_disk(table) -> set[str]:
    """Every file under the table's location."""
    root = local_path(table.metadata.location)
    return {os.path.join(d, name) for d, _, names in os.walk(root) for name in names}


def files_referenced(table) -> set[str]:
    """Every file the table's metadata still needs, computed here independently of
    ``storage.admin.orphans.referenced_files``: the current metadata file and the metadata log, the commit-id registry's files;
    per retained snapshot its manifest list, its manifests and the data files it reads."""
    meta = table.metadata
    needed = {local_path(table.metadata_location)} | {local_path(e.metadata_file) for e in meta.metadata_log}
    listed = json.loads(meta.properties.get("icelog.commits.files") or '{"dir": "", "files": []}')
    needed.update(local_path(f"{listed['dir']}/icelog-commits-{stem}.avro") for stem, *_ in listed["files"])  # commit-id registry
    for snapshot in meta.snapshots:
        needed.add(local_path(snapshot.manifest_list))
        needed.update(local_path(m.manifest_path) for m in snapshot.manifests(table.io))
        needed.update(local_path(task.file.file_path) for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    return needed

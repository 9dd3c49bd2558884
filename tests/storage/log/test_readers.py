"""Readers never fail because a writer is committing (I7), and metadata still stays bounded.

A commit never deletes the metadata file it replaced; superseded files go only after
``icelog.metadata.delete-grace-ms``. So a reader holding an old pointer can always load it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from icelog.storage.core.commit import METADATA_GRACE_MS
from icelog.storage.core.metadata_files import SWEEP_EVERY, version_of
from icelog.storage.log.table import LogTable
from tests.support.processes import worker_processes

ROOT = Path(__file__).resolve().parents[3]


def metadata_files(t: LogTable) -> list[str]:
    folder = t.table().metadata.location.removeprefix("file://") + "/metadata"
    return sorted(f for f in os.listdir(folder) if f.endswith(".metadata.json"))


def test_i7_readers_never_fail_while_a_writer_commits(heavy_spec, tmp_path):
    catalog = heavy_spec.open()
    # A short metadata log makes old pointers fall out of it after a few commits, as in the
    # reported failure (readers died on a deleted *.metadata.json).
    t = LogTable.create(catalog, "db.busy", 1, properties={"write.metadata.previous-versions-max": "2"})
    t.append({0: [{"key": "seed"}]})
    failures, reads = [], 0
    # Enough commits that the reader overlaps many of them however fast commits got (80 were
    # over after 3 reads once the commit cost went flat: the CLI reader below takes seconds).
    with worker_processes(heavy_spec, [["conditional_loop", t.identifier, "0", "240", "w"]], tmp_path) as procs:
        env = {**heavy_spec.env(), "ICELOG_LOG_LEVEL": "error"}
        while procs[0].poll() is None:
            try:
                rows = t.read(0)  # icelog's reader
                assert rows.column("log_offset").to_pylist() == list(range(rows.num_rows))
                catalog.load_table(t.identifier).scan().to_arrow()  # a plain pyiceberg reader
                reads += 1
            except Exception as e:  # noqa: BLE001 - any failure is the defect
                failures.append(repr(e))
            if reads % 25 == 1:
                done = subprocess.run(
                    [sys.executable, "-m", "icelog.pipelines.cli", "--output", "json", "offsets", t.identifier],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    failures.append(done.stdout + done.stderr[-2000:])
        assert procs[0].wait() == 0, (tmp_path / "worker0.err").read_text()[-2000:]
    assert reads >= 5 and failures == []
    assert t.watermarks()[0].end == 241


def test_superseded_metadata_is_deleted_after_the_grace_and_kept_within_it(sqlite_catalog):
    kept = LogTable.create(sqlite_catalog, "db.kept", 1, properties={"write.metadata.previous-versions-max": "2"})
    for i in range(8):
        kept.append({0: [{"key": str(i)}]})
    assert len(metadata_files(kept)) == 9  # every version: all superseded within the default 60 s

    pruned = LogTable.create(
        sqlite_catalog, "db.pruned", 1, properties={"write.metadata.previous-versions-max": "2", METADATA_GRACE_MS: "0"}
    )
    for i in range(8):
        pruned.append({0: [{"key": str(i)}]})
        time.sleep(0.01)  # superseded strictly before the cutoff
    files = metadata_files(pruned)
    assert len(files) <= 4, files  # current + the 2 in the metadata log (+1 in flight at most)
    assert pruned.read(0).num_rows == 8


def test_i7_a_reader_holding_an_old_pointer_can_still_load_it_after_many_commits(catalog):
    """Deterministic form of the race: read the pointer, let writers move on, then read the file."""
    from pyiceberg.serializers import FromInputFile

    t = LogTable.create(catalog, "db.held", 1, properties={"write.metadata.previous-versions-max": "2"})
    t.append({0: [{"key": "first"}]})
    held = t.table()  # the pointer a slow reader read
    for i in range(6):  # the held file leaves the 2-entry metadata log
        time.sleep(0.02)
        t.append({0: [{"key": str(i)}]})
    assert held.metadata_location not in {e.metadata_file for e in t.table().metadata.metadata_log}
    metadata = FromInputFile.table_metadata(held.io.new_input(held.metadata_location))
    assert metadata.current_snapshot_id == held.metadata.current_snapshot_id
    assert held.scan().to_arrow().num_rows == 1  # its manifests and data are still there too


def superseded_within_a_short_grace(catalog, name: str, commits: int = 8) -> LogTable:
    """A table whose metadata files all left the metadata log inside a 1 s grace."""
    t = LogTable.create(catalog, name, 1, properties={"write.metadata.previous-versions-max": "2", METADATA_GRACE_MS: "1000"})
    for i in range(commits):
        t.append({0: [{"key": str(i)}]})
    assert len(metadata_files(t)) == commits + 1  # nothing past the grace yet
    time.sleep(1.2)
    return t


def test_i7_metadata_superseded_inside_the_grace_is_deleted_by_a_later_commit(sqlite_catalog):
    """The file leaving the log is judged at once; those left inside the grace wait for the
    next commit that lists the folder (every ``SWEEP_EVERY`` versions), not for ``maintain``."""
    t = superseded_within_a_short_grace(sqlite_catalog, "db.busy_disk")
    t.append({0: [{"key": "later"}]})
    assert len(metadata_files(t)) == 9  # only the file that left the log now, and it was still inside the grace
    commits = 9
    while (version_of(t.table().metadata_location) + 1) % SWEEP_EVERY:
        t.append({0: [{"key": "later"}]})
        commits += 1
    time.sleep(1.2)  # every file superseded so far is now past the grace
    t.append({0: [{"key": "later"}]})  # a listing version
    commits += 1
    # current + the 2 in the metadata log + the one this commit superseded (inside the grace)
    assert len(metadata_files(t)) <= 4, metadata_files(t)
    assert t.read(0).num_rows == commits


def test_i7_maintain_deletes_metadata_superseded_past_the_grace(sqlite_catalog):
    from icelog.storage.admin.maintenance import maintain

    t = superseded_within_a_short_grace(sqlite_catalog, "db.idle_disk")
    held = t.table().metadata_location
    report = maintain(sqlite_catalog, t.identifier, compact=False, keep_snapshots=100)  # no commit of its own
    assert report["metadata_files_removed"] >= 6
    assert len(metadata_files(t)) == 3  # current + the metadata log
    assert t.table().metadata_location == held and t.read(0).num_rows == 8

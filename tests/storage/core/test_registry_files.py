"""The commit-id registry's older entries live in immutable registry files (I2, I4, I7).

The metadata keeps the newest entries (``icelog.commits``); a commit whose tail outgrew
``TAIL_BYTES`` writes it to a file before its swap and lists it (``icelog.commits.files``) in
the same swap. Ids stay findable for the same window, a file written by a commit that never
landed counts for nothing, and orphan cleanup keeps exactly the listed files.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icelog.storage import properties as props
from icelog.storage.admin.orphans import remove_orphan_files
from icelog.storage.core import faults, registry
from icelog.storage.core.commit import KEEP_COMMIT_IDS, find_commit, new_commit_id
from icelog.storage.core.registry import NOT_FOUND, all_commits, file_list
from icelog.storage.errors import CommitIdForgotten
from icelog.storage.log.files import local_path
from icelog.storage.log.table import LogTable
from icelog.storage.properties import COMMIT_FILES, COMMIT_IDS_MIN_RETENTION_MS, COMMITS
from icelog.validations.contiguity import check_contiguity
from tests.support.faults import kill_9, run_to_end
from tests.support.files import files_on_disk, files_referenced

MIN_RETENTION_MS = COMMIT_IDS_MIN_RETENTION_MS.key


def rows(tag: str, n: int = 1) -> list[dict]:
    return [{"key": tag, "value": f"{tag}-{i}"} for i in range(n)]


@pytest.fixture
def small_tail(monkeypatch):
    """Registry files every few commits (a tail of a few hundred bytes), and no file read cached."""
    monkeypatch.setattr(registry, "TAIL_BYTES", 300)
    registry.clear_cache()
    yield
    registry.clear_cache()


def listed(t: LogTable) -> list[str]:
    files = file_list(t.table().metadata)
    return files.paths() if files else []


def registry_files_on_disk(t: LogTable) -> set[str]:
    return {p for p in files_on_disk(t.table()) if os.path.basename(p).startswith(registry.FILE_PREFIX)}


def commit_id_made_at(ms: int) -> str:
    """A UUIDv7 commit id carrying ``ms`` as its creation time."""
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62)).hex


def test_i4_a_resend_found_in_a_registry_file_returns_its_original_result(catalog, small_tail):
    t = LogTable.create(catalog, "db.files", 2)
    first = t.append({0: rows("first", 2)}, commit_id="first")  # an id without a time: every file is read
    stamped = new_commit_id()
    second = t.append({1: rows("second")}, commit_id=stamped)
    ids = [t.append({0: rows(str(i))}, commit_id=f"c{i}").commit_id for i in range(20)]
    metadata = t.table().metadata
    assert len(listed(t)) >= 3 and all(os.path.exists(local_path(p)) for p in listed(t))
    assert "first" not in metadata.properties[COMMITS] and stamped not in metadata.properties[COMMITS]
    assert len(metadata.properties[COMMITS]) < 2 * registry.TAIL_BYTES
    assert [e[0] for e in all_commits(t.table())] == ["first", stamped, *ids]

    registry.clear_cache()  # as a fresh process: the files are read, not remembered
    again = t.append({0: rows("first", 2)}, commit_id="first")
    assert again.duplicate and again.ranges == first.ranges == {0: (0, 2)} and again.snapshot_id == first.snapshot_id
    resent = t.append({1: rows("second")}, commit_id=stamped)
    assert resent.duplicate and resent.ranges == second.ranges
    assert t.watermarks()[0].end == 22 and t.watermarks()[1].end == 1
    assert find_commit(t.table(), "never-sent") is NOT_FOUND


def test_i4_files_leave_the_window_whole_and_the_ids_they_held_are_refused_not_written_again(sqlite_catalog, small_tail):
    keep = 12  # more than a file holds (about 5 entries here)
    t = LogTable.create(sqlite_catalog, "db.window", 1, properties={KEEP_COMMIT_IDS: str(keep), MIN_RETENTION_MS: "0"})
    lost = new_commit_id()
    t.append({0: rows("lost")}, commit_id=lost)
    seen: set[str] = set()
    for i in range(50):
        t.append({0: rows(str(i))}, commit_id=f"c{i}")
        seen.update(listed(t))
        entries = all_commits(t.table())
        files = file_list(t.table().metadata)
        per_file = max((f.count for f in files.files), default=0) if files else 0
        # at least the newest `keep`, and never a whole file's entries beyond them
        newest = min(keep, i + 1)
        assert [e[0] for e in entries[-newest:]] == [f"c{j}" for j in range(i + 1 - newest, i + 1)]
        assert len(entries) < keep + per_file or len(entries) <= i + 2
    metadata = t.table().metadata
    assert int(metadata.properties["icelog.commits.forgotten-ms"]) > 0
    dropped = seen - set(listed(t))
    assert dropped
    end = t.watermarks()[0].end
    with pytest.raises(CommitIdForgotten):
        t.append({0: rows("lost")}, commit_id=lost)
    assert t.watermarks()[0].end == end

    # Maintenance: the dropped files are dead, the listed ones live.
    on_disk = registry_files_on_disk(t)
    assert {local_path(p) for p in dropped} <= on_disk
    removed = remove_orphan_files(sqlite_catalog, t.identifier, older_than_s=0)
    assert {local_path(p) for p in dropped} <= set(removed)
    assert registry_files_on_disk(t) == {local_path(p) for p in listed(t)}
    assert files_on_disk(t.table()) == files_referenced(t.table())
    registry.clear_cache()
    oldest_kept = all_commits(t.table())[0]
    assert t.append({0: rows("x")}, commit_id=oldest_kept[0]).duplicate  # found in a live file after cleanup


def test_i4_the_time_floor_keeps_ids_in_files_beyond_the_count(sqlite_catalog, small_tail):
    t = LogTable.create(sqlite_catalog, "db.floor", 1, properties={KEEP_COMMIT_IDS: "3"})
    first = t.append({0: rows("first")}, commit_id="first")
    for i in range(30):
        t.append({0: rows(str(i))})
    assert len(listed(t)) >= 3 and len(all_commits(t.table())) == 31
    assert "icelog.commits.forgotten-ms" not in t.table().metadata.properties
    again = t.append({0: rows("first")}, commit_id="first")
    assert again.duplicate and again.ranges == first.ranges


def entry_level_kept(times: list[int], keep: int, cap: int, floor_ms: int) -> int:
    """How many entries one list would keep (the rule before registry files): the newest
    ``keep``, and older ones younger than the floor, ``cap`` in all."""
    start = max(0, len(times) - keep)
    while start > 0 and len(times) - start < cap and times[start - 1] > floor_ms:
        start -= 1
    return len(times) - start


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 100)), min_size=1, max_size=30),
    st.integers(1, 120),
    st.integers(0, 2000),
)
def test_i4_whole_files_keep_every_id_one_list_would_and_at_most_one_file_more(units, keep, retention):
    """Units (files, then tail entries) in commit order, times rising: dropping whole units keeps
    every entry the one-list rule keeps, and never a whole unit beyond it."""
    times: list[int] = []
    unit_times = []
    counts = [count for count, _ in units]
    for count, gap in units:
        first = (times[-1] if times else 0) + gap
        times.extend(first + j for j in range(count))
        unit_times.append(times[-1])
    now = times[-1] + 1
    settings = props.CommitSettings.of({KEEP_COMMIT_IDS: str(keep), MIN_RETENTION_MS: str(retention)})
    cap = max(keep, registry.COMMIT_IDS_MAX)
    dropped = registry._dropped(list(zip(counts, unit_times, strict=True)), settings, now)
    kept = sum(counts[dropped:])
    one_list = entry_level_kept(times, keep, cap, now - retention)
    assert kept >= one_list
    if dropped < len(counts):
        assert kept - counts[dropped] < one_list


def test_i4_a_table_written_by_an_older_icelog_moves_its_registry_into_a_file_and_keeps_every_id(sqlite_catalog):
    registry.clear_cache()
    t = LogTable.create(sqlite_catalog, "db.legacy", 1)
    landed = [t.append({0: rows(f"old{i}")}, commit_id=f"old{i}") for i in range(3)]
    real = json.loads(t.table().metadata.properties[COMMITS])
    # As an older icelog left it: the whole registry in the property, the oldest entries without a time.
    legacy = [[f"legacy{i}", {"0": [0, 0]}, None] for i in range(400)] + real
    sqlite_catalog.load_table(t.identifier).transaction().set_properties({COMMITS: json.dumps(legacy)}).commit_transaction()
    assert len(t.table().metadata.properties[COMMITS]) > registry.TAIL_BYTES and COMMIT_FILES not in t.table().metadata.properties

    again = t.append({0: rows("old1")}, commit_id="old1")  # found in the old registry, before any new commit
    assert again.duplicate and again.ranges == landed[1].ranges
    t.append({0: rows("new")}, commit_id="new")  # the first new commit moves it
    metadata = t.table().metadata
    assert [e[0] for e in json.loads(metadata.properties[COMMITS])] == ["new"]
    assert len(listed(t)) == 1
    assert [e[0] for e in all_commits(t.table())] == [e[0] for e in legacy] + ["new"]
    registry.clear_cache()
    for i, result in enumerate(landed):
        resent = t.append({0: rows(f"old{i}")}, commit_id=f"old{i}")
        assert resent.duplicate and resent.ranges == result.ranges
    assert find_commit(t.table(), "legacy7") == ({"0": [0, 0]}, None)
    assert t.watermarks()[0].end == 4


def test_i2_concurrent_writers_both_rolling_the_tail_keep_every_id_once(catalog_spec, small_tail):
    """Writers race on one base whose tail is full: each writes its own registry file, one swap
    lands, the losers delete theirs and decide again on the table as it is now."""
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.race", 1)
    written: list[str] = []
    write = registry._write

    def spy(table, path, entries):
        written.append(path)
        write(table, path, entries)

    faults.set_delays(f"{faults.AFTER_REGISTRY_FILE}:0.3")  # every roller waits: the others roll the same tail
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(registry, "_write", spy)
            errors: list[BaseException] = []

            def writer(w: int) -> None:
                try:
                    mine = LogTable(catalog_spec.open(), t.identifier)
                    for i in range(8):
                        mine.append({0: rows(f"w{w}-{i}")}, commit_id=f"w{w}-{i}")
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=300)
            assert not errors, errors
    finally:
        faults.set_delays(None)
    registry.clear_cache()
    ids = [e[0] for e in all_commits(t.table())]
    expected = {f"w{w}-{i}" for w in range(3) for i in range(8)}
    assert sorted(ids) == sorted(expected)  # each exactly once
    assert all(find_commit(t.table(), cid) is not NOT_FOUND for cid in expected)
    live = {local_path(p) for p in listed(t)}
    lost = {local_path(p) for p in written} - live
    assert lost, "no writer lost a race while rolling: the test raced nothing"
    assert live <= registry_files_on_disk(t)
    # A lost race deletes its file; one whose swap outcome was unknown leaves it to orphan cleanup.
    remove_orphan_files(catalog, t.identifier, older_than_s=0)
    assert registry_files_on_disk(t) == live
    assert t.watermarks()[0].end == 24 and check_contiguity(t.table(), deep=True).ok


@pytest.mark.fault
def test_i4_i7_kill_9_after_writing_a_registry_file_before_the_swap(catalog_spec, tmp_path):
    """The file of a commit that never landed makes no id look committed or forgotten."""
    registry.clear_cache()
    catalog = catalog_spec.open()
    t = LogTable.create(catalog, "db.crash", 1)
    acknowledged = []
    while len(t.table().metadata.properties.get(COMMITS, "")) < registry.TAIL_BYTES:  # the next commit rolls the tail
        acknowledged.append(t.append({0: rows("ack")}, commit_id=f"ack{len(acknowledged)}"))
    before = t.table().metadata_location

    left = kill_9(
        catalog_spec,
        faults.AFTER_REGISTRY_FILE,
        "append_rows",
        "db.crash",
        0,
        3,
        "victim",
        "commit-1",
        directory=tmp_path,
        table=t,
    )

    assert any(os.path.basename(p).startswith(registry.FILE_PREFIX) for p in left), left
    metadata = t.table().metadata
    assert t.table().metadata_location == before and COMMIT_FILES not in metadata.properties
    assert "icelog.commits.forgotten-ms" not in metadata.properties
    assert find_commit(t.table(), "commit-1") is NOT_FOUND
    assert t.append({0: rows("ack")}, commit_id="ack0").duplicate  # every acknowledged id is still found

    outcome = run_to_end(catalog_spec, "append_rows", "db.crash", 0, 3, "victim", "commit-1", directory=tmp_path, name="resend")
    assert not outcome["duplicate"] and outcome["range"] == [len(acknowledged), len(acknowledged) + 3]
    assert len(listed(t)) == 1  # the resend rolled the tail into its own file
    assert t.append({0: rows("ack")}, commit_id="ack0").duplicate  # now found in that file

    dead = {p for p in left if os.path.basename(p).startswith(registry.FILE_PREFIX)}
    removed = set(remove_orphan_files(catalog, t.identifier, older_than_s=0))
    assert dead <= removed and {local_path(p) for p in listed(t)} <= registry_files_on_disk(t)
    assert files_on_disk(t.table()) == files_referenced(t.table())
    assert check_contiguity(t.table(), deep=True).ok
    assert t.read(0).column("key").to_pylist() == ["ack"] * len(acknowledged) + ["victim"] * 3


def test_i4_a_table_re_created_at_the_same_location_never_counts_the_old_tables_ids(sqlite_catalog, small_tail):
    old = LogTable.create(sqlite_catalog, "db.again", 1)
    for i in range(12):
        old.append({0: rows(str(i))}, commit_id=f"c{i}")
    old_files = old.table().metadata.properties[COMMIT_FILES]
    location = old.table().metadata.location
    sqlite_catalog.drop_table(old.identifier)
    new = LogTable.create(sqlite_catalog, "db.again", 1)
    assert new.table().metadata.location == location  # the old files are still there
    assert registry_files_on_disk(new)

    # Even its file list copied over (by hand, or a tool copying properties): another table's files count for nothing.
    sqlite_catalog.load_table(new.identifier).transaction().set_properties({COMMIT_FILES: old_files}).commit_transaction()
    registry.clear_cache()
    assert find_commit(new.table(), "c0") is NOT_FOUND
    fresh = new.append({0: rows("0")}, commit_id="c0")
    assert not fresh.duplicate and fresh.ranges == {0: (0, 1)}

    sqlite_catalog.load_table(new.identifier).transaction().remove_properties(COMMIT_FILES).commit_transaction()
    remove_orphan_files(sqlite_catalog, new.identifier, older_than_s=0)
    assert not registry_files_on_disk(new)


def test_i4_registry_files_on_rest_and_s3(rest_catalog, small_tail):
    t = LogTable.create(rest_catalog, "db.files", 1)
    first = t.append({0: rows("first")}, commit_id="first")
    for i in range(12):
        t.append({0: rows(str(i))}, commit_id=f"c{i}")
    paths = listed(t)
    assert paths and all(p.startswith("s3://") for p in paths)
    registry.clear_cache()
    again = t.append({0: rows("first")}, commit_id="first")
    assert again.duplicate and again.ranges == first.ranges
    remove_orphan_files(rest_catalog, t.identifier, older_than_s=0)  # keeps the listed files
    registry.clear_cache()
    assert [e[0] for e in all_commits(t.table())][:3] == ["first", "c0", "c1"]
    assert t.append({0: rows("c0")}, commit_id="c0").duplicate
    assert t.watermarks()[0].end == 13


def test_i6_a_mirror_target_keeps_its_own_registry_not_its_sources_files(source, target, small_tail):
    from icelog.storage.replication.mirror import mirror
    from tests.support.mirror import PRINCIPAL

    src = LogTable.create(source, "orders", 1)
    for i in range(12):
        src.append({0: rows(str(i))}, commit_id=f"src{i}")
    assert listed(src)
    mirror(source, "orders", target, principal=PRINCIPAL)
    dst = LogTable.open(target, "orders")
    assert not set(listed(dst)) & set(listed(src))
    assert find_commit(dst.table(), "src0") is NOT_FOUND
    assert dst.watermarks()[0].end == 12


def test_i4_an_unreadable_registry_file_never_lets_a_resent_id_write_again(sqlite_catalog, small_tail):
    """A lookup that cannot read a listed file (a read error other than "not found": the store
    failing, not the file gone) cannot prove the id new: the commit reads again until its
    deadline and then fails as a catalog read does, writing nothing."""
    from icelog.storage.core.commit import commit
    from icelog.storage.errors import CatalogUnavailable
    from icelog.storage.producers.idempotent import InitProducer

    t = LogTable.create(sqlite_catalog, "db.unreadable", 1)
    commit(sqlite_catalog, t.identifier, InitProducer(t.identifier, "client-a", 7), commit_id="init-1")
    for i in range(12):
        t.append({0: rows(str(i))}, commit_id=f"c{i}")
    unreadable = local_path(listed(t)[0])  # the file holding init-1
    os.remove(unreadable)
    os.mkdir(unreadable)  # reading it fails with an OSError that is not FileNotFoundError
    registry.clear_cache()
    before = t.table().metadata_location
    with pytest.raises(CatalogUnavailable):
        commit(sqlite_catalog, t.identifier, InitProducer(t.identifier, "client-a", 8), commit_id="init-1", deadline_s=0.3)
    assert t.table().metadata_location == before  # nothing written, and the file is not dropped


def delete_listed(t: LogTable, path: str) -> None:
    """The store loses a listed registry file, as another engine's orphan cleanup deletes it."""
    t.table().io.delete(path)
    registry.clear_cache()  # as a fresh process: nothing remembered


def test_i2_i4_a_gone_registry_file_refuses_the_ids_it_may_hold_and_the_table_heals(catalog, small_tail):
    """A listed file deleted by a foreign orphan cleanup: a re-sent id it may hold is refused
    (never written twice, never a wedged table), an id newer than it is unaffected, and the
    table drops the file and moves ``forgotten-ms`` past it, so its ids stay forgotten."""
    from icelog.storage.errors import RegistryFileGone

    t = LogTable.create(catalog, "db.gone", 1)
    stamped = new_commit_id()
    t.append({0: rows("stamped")}, commit_id=stamped)
    t.append({0: rows("plain")}, commit_id="plain-id")  # an id without a time: every file may hold it
    for i in range(12):
        t.append({0: rows(str(i))})
    gone = listed(t)[0]
    assert {"plain-id", stamped} <= {e[0] for e in all_commits(t.table())}
    newest_ms = file_list(t.table().metadata).files[0].newest_ms
    delete_listed(t, gone)
    end = t.watermarks()[0].end

    newer_id = commit_id_made_at(newest_ms + registry.CLOCK_SKEW_MS + 1)  # made after the file's commits
    newer = t.append({0: rows("newer")}, commit_id=newer_id)  # never reads the file
    assert not newer.duplicate and gone in listed(t)
    end += 1

    with pytest.raises(RegistryFileGone) as caught:
        t.append({0: rows("plain")}, commit_id="plain-id")
    assert isinstance(caught.value, CommitIdForgotten)
    assert caught.value.path == gone and gone in str(caught.value) and caught.value.table == t.identifier
    assert t.watermarks()[0].end == end  # nothing written
    metadata = t.table().metadata  # healed: the file is dropped, its commits forgotten
    assert gone not in listed(t) and int(metadata.properties["icelog.commits.forgotten-ms"]) >= newest_ms
    with pytest.raises(CommitIdForgotten):  # a UUIDv7 id of the file's stays refused, by the forgotten time
        t.append({0: rows("stamped")}, commit_id=stamped)
    assert t.watermarks()[0].end == end

    assert not t.append({0: rows("fresh")}).duplicate  # not wedged
    assert not t.append({0: rows("fresh")}, commit_id="another-plain-id").duplicate
    assert t.append({0: rows("fresh")}, commit_id="another-plain-id").duplicate
    assert t.watermarks()[0].end == end + 2
    registry.clear_cache()
    assert [e[0] for e in all_commits(t.table())][-1] == "another-plain-id"


def test_i4_a_first_send_drops_a_gone_registry_file_in_its_own_commit(sqlite_catalog, small_tail):
    """A first send (its id was never sent) cannot be in a gone file: it lands, and its swap
    drops the file and moves ``forgotten-ms`` past it."""
    import pyarrow as pa

    from icelog.storage.core.commit import commit
    from icelog.storage.log.table import AppendRequest

    t = LogTable.create(sqlite_catalog, "db.first", 1)
    for i in range(14):
        t.append({0: rows(str(i))}, commit_id=f"c{i}")
    gone = listed(t)[0]
    newest_ms = file_list(t.table().metadata).files[0].newest_ms
    delete_listed(t, gone)
    request = AppendRequest(t.identifier, t.conform({0: pa.table({"key": ["k"], "value": ["v"]})}), {0: 14}, "")
    outcome = commit(sqlite_catalog, t.identifier, request, commit_id="first-send", resent=False)
    assert not outcome.already_committed and t.watermarks()[0].end == 15
    assert gone not in listed(t)
    assert int(t.table().metadata.properties["icelog.commits.forgotten-ms"]) >= newest_ms
    with pytest.raises(CommitIdForgotten):  # a UUIDv7 id the file could have held is refused from now on
        t.append({0: rows("again")}, commit_id=commit_id_made_at(newest_ms))


def test_i4_a_stale_table_whose_file_a_later_commit_dropped_is_not_a_gone_file(sqlite_catalog, small_tail):
    """A file missing from a stale table's list only (a later commit dropped it, icelog's cleanup
    deleted it) is no loss: the lookup fails as a read (the commit reads again), nothing is forgotten."""
    t = LogTable.create(sqlite_catalog, "db.stale", 1, properties={KEEP_COMMIT_IDS: "6", MIN_RETENTION_MS: "0"})
    while not listed(t):
        t.append({0: rows("x")}, commit_id=f"c{t.watermarks()[0].end}")
    stale = t.table()
    first = listed(t)[0]
    while first in listed(t):
        t.append({0: rows("x")})
    remove_orphan_files(sqlite_catalog, t.identifier, older_than_s=0)
    registry.clear_cache()
    with pytest.raises(OSError):
        find_commit(stale, "never-sent")
    assert not registry._is_gone(first)
    assert find_commit(t.table(), "never-sent") is NOT_FOUND


def test_i4_a_gone_registry_file_on_rest_and_s3(rest_catalog, small_tail):
    from icelog.storage.errors import RegistryFileGone

    t = LogTable.create(rest_catalog, "db.gone", 1)
    t.append({0: rows("first")}, commit_id="first")
    for i in range(12):
        t.append({0: rows(str(i))})
    gone = listed(t)[0]
    delete_listed(t, gone)
    with pytest.raises(RegistryFileGone):
        t.append({0: rows("first")}, commit_id="first")
    assert gone not in listed(t) and t.watermarks()[0].end == 13
    assert not t.append({0: rows("fresh")}, commit_id="fresh").duplicate

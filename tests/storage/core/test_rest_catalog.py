"""The commit core on an Iceberg REST catalog over S3 (a real SeaweedFS server).

The REST spec has no requirement on properties or on the metadata location, so icelog proves
the exact base of every commit with a tag that each commit moves (``storage.core.swap.
prove_base``). These tests race property-only commits on one base, and show that without the
tag the same race loses updates.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from icelog.storage.core import swap
from icelog.storage.core.commit import Decision, Request, commit, commit_tables
from icelog.storage.errors import AtomicCommitUnsupported, ForeignCommit, OffsetMismatch
from icelog.storage.log.state import LogState
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity

COUNTER = "test.counter"


class Bump(Request):
    """A property-only commit: read a counter from the base, write it plus one."""

    state_type = LogState

    def decide(self, state, table):
        n = int(table.metadata.properties.get(COUNTER, "0"))
        return Decision(state=state, result=n + 1, properties={COUNTER: str(n + 1)})


def counter(t: LogTable) -> int:
    return int(t.table().metadata.properties.get(COUNTER, "0"))


def without_base_proof(monkeypatch) -> None:
    """The swap without the base tag: the spec's requirements alone."""

    def spec_only(catalog, s):
        return tuple(r for r in s.requirements if r.type in swap.SPEC_REQUIREMENTS), s.updates

    monkeypatch.setattr(swap, "prove_base", spec_only)


def test_i1_i2_conditional_appends_keep_the_log_on_rest(rest_catalog, unchanged):
    t = LogTable.create(rest_catalog, "db.events", 2)
    t.append({0: [{"key": "a", "value": "1"}], 1: [{"key": "b", "value": "2"}]})
    t.append({0: [{"key": "c", "value": "3"}]}, expected_offsets={0: 1})
    with unchanged(t), pytest.raises(OffsetMismatch):
        t.append({0: [{"key": "d", "value": "4"}]}, expected_offsets={0: 1})
    assert [w.end for w in t.watermarks().values()] == [2, 1]
    assert t.read(0).column("value").to_pylist() == ["1", "3"]
    assert t.table().io.properties.get("s3.endpoint")  # the data went to S3, not a local folder
    assert all(f.file.file_path.startswith("s3://") for f in t.table().scan().plan_files())
    assert check_contiguity(t.table()).ok


@pytest.mark.parametrize("proof", [True, False])
def test_i3_a_second_property_only_commit_on_the_same_base_decides_again(rest_catalog, monkeypatch, proof):
    """Two commits decided on one loaded base: with the tag the second loses its first attempt
    and decides again on the first's result (2); without it both pass and one increment is lost."""
    t = LogTable.create(rest_catalog, "db.events", 1)
    commit(rest_catalog, "db.events", Bump())  # adopted: the base tag exists from here on
    if not proof:
        without_base_proof(monkeypatch)
    base = t.table()
    commit(rest_catalog, "db.events", Bump(), loaded=base)
    commit(rest_catalog, "db.events", Bump(), loaded=base)
    assert counter(t) == (3 if proof else 2)


def test_i3_racing_property_only_commits_lose_nothing(rest_spec):
    """Threads with their own clients commit increments, each first attempt on one shared base:
    every increment lands exactly once."""
    threads, each = 6, 4
    catalog = rest_spec.open()
    t = LogTable.create(catalog, "db.events", 1)
    base = t.table()  # not adopted yet: the first commits race the adoption too
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run() -> None:
        own = rest_spec.open()
        try:
            start.wait()
            for i in range(each):
                commit(own, "db.events", Bump(), loaded=base if i == 0 else None)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert counter(t) == threads * each
    assert len(swap.base_tags(t.table().metadata)) == 1


def test_i3_a_stale_adopter_cannot_revive_a_tag(rest_catalog):
    """Adoption moves main: an adopter that read the table before the first adoption loses,
    so no tag a stale base holds is ever made again."""
    t = LogTable.create(rest_catalog, "db.events", 1)
    stale = t.table()
    commit(rest_catalog, "db.events", Bump())  # adopts (icelog-base-0) and then commits (-1)
    swap.adopt(rest_catalog, stale)  # loses on main; changes nothing
    assert list(swap.base_tags(t.table().metadata)) == [f"{swap.BASE_TAG}1"]
    commit(rest_catalog, "db.events", Bump())
    assert counter(t) == 2


def test_i5_multi_table_commits_are_refused_on_rest(rest_catalog, unchanged):
    """SeaweedFS applies transactions/commit table by table (readers see half of one; kill -9
    leaves half of one): icelog refuses rather than commit table by table."""
    a, b = LogTable.create(rest_catalog, "db.a", 1), LogTable.create(rest_catalog, "db.b", 1)
    with unchanged(a), unchanged(b), pytest.raises(AtomicCommitUnsupported):
        commit_tables(rest_catalog, [("db.a", Bump()), ("db.b", Bump())])


def test_i8_a_foreign_append_is_refused_until_repaired(rest_catalog):
    t = LogTable.create(rest_catalog, "db.events", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    foreign = t.table()
    foreign.append(pa.Table.from_pylist([], schema=foreign.schema().as_arrow()))  # a plain pyiceberg writer
    with pytest.raises(ForeignCommit):
        t.append({0: [{"key": "b", "value": "2"}]})


def test_the_tag_is_what_the_server_checks(rest_catalog):
    """The server enforces the tag requirement: a commit on a base whose tag moved gets 409."""
    t = LogTable.create(rest_catalog, "db.events", 1)
    commit(rest_catalog, "db.events", Bump())
    base = t.table()
    (tag,) = swap.base_tags(base.metadata)
    commit(rest_catalog, "db.events", Bump())
    from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate

    with pytest.raises(CommitFailedException):
        rest_catalog.commit_table(
            base,
            (AssertRefSnapshotId(ref=tag, snapshot_id=base.metadata.refs[tag].snapshot_id),),
            (SetPropertiesUpdate(updates={COUNTER: "99"}),),
        )
    assert counter(t) == 2


def test_tables_are_written_through_icelogs_file_io_unless_configured(rest_catalog, rest_spec):
    """icelog's catalogs open tables with ``storage.core.fileio.LogFileIO`` (one ``PutObject`` per
    small S3 file); a ``py-io-impl`` in the configuration wins, as in pyiceberg."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from icelog.storage.core.catalog import open_catalog
    from icelog.storage.core.fileio import LogFileIO

    t = LogTable.create(rest_catalog, "db.events", partitions=1)
    t.append({0: [{"key": "k", "value": "v"}]})
    assert type(t.table().io) is LogFileIO
    assert t.table().io.fs_by_scheme("s3", "warehouse").__reduce__()[1][0]["allow_delayed_open"] is True
    plain = open_catalog("plain-io", **rest_spec.properties(), **{"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"})
    assert type(LogTable(plain, "db.events").table().io) is PyArrowFileIO
    assert [r["value"] for r in LogTable(plain, "db.events").read(0).to_pylist()] == ["v"]


def test_racing_clients_create_one_namespace_without_a_server_error(rest_spec):
    """SeaweedFS answers 500 to a client whose create races another's half-created namespace
    (about 1 call in 30 here; CI saw it once in the producer-id race): ``ensure_namespace``
    asks again, as it would a read, and every racer returns."""
    from icelog.storage.core.catalog import ensure_namespace

    clients, namespaces = 6, 12
    catalogs = [rest_spec.open() for _ in range(clients)]
    errors: list[BaseException] = []
    for n in range(namespaces):
        start = threading.Barrier(clients)

        def run(catalog, namespace=f"race{n}", start=start) -> None:
            start.wait()
            try:
                ensure_namespace(catalog, namespace)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        workers = [threading.Thread(target=run, args=(c,)) for c in catalogs]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert errors == []
    assert {f"race{n}" for n in range(namespaces)} <= {ns[0] for ns in catalogs[0].list_namespaces()}

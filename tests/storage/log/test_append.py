"""I2 conditional append, I7 durability of acknowledged rows, I8 bad input, on SQLite and PostgreSQL;
table names and catalog configuration."""

from __future__ import annotations

import os
import pickle

import pyarrow as pa
import pytest

from icelog.storage.core.commit import commit
from icelog.storage.errors import (
    AbortableError,
    CommitConflict,
    EmptyBatch,
    IcelogError,
    InvalidIdentifier,
    InvalidInput,
    InvalidOffset,
    OffsetMismatch,
    SchemaMismatch,
    TableAlreadyExists,
    TerminalError,
    TransientError,
    UnknownPartition,
    UnknownTable,
)
from icelog.storage.log.table import AppendRequest, LogTable
from icelog.validations.contiguity import check_contiguity
from tests.support.interleave import Interleaved


def rows(*values: str) -> list[dict]:
    return [{"key": v, "value": v} for v in values]


def test_i2_append_assigns_offsets_from_log_end(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    first = t.append({0: rows("a", "b")})
    second = t.append({0: rows("c"), 1: rows("x")})
    assert first.ranges == {0: (0, 2)}
    assert second.ranges == {0: (2, 3), 1: (0, 1)}
    assert t.read(0).column("log_offset").to_pylist() == [0, 1, 2]
    assert t.read(0).column("key").to_pylist() == ["a", "b", "c"]
    assert t.read(0, 1, 2).column("key").to_pylist() == ["b"]
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (0, 3), 1: (0, 1)}


def test_i2_expected_offset_commits_only_at_log_end(catalog, unchanged):
    t = LogTable.create(catalog, "db.events", partitions=1)
    assert t.append({0: rows("a")}, {0: 0}).ranges == {0: (0, 1)}
    with unchanged(t):
        with pytest.raises(OffsetMismatch) as e:
            t.append({0: rows("b")}, {0: 0})
        assert (e.value.expected, e.value.actual, e.value.partition) == (0, 1, 0)
        with pytest.raises(OffsetMismatch) as e:
            t.append({0: rows("b")}, {0: 5})
        assert e.value.actual == 1
    assert t.append({0: rows("b")}, {0: 1}).ranges == {0: (1, 2)}


def test_i2_multi_partition_append_is_all_or_nothing(catalog, unchanged):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({1: rows("x")})
    with unchanged(t), pytest.raises(OffsetMismatch) as e:
        t.append({0: rows("a"), 1: rows("y")}, {0: 0, 1: 0})
    assert (e.value.partition, e.value.expected, e.value.actual) == (1, 0, 1)
    assert t.read(0).num_rows == 0 and t.read(1).num_rows == 1


def test_i2_appends_to_other_partitions_in_between_are_not_a_conflict(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    end = t.watermarks()[0].end
    for i in range(3):
        t.append({1: rows(f"other{i}")})
    assert t.append({0: rows("mine")}, {0: end}).ranges == {0: (0, 1)}


def test_i2_commit_to_another_partition_racing_a_conditional_append_is_no_conflict(catalog):
    """Raced, deterministically: the competing commit to partition 1 lands after the conditional
    append on partition 0 decided, so its compare-and-swap loses; it decides again on the new
    base, finds partition 0 still ending where it expected, and commits there."""
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({0: rows("a", "b")})
    expected = t.watermarks()[0].end
    other = LogTable(catalog, t.identifier)
    mine = pa.Table.from_pylist(rows("mine"), schema=t.payload_schema())
    request = Interleaved(AppendRequest(t.identifier, {0: mine}, {0: expected}, "c1"), lambda: other.append({1: rows("other")}))
    outcome = commit(catalog, t.identifier, request, commit_id="c1")
    assert expected == 2
    assert request.decisions == [{0: (2, 3)}, {0: (2, 3)}]  # decided twice, on two bases, same offsets
    assert outcome.attempts >= 2
    assert outcome.result.ranges == {0: (expected, expected + 1)}
    assert t.read(0).column("key").to_pylist() == ["a", "b", "mine"]
    assert t.read(1).column("key").to_pylist() == ["other"]
    assert {p: (w.start, w.end) for p, w in t.watermarks().items()} == {0: (0, 3), 1: (0, 1)}
    assert check_contiguity(t.table(), deep=True).ok


def test_i7_rows_survive_later_commits_and_snapshot_expiry(catalog):
    t = LogTable.create(catalog, "db.events", partitions=1, properties={"icelog.snapshots.keep": "3"})
    acknowledged = []
    for i in range(12):
        acknowledged.append(t.append({0: rows(f"v{i}")}).ranges[0])
    table = t.table()
    assert len(table.metadata.snapshots) <= 3
    assert t.read(0).column("key").to_pylist() == [f"v{i}" for i in range(12)]
    assert acknowledged == [(i, i + 1) for i in range(12)]


def test_add_partitions_never_removes(catalog):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({1: rows("a")})
    t.add_partitions(4)
    assert t.append({3: rows("b")}).ranges == {3: (0, 1)}
    assert t.watermarks()[1].end == 1
    with pytest.raises(InvalidInput):
        t.add_partitions(2)
    assert len(t.watermarks()) == 4


def test_payload_schema_from_spec_and_typed_columns(catalog):
    payload = [
        {"name": "tailnum", "type": "string"},
        {"name": "dep_delay", "type": "double"},
        {"name": "flight", "type": "long", "required": True},
    ]
    t = LogTable.create(catalog, "db.flights", partitions=1, payload=payload)
    t.append({0: [{"tailnum": "N1", "dep_delay": 2, "flight": 7}, {"flight": 8}]})
    got = t.read(0)
    assert got.column("dep_delay").to_pylist() == [2.0, None]
    assert got.column("flight").to_pylist() == [7, 8]


# --- I8: bad input changes nothing ----------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error",
    [
        ({5: rows("a")}, UnknownPartition),
        ({-1: rows("a")}, UnknownPartition),
        ({0: []}, EmptyBatch),
        ({0: pa.table({"key": pa.array([], pa.string())})}, EmptyBatch),
        ({0: [{"key": "a", "nope": 1}]}, SchemaMismatch),
        ({0: [{"key": 12}]}, SchemaMismatch),
        ({0: [{"key": "a"}, {"key": 3}]}, SchemaMismatch),
        ({}, InvalidInput),
    ],
)
def test_i8_bad_rows_raise_typed_errors_and_change_nothing(catalog, unchanged, bad, error):
    t = LogTable.create(catalog, "db.events", partitions=2)
    t.append({0: rows("a")})
    with unchanged(t), pytest.raises(error):
        t.append(bad)


def test_i8_negative_or_non_integer_expected_offset(catalog, unchanged):
    t = LogTable.create(catalog, "db.events", partitions=1)
    t.append({0: rows("a")})
    for k in (-1, "3", 1.5, True, None):
        with unchanged(t), pytest.raises(InvalidOffset):
            t.append({0: rows("a")}, {0: k})
    with unchanged(t), pytest.raises(InvalidInput):  # an expected offset for a partition without rows
        t.append({0: rows("a")}, {0: 1, 1: 0})


def test_i8_required_column_missing(catalog, unchanged):
    t = LogTable.create(catalog, "db.f", partitions=1, payload=[{"name": "n", "type": "long", "required": True}])
    t.append({0: [{"n": 1}]})
    with unchanged(t):
        with pytest.raises(SchemaMismatch):
            t.append({0: [{"n": None}]})
        with pytest.raises(SchemaMismatch):
            t.append({0: pa.table({"other": [1]})})
    assert t.watermarks()[0].end == 1


@pytest.mark.parametrize("name", ["db.ev'ents", "db.e;drop", "db/x.y", "../etc.passwd", "a.b.c", "", "db.", "db.1x", "db.e v"])
def test_i8_bad_identifiers_rejected_before_touching_the_catalog(catalog, unchanged, name):
    with unchanged(catalog=catalog), pytest.raises(InvalidIdentifier):
        LogTable.create(catalog, name, partitions=1)
    assert catalog.list_namespaces() == []


@pytest.mark.parametrize(
    "payload",
    [[{"name": "log_offset", "type": "long"}], [{"name": "x", "type": "decimal"}], [{"name": "x;y", "type": "string"}], []],
)
def test_i8_bad_payload_schema(catalog, unchanged, payload):
    with unchanged(catalog=catalog), pytest.raises(InvalidInput):
        LogTable.create(catalog, "db.events", partitions=1, payload=payload)
    assert catalog.list_namespaces() == []


def test_i8_bad_partition_count_and_duplicates(catalog, unchanged):
    for n in (0, -3, True, "2", 100_001):
        with unchanged(catalog=catalog), pytest.raises(InvalidInput):
            LogTable.create(catalog, "db.events", partitions=n)
    assert catalog.list_namespaces() == []
    t = LogTable.create(catalog, "db.events", partitions=1)
    t.append({0: rows("a")})
    folder = t.table().metadata.location.removeprefix("file://") + "/metadata"
    files = sorted(os.listdir(folder))
    with unchanged(t), unchanged(catalog=catalog), pytest.raises(TableAlreadyExists):
        LogTable.create(catalog, "db.events", partitions=3)
    assert sorted(os.listdir(folder)) == files  # not even a refused table's first metadata file
    assert len(t.watermarks()) == 1
    with unchanged(catalog=catalog), pytest.raises(UnknownTable):
        LogTable.open(catalog, "db.missing")


def test_i8_partitions_are_never_removed(catalog, unchanged):
    t = LogTable.create(catalog, "db.events", partitions=3)
    t.append({2: rows("a")})
    for count in (2, 0, -1, "4", True):
        with unchanged(t), pytest.raises(InvalidInput):
            t.add_partitions(count)


# --- names and catalogs ------------------------------------------------------------------------


def test_bare_table_names_go_to_namespace_logs(catalog):
    t = LogTable.create(catalog, "events", partitions=1)
    assert t.identifier == "logs.events"
    assert ("logs",) in catalog.list_namespaces()
    assert catalog.list_tables("logs") == [("logs", "events")]
    LogTable.open(catalog, "events").append({0: rows("a")})
    assert LogTable(catalog, "logs.events").read(0).column("key").to_pylist() == ["a"]
    with pytest.raises(TableAlreadyExists):
        LogTable.create(catalog, "logs.events", partitions=1)


def test_open_catalog_without_a_name_is_the_embedded_sqlite_catalog_under_icelog_home(tmp_path, monkeypatch):
    from icelog.storage.core.catalog import EMBEDDED_NAME, LogSqlCatalog, open_catalog

    home = tmp_path / "home"
    monkeypatch.setenv("ICELOG_HOME", str(home))
    catalog = open_catalog()
    assert isinstance(catalog, LogSqlCatalog) and catalog.name == EMBEDDED_NAME
    assert catalog.properties["uri"] == f"sqlite:///{home / 'catalog.db'}"
    t = LogTable.create(catalog, "db.events", partitions=1)
    t.append({0: rows("a")})
    assert (home / "catalog.db").is_file()
    assert t.table().metadata.location.startswith(f"file://{home / 'warehouse'}/")
    # Opened again (another process would do the same), it is the same catalog.
    assert LogTable(open_catalog(), "db.events").read(0).column("key").to_pylist() == ["a"]
    # Without ICELOG_HOME: ./.icelog
    monkeypatch.delenv("ICELOG_HOME")
    monkeypatch.chdir(tmp_path)
    assert open_catalog().properties["uri"] == f"sqlite:///{tmp_path / '.icelog' / 'catalog.db'}"


def test_open_catalog_by_name_from_pyiceberg_environment_variables(sqlite_spec, tmp_path, monkeypatch):
    from icelog.storage.core.catalog import LogSqlCatalog, open_catalog

    name = sqlite_spec.name  # the SQL catalog keeps each catalog name's tables apart
    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "embedded"))
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__URI", sqlite_spec.uri)
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__WAREHOUSE", sqlite_spec.warehouse)
    LogTable.create(sqlite_spec.open(), "db.events", partitions=1).append({0: rows("a")})
    catalog = open_catalog(name)
    assert isinstance(catalog, LogSqlCatalog) and catalog.properties["uri"] == sqlite_spec.uri
    assert LogTable(catalog, "db.events").read(0).column("key").to_pylist() == ["a"]
    monkeypatch.setenv("ICELOG_CATALOG", name)
    chosen = open_catalog()
    assert chosen.name == name and chosen.properties["warehouse"] == sqlite_spec.warehouse
    LogTable(chosen, "db.events").append({0: rows("b")})
    assert LogTable(sqlite_spec.open(), "db.events").read(0).column("key").to_pylist() == ["a", "b"]
    assert not (tmp_path / "embedded").exists()  # the embedded default was not touched


@pytest.mark.parametrize("how", ["argument", "ICELOG_CATALOG"])
def test_open_catalog_of_an_unknown_name_names_the_variable_to_set(tmp_path, monkeypatch, how):
    from icelog.storage.core.catalog import CatalogNotConfigured, open_catalog

    monkeypatch.setenv("ICELOG_HOME", str(tmp_path / "embedded"))
    if how == "argument":
        call = lambda: open_catalog("nowhere")  # noqa: E731
    else:
        monkeypatch.setenv("ICELOG_CATALOG", "nowhere")
        call = open_catalog
    with pytest.raises(CatalogNotConfigured) as e:
        call()
    assert isinstance(e.value, InvalidInput)
    assert "PYICEBERG_CATALOG__NOWHERE__URI" in str(e.value)
    assert not (tmp_path / "embedded").exists()  # no silent fallback to the embedded catalog


def test_the_users_pyiceberg_yaml_is_ignored(tmp_path, monkeypatch):
    """tests/conftest.py isolates every test from ~/.pyiceberg.yaml and catalog variables."""
    from icelog.storage.core.catalog import CatalogNotConfigured, open_catalog

    home = tmp_path / "user"
    home.mkdir()
    (home / ".pyiceberg.yaml").write_text(
        f"catalog:\n  personal:\n    uri: sqlite:///{tmp_path}/personal.db\n    warehouse: file://{tmp_path}/wh\n"
    )
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(CatalogNotConfigured):
        open_catalog("personal")
    assert not [
        name for name in os.environ if name.startswith("PYICEBERG_CATALOG__") or name in ("ICELOG_CATALOG", "ICELOG_HOME")
    ]


def test_errors_are_typed_and_picklable():
    cases = [
        OffsetMismatch(table="db.t", partition=1, expected=3, actual=5),
        CommitConflict(table="db.t", attempts=4),
        UnknownPartition(table="db.t", partition=9, partitions=2),
        InvalidIdentifier(identifier="a;b", reason="bad"),
    ]
    for error in cases:
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and clone.fields == error.fields and str(clone) == str(error)
        assert isinstance(clone, IcelogError)
    # OffsetMismatch: abort and redo from the start (re-read the log), not a plain retry.
    assert isinstance(cases[0], AbortableError) and not isinstance(cases[0], (TransientError, TerminalError))
    assert isinstance(cases[1], TransientError)
    assert isinstance(cases[3], ValueError)
    assert cases[0].to_dict()["actual"] == 5 and "expected offset 3" in str(cases[0])


# --- an append's first base: the table as its LogTable last saw it ------------------------------


def test_an_append_after_an_append_reads_no_metadata(catalog, monkeypatch):
    """A writer's steady stream: the table its last commit left is the next append's base, so
    the append costs no catalog read (on REST, one request less per append)."""
    t = LogTable.create(catalog, "db.events", partitions=1)
    t.append({0: rows("a")})
    reads = []
    real = type(catalog).load_table
    monkeypatch.setattr(type(catalog), "load_table", lambda self, ident: reads.append(ident) or real(self, ident))
    assert t.append({0: rows("b")}, {0: 1}).ranges == {0: (1, 2)}
    assert t.append({0: rows("c")}, {0: 2}).ranges == {0: (2, 3)}
    assert reads == []


def test_a_stale_base_never_decides_an_append(catalog):
    """Another writer moved the table since this LogTable last saw it: the offsets come from the
    table as it is (the compare-and-swap refuses the stale base), an expected offset is judged
    against it (no false OffsetMismatch), and a partition added meanwhile is known."""
    mine, theirs = LogTable.create(catalog, "db.events", partitions=1), LogTable(catalog, "db.events")
    mine.append({0: rows("a")})
    theirs.append({0: rows("b", "c")})
    assert mine.append({0: rows("d")}).ranges == {0: (3, 4)}
    theirs.append({0: rows("e")})
    assert mine.append({0: rows("f")}, {0: 5}).ranges == {0: (5, 6)}
    theirs.append({0: rows("g")})
    with pytest.raises(OffsetMismatch) as e:
        mine.append({0: rows("h")}, {0: 6})  # stale by one commit, and wrong on the table as it is
    assert e.value.actual == 7
    theirs.add_partitions(2)
    assert mine.append({1: rows("x")}).ranges == {1: (0, 1)}
    assert mine.read(0).column("key").to_pylist() == ["a", "b", "c", "d", "e", "f", "g"]
    assert check_contiguity(mine.table(), deep=True).ok


def test_a_stale_base_whose_files_maintenance_deleted_is_read_again(catalog):
    """The base this LogTable last saw names a manifest list that snapshot expiry and orphan
    cleanup have deleted since: the append reads the table again and lands, not a false
    StorageUnavailable (which a retry on the same stale base would repeat)."""
    from icelog.storage.admin.maintenance import maintain

    mine, theirs = LogTable.create(catalog, "db.events", partitions=1), LogTable(catalog, "db.events")
    mine.append({0: rows("a")})
    old_list = mine.table().current_snapshot().manifest_list
    theirs.append({0: rows("b")})
    theirs.append({0: rows("c")})
    maintain(catalog, "db.events", keep_snapshots=1, orphan_age_s=0, compact=False)
    assert not os.path.exists(old_list.removeprefix("file://"))
    assert mine.append({0: rows("d")}).ranges == {0: (3, 4)}
    assert mine.read(0).column("key").to_pylist() == ["a", "b", "c", "d"]


def test_rows_checked_for_a_table_since_re_created_are_checked_again_on_the_new_one(catalog):
    """Another client drops the table and creates another under its name while this LogTable
    still holds the old one as its first base. Rows checked and converted for the old table
    must not land in the new one (they did, unreadable there): they are checked again on the
    table as it is, refused if they do not fit it (nothing written, I8), and land at its
    offsets if they do."""
    mine, other = LogTable.create(catalog, "db.events", partitions=1), LogTable(catalog, "db.events")
    mine.table()  # held as the first base: empty, at the offsets the new table starts at too
    other.drop()
    amounts = [{"name": "key", "type": "string"}, {"name": "amount", "type": "long", "required": True}]
    LogTable.create(catalog, "db.events", partitions=1, payload=amounts)
    with pytest.raises(SchemaMismatch):
        mine.append({0: rows("b")})
    assert other.watermarks()[0].end == 0 and other.table().current_snapshot() is None
    other.drop()
    LogTable.create(catalog, "db.events", partitions=1)  # the same schema, another table
    assert mine.append({0: rows("c")}).ranges == {0: (0, 1)}
    assert other.read(0).column("key").to_pylist() == ["c"]
    assert check_contiguity(other.table(), deep=True).ok


def test_a_manifest_merge_rewrites_a_bounded_bin_not_every_live_file(sqlite_spec):
    """A manifest merge must not rewrite the manifest of all live files (at pyiceberg's 8 MB
    target: a 2 s commit every 50 at 10,000 files). Log tables set a target size, and
    what one commit's merge replaces stays within it. Shown at a small target, over 3 merges."""
    from icelog.storage.log.table import MANIFEST_TARGET_BYTES

    catalog = sqlite_spec.open()
    default = LogTable.create(catalog, "db.default", 1).table().metadata.properties
    assert default["commit.manifest.target-size-bytes"] == str(MANIFEST_TARGET_BYTES) and MANIFEST_TARGET_BYTES <= 1024 * 1024
    target = 64 * 1024  # ~12 one-file manifests
    t = LogTable.create(catalog, "db.events", 1, properties={"commit.manifest.target-size-bytes": str(target)})
    before: dict[str, int] = {}
    replaced = []
    for i in range(120):
        table = t.append({0: [{"key": f"k{i}", "value": "v"}]}) and t.table()
        now = {m.manifest_path: m.manifest_length for m in table.current_snapshot().manifests(table.io)}
        gone = [length for path, length in before.items() if path not in now]
        if gone:
            replaced.append(sum(gone))
        before = now
    assert len(replaced) >= 3, replaced  # merges happened
    assert max(replaced) <= target, replaced  # each rewrote one bounded bin
    assert check_contiguity(t.table()).ok

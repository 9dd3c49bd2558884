"""The manifest reader of the metadata-only check against pyiceberg's planning (``plan_files``).

``storage.log.manifests`` decodes only a few fields of each manifest entry: each table history
here (appends on several partitions, key-clustered files, retention, compaction, an older
snapshot, a foreign append) must give the same files, partitions, row counts and offset bounds
as pyiceberg does, or the check would judge files pyiceberg would not plan.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.manifest import ManifestContent

from icelog.storage.admin.maintenance import maintain
from icelog.storage.core.commit import commit
from icelog.storage.errors import UnknownSnapshot
from icelog.storage.log import manifests
from icelog.storage.log.maintenance import Retention, files_by_partition
from icelog.storage.log.manifests import LiveFile, live_files
from icelog.storage.log.table import LogTable
from icelog.validations.contiguity import check_contiguity


def planned(table, field_id: int, snapshot_id: int | None = None) -> list[tuple]:
    tasks = table.scan(snapshot_id=snapshot_id).plan_files()
    return sorted(
        (
            t.file.file_path,
            tuple(t.file.partition),
            t.file.record_count,
            t.file.lower_bounds[field_id],
            t.file.upper_bounds[field_id],
        )
        for t in tasks
    )


def read(table, field_id: int, snapshot_id: int | None = None) -> list[tuple]:
    return sorted(
        (f.path, f.partition, f.record_count, f.lower[field_id], f.upper[field_id])
        for f in live_files(table, [field_id], snapshot_id)
    )


def offset_id(table) -> int:
    return table.schema().find_field("log_offset").field_id


def test_the_reader_plans_what_pyiceberg_plans_through_a_tables_history(catalog):
    t = LogTable.create(catalog, "db.events", 3, properties={"icelog.key-column": "key"})
    assert live_files(t.table(), [1]) == []  # no snapshot yet
    for i in range(6):
        t.append({p: [{"key": f"k{j}", "value": str(i)} for j in range(p + 1)] for p in range(3)})
    t.append({0: [{"key": f"k{j}", "value": "big"} for j in range(3000)]})  # clustered by key hash
    first = t.table()
    old = first.metadata.current_snapshot_id
    one_file = files_by_partition(first)[1][0][2].file_size_in_bytes
    commit(catalog, t.identifier, Retention(t.identifier, retention_bytes=2 * one_file))  # drops files
    retained = t.table().metadata.current_snapshot_id  # its manifests list them as deleted entries
    maintain(catalog, t.identifier, keep_snapshots=50, orphan_age_s=3600)  # compaction rewrites the rest
    compacted = t.table().metadata.current_snapshot_id
    t.append({2: [{"key": "late", "value": "x"}]})
    table = t.table()
    field = offset_id(table)
    assert read(table, field) == planned(table, field) and len(read(table, field)) > 3
    for snapshot in (old, retained, compacted):
        assert read(table, field, snapshot) == planned(table, field, snapshot)
    assert len(planned(table, field, retained)) < len(planned(table, field, old))
    assert check_contiguity(table).ok


def test_the_reader_keeps_only_the_bounds_asked_for_and_refuses_an_unknown_snapshot(catalog):
    t = LogTable.create(catalog, "db.events", 1)
    t.append({0: [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}]})
    table = t.table()
    (f,) = live_files(table, [offset_id(table)])
    assert isinstance(f, LiveFile) and set(f.lower) == set(f.upper) == {offset_id(table)}
    assert (f.record_count, int.from_bytes(f.upper[offset_id(table)], "little")) == (2, 1)
    with pytest.raises(UnknownSnapshot):
        live_files(table, [offset_id(table)], snapshot_id=12345)


def test_a_foreign_append_is_read_as_pyiceberg_reads_it(catalog):
    """Another writer's fast append (its own manifest, v2 sequence numbers inherited)."""
    t = LogTable.create(catalog, "db.events", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    foreign = catalog.load_table("db.events")
    rows = t.read(0).select([f.name for f in foreign.schema().as_arrow()])
    foreign.append(pa.Table.from_batches(rows.to_batches(), foreign.schema().as_arrow()))
    table = catalog.load_table("db.events")
    assert read(table, offset_id(table)) == planned(table, offset_id(table))
    assert len(read(table, offset_id(table))) == 2


def test_an_empty_foreign_file_is_skipped_as_pyiceberg_skips_it(catalog, tmp_path):
    """A zero-row data file (another engine's, or add_files of an empty Parquet file) has no
    bounds: plan_files leaves it out, and so must the metadata-only check."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    t = LogTable.create(catalog, "db.events", 1)
    t.append({0: [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}]})
    foreign = catalog.load_table("db.events")
    empty = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"file://{tmp_path}/empty.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(0),
        record_count=0,
        file_size_in_bytes=4,
        lower_bounds={},
        upper_bounds={},
    )
    empty.spec_id = foreign.metadata.default_spec_id
    with foreign.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(empty)
    table = catalog.load_table("db.events")
    assert read(table, offset_id(table)) == planned(table, offset_id(table))
    assert len(read(table, offset_id(table))) == 1
    assert check_contiguity(table).ok


def test_a_snapshot_with_delete_manifests_is_planned_by_pyiceberg(catalog, monkeypatch):
    """Row-level deletes (another engine's) change which rows are live: pyiceberg applies them.
    (pyiceberg 0.12 writes no delete files, so the manifest list says so here.)"""
    t = LogTable.create(catalog, "db.events", 1)
    t.append({0: [{"key": "a", "value": "1"}]})
    real = manifests._manifest_list

    def with_a_delete_manifest(table, snapshot):
        found = real(table, snapshot)
        data = found[0]
        deletes = SimpleNamespace(
            manifest_path=data.manifest_path, partition_spec_id=data.partition_spec_id, content=ManifestContent.DELETES
        )
        return [*found, deletes]

    monkeypatch.setattr(manifests, "_manifest_list", with_a_delete_manifest)
    decoded = []
    real_entries = manifests._entries
    monkeypatch.setattr(manifests, "_entries", lambda data: decoded.append(1) or real_entries(data))
    planned_by = []
    real_planned = manifests._planned
    monkeypatch.setattr(manifests, "_planned", lambda *a: planned_by.append(a) or real_planned(*a))
    table = t.table()
    assert read(table, offset_id(table)) == planned(table, offset_id(table))
    assert len(planned_by) == 1 and decoded == []  # the manifests themselves were not read


def test_a_format_v1_tables_manifests_are_read_as_pyiceberg_reads_them(catalog):
    """A v1 manifest entry has no ``content`` field (v1 has no delete files) and a required
    snapshot id: the read schema takes what the file has."""
    catalog.create_namespace("v1")
    schema = pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("s", pa.large_string())])
    table = catalog.create_table("v1.t", schema=schema, properties={"format-version": "1"})
    for start in (0, 10, 20):
        table.append(pa.table({"n": pa.array(range(start, start + 10), pa.int64()), "s": ["x"] * 10}, schema=schema))
    table = catalog.load_table("v1.t")
    assert table.metadata.format_version == 1
    n = table.schema().find_field("n").field_id
    assert len(read(table, n)) == 3 and read(table, n) == planned(table, n)


@pytest.mark.parametrize("sized", [False, True], ids=["counted blocks", "blocks with their byte size"])
def test_a_skipped_map_of_integers_is_passed_over_exactly(sized):
    """Column sizes, value, null and NaN counts are skipped a block at a time. Avro lets a
    writer give a block's byte size after a negative count (pyiceberg never does; others may):
    both forms end exactly where the next field starts."""
    blocks = [[(1, 88), (2, 2**40)], [(3, -5), (2**31 - 1, 0), (7, 1)]]
    out = io.BytesIO()
    enc = BinaryEncoder(out)
    for block in blocks:
        body = io.BytesIO()
        for key, value in block:
            BinaryEncoder(body).write_int(key)
            BinaryEncoder(body).write_int(value)
        enc.write_int(-len(block) if sized else len(block))
        if sized:
            enc.write_int(len(body.getvalue()))
        enc.write(body.getvalue())
    enc.write_int(0)  # the map's end
    enc.write_int(12345)  # the next field
    decoder = new_decoder(out.getvalue())
    manifests._SkipIntMap().skip(decoder)
    assert decoder.read_int() == 12345

"""pyiceberg's Avro writers with their schema work kept (``storage.core.avro_writers``): the same
bytes as pyiceberg's own, and the schema work done once per schema."""

from __future__ import annotations

import pytest
from pyiceberg import manifest
from pyiceberg.avro import file as avro_file
from pyiceberg.manifest import write_manifest, write_manifest_list

from icelog.storage.core import avro_writers
from icelog.storage.log.table import LogTable


@pytest.fixture
def committed(catalog):
    """A log table with two commits: a snapshot whose manifests and entries the tests write again."""
    log_table = LogTable.create(catalog, "db.t", 4)
    log_table.append({0: [{"key": "a", "value": "1"}], 2: [{"key": "b", "value": "2"}]})
    log_table.append({1: [{"key": "c", "value": "3"}]})
    table = log_table.table()
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io)
    entries = [e for m in manifests for e in m.fetch_manifest_entry(table.io)]
    return table, snapshot, manifests, entries


def _write_both(table, snapshot, manifests, entries, folder, tag: str) -> tuple[bytes, bytes]:
    with write_manifest(
        format_version=2,
        spec=table.spec(),
        schema=table.schema(),
        output_file=table.io.new_output(f"file://{folder}/{tag}-m.avro"),
        snapshot_id=snapshot.snapshot_id,
        avro_compression="gzip",
    ) as writer:
        for entry in entries:
            writer.add_entry(entry)
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(f"file://{folder}/{tag}-l.avro"),
        snapshot_id=snapshot.snapshot_id,
        parent_snapshot_id=snapshot.parent_snapshot_id,
        sequence_number=snapshot.sequence_number,
        avro_compression="gzip",
    ) as lister:
        lister.add_manifests(manifests)
    return (folder / f"{tag}-m.avro").read_bytes(), (folder / f"{tag}-l.avro").read_bytes()


def test_kept_schema_work_writes_the_bytes_pyiceberg_writes(committed, tmp_path, monkeypatch):
    avro_writers.install()
    monkeypatch.setattr(avro_file.os, "urandom", lambda n: b"\x07" * n)  # one sync marker for both files
    kept = _write_both(*committed, tmp_path, "kept")
    # pyiceberg's own, as install found them
    monkeypatch.setattr(avro_file, "resolve_writer", avro_file.resolve_writer.fn)
    monkeypatch.setattr(avro_file, "construct_writer", avro_file.construct_writer.fn)
    monkeypatch.setattr(avro_file, "AvroSchemaConversion", avro_file.AvroSchemaConversion.__bases__[0])
    original = manifest.ManifestWriter._with_partition.__closure__[0].cell_contents
    assert original.__module__ == "pyiceberg.manifest"
    monkeypatch.setattr(manifest.ManifestWriter, "_with_partition", original)
    assert _write_both(*committed, tmp_path, "pyiceberg") == kept


def test_a_manifests_schemas_are_built_once_per_partition_type(committed, tmp_path, monkeypatch):
    avro_writers.install()
    built = []
    real = manifest.data_file_with_partition
    monkeypatch.setattr(manifest, "data_file_with_partition", lambda **kw: built.append(kw) or real(**kw))
    table, snapshot, manifests, entries = committed
    for i in range(3):
        _write_both(table, snapshot, manifests, entries, tmp_path, str(i))
    # pyiceberg builds two per manifest (file and read format); kept: at most those two, once
    assert len(built) <= 2, built

"""Contract: the private pyiceberg names icelog relies on (pinned pyiceberg==0.12.0).

A pyiceberg upgrade that renames or reshapes any of them fails here, loudly, before the
commit core misbehaves.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import Transaction
from pyiceberg.table.update import AddSnapshotUpdate, SetSnapshotRefUpdate

from icelog.storage.core.catalog import LogSqlCatalog


def test_pyiceberg_version_is_the_pinned_one():
    assert version("pyiceberg") == "0.12.0"


def test_sql_catalog_private_names_used_by_the_swap():
    assert list(inspect.signature(SqlCatalog._update_and_stage_table).parameters) == [
        "self",
        "current_table",
        "table_identifier",
        "requirements",
        "updates",
    ]
    assert list(inspect.signature(SqlCatalog._write_metadata).parameters) == ["metadata", "io", "metadata_path"]
    assert "orm_table" in inspect.signature(SqlCatalog._convert_orm_to_iceberg).parameters
    assert {"catalog_name", "table_namespace", "table_name", "metadata_location", "previous_metadata_location"} <= set(
        IcebergTables.__table__.columns.keys()
    )
    # The fault point between metadata write and swap hooks the same name.
    assert issubclass(SqlCatalog, MetastoreCatalog) and LogSqlCatalog._write_metadata is not MetastoreCatalog._write_metadata


def test_transaction_exposes_staged_updates(sqlite_catalog):
    from icelog.storage.log.table import LogTable

    table = LogTable.create(sqlite_catalog, "db.contract", 1).table()
    txn = table.transaction()
    assert isinstance(txn, Transaction) and txn._updates == ()
    txn.set_properties({"a": "b"})
    assert len(txn._updates) == 1
    assert {"snapshot", "action"} <= set(AddSnapshotUpdate.model_fields)
    assert SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=1).ref_name == "main"


def test_parquet_footer_names_used_to_register_spark_files():
    from pyiceberg.io import pyarrow as pio

    assert list(inspect.signature(pio._check_pyarrow_schema_compatible).parameters)[:2] == ["requested_schema", "provided_schema"]
    assert "format_version" in inspect.signature(pio._check_pyarrow_schema_compatible).parameters
    assert {"parquet_metadata", "stats_columns", "parquet_column_mapping"} <= set(
        inspect.signature(pio.data_file_statistics_from_parquet_metadata).parameters
    )
    assert callable(pio.compute_statistics_plan) and callable(pio.parquet_path_to_id_mapping)


def test_overwrite_builds_its_manifest_evaluators_through_an_instance_lookup():
    """icelog.storage.core.commit._evaluator_per_manifest replaces ``_build_manifest_evaluator`` on the
    overwrite instance; pyiceberg must look it up there when it matches files to delete."""
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    assert list(inspect.signature(_OverwriteFiles._build_manifest_evaluator).parameters) == ["self", "spec_id"]
    assert "self._build_manifest_evaluator" in inspect.getsource(_OverwriteFiles._deleted_entries)


def test_staging_transaction_caches_exactly_what_pyiceberg_computes(sqlite_catalog):
    """The commit core's metadata view per staged-update tuple equals pyiceberg's own, after
    every change a commit stages (a snapshot, properties), and moves on when they change."""
    from pyiceberg.table.update import update_table_metadata

    from icelog.storage.core.commit import _StagingTransaction
    from icelog.storage.log.table import LogTable

    log_table = LogTable.create(sqlite_catalog, "db.staging", 1)
    log_table.append({0: [{"key": "a"}]})
    table = log_table.table()
    assert isinstance(Transaction.__dict__["table_metadata"], property)
    cached = _StagingTransaction(table)
    assert isinstance(cached._updates, tuple)
    cached.set_properties({"x": "1"})

    def pyicebergs(txn):  # what Transaction.table_metadata computes, uncached
        return update_table_metadata(txn._table.metadata, txn._updates)

    def same(a, b):  # pyiceberg stamps last_updated_ms with "now" on every computation
        return a.model_copy(update={"last_updated_ms": 0}) == b.model_copy(update={"last_updated_ms": 0})

    first = cached.table_metadata
    assert first is cached.table_metadata  # computed once for these updates
    assert same(first, pyicebergs(cached))
    cached.update_snapshot().fast_append().commit()  # stages a snapshot, the table is not committed
    cached.set_properties({"y": "2"})
    assert cached.table_metadata is not first and same(cached.table_metadata, pyicebergs(cached))
    assert cached.table_metadata.properties["y"] == "2"


def test_apply_updates_is_pyicebergs_update_without_the_deep_copy(sqlite_catalog):
    """``storage.core.swap.apply_updates`` re-states ``update_table_metadata`` on its private
    helpers: same result for every kind of update a commit stages, and the base left as it was."""
    from pyiceberg.table.update import RemoveSnapshotsUpdate, SetPropertiesUpdate, update_table_metadata

    from icelog.storage.core.commit import _StagingTransaction
    from icelog.storage.core.swap import apply_updates
    from icelog.storage.log.table import LogTable

    assert "model_copy(deep=True)" in inspect.getsource(update_table_metadata)  # what it saves
    assert list(inspect.signature(update_table_metadata).parameters) == [
        "base_metadata",
        "updates",
        "enforce_validation",
        "metadata_location",
    ]
    log_table = LogTable.create(sqlite_catalog, "db.apply", 1, properties={"write.metadata.previous-versions-max": "2"})
    for i in range(4):
        log_table.append({0: [{"key": str(i)}]})
    table = log_table.table()
    before = table.metadata.model_dump_json()
    txn = _StagingTransaction(table)
    txn.update_snapshot().fast_append().commit()
    updates = (
        *txn._updates,
        SetPropertiesUpdate(updates={"x": "1"}),
        RemoveSnapshotsUpdate(snapshot_ids=[table.metadata.snapshots[0].snapshot_id]),
    )
    ours = apply_updates(table.metadata, updates, table.metadata_location)
    theirs = update_table_metadata(table.metadata, updates, metadata_location=table.metadata_location)
    assert ours.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0})
    assert len(ours.metadata_log) == 2 and ours.metadata_log[-1].metadata_file == table.metadata_location
    assert table.metadata.model_dump_json() == before  # the base is untouched


def test_log_file_writer_describes_a_file_as_pyicebergs_write_file(sqlite_catalog):
    """icelog.storage.log.files writes data files itself (encodings, row groups) with pyiceberg's private
    writer options (_get_parquet_writer_kwargs) and statistics helpers: the DataFile it returns
    must say what pyiceberg's own write_file says of the same rows, apart from path and bytes."""
    import uuid

    import pyarrow as pa
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, write_file
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table import WriteTask

    from icelog.storage.log import schema as cols
    from icelog.storage.log.files import write_log_files
    from icelog.storage.log.table import LogTable

    assert set(inspect.signature(_get_parquet_writer_kwargs).parameters) == {"table_properties"}
    t = LogTable.create(sqlite_catalog, "db.contract", 2)  # key/value strings: a key column
    n = 5_000  # large enough to be clustered by key hash
    t.append({1: pa.table({"key": [f"key-{i % 97}" for i in range(n)], "value": [str(i) for i in range(n)]})})
    table = t.table()
    rows = t.read(1)
    ours = write_log_files(table, {1: rows})
    metadata, spec = table.metadata, table.metadata.spec()
    key = PartitionKey(field_values=[PartitionFieldValue(spec.fields[0], 1)], partition_spec=spec, schema=metadata.schema())
    arrow = metadata.schema().as_arrow()
    task = WriteTask(uuid.uuid4(), 0, metadata.schema(), rows.select(arrow.names).cast(arrow).to_batches(), partition_key=key)
    (theirs,) = write_file(table.io, metadata, iter([task]))
    (mine,) = ours
    for field in ("content", "file_format", "partition", "record_count", "null_value_counts", "lower_bounds", "upper_bounds"):
        assert getattr(mine, field) == getattr(theirs, field), field
    assert set(mine.column_sizes) == set(theirs.column_sizes) and set(mine.value_counts) == set(theirs.value_counts)
    assert mine.value_counts == theirs.value_counts
    assert mine.file_path.rsplit("/", 1)[0] == theirs.file_path.rsplit("/", 1)[0]  # the location provider's folder
    assert cols.KEY_HASH in rows.column_names


def test_pyarrow_file_io_gives_the_file_system_maintenance_lists_with(tmp_path):
    """Orphan cleanup and the metadata sweep list and delete through ``PyArrowFileIO.fs_by_scheme``
    (an undocumented attribute) at the path ``parse_location`` gives (``bucket/key`` on S3)."""
    from pyarrow.fs import LocalFileSystem, S3FileSystem
    from pyiceberg.io.pyarrow import PyArrowFileIO

    assert PyArrowFileIO.parse_location("s3://warehouse/db/t/metadata/v3.metadata.json") == (
        "s3",
        "warehouse",
        "warehouse/db/t/metadata/v3.metadata.json",
    )
    assert PyArrowFileIO.parse_location(f"file://{tmp_path}/x") == ("file", "", f"{tmp_path}/x")
    io = PyArrowFileIO({"s3.endpoint": "http://127.0.0.1:1", "s3.region": "us-east-1"})
    assert isinstance(io.fs_by_scheme("file", None), LocalFileSystem)
    assert isinstance(io.fs_by_scheme("s3", "warehouse"), S3FileSystem)


def test_log_file_io_keeps_every_s3_option_pyiceberg_chooses_and_opens_small_files_lazily():
    """``storage.core.fileio.LogFileIO`` overrides the private ``_initialize_s3_fs(netloc)`` and
    rebuilds its S3FileSystem from pyarrow's pickled options with ``allow_delayed_open`` (one
    ``PutObject`` per small file): nothing else pyiceberg set may change."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from icelog.storage.core.fileio import LogFileIO

    assert list(inspect.signature(PyArrowFileIO._initialize_s3_fs).parameters) == ["self", "netloc"]
    properties = {
        "s3.endpoint": "http://127.0.0.1:1",
        "s3.access-key-id": "k",
        "s3.secret-access-key": "s",
        "s3.region": "eu-west-3",
        "s3.connect-timeout": "2.5",
        "s3.request-timeout": "7",
        "s3.force-virtual-addressing": "false",
    }
    plain = PyArrowFileIO(properties).fs_by_scheme("s3", "warehouse").__reduce__()[1][0]
    ours = LogFileIO(properties).fs_by_scheme("s3", "warehouse").__reduce__()[1][0]
    assert plain["allow_delayed_open"] is False and ours["allow_delayed_open"] is True
    assert {k: v for k, v in ours.items() if k != "allow_delayed_open"} == {
        k: v for k, v in plain.items() if k != "allow_delayed_open"
    }
    assert (ours["connect_timeout"], ours["region"], ours["access_key"]) == (2.5, "eu-west-3", "k")


def test_sql_catalog_table_the_light_pointer_read_queries():
    from pyiceberg.catalog import sql as pyiceberg_sql

    from icelog.storage.core import pointer

    assert pointer.TABLES == IcebergTables.__tablename__
    assert {"catalog_name", "table_namespace", "table_name", "metadata_location", "iceberg_type"} <= set(
        IcebergTables.__table__.columns.keys()
    )
    assert pointer.TABLE_TYPE == pyiceberg_sql.ICEBERG_TABLE_TYPE


def test_manifest_merge_private_names_used_by_the_merge_in_the_caller():
    from pyiceberg.table.update.snapshot import _ManifestMergeManager, _MergeAppendFiles

    assert list(inspect.signature(_ManifestMergeManager.__init__).parameters) == [
        "self",
        "target_size_bytes",
        "min_count_to_merge",
        "merge_enabled",
        "snapshot_producer",
    ]
    assert list(inspect.signature(_ManifestMergeManager._merge_group).parameters) == [
        "self",
        "first_manifest",
        "spec_id",
        "manifests",
    ]
    assert list(inspect.signature(_ManifestMergeManager._create_manifest).parameters) == ["self", "spec_id", "manifest_bin"]
    assert list(inspect.signature(_MergeAppendFiles._process_manifests).parameters) == ["self", "manifests"]
    assert {"_target_size_bytes", "_min_count_to_merge", "_merge_enabled"} <= set(_MergeAppendFiles.__annotations__)


def test_avro_private_names_used_by_the_manifest_reader():
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.avro.resolver import ReadSchemaResolver, SchemaPartnerAccessor

    assert {"decoder", "header", "reader", "block"} <= set(AvroFile.__slots__) and callable(AvroFile._read_header)
    assert list(inspect.signature(ReadSchemaResolver.map).parameters) == [
        "self",
        "map_type",
        "expected_map",
        "key_reader",
        "value_reader",
    ]
    assert {"field_partner", "list_element_partner", "map_key_partner", "map_value_partner"} <= set(vars(SchemaPartnerAccessor))
    assert list(new_decoder(b"\x04\x06").read_ints(2)) == [2, 3]


def test_avro_writer_names_kept_by_the_commit_core():
    """``storage.core.avro_writers`` replaces these module names with kept versions of them:
    they must be the module globals pyiceberg's Avro output file and manifest writer call."""
    from pyiceberg import manifest
    from pyiceberg.avro import file as avro_file

    from icelog.storage.core import avro_writers

    avro_writers.install()
    originals = {
        "resolve_writer": avro_file.resolve_writer.fn,
        "construct_writer": avro_file.construct_writer.fn,
    }
    assert list(inspect.signature(originals["resolve_writer"]).parameters) == ["record_schema", "file_schema"]
    assert list(inspect.signature(originals["construct_writer"]).parameters) == ["file_schema"]
    output_file = inspect.getsource(avro_file.AvroOutputFile)
    assert all(f"{name}(" in output_file for name in (*originals, "AvroSchemaConversion"))
    assert avro_file.AvroSchemaConversion.__bases__[0].__module__ == "pyiceberg.utils.schema_conversion"
    with_partition = manifest.ManifestWriter._with_partition.__closure__[0].cell_contents
    assert list(inspect.signature(with_partition).parameters) == ["self", "format_version"]
    assert "_with_partition(" in inspect.getsource(manifest.ManifestWriter)

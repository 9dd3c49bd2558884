"""Great Expectations suites: pass on the real flights, fail on planted payload and system violations."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from icelog.pipelines.flights import create_table, load_flights
from icelog.storage.errors import InvalidInput
from icelog.validations.quality import payload_expectations, run_suite


@pytest.fixture(scope="module")
def flights_rows() -> pa.Table:
    return load_flights().slice(0, 20_000)


@pytest.fixture
def flights(sqlite_catalog, flights_rows, tmp_path):
    table, _ = create_table(sqlite_catalog)
    table.append({0: flights_rows.slice(0, 10_000), 1: flights_rows.slice(10_000)})
    return table


def plant_rows(table, rows: list[dict]) -> None:
    """Append rows straight through pyiceberg (around icelog's checks)."""
    iceberg = table.table()
    schema = iceberg.schema().as_arrow()
    full = [{**{f.name: None for f in schema}, "log_timestamp": 1_700_000_000_000_000, **r} for r in rows]
    iceberg.append(pa.Table.from_pylist(full).cast(schema))


def test_suite_passes_on_the_demo_flights(flights, tmp_path):
    result = run_suite(flights.table(), docs_root=tmp_path / "gx")
    assert result.success, result.failed
    assert result.evaluated >= 15  # 6 system + 9 declared in expectations/demo.flights.json
    assert result.data_docs and result.data_docs.endswith("index.html")


def test_suite_fails_on_planted_payload_violations(flights, tmp_path):
    end = flights.watermarks()[0].end
    plant_rows(
        flights,
        [
            {
                "log_partition": 0,
                "log_offset": end,
                "carrier": "ZZ",
                "dep_delay": 5000.0,
                "flight": 1,
                "origin": "JFK",
                "month": 1,
                "distance": 100.0,
            }
        ],
    )
    result = run_suite(flights.table(), docs_root=tmp_path / "gx")
    assert not result.success
    failed = {(f["expectation"], f["kwargs"].get("column")) for f in result.failed}
    assert ("expect_column_values_to_be_in_set", "carrier") in failed
    assert ("expect_column_values_to_be_between", "dep_delay") in failed
    assert all(f["unexpected_count"] == 1 for f in result.failed if f["kwargs"].get("column") in ("carrier", "dep_delay"))


def test_suite_fails_on_a_duplicated_offset(flights, tmp_path):
    plant_rows(
        flights,
        [{"log_partition": 1, "log_offset": 5, "carrier": "AA", "flight": 1, "origin": "JFK", "month": 1, "distance": 100.0}],
    )
    failed = {f["expectation"] for f in run_suite(flights.table(), docs_root=tmp_path / "gx").failed}
    assert failed == {"expect_compound_columns_to_be_unique"}


def test_bad_expectation_files_are_typed_errors(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"expectations": [{"type": "drop_table"}]}')
    with pytest.raises(InvalidInput):
        payload_expectations("db.x", bad)
    bad.write_text("{nope")
    with pytest.raises(InvalidInput):
        payload_expectations("db.x", bad)
    assert payload_expectations("db.none") == []


# --- incremental validation --------------------------------------------------------------


def tamper(table, partition: int, column: str, value) -> str:
    """Rewrite one already-committed data file in place (bit rot, or a hand edit): its
    first row's ``column`` becomes ``value``. No commit, so lineage knows nothing of it."""
    import pyarrow.parquet as pq

    from icelog.storage.log.files import local_path
    from icelog.storage.log.maintenance import files_by_partition

    path = local_path(files_by_partition(table.table())[partition][0][2].file_path)
    rows = pq.read_table(path)
    index = rows.schema.get_field_index(column)
    values = rows[column].to_pylist()
    values[0] = value
    pq.write_table(rows.set_column(index, rows.schema.field(index), pa.array(values, rows.schema.field(index).type)), path)
    return path


def test_incremental_validation_reads_only_new_ranges_and_full_catches_an_old_bad_row(flights, flights_rows, tmp_path):
    root = tmp_path / "gx"
    first = run_suite(flights.table(), docs_root=root)
    assert first.success and first.scope["mode"] == "full" and first.scope["rows"] == 20_000
    tamper(flights, 0, "carrier", "ZZ")  # an old range goes bad without a commit
    flights.append({1: flights_rows.slice(0, 100)})
    new = run_suite(flights.table(), docs_root=root)
    assert new.scope["mode"] == "incremental"
    assert new.scope["ranges"] == {"1": [[10_000, 10_100]]} and new.scope["since"] == first.snapshot_id
    assert new.success, new.failed  # the tampered old row is outside the scope
    assert run_suite(flights.table(), docs_root=root).scope["mode"] == "none"
    full = run_suite(flights.table(), docs_root=root, full=True)
    assert not full.success and full.scope["mode"] == "full"
    assert [(f["kwargs"]["column"], f["unexpected_count"]) for f in full.failed] == [("carrier", 1)]


def test_a_run_with_nothing_new_repeats_the_last_result_and_what_it_covered(flights, flights_rows, tmp_path):
    root = tmp_path / "gx"
    first = run_suite(flights.table(), docs_root=root)
    again = run_suite(flights.table(), docs_root=root)  # `make demo; make demo`
    assert again.scope["mode"] == "none" and again.scope["rows"] == 0
    assert (again.success, again.evaluated, again.engine) == (True, first.evaluated, "pandas") and first.evaluated >= 15
    covered = again.scope["last_run"]
    assert (covered["mode"], covered["rows"], covered["snapshot_id"]) == ("full", 20_000, first.snapshot_id)
    assert again.data_docs == first.data_docs
    flights.append({1: flights_rows.slice(0, 100)})
    increment = run_suite(flights.table(), docs_root=root)
    assert run_suite(flights.table(), docs_root=root).scope["last_run"]["rows"] == 100 == increment.scope["rows"]
    # A full run that fails at the validated snapshot is the result that stands, failures included.
    tamper(flights, 0, "carrier", "ZZ")
    full = run_suite(flights.table(), docs_root=root, full=True)
    repeated = run_suite(flights.table(), docs_root=root)
    assert repeated.scope["mode"] == "none" and not repeated.success and repeated.failed == full.failed


def test_a_record_without_the_last_result_validates_again_rather_than_show_an_empty_pass(flights, tmp_path):
    import json

    from icelog.validations.quality import validation_record

    root = tmp_path / "gx"
    run_suite(flights.table(), docs_root=root)
    path = root / "validated" / "demo.flights.json"
    record = validation_record(flights.table(), root)
    for run in record["runs"]:  # as written before the expectation count was recorded
        del run["evaluated"]
    path.write_text(json.dumps(record))
    result = run_suite(flights.table(), docs_root=root)
    assert result.scope["mode"] == "full" and "not recorded" in result.scope["reason"]
    assert result.success and result.evaluated >= 15


def test_incremental_validation_fails_on_a_bad_new_row_until_it_is_fixed(flights, flights_rows, tmp_path):
    from icelog.validations.quality import validation_record

    root = tmp_path / "gx"
    passed = run_suite(flights.table(), docs_root=root)
    bad = flights_rows.slice(0, 50).to_pylist()
    bad[7]["carrier"] = "ZZ"
    flights.append({0: pa.Table.from_pylist(bad, flights_rows.schema)})
    for _ in range(2):  # a failure does not advance the record: the next run checks the same rows
        result = run_suite(flights.table(), docs_root=root)
        assert not result.success
        assert result.scope["ranges"] == {"0": [[10_000, 10_050]]}
        assert [(f["kwargs"]["column"], f["unexpected_count"]) for f in result.failed] == [("carrier", 1)]
    record = validation_record(flights.table(), root)
    assert record["validated_snapshot_id"] == passed.snapshot_id
    assert [r["success"] for r in record["runs"]] == [True, False, False]


def test_incremental_validation_falls_back_to_full_when_the_validated_snapshot_expired(sqlite_catalog, tmp_path):
    from icelog.storage.log.table import LogTable

    t = LogTable.create(sqlite_catalog, "db.events", partitions=1, properties={"icelog.snapshots.keep": "2"})
    t.append({0: [{"key": "a"}] * 3})
    assert run_suite(t.table(), docs_root=tmp_path).scope["mode"] == "full"
    for _ in range(3):
        t.append({0: [{"key": "b"}]})
    result = run_suite(t.table(), docs_root=tmp_path)
    assert result.success and result.scope["mode"] == "full" and result.scope["rows"] == 6
    assert "no longer retained" in result.scope["reason"]


def test_incremental_validation_falls_back_to_full_after_a_foreign_commit(flights, tmp_path):
    run_suite(flights.table(), docs_root=tmp_path)
    plant_rows(
        flights,
        [{"log_partition": 1, "log_offset": 5, "carrier": "AA", "flight": 1, "origin": "JFK", "month": 1, "distance": 100.0}],
    )
    result = run_suite(flights.table(), docs_root=tmp_path)
    assert result.scope["mode"] == "full" and "without icelog lineage" in result.scope["reason"]
    assert {f["expectation"] for f in result.failed} == {"expect_compound_columns_to_be_unique"}


def test_engine_is_picked_by_rows_in_scope(monkeypatch):
    from icelog.validations.quality import pick_engine

    monkeypatch.setenv("ICELOG_GX_SPARK_ROWS", "1000")
    assert pick_engine(1000) == "pandas" and pick_engine(1001) == "spark"
    assert pick_engine(10**9, "pandas") == "pandas"
    monkeypatch.setenv("ICELOG_GX_SPARK_ROWS", "many")
    with pytest.raises(InvalidInput, match="ICELOG_GX_SPARK_ROWS"):
        pick_engine(5)
    with pytest.raises(InvalidInput):
        pick_engine(5, "polars")


# --- GX on Spark --------------------------------------------------------------------------


def failures(result) -> set[tuple]:
    return {(f["expectation"], f["kwargs"].get("column"), f["unexpected_count"]) for f in result.failed}


@pytest.mark.integration
def test_gx_on_spark_passes_on_the_flights_and_fails_on_planted_rows_like_pandas(flights, spark, tmp_path):
    ok = run_suite(flights.table(), docs_root=tmp_path / "gx", engine="spark", spark=spark)
    assert ok.engine == "spark" and ok.success, ok.failed
    assert ok.evaluated >= 15
    end = flights.watermarks()[0].end
    plant_rows(
        flights,
        [
            {
                "log_partition": 0,
                "log_offset": end,
                "carrier": "ZZ",
                "dep_delay": 5000.0,
                "flight": 1,
                "origin": "JFK",
                "month": 1,
                "distance": 100.0,
            }
        ],
    )
    on_spark = run_suite(flights.table(), docs_root=tmp_path / "gx", engine="spark", spark=lambda: spark)
    on_pandas = run_suite(flights.table(), docs_root=tmp_path / "gx", engine="pandas")
    assert not on_spark.success and on_spark.engine == "spark"
    assert failures(on_spark) == failures(on_pandas)
    assert ("expect_column_values_to_be_in_set", "carrier", 1) in failures(on_spark)


def test_missing_web_assets_leave_validation_standing_and_say_why(sqlite_catalog, tmp_path, monkeypatch):
    from icelog.storage.log.table import LogTable
    from icelog.validations.quality import WebAssetsMissing, offline_data_docs

    monkeypatch.setenv("ICELOG_WEB_ASSETS", str(tmp_path / "nowhere"))
    t = LogTable.create(sqlite_catalog, "db.events", partitions=1)
    t.append({0: [{"key": "a"}] * 3})
    result = run_suite(t.table(), docs_root=tmp_path / "gx")
    assert result.success and "ICELOG_WEB_ASSETS" in result.docs_not_offline and "make setup" in result.docs_not_offline
    with pytest.raises(WebAssetsMissing):
        offline_data_docs(tmp_path / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site")
    monkeypatch.delenv("ICELOG_WEB_ASSETS")
    site = Path(result.data_docs).parent
    replaced = offline_data_docs(site)
    assert any("cdn.jsdelivr.net/npm/vega@5" in u for u in replaced) and any("bootstrap" in u for u in replaced)
    pages = "".join(page.read_text() for page in site.rglob("*.html"))
    assert "cdn" not in pages and "unpkg.com" not in pages and "integrity=" not in pages


def test_a_past_snapshot_is_validated_in_full_and_records_nothing(flights, flights_rows, tmp_path):
    from icelog.storage.errors import UnknownSnapshot
    from icelog.validations.quality import validation_record

    before = flights.table().metadata.current_snapshot_id
    bad = flights_rows.slice(0, 5).to_pylist()
    bad[0]["carrier"] = "ZZ"
    flights.append({0: pa.Table.from_pylist(bad, flights_rows.schema)})
    past = run_suite(flights.table(), docs_root=tmp_path, snapshot_id=before)
    assert past.success and past.scope["mode"] == "full" and past.scope["rows"] == 20_000 and past.snapshot_id == before
    assert validation_record(flights.table(), tmp_path) == {}
    assert not run_suite(flights.table(), docs_root=tmp_path).success  # the current snapshot has the bad row
    with pytest.raises(UnknownSnapshot):
        run_suite(flights.table(), docs_root=tmp_path, snapshot_id=12345)

"""Great Expectations suites: pass on the real flights, fail on planted payload and system violations."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.flights import create_table, load_flights
from storage.errors import InvalidInput
from validations.quality import payload_expectations, run_suite


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
    plant_rows(flights, [{"log_partition": 0, "log_offset": end, "carrier": "ZZ", "dep_delay": 5000.0, "flight": 1, "origin": "JFK", "month": 1, "distance": 100.0}])
    result = run_suite(flights.table(), docs_root=tmp_path / "gx")
    assert not result.success
    failed = {(f["expectation"], f["kwargs"].get("column")) for f in result.failed}
    assert ("expect_column_values_to_be_in_set", "carrier") in failed
    assert ("expect_column_values_to_be_between", "dep_delay") in failed
    assert all(f["unexpected_count"] == 1 for f in result.failed if f["kwargs"].get("column") in ("carrier", "dep_delay"))


def test_suite_fails_on_a_duplicated_offset(flights, tmp_path):
    plant_rows(flights, [{"log_partition": 1, "log_offset": 5, "carrier": "AA", "flight": 1, "origin": "JFK", "month": 1, "distance": 100.0}])
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

"""``icelog mirror`` and ``icelog acls``: typed exit codes, JSON documents, read-only targets."""

from __future__ import annotations

import pytest

from icelog.storage.log.table import LogTable
from tests.support.cli import Cli
from tests.support.mirror import assert_parity


@pytest.fixture
def icelog(mirror_cli) -> Cli:
    return mirror_cli


def test_i6_mirror_cli_acls_mirror_validate_promote(icelog, sqlite_spec, target_spec):
    source = LogTable.create(sqlite_spec.open(), "orders", 2)
    source.append({0: [{"key": "a"}, {"key": "b"}], 1: [{"key": "c"}]})
    refused = icelog("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot", code=5)
    assert refused["error"] == "AuthorizationFailed"
    assert icelog("--catalog", "drcat", "acls", "list") == {"acls": []}
    icelog("--catalog", "drcat", "acls", "add", "--principal", "bot", "--table", "logs.*")
    assert icelog("--catalog", "drcat", "acls", "list")["acls"] == [
        {"principal": "bot", "operation": "replicator-write", "table": "logs.*"}
    ]
    done = icelog("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot")
    assert done["ranges"] == {"0": [0, 2], "1": [0, 1]} and done["log_ends"] == {"0": 2, "1": 1}
    icelog.env["ICELOG_PRINCIPAL"] = "bot"
    assert icelog("mirror", "orders", "--target-catalog", "drcat")["up_to_date"] is True
    assert icelog("--catalog", "drcat", "validate", "orders", "--check", "mirror-parity")["ok"] is True
    refused = icelog("--catalog", "drcat", "produce", "orders", "--partition", "0", input='{"key": "x"}\n', code=2)
    assert refused["error"] == "ReadOnlyTable"
    assert icelog("--catalog", "drcat", "mirror", "promote", "orders")["promoted"] is True
    icelog("--catalog", "drcat", "produce", "orders", "--partition", "0", input='{"key": "x"}\n')
    assert LogTable.open(target_spec.open(), "orders").watermarks()[0].end == 3
    assert icelog("mirror", "orders", "--target-catalog", "drcat", code=2)["error"] == "MirrorPromoted"
    icelog("--catalog", "drcat", "acls", "remove", "--principal", "bot", "--table", "logs.*")
    assert icelog("--catalog", "drcat", "acls", "list") == {"acls": []}


def test_i6_read_only_mirror_refuses_the_cli_writes_and_the_next_step_stays_in_parity(icelog, sqlite_spec, target_spec):
    source = LogTable.create(sqlite_spec.open(), "orders", 2)
    source.append({0: [{"key": "a"}, {"key": "b"}], 1: [{"key": "c"}]})
    icelog("--catalog", "drcat", "acls", "add", "--principal", "bot", "--table", "logs.*")
    icelog.env["ICELOG_PRINCIPAL"] = "bot"
    icelog("mirror", "orders", "--target-catalog", "drcat")
    before = icelog("--catalog", "drcat", "topics", "describe", "orders")
    for write in (
        ("producers", "init", "orders", "--client-id", "dr-app"),
        ("topics", "add-partitions", "orders", "--count", "4"),
        ("maintain", "orders", "--retention-bytes", "1"),
        ("producers", "rebuild", "orders"),
    ):
        assert icelog("--catalog", "drcat", *write, code=2)["error"] == "ReadOnlyTable", write
    assert icelog("--catalog", "drcat", "topics", "describe", "orders") == before
    source.append({0: [{"key": "d"}]})
    assert icelog("mirror", "orders", "--target-catalog", "drcat")["ranges"] == {"0": [2, 3]}
    assert icelog("--catalog", "drcat", "validate", "orders", "--check", "mirror-parity")["ok"] is True


def test_i6_mirror_cli_text_output_and_usage(icelog, sqlite_spec):
    LogTable.create(sqlite_spec.open(), "orders", 1).append({0: [{"key": "a"}]})
    icelog("--catalog", "drcat", "acls", "add", "--principal", "bot", "--table", "logs.orders")
    result = icelog.raw("mirror", "orders", "--target-catalog", "drcat", "--principal", "bot", json_output=False)
    assert result.exit_code == 0 and "p0: [0, 1)" in result.stdout
    assert icelog.raw("mirror", "--help", json_output=False).exit_code == 0
    assert icelog("mirror", "orders", code=2)["error"]  # --target-catalog is required


def test_i6_mirror_task_of_the_dag(sqlite_spec, target_spec, monkeypatch):
    from icelog.pipelines.mirror import mirror_table
    from icelog.storage.errors import InvalidInput
    from icelog.storage.replication.acls import add_acl

    for key, value in {**sqlite_spec.env(), **target_spec.env()}.items():
        if key.startswith(("PYICEBERG_CATALOG__", "ICELOG_CATALOG")):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("ICELOG_CATALOG", sqlite_spec.name)
    monkeypatch.setenv("ICELOG_PRINCIPAL", "dag")
    LogTable.create(sqlite_spec.open(), "orders", 1).append({0: [{"key": "a"}]})
    add_acl(target_spec.open(), "dag", "logs.orders")
    with pytest.raises(InvalidInput):
        mirror_table("orders")
    monkeypatch.setenv("ICELOG_MIRROR_CATALOG", "drcat")
    assert mirror_table("orders")["log_ends"] == {0: 1}
    assert mirror_table("orders")["up_to_date"] is True


def test_i6_spark_bulk_mirror_copies_on_executors_and_keeps_parity(spark, sqlite_spec, target_spec):
    from icelog.pipelines.mirror import mirror_bulk
    from icelog.storage.replication.acls import add_acl

    source, target = sqlite_spec.open(), target_spec.open()
    add_acl(target, "bulk", "*")
    src = LogTable.create(source, "orders", 3)
    for i in range(4):
        src.append({p: [{"key": f"k{i}{p}", "value": str(i)}] * (p + 1) for p in range(3)})
    result = mirror_bulk(spark, source, "orders", target, principal="bulk")
    assert result.copied_files == 12 and result.ranges == {0: (0, 4), 1: (0, 8), 2: (0, 12)}
    assert_parity(source, target)

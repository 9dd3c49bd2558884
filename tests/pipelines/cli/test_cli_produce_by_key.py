"""``icelog produce`` as kafka-console-producer: routed by key without ``--partition``, and
``key<SEP>value`` lines with ``--key-separator``."""

from __future__ import annotations

import json

import pytest

from icelog.storage.log.keys import partition_for_key
from tests.support.cli import Cli


@pytest.fixture
def events(icelog: Cli) -> Cli:
    icelog("topics", "create", "db.events", "--partitions", "3")
    return icelog


def _rows(icelog: Cli) -> list[list]:
    return icelog("sql", "select log_partition, log_offset, key, value from db.events order by 1, 2")["rows"]


def test_produce_without_partition_routes_each_record_to_its_keys_partition(events):
    keys = [f"k{i % 7}" for i in range(40)]
    lines = "".join(json.dumps({"key": k, "value": str(i)}) + "\n" for i, k in enumerate(keys))
    doc = events("produce", "db.events", "--batch-size", "15", input=lines)
    assert doc["rows"] == 40 and doc["batches"] == 3 and doc["key_column"] == "key"
    rows = _rows(events)
    assert all(p == partition_for_key(k, 3) for p, _, k, _ in rows)
    for p, (first, nxt) in doc["partitions"].items():
        mine = [r for r in rows if r[0] == int(p)]
        assert [r[1] for r in mine] == list(range(first, nxt))  # contiguous from the log start
        assert [int(r[3]) for r in mine] == sorted(int(r[3]) for r in mine)  # input order kept per key
    assert events.state()[3] == 40


def test_key_separator_reads_key_and_value_text(events):
    doc = events("produce", "db.events", "--key-separator", "\\t", input="a\tx\tstill the value\nb\t\n\nc\t3\n")
    assert doc["rows"] == 3
    assert sorted((k, v) for _, _, k, v in _rows(events)) == [("a", "x\tstill the value"), ("b", ""), ("c", "3")]
    one = events("produce", "db.events", "--partition", "1", "--key-separator", ":", input="d:4\n")
    assert one["partition"] == 1 and [1, one["base_offset"], "d", "4"] in _rows(events)


def test_i8_a_line_without_the_separator_is_malformed_and_writes_nothing(events):
    before = events.state()
    doc = events("produce", "db.events", "--key-separator", ",", input="a,1\nno separator\n", code=2)
    assert doc["error"] == "MalformedInput" and doc["line"] == 2
    assert events.state() == before


@pytest.mark.parametrize(
    "args", [["--expected-offset", "0"], ["--producer-id", "1", "--epoch", "0", "--sequence", "0"], ["--key-separator", ""]]
)
def test_i8_per_partition_options_without_partition_exit_2(events, args):
    before = events.state()
    doc = events("produce", "db.events", *args, input='{"key": "a", "value": "b"}\n', code=2)
    assert doc["error"] == "InvalidInput"
    assert events.state() == before


def test_i8_a_table_without_key_column_needs_a_partition(icelog, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps([{"name": "amount", "type": "long"}]))
    icelog("topics", "create", "db.amounts", "--partitions", "2", "--schema", str(schema))
    doc = icelog("produce", "db.amounts", input='{"amount": 1}\n', code=2)
    assert doc["error"] == "InvalidInput" and "partition" in doc["message"]

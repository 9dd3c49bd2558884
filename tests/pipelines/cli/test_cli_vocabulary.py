"""One vocabulary in the CLI's text output: offset ranges half-open, [start, end), as Kafka's
log start and end offsets; counts pluralized; an empty table says so; --help says the notation."""

from __future__ import annotations

import json

from icelog.storage.log.table import LogTable


def text(icelog, *args: str, input: str | None = None, code: int = 0) -> str:
    result = icelog.raw(*args, input=input, json_output=False)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return result.stdout + result.stderr


def rows(n: int) -> str:
    return "".join(json.dumps({"key": f"k{i}"}) + "\n" for i in range(n))


def test_offset_ranges_are_half_open_everywhere(icelog, sqlite_spec):
    icelog("topics", "create", "db.events", "--partitions", "1")
    # 164 rows are offsets [0, 164), not "0..163"; one batch is "1 batch".
    assert "db.events[0] offsets [0, 164) (164 rows in 1 batch)" in text(
        icelog, "produce", "db.events", "--partition", "0", input=rows(164)
    )
    assert "offsets [164, 165) (1 row in 1 batch)" in text(icelog, "produce", "db.events", "--partition", "0", input=rows(1))
    # A start offset past the end names the log in the same notation.
    out = icelog("consume", "db.events", "--partition", "0", "--offset", "999", code=2)
    assert out["error"] == "InvalidOffset" and "the log holds [0, 165)" in out["message"], out
    text(icelog, "consume", "db.events", "--group", "g", "--max-records", "3")
    described = text(icelog, "groups", "describe", "--group", "g")
    assert "[0, 165)" in described and ".." not in described, described


def test_routed_produce_says_ranges_and_plurals(icelog, sqlite_spec):
    icelog("topics", "create", "db.keyed", "--partitions", "2")
    out = text(icelog, "produce", "db.keyed", input=rows(4))
    assert "(4 rows in 1 batch)" in out and "[0, " in out and ".." not in out, out


def test_topics_describe_of_an_empty_table_and_topics_help(icelog, sqlite_spec):
    LogTable.create(sqlite_spec.open(), "db.empty", 1)
    out = text(icelog, "topics", "describe", "db.empty")
    assert "snapshot=None" not in out and "snapshot=none (nothing committed yet)" in out, out
    helped = text(icelog, "topics", "--help")
    assert "alter" in helped.split("Commands:")[0] and "delete" in helped.split("Commands:")[0]  # the summary says them too
    assert "[start, end)" in helped
    assert "half-open" in text(icelog, "--help")


def test_topics_list_system_includes_the_ingest_ledger(icelog, sqlite_spec):
    from icelog.storage.ingest.ledger import LEDGER_TABLE, ensure_ledger

    catalog = sqlite_spec.open()
    LogTable.create(catalog, "db.a", 1)
    ensure_ledger(catalog)
    assert icelog("topics", "list") == {"tables": ["db.a"]}
    assert LEDGER_TABLE in icelog("topics", "list", "--system")["tables"]

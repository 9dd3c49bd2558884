"""The bench table and its section of BENCHMARKS.md, on synthetic figures (no benchmark runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.report import (
    BEGIN,
    END,
    PREVIOUS_BEGIN,
    PREVIOUS_END,
    Figure,
    Target,
    figure,
    render_section,
    render_table,
    replace_section,
)

RUN = {
    "command": "python -m tests.bench.run",
    "date": "2026-11-23 00:00 UTC",
    "commit": "abc1234",
    "cpus": 2,
    "load_start": (1.0, 1.5, 2.0),
    "load_end": (3.0, 2.5, 2.0),
    "versions": "Python 3.11",
    "benches": ["latency", "spark"],
}


def row(table: str, name: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_missed_target_prints_as_missed_and_a_met_one_as_met():
    table = render_table(
        [
            Figure("spark ingest", 1.8, "Mrows/s", "plain write", 4.5, Target("ratio", ">=", 0.8)),
            Figure("append p50", 22.0, "ms", "plain append", 21.4, Target("value", "<=", 50)),
            Figure("check", 1000.0, "ms", target=Target("value", "<", 1000)),  # on the bound of a strict target
            Figure("gx first run", 5.9, "s", "second run", 0.9),
        ]
    )
    assert row(table, "spark ingest")[3:] == ["0.40", "ratio ≥ 0.8", "**missed**"]
    assert row(table, "append p50")[4:] == ["≤ 50 ms", "met"]
    assert row(table, "check")[-1] == "**missed**"
    assert row(table, "gx first run")[-2:] == ["—", "—"]
    assert row(render_table([Figure("gx second run", 0.0045, "s")]), "gx second run")[1] == "0.0045 s"


def test_a_ratio_target_without_a_reference_is_not_checked_rather_than_met():
    fig = Figure("ledger lookup", 700.0, "ms", target=Target("ratio", "<=", 1.5))
    assert fig.ratio is None and fig.verdict == "not checked"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("target <= 1.5x", Target("ratio", "<=", 1.5)),
        ("target <= 1.5x (2 tables)", Target("ratio", "<=", 1.5, "(2 tables)")),
        ("target ratio <= 0.3", Target("ratio", "<=", 0.3)),
        ("<= 1.5", Target("value", "<=", 1.5)),
        ("target >= 50 Mrows/s", Target("value", ">=", 50)),
        ("target < 1,000 ms", Target("value", "<", 1000)),
        ("target overhead <= 10%", Target("ratio", "<=", 1.1, "overhead <= 10%")),
        ("≤ 1.5×", Target("ratio", "<=", 1.5)),
    ],
)
def test_a_stated_target_string_becomes_a_checked_bound(text, expected):
    parsed = Target.parse(text)
    assert parsed is not None and (parsed.on, parsed.op, parsed.note) == (expected.on, expected.op, expected.note)
    assert parsed.bound == pytest.approx(expected.bound)


def test_record_style_string_targets_are_checked_and_unboundable_text_is_reported_not_checked():
    # The call other benches make: record(name, value, unit, reference, ref_value, target_string).
    assert figure("p50 @ 10,000 partitions", 40.0, "ms", "10 partitions", 20.0, "target <= 1.5x").verdict == "missed"
    assert figure("p50 @ 10,000 partitions", 25.0, "ms", "10 partitions", 20.0, "target <= 1.5x").verdict == "met"
    vague = figure("producer state", 180.0, "KiB", "after expiry", 0.1, "O(active producers)")
    assert vague.verdict == "not checked" and "O(active producers)" in render_table([vague])


def test_target_rejects_an_unknown_side_or_operator():
    with pytest.raises(ValueError):
        Target("speed", "<=", 1)
    with pytest.raises(ValueError):
        Target("ratio", "=<", 1)


def test_the_section_between_the_markers_is_replaced_and_the_rest_kept():
    doc = f"# Benchmarks\nintro\n\n{BEGIN}\nold table\n{END}\n\n## Storage\nanalysis\n"
    once = replace_section(doc, render_section([Figure("append p50", 60.0, "ms", target=Target("value", "<=", 50))], RUN))
    assert once.startswith("# Benchmarks\nintro\n\n" + BEGIN) and once.endswith(f"{PREVIOUS_END}\n\n## Storage\nanalysis\n")
    new, previous = once.split(END)
    assert "old table" not in new and "| append p50 | 60.0 ms |" in new and "**missed**" in new
    assert previous.count("old table") == 1  # the run before, kept beside it
    assert "`python -m tests.bench.run`" in once and "commit `abc1234`" in once and "2 CPUs" in once
    assert "1.00 / 1.50 / 2.00 at the start, 3.00 / 2.50 / 2.00 at the end" in once
    twice = replace_section(once, render_section([Figure("append p50", 20.0, "ms", target=Target("value", "<=", 50))], RUN))
    assert twice.count(BEGIN) == 1 and twice.count(END) == 1 and "| met |" in twice.split(END)[0]
    new, previous = twice.split(END)
    assert "60.0 ms" not in new and "60.0 ms" in previous and "old table" not in twice  # one run back, no more
    assert twice.count(PREVIOUS_BEGIN) == 1 and twice.endswith(f"{PREVIOUS_END}\n\n## Storage\nanalysis\n")


@pytest.mark.parametrize(
    "broken",
    [
        "no markers at all\n",
        f"{BEGIN}\nonly the start\n",
        f"{END}\nend before start\n{BEGIN}\n",
        f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n",
    ],
)
def test_missing_repeated_or_reversed_markers_refuse_to_write(broken):
    with pytest.raises(ValueError):
        replace_section(broken, "table")


def test_benchmarks_md_has_one_generated_section():
    text = (Path(__file__).resolve().parents[2] / "BENCHMARKS.md").read_text()
    assert replace_section(text, "x").count(BEGIN) == 1

"""The bench report: figures with machine-checked targets, one table, and its section of BENCHMARKS.md.

Pure (no storage imports), so the table and the marker handling are unit-tested on synthetic figures
(``tests/bench/test_report.py``) without running a benchmark.
"""

from __future__ import annotations

import operator
import re
from dataclasses import asdict, dataclass
from typing import Any

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
PREVIOUS_BEGIN = "<!-- bench:previous:begin -->"
PREVIOUS_END = "<!-- bench:previous:end -->"

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_SHOWN = {"<": "<", "<=": "≤", ">": ">", ">=": "≥"}


@dataclass(frozen=True)
class Target:
    """A bound that a figure meets or misses: on its value (in its unit) or on its ratio to the reference.

    Args:
        on: ``"value"`` or ``"ratio"`` (value / reference value).
        op: one of ``<``, ``<=``, ``>``, ``>=``.
        bound: the number compared against.
        note: how the target was stated, when that differs from the bound (``"overhead ≤ 10%"``).
    """

    on: str
    op: str
    bound: float
    note: str = ""

    def __post_init__(self) -> None:
        if self.on not in ("value", "ratio"):
            raise ValueError(f"Target.on must be 'value' or 'ratio', not {self.on!r}")
        if self.op not in _OPS:
            raise ValueError(f"Target.op must be one of {sorted(_OPS)}, not {self.op!r}")

    def met(self, value: float, ratio: float | None) -> bool | None:
        """Whether the figure meets the bound; None when the ratio it needs was not measured."""
        measured = value if self.on == "value" else ratio
        return None if measured is None else bool(_OPS[self.op](measured, self.bound))

    def describe(self, unit: str) -> str:
        bound = f"{_SHOWN[self.op]} {self.bound:,g}"
        text = f"ratio {bound}" if self.on == "ratio" else f"{bound} {unit}"
        return f"{text} ({self.note})" if self.note else text

    @classmethod
    def parse(cls, text: str) -> Target | None:
        """A target from the way figures used to state them: ``"target <= 50 ms"``, ``"target >= 0.7x"``,
        ``"target ratio <= 0.3"``, ``"target overhead <= 10%"``; None when the text states no bound."""
        match = re.fullmatch(
            r"\s*(?:target:?\s*)?(ratio|overhead)?\s*(<=|>=|<|>|≤|≥)\s*([\d,]*\.?\d+)\s*(x|×|%)?\s*(.*?)\s*", text, re.IGNORECASE
        )
        if match is None:
            return None
        what, op, number, suffix, rest = match.groups()
        op = {"≤": "<=", "≥": ">="}.get(op, op)
        bound = float(number.replace(",", ""))
        if suffix == "%":  # an overhead: icelog / reference <= 1 + n %
            return cls("ratio", op, 1 + bound / 100, text.strip().removeprefix("target").strip())
        on = "ratio" if what or suffix else "value"
        note = rest if on == "ratio" else ""  # a value target's rest is its unit
        return cls(on, op, bound, note)


@dataclass(frozen=True)
class Figure:
    """One benchmark figure, with the reference measured in the same run and its target."""

    name: str
    value: float
    unit: str
    reference: str = ""
    reference_value: float | None = None
    target: Target | None = None
    target_text: str = ""  # a stated target that names no checkable bound ("O(active producers)")

    @property
    def ratio(self) -> float | None:
        return self.value / self.reference_value if self.reference_value else None

    @property
    def verdict(self) -> str:
        """``met``, ``missed``, ``not checked`` (a target without a bound, or its ratio unmeasured) or ``—``."""
        if self.target is None:
            return "not checked" if self.target_text else "—"
        met = self.target.met(self.value, self.ratio)
        return "not checked" if met is None else "met" if met else "missed"

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio, "verdict": self.verdict}


def figure(
    name: str, value: float, unit: str, reference: str = "", ref_value: float | None = None, target: Target | str | None = None
) -> Figure:
    """A :class:`Figure` from ``record``'s arguments: ``target`` may be a :class:`Target` or a stated string."""
    if isinstance(target, str):
        parsed = Target.parse(target)
        return Figure(name, value, unit, reference, ref_value, parsed, "" if parsed else target.strip())
    return Figure(name, value, unit, reference, ref_value, target)


def _number(x: float) -> str:
    """Three significant digits or so, never a small figure rounded to zero (a warm GX run: 0.0045 s)."""
    size = abs(x)
    return f"{x:,.0f}" if size >= 100 else f"{x:.1f}" if size >= 10 else f"{x:.2f}" if size >= 0.1 or x == 0 else f"{x:.2g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(figures: list[Figure]) -> str:
    """One Markdown table: figure, value, reference (same run), ratio, target, met / missed."""
    lines = ["| figure | value | reference (same run) | ratio | target | met |", "|---|---|---|---|---|---|"]
    for f in figures:
        reference = f"{f.reference}: {_number(f.reference_value)} {f.unit}" if f.reference_value is not None else f.reference
        target = f.target.describe(f.unit) if f.target else f.target_text or "—"
        verdict = "**missed**" if f.verdict == "missed" else f.verdict
        ratio = _number(f.ratio) if f.ratio is not None else ""
        lines.append(
            f"| {_cell(f.name)} | {_number(f.value)} {f.unit} | {_cell(reference)} | {ratio} | {_cell(target)} | {verdict} |"
        )
    return "\n".join(lines)


def render_section(figures: list[Figure], run: dict[str, Any]) -> str:
    """The generated section: how, where and when the figures were measured, then the table."""
    load = lambda key: " / ".join(f"{x:.2f}" for x in run[key])  # noqa: E731
    met = sum(f.verdict == "met" for f in figures)
    missed = sum(f.verdict == "missed" for f in figures)
    lines = [
        f"Generated by `{run['command']}` on {run['date']}, commit `{run['commit']}`.",
        f"Machine: {run['cpus']} CPUs; load average (1 / 5 / 15 min) {load('load_start')} at the start, {load('load_end')} at the end.",
        f"Versions: {run['versions']}.",
        f"Benches: {', '.join(run['benches'])}."
        + (f" Not available: {', '.join(run['unavailable'])}." if run.get("unavailable") else ""),
        f"Targets: {met} met, {missed} missed, of {sum(f.target is not None for f in figures)} checked.",
        "",
        render_table(figures),
    ]
    return "\n".join(lines)


def _between(markdown: str, begin: str, end: str, required: bool) -> tuple[str, str, str] | None:
    """(text before ``begin``, text between, text after ``end``), or None when neither is there."""
    if markdown.count(begin) == 0 and markdown.count(end) == 0 and not required:
        return None
    if markdown.count(begin) != 1 or markdown.count(end) != 1:
        raise ValueError(
            f"BENCHMARKS.md needs exactly one {begin} and one {end} (found {markdown.count(begin)} and {markdown.count(end)})"
        )
    head, rest = markdown.split(begin)
    if end not in rest:
        raise ValueError(f"{end} comes before {begin}")
    body, tail = rest.split(end)
    return head, body.strip(), tail


def replace_section(markdown: str, body: str) -> str:
    """``markdown`` with the text between :data:`BEGIN` and :data:`END` replaced by ``body``, and
    the table it replaced kept right after it, between :data:`PREVIOUS_BEGIN` and
    :data:`PREVIOUS_END` (the run before, for comparison; the one before that is dropped).

    Raises:
        ValueError: the markers are missing, repeated or out of order (nothing is written then).
    """
    head, old, tail = _between(markdown, BEGIN, END, required=True)  # type: ignore[misc]
    previous = _between(tail, PREVIOUS_BEGIN, PREVIOUS_END, required=False)
    if previous is not None:
        between, _, tail = previous
        if between.strip():
            raise ValueError(f"{PREVIOUS_BEGIN} must follow {END} directly")
    kept = f"\n\n{PREVIOUS_BEGIN}\n**The run before** (kept for comparison):\n\n{old}\n{PREVIOUS_END}" if old else ""
    return f"{head}{BEGIN}\n{body.strip()}\n{END}{kept}{tail}"

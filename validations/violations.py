"""The shape every icelog check returns: exact, structured violations."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Violation:
    """One broken invariant.

    Attributes:
        check: The check that found it (e.g. ``contiguity``, ``watermark``).
        table: Qualified table name.
        kind: What broke: ``gap``, ``duplicate``, ``watermark``, ``misplaced_row`` ...
        partition: The log partition, when the violation belongs to one.
        first: First offset concerned (inclusive), when offsets are concerned.
        last: Last offset concerned (inclusive).
        detail: A human-readable sentence, with the expected and the actual value.
    """

    check: str
    table: str
    kind: str
    detail: str
    partition: int | None = None
    first: int | None = None
    last: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


@dataclass
class CheckReport:
    table: str
    snapshot_id: int | None
    checks: list[str]
    violations: list[Violation]
    rows: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "ok": self.ok,
            "snapshot_id": self.snapshot_id,
            "checks": self.checks,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "violations": [v.to_dict() for v in self.violations],
        }

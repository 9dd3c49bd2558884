"""One verdict on a validation, in the same words on every surface.

A validation is the registered checks (contiguity, watermarks, producers, transactions) plus
the table's Great Expectations suite. Every check violation is an error. A failed expectation
is an error or a warning, as its suite says (``"severity": "error" | "warn"``, per expectation
or for the whole suite; default ``error``):

* **errors fail the gate**: the Airflow task fails, ``icelog report`` and ``icelog validate``
  exit 1, the report's badge says ``VIOLATIONS``, ``make demo`` fails, and the data-quality
  record does not advance (the rows are validated again until fixed);
* **warnings are findings**: the task succeeds and logs them at WARNING, the badge says
  ``WARNINGS``, the report lists them, and the record advances.

The Airflow task, the HTML report, the CLI and the demo all take their verdict from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, WARNINGS, VIOLATIONS = "OK", "WARNINGS", "VIOLATIONS"
#: A suite's words for how much a failed expectation matters.
SEVERITIES = ("error", "warn")


def severity_of(failure: dict[str, Any]) -> str:
    """``error`` or ``warn`` for one failed expectation (records written before severities: error)."""
    return "warn" if failure.get("severity") == "warn" else "error"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 row``, ``2 rows``; ``1 batch``, ``3 batches`` (``many`` defaults to ``one + 's'``)."""
    return f"{n} {one if n == 1 else many or one + ('es' if one.endswith(('ch', 'sh', 's', 'x')) else 's')}"


@dataclass(frozen=True)
class Verdict:
    """What one validation found: check violations, failed expectations by severity."""

    violations: int = 0
    errors: int = 0
    warnings: int = 0

    @classmethod
    def of(cls, checks: dict[str, Any] | None, quality: dict[str, Any] | None) -> Verdict:
        """From a checks report's and a quality result's dicts (``report.json``'s ``checks`` and ``quality``)."""
        failed = (quality or {}).get("failed") or []
        return cls(
            violations=len((checks or {}).get("violations") or []),
            errors=sum(severity_of(f) == "error" for f in failed),
            warnings=sum(severity_of(f) == "warn" for f in failed),
        )

    @property
    def ok(self) -> bool:
        """The gate: no check violation and no failed expectation of severity ``error``."""
        return not self.violations and not self.errors

    @property
    def status(self) -> str:
        return VIOLATIONS if not self.ok else WARNINGS if self.warnings else OK

    def findings(self) -> str:
        """``3 violations, 1 failed expectation, 2 warnings`` (empty when all passed)."""
        parts = []
        if self.violations:
            parts.append(plural(self.violations, "violation"))
        if self.errors:
            parts.append(plural(self.errors, "failed expectation"))
        if self.warnings:
            parts.append(plural(self.warnings, "warning"))
        return ", ".join(parts)

    def describe(self) -> str:
        """``VIOLATIONS: 1 failed expectation, 2 warnings``, or ``OK: every check and expectation passed``."""
        return f"{self.status}: {self.findings() or 'every check and expectation passed'}"

"""Run a competing action in the middle of a commit decision (deterministic races)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Interleaved:
    """Wraps a commit request; after its first decision, runs ``meanwhile`` (a competing commit).

    So the decision's compare-and-swap is bound to lose once, and the commit core must
    decide again on the new base. ``decisions`` records the offsets of every decision.
    Everything else (state type, receipts, ...) is the wrapped request's.
    """

    inner: Any
    meanwhile: Callable[[], None]
    decisions: list = field(default_factory=list)

    def decide(self, state, table):
        decision = self.inner.decide(state, table)
        self.decisions.append(dict(decision.ranges))
        if len(self.decisions) == 1:
            self.meanwhile()
        return decision

    def result_from_snapshot(self, snapshot):
        return self.inner.result_from_snapshot(snapshot)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "meanwhile", "decisions"):  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.inner, name)

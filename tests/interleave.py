"""Run a competing action in the middle of a commit decision (deterministic races)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Interleaved:
    """Wraps a commit request; after its first decision, runs ``meanwhile`` (a competing commit)."""

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

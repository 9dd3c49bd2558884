"""IC ranges (I10): the pure range-commit state agrees with a plain set of done offsets."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from icelog.storage.groups.ranges import RangeError, RangeState, amend, commit_range, pending, resume_at, to_ranges


def test_i10_seed_example_merge_adjacent_ranges():
    state = RangeState(stable=10, ranges=((45, 47), (50, 50)))
    assert commit_range(state, 48, 49) == RangeState(10, ((45, 50),))


def test_i10_seed_example_stable_advances_and_drops_ranges():
    assert commit_range(RangeState(42, ((45, 47),)), 43, 44) == RangeState(47, ())


def test_i10_seed_example_gap_amending():
    assert amend(RangeState(40, ((43, 45), (48, 49))), 40, 50) == [(41, 42), (46, 47), (50, 50)]


@pytest.mark.parametrize("first,last", [(5, 4), (-1, 3), (43, 43), (40, 41), (44, 50), (1.5, 2), (True, 3)])
def test_i8_bad_ranges_refused(first, last):
    with pytest.raises(RangeError):
        commit_range(RangeState(40, ((43, 45),)), first, last)


def test_resume_at_log_start_past_stable():
    assert resume_at(RangeState(5, ((9, 12), (20, 21))), 11) == RangeState(12, ((20, 21),))
    assert resume_at(RangeState(5, ()), 3) == RangeState(5, ())


class RangeMachine(RuleBasedStateMachine):
    """Random commits against a reference model: the set of done offsets."""

    def __init__(self):
        super().__init__()
        self.state = RangeState(-1, ())
        self.done: set[int] = set()

    @rule(first=st.integers(0, 60), length=st.integers(1, 6))
    def commit(self, first, length):
        last = first + length - 1
        overlaps = any(o in self.done for o in range(first, last + 1))
        if overlaps:
            before = self.state
            with pytest.raises(RangeError):
                commit_range(self.state, first, last)
            assert self.state == before
        else:
            self.state = commit_range(self.state, first, last)
            self.done |= set(range(first, last + 1))

    @rule(first=st.integers(0, 60), length=st.integers(1, 12))
    def amend_then_commit(self, first, length):
        last = first + length - 1
        gaps = pending(self.state, first, last)
        assert [o for lo, hi in gaps for o in range(lo, hi + 1)] == [o for o in range(first, last + 1) if o not in self.done]
        for lo, hi in gaps:
            self.state = commit_range(self.state, lo, hi)
        self.done |= set(range(first, last + 1))

    @precondition(lambda self: self.done)
    @rule(start=st.integers(0, 70))
    def retention(self, start):
        self.state = resume_at(self.state, start)
        self.done |= set(range(start))

    @invariant()
    def agrees_with_model(self):
        stable = -1
        while stable + 1 in self.done:
            stable += 1
        assert self.state.stable == stable
        assert list(self.state.ranges) == to_ranges(o for o in self.done if o > stable)
        for lo, hi in self.state.ranges:
            assert lo >= stable + 2 and lo <= hi
        for a, b in zip(self.state.ranges, self.state.ranges[1:], strict=False):
            assert a[1] + 1 < b[0]
        assert pending(self.state, 0, 80) == to_ranges(o for o in range(81) if o not in self.done)


TestRangeMachine = RangeMachine.TestCase
TestRangeMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

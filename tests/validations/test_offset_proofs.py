"""The in-memory proofs of the deep check on object stores (``validations.contiguity._proven_rows``)
against an oracle: a file is proven exactly when its offsets are one contiguous range, each once,
all in its partition; any chunking of the column and any block size give the same answer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icelog.validations import contiguity
from icelog.validations.contiguity import _proven_rows


def _oracle(offsets: list[int], parts: list[int], partition: int):
    if not offsets or set(parts) != {partition}:
        return None
    lo, hi = min(offsets), max(offsets)
    if sorted(offsets) != list(range(lo, hi + 1)):
        return None
    return (lo, hi, len(offsets))


@st.composite
def files(draw):
    n = draw(st.integers(1, 60))
    base = draw(st.integers(0, 1 << 40))
    offsets = list(range(base, base + n))
    kind = draw(st.sampled_from(["in order", "shuffled", "gap", "duplicate", "swap", "foreign partition"]))
    if kind == "shuffled":
        offsets = draw(st.permutations(offsets))
    elif kind == "gap":
        offsets[draw(st.integers(0, n - 1))] += n + draw(st.integers(0, 3))
    elif kind == "duplicate" and n > 1:
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        offsets[i] = offsets[j]
    elif kind == "swap" and n > 1:
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        offsets[i], offsets[j] = offsets[j], offsets[i]
    parts = [3] * n
    if kind == "foreign partition":
        parts[draw(st.integers(0, n - 1))] = 4
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=4))))
    return offsets, parts, cuts


@pytest.mark.parametrize("block", [1, 3, 8, contiguity.PROOF_BLOCK])
@settings(max_examples=150, deadline=None)
@given(file=files())
def test_the_proof_agrees_with_the_oracle_for_any_chunks_and_block_size(file, block):
    offsets, parts, cuts = file
    bounds = [0, *cuts, len(offsets)]
    chunked = pa.chunked_array([pa.array(offsets[a:b], pa.int64()) for a, b in zip(bounds, bounds[1:], strict=False)], pa.int64())
    table = pa.table({"log_partition": pa.array(parts, pa.int32()), "log_offset": chunked})
    saved = contiguity.PROOF_BLOCK, contiguity._ROW_NUMBERS
    contiguity.PROOF_BLOCK, contiguity._ROW_NUMBERS = block, np.arange(block, dtype=np.int64)
    try:
        span = _proven_rows("f", 3, table)
    finally:
        contiguity.PROOF_BLOCK, contiguity._ROW_NUMBERS = saved
    expected = _oracle(offsets, parts, 3)
    assert (None if span is None else (span.first, span.last, span.rows)) == expected


def test_a_foreign_offset_column_that_is_not_int64_is_cast_or_diagnosed():
    parts = pa.array([0, 0, 0], pa.int32())
    as_int32 = pa.table({"log_partition": parts, "log_offset": pa.array([5, 6, 7], pa.int32())})
    as_fraction = pa.table({"log_partition": parts, "log_offset": pa.array([5.0, 6.5, 7.0])})
    as_text = pa.table({"log_partition": parts, "log_offset": pa.array(["5", "6", "7"])})
    assert _proven_rows("f", 0, as_int32) is not None
    assert _proven_rows("f", 0, as_fraction) is None
    assert _proven_rows("f", 0, as_text) is None  # left to the exact diagnosis, no crash


@pytest.mark.parametrize("rows", [5, contiguity.PROOF_BLOCK + 5])
def test_offsets_that_wrap_past_2_63_in_the_last_block_are_not_proven(rows):
    """int64 offsets 2^63 - 3, 2^63 - 2, 2^63 - 1, then -2^63, ...: offset minus row number
    stays constant across the wrap, so the proof must not take them for a range past 2^63."""
    offsets = np.arange(rows, dtype=np.int64) + np.int64(2**63 - 1 - (rows - 3))  # wraps 2 rows before the end
    assert offsets[-1] < 0 < offsets[-3]
    table = pa.table({"log_partition": pa.array([0] * rows, pa.int32()), "log_offset": pa.array(offsets)})
    assert _proven_rows("f", 0, table) is None

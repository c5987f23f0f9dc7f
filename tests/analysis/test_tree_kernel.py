"""The compiled tree kernel (``_tree_kernels.resolve_requests``, what `_trees.resolve_trees`
runs from ``KERNEL_ROWS`` spans on) against the block path it replaces, on generated
requests: repeated ids (left to the blocks), spans without ids, self-parents, cycles,
orphans, two traces a request, ties between earliest spans, spans outside their root."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ttft.analysis._trees as trees
from ttft.analysis import _column_arrays
from ttft.analysis._trees import CODE, Spans

STAGES = np.asarray([CODE[s] for s in ("client", "server", "tokenize", "queue", "sample",
                                       "prefill", "gpu", "network")], np.int8)


def _spans(seed: int, n_req: int, widest: int, id_values: int, times: int,
           shuffled: bool) -> tuple:
    """Requests of 0 to ``widest`` spans, ids drawn from ``id_values`` values (few: ids
    repeat), start and end from ``times`` values (few: earliest spans tie), laid out in
    request order or (``shuffled``) in a random order of requests."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, widest + 1, n_req)
    counts[rng.random(n_req) < 0.1] = widest  # a few of the widest
    order = rng.permutation(n_req) if shuffled else np.arange(n_req)
    offsets = np.empty(n_req, np.int64)
    offsets[order] = np.concatenate([[0], np.cumsum(counts[order])[:-1]])
    n = int(counts.sum())
    req = np.empty(n, np.int64)
    for r in range(n_req):
        req[offsets[r]:offsets[r] + counts[r]] = r
    hi = rng.integers(0, id_values, n).astype(np.uint64)
    lo = rng.integers(0, id_values, n).astype(np.uint64)
    has = rng.random(n) > 0.1
    trace = (req * 2 + rng.integers(0, 2, n)).astype(np.int64)  # two traces a request
    # Parents: mostly another span of the request (in its trace or the other one), else
    # an id no span has, or the span's own id.
    pick = offsets[req] + (rng.random(n) * np.maximum(counts[req], 1)).astype(np.int64)
    pick = np.minimum(pick, n - 1)
    phi, plo, ptr = hi[pick].copy(), lo[pick].copy(), trace[pick].copy()
    stray = rng.random(n) < 0.1
    phi[stray] = np.uint64(2**63) + rng.integers(0, 2**40, int(stray.sum())).astype(np.uint64)
    own = rng.random(n) < 0.05
    phi[own], plo[own], ptr[own] = hi[own], lo[own], trace[own]
    has_parent = rng.random(n) < 0.9
    start = rng.integers(0, times, n).astype(np.int64) * 1000
    end = start + rng.integers(0, times, n).astype(np.int64) * 1000
    spans = Spans(req=req, start_ns=start, end_ns=end,
                  stage=STAGES[rng.integers(0, len(STAGES), n)],
                  client=rng.random(n) < 0.5, sid_hi=hi, sid_lo=lo,
                  parent=np.full(n, -1, np.int32), depth=np.zeros(n, np.int16),
                  keep=np.ones(n, bool), counts=counts, offsets=offsets, trace=trace,
                  trace_values=[f"{t:032x}" for t in rng.permutation(2 * n_req)])
    return spans, has, (phi, plo, ptr), has_parent, n_req


def _resolved(kernel_rows: int, spans: Spans, *args) -> tuple:
    spans = Spans(**{**vars(spans), "parent": spans.parent.copy(),
                     "depth": spans.depth.copy(), "keep": spans.keep.copy()})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_column_arrays, "KERNEL_ROWS", kernel_rows)
        patch.setattr(_column_arrays, "LOADED_KERNEL_ROWS", kernel_rows)
        out = trees.resolve_trees(spans, *args[:3], args[3], spans.trace, spans.trace_values)
    return spans, out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**9), n_req=st.integers(1, 40), widest=st.integers(1, 30),
       id_values=st.sampled_from([2, 5, 2**62]), times=st.sampled_from([2, 4, 1000]),
       shuffled=st.booleans())
def test_the_compiled_trees_equal_the_blocks(seed, n_req, widest, id_values, times,
                                             shuffled):
    spans, has, psid, has_parent, n_req = _spans(seed, n_req, widest, id_values, times,
                                                 shuffled)
    args = (has, psid, has_parent, n_req)
    blocks, by_blocks = _resolved(10**18, spans, *args)
    compiled, by_kernel = _resolved(1, spans, *args)
    for name in ("parent", "depth", "keep"):
        np.testing.assert_array_equal(getattr(compiled, name), getattr(blocks, name),
                                      err_msg=name)
    assert by_kernel.keys() == by_blocks.keys()
    for name, values in by_blocks.items():
        np.testing.assert_array_equal(by_kernel[name], values, err_msg=name)


def test_the_kernel_leaves_repeated_ids_and_trace_ties_to_the_blocks():
    """What the kernel leaves: a request repeating a (trace, id) (which copy is kept is
    the sorting path's), one whose two earliest client spans differ only in trace (ranked
    by trace id); and what it keeps: a request of unique ids, its parents and depths."""
    from ttft.analysis._tree_kernels import resolve_requests

    # Request 0: ids 1, 2, 3, a chain 3 → 2 → 1. Request 1: id 5 twice in trace 2.
    # Request 2: two client spans alike but for their traces (4 and 5).
    counts = np.asarray([3, 2, 2])
    offsets = np.asarray([0, 3, 5])
    hi = np.zeros(7, np.uint64)
    lo = np.asarray([1, 2, 3, 5, 5, 7, 7], np.uint64)
    trace = np.asarray([0, 0, 0, 2, 2, 4, 5])
    has = np.ones(7, bool)
    phi = np.zeros(7, np.uint64)
    plo = np.asarray([0, 1, 2, 0, 0, 0, 0], np.uint64)
    has_parent = np.asarray([False, True, True, False, False, False, False])
    stage = np.full(7, CODE["client"], np.int8)
    start = np.asarray([0, 10, 20, 0, 0, 5, 5])
    end = start + 100
    parent, depth = np.full(7, -1, np.int32), np.zeros(7, np.int16)
    roots = np.full((2, 3), -1, np.int64)
    ends = np.full((7, 3), trees.NONE_NS, np.int64)
    tallies = np.zeros((2, 3), np.int64)
    left = np.zeros(3, bool)
    codes = np.asarray([CODE[s] for s in ("client", "server", "sample", "tokenize", "queue")])
    resolve_requests(counts, offsets, hi, lo, has, phi, plo, trace, has_parent, trace, stage,
                     np.ones(7, bool), start, end, np.ones(trees.N_STAGES + 1, bool), codes,
                     parent, depth, roots, ends, tallies, left)
    assert left.tolist() == [False, True, True]
    assert parent[:3].tolist() == [-1, 0, 1]
    assert depth[:3].tolist() == [0, 1, 2]
    assert roots[0, 0] == 0 and ends[0, 0] == 0 and ends[1, 0] == 100
    assert tallies[:, 0].tolist() == [0, 0]



def _earliest_starts(start: np.ndarray) -> tuple[int, int]:
    """The kernel's earliest tokenize and queue starts of one request of two tokenize
    spans then two queue spans starting at ``start``."""
    from ttft.analysis._tree_kernels import resolve_requests

    n = len(start)
    stage = np.asarray([CODE["tokenize"]] * 2 + [CODE["queue"]] * 2, np.int8)
    words, none, codes = np.arange(n, dtype=np.uint64), np.zeros(n, np.uint64), np.zeros(n,
                                                                                      np.int32)
    ends = np.full((7, 1), trees.NONE_NS, np.int64)
    order = ("client", "server", "sample", "tokenize", "queue")
    resolve_requests(np.asarray([n]), np.asarray([0]), words, none, np.ones(n, bool), none,
                     none, codes, np.zeros(n, bool), codes, stage, np.ones(n, bool), start,
                     start + 10, np.ones(trees.N_STAGES + 1, bool),
                     np.asarray([CODE[s] for s in order]), np.full(n, -1, np.int32),
                     np.zeros(n, np.int16), np.full((2, 1), -1, np.int64), ends,
                     np.zeros((2, 1), np.int64), np.zeros(1, bool))
    return int(ends[4, 0]), int(ends[5, 0])


def test_an_earliest_start_of_the_int64_minimum_is_kept():
    """The kernel's earliest tokenize and queue starts are true minima: a start equal to
    ``NONE_NS`` (what marks "none" in the outputs) is not taken for "none yet"."""
    low = int(trees.NONE_NS)
    assert _earliest_starts(np.asarray([low, 5, low, 7])) == (low, low)
    assert _earliest_starts(np.asarray([9, 3, 8, 2])) == (3, 2)



def test_trace_codes_of_another_width_give_the_same_trees():
    """int64 trace codes (the kernel reads int32) give the blocks' answer; codes beyond
    int32's range (more traces than any table holds) leave every request to the blocks
    rather than wrap."""
    spans, has, (phi, plo, ptr), has_parent, n_req = _spans(7, 20, 12, 5, 4, False)
    spans.trace = spans.trace.astype(np.int64)
    args = (has, (phi, plo, ptr.astype(np.int64)), has_parent, n_req)
    blocks, by_blocks = _resolved(10**18, spans, *args)
    compiled, by_kernel = _resolved(1, spans, *args)
    np.testing.assert_array_equal(compiled.parent, blocks.parent)
    for name, values in by_blocks.items():
        np.testing.assert_array_equal(by_kernel[name], values, err_msg=name)
    wide = spans.trace + 2**33
    left = trees._compiled(spans, has, (phi, plo, wide), has_parent, wide,
                           np.ones(trees.N_STAGES + 1, bool), {})
    assert left.all() and len(left) == n_req

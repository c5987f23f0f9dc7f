"""The critical-path policy on one block of requests (private to ``analysis``)."""

from __future__ import annotations

import numpy as np

from ttft.analysis import _request_blocks
from ttft.analysis._request_blocks import MAX_BITS, take_rows
from ttft.analysis._trees import CODE


def critical_path(block) -> np.ndarray:
    """Per request of a ``(requests, K)`` block of ``attribution._Block``: the parts
    of Jaeger's walk from the window's end, children clipped to their parents
    (docs/attribution.md, "Policies"; ties: `_Block.ties`)."""
    k, virtual = block.k, block.k
    par = np.where(block.parent < 0, virtual, block.parent)
    par = np.where(block.is_root, virtual, par)
    lo, hi = block.lo.copy(), block.hi.copy()
    ext_lo = np.concatenate([lo, block.a], axis=1)
    ext_hi = np.concatenate([hi, block.b], axis=1)
    for _ in range(k):
        new_lo = np.maximum(block.lo, np.take_along_axis(ext_lo, par, axis=1))
        new_hi = np.minimum(block.hi, np.take_along_axis(ext_hi, par, axis=1))
        if np.array_equal(new_lo, ext_lo[:, :k]) and np.array_equal(new_hi, ext_hi[:, :k]):
            break
        ext_lo[:, :k], ext_hi[:, :k] = new_lo, new_hi
    lo, hi = ext_lo[:, :k], ext_hi[:, :k]
    live = block.inc & (hi > lo)
    # rank by (end, start, span_id): the walk takes the child that ends last.
    keys = (*block.sid[::-1], lo, hi)
    order = np.lexsort(keys, axis=-1)
    # Neighbours tied on every key share the span id's high word (random: rarely shared),
    # so the other keys are compared only in the rows where some neighbours share it.
    first = np.take_along_axis(keys[1], order, axis=1)
    maybe = np.flatnonzero((first[:, 1:] == first[:, :-1]).any(axis=1))
    same = np.ones((len(maybe), max(k - 1, 0)), bool)
    for key in keys:
        ranked = np.take_along_axis(key[maybe], order[maybe], axis=1)
        same &= ranked[:, 1:] == ranked[:, :-1]
    tied = maybe[same.any(axis=1)]
    if len(tied):  # one id in two traces: the stage, then the trace id decide
        stage, trace = block.ties(tied)
        order[tied] = np.lexsort((trace, stage, *(key[tied] for key in keys)), axis=-1)
    rank = np.argsort(order, axis=1)
    if k > MAX_BITS:  # wide: a walk per row, not (K, K) sibling matrices
        return _wide(block, par, live, lo, hi, rank)
    rank = np.where(live, rank, -1)
    sib = (par[:, :, None] == par[:, None, :]) & live[:, :, None] & live[:, None, :]
    sib &= ~np.eye(k, dtype=bool)[None]
    first = live & ~(sib & (rank[:, None, :] > rank[:, :, None])).any(axis=2)
    before = sib & (hi[:, None, :] <= lo[:, :, None])
    best = np.where(before, rank[:, None, :], -1).max(axis=2)
    nxt = np.where(best >= 0, np.where(before, rank[:, None, :], -1).argmax(axis=2), -1)
    chain = first.copy()
    for _ in range(k):
        r, c = np.nonzero(chain & (nxt >= 0))
        grown = np.zeros_like(chain)
        grown[r, nxt[r, c]] = True
        if not (grown & ~chain).any():
            break
        chain |= grown
    on = chain.copy()
    for _ in range(k):
        parent_on = np.where(
            par == virtual, True, take_rows(on, np.where(par == virtual, 0, par), False)
        )
        new = chain & parent_on
        if np.array_equal(new, on):
            break
        on = new
    length = np.where(on, hi - lo, 0)
    flat = (np.arange(block.n)[:, None] * (k + 1) + par).ravel()
    child = _request_blocks.row_sums(flat, length, block.n * (k + 1)).reshape(block.n, k + 1)
    own = np.where(on, length - child[:, :k], 0)
    att = block.sum_by_stage(block.out_stage, own)
    att[:, CODE["unattributed"]] += (block.b - block.a)[:, 0] - child[:, k]
    return att


def _wide(block, par, live, lo, hi, rank) -> np.ndarray:
    """`critical_path` of a wide block by the compiled walk (``_wide_kernels.critical_walk``)."""
    from ttft.analysis._wide_kernels import critical_walk  # numba: only wide requests

    # live columns first, grouped by parent, each group by ascending rank
    grouped = np.lexsort((rank, par, ~live), axis=-1)
    by_depth = np.argsort(block.depth, axis=1, kind="stable")
    own, root_children = critical_walk(par.astype(np.int64), live, lo, hi, grouped,
                                       by_depth)
    att = block.sum_by_stage(block.out_stage, own)
    att[:, CODE["unattributed"]] += (block.b - block.a)[:, 0] - root_children
    return att

"""The compiled tree kernel (numba) of `_trees.resolve_trees` (private to ``analysis``):
what the block path does for a request, one request at a time, exact (the block path is
its reference: ``tests/analysis/test_tree_kernel.py``), compiled once per machine
(``cache=True``). It calls ``_kernels._slot``, whose changes numba's cache does not see
here: edit this file too when that one changes, so both are compiled again."""

from __future__ import annotations

import numpy as np
from numba import njit

from ttft.analysis._kernels import _slot


@njit(cache=True, nogil=True)
def _earlier(j, best, start, end, hi, lo, trace) -> int:
    """1 where span ``j`` starts before span ``best`` (ties: the longer, then the smaller
    id words), 0 where not, 2 where only their traces' ids could tell (`_trees._earliest`
    ranks those by string; the request is left to it)."""
    if start[j] != start[best]:
        return 1 if start[j] < start[best] else 0
    if end[j] != end[best]:
        return 1 if end[j] > end[best] else 0
    if hi[j] != hi[best]:
        return 1 if hi[j] < hi[best] else 0
    if lo[j] != lo[best]:
        return 1 if lo[j] < lo[best] else 0
    return 0 if trace[j] == trace[best] else 2


@njit(cache=True, nogil=True)
def _ids_table(o, k, hi, lo, has, trace, table, width) -> bool:
    """The ``(trace, id)`` of request spans ``o .. o + k`` in ``table[:width]`` (open
    addressing, the span's index in each used slot); False where one repeats."""
    mask = np.uint64(width - 1)
    table[:width] = -1
    for j in range(o, o + k):
        if not has[j]:
            continue
        s = _slot(np.uint64(trace[j]), hi[j], lo[j], mask)
        while table[s] >= 0:
            at = table[s]
            if trace[at] == trace[j] and hi[at] == hi[j] and lo[at] == lo[j]:
                return False
            s = (s + 1) & (width - 1)
        table[s] = j
    return True


@njit(cache=True, nogil=True)
def _parents(o, k, hi, lo, trace, phi, plo, ptr, has_parent, table, width, parent) -> int:
    """Each span's parent column in its request (the other span whose ``(trace, id)`` is
    its ``(ptr, parent id)``; -1 none), by `_ids_table`; returns the orphans."""
    mask = np.uint64(width - 1)
    orphans = 0
    for j in range(o, o + k):
        p = -1
        if has_parent[j]:
            s = _slot(np.uint64(ptr[j]), phi[j], plo[j], mask)
            while table[s] >= 0:
                at = table[s]
                if trace[at] == ptr[j] and hi[at] == phi[j] and lo[at] == plo[j]:
                    if at != j:
                        p = at - o
                    break
                s = (s + 1) & (width - 1)
            if p < 0:
                orphans += 1
        parent[j] = p
    return orphans


@njit(cache=True, nogil=True)
def _walked_depths(o, k, parent, depth, state, walked, stack) -> None:
    """Each span's ancestors, walking up each chain once (``k`` for a span that reaches a
    cycle), at most the int16 range: `_trees._depths`' answer."""
    state[:k] = 0  # 0 not seen, 1 on the walk, 2 done
    for c in range(k):
        if state[c] == 2:
            continue
        top, x = 0, c
        while x >= 0 and state[x] == 0:
            state[x] = 1
            stack[top] = x
            top += 1
            x = parent[o + x]
        d = -1 if x < 0 else (k if state[x] == 1 else walked[x])
        while top > 0:
            top -= 1
            d = min(d + 1, k)
            walked[stack[top]] = d
            state[stack[top]] = 2
    for c in range(k):
        depth[o + c] = min(walked[c], 32767)


@njit(cache=True, nogil=True)
def _firsts(o, k, stage, start, end, hi, lo, trace, codes, first) -> bool:
    """The earliest client, server and sample span (`_earlier`) into ``first`` (-1 none);
    False where two differ only in trace."""
    first[:] = -1
    for j in range(o, o + k):
        for m in range(3):
            if stage[j] != codes[m]:
                continue
            if first[m] < 0:
                first[m] = j
                continue
            later = _earlier(j, first[m], start, end, hi, lo, trace)
            if later == 2:
                return False
            if later == 1:
                first[m] = j
    return True


@njit(cache=True, nogil=True)
def _outside(o, k, stage, client, start, end, request_level, first) -> int:
    """Request-level spans wholly outside their side's root span (``first``)."""
    outside = 0
    for j in range(o, o + k):
        root = first[0 if client[j] else 1]
        if root < 0 or j == root or not request_level[stage[j]]:
            continue
        if end[j] < start[root] or start[j] > end[root]:
            outside += 1
    return outside


@njit(cache=True, nogil=True)
def resolve_requests(counts, offsets, hi, lo, has, phi, plo, ptr, has_parent, trace, stage,
                     client, start, end, request_level, codes, parent, depth, roots, ends,
                     tallies, left) -> None:
    """`_trees.resolve_trees` one request at a time, for every request whose spans repeat
    no ``(trace, id)`` and whose earliest spans tie on no more than their trace: parents
    (`_parents`), depths (`_walked_depths`) and per request the roots, window ends and
    counts (``codes``: the client, server, sample, tokenize and queue stage codes;
    ``roots[:, r]``: client, server root column; ``ends[:, r]``: client start, end,
    server start, end, tokenize start, queue start, sample end, left as given where no
    such span; ``tallies[:, r]``: orphans, spans outside their side's root).
    Every other request is marked in ``left``: the block path then writes all its outputs
    again."""
    widest = 1
    for r in range(len(counts)):
        widest = max(widest, counts[r])
    size = 1
    while size < 2 * widest + 1:
        size *= 2
    table = np.empty(size, np.int64)
    state = np.zeros(widest, np.int8)
    walked = np.zeros(widest, np.int64)
    stack = np.empty(widest, np.int64)
    first = np.empty(3, np.int64)
    for r in range(len(counts)):
        k, o = counts[r], offsets[r]
        if k == 0:
            continue
        width = 1
        while width < 2 * k + 1:
            width *= 2
        if not _ids_table(o, k, hi, lo, has, trace, table, width):
            left[r] = True
            continue
        tallies[0, r] = _parents(o, k, hi, lo, trace, phi, plo, ptr, has_parent, table, width,
                                 parent)
        _walked_depths(o, k, parent, depth, state, walked, stack)
        if not _firsts(o, k, stage, start, end, hi, lo, trace, codes, first):
            left[r] = True
            continue
        for m in range(2):
            if first[m] >= 0:
                roots[m, r] = first[m] - o
                ends[2 * m, r], ends[2 * m + 1, r] = start[first[m]], end[first[m]]
        if first[2] >= 0:
            ends[6, r] = end[first[2]]
        for m in range(2):  # the earliest tokenize, queue start
            found, earliest = False, 0
            for j in range(o, o + k):
                if stage[j] == codes[3 + m] and (not found or start[j] < earliest):
                    found, earliest = True, start[j]
            if found:
                ends[4 + m, r] = earliest
        tallies[1, r] = _outside(o, k, stage, client, start, end, request_level, first)

"""Compiled sweeps (numba) for requests wider than a block's bits (over
``_request_blocks.MAX_BITS`` spans), whose vectorized forms cost ``(K, K)`` or ``(S, K)``
per request (private to ``analysis``): each policy in time linear in spans and segments
(times a log), memory linear, exactly as the blocks compute it (the tests compare both
with ``analysis.reference``). Compiled once per machine (``cache=True``)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def paint_owners(first, stop, segments) -> np.ndarray:
    """``(N, segments)`` int32: per row, the highest column ``j`` covering each segment
    (``first[:, j] <= s < stop[:, j]``), -1 where none does: what assigning every column's
    segments in ascending column order leaves (the exclusive policy's owner). Columns are
    painted from the highest down, each segment once, skipping painted runs through a
    union-find of the next unpainted segment: ``O(N (K + S))``, whatever ``K``."""
    n, k = first.shape
    owner = np.full((n, segments), -1, np.int32)
    nxt = np.empty(segments + 1, np.int64)
    for r in range(n):
        for s in range(segments + 1):
            nxt[s] = s
        for j in range(k - 1, -1, -1):
            s = np.int64(first[r, j])
            end = np.int64(stop[r, j])
            while True:
                root = s  # the next unpainted segment at or after s
                while nxt[root] != root:
                    root = nxt[root]
                while nxt[s] != root:  # compress the path walked
                    nxt[s], s = root, nxt[s]
                s = root
                if s >= end:
                    break
                owner[r, s] = j
                nxt[s] = s + 1
    return owner


@njit(cache=True, nogil=True)
def _fenwick_add(tree, i, value) -> None:
    i += 1
    while i < len(tree):
        tree[i] += value
        i += i & -i


@njit(cache=True, nogil=True)
def _fenwick_sum(tree, i) -> np.int64:
    """Sum of positions ``[0, i]``."""
    total = np.int64(0)
    i += 1
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


@njit(cache=True, nogil=True)
def _fenwick_find(tree, count) -> np.int64:
    """The position holding the ``count``-th (1-based) unit of a 0/1 tree."""
    pos, step = 0, 1
    while step * 2 < len(tree):
        step *= 2
    while step > 0:
        if pos + step < len(tree) and tree[pos + step] < count:
            pos += step
            count -= tree[pos]
        step //= 2
    return pos  # 0-based: the unit lies at position pos


@njit(cache=True, nogil=True)
def _leaf_in(x, g, st) -> None:
    """Column ``x`` becomes a leaf: its shares are counted from now."""
    leaf, leaves, extra, g_entry, e_entry, count = st
    leaf[x] = True
    g_entry[x] = g
    e_entry[x] = _fenwick_sum(extra, x)
    _fenwick_add(leaves, x, 1)
    count[0] += 1


@njit(cache=True, nogil=True)
def _leaf_out(x, g, st, out) -> None:
    """Column ``x`` stops being a leaf: the shares since it became one go to ``out[x]``."""
    leaf, leaves, extra, g_entry, e_entry, count = st
    out[x] += g - g_entry[x] + _fenwick_sum(extra, x) - e_entry[x]
    leaf[x] = False
    _fenwick_add(leaves, x, -1)
    count[0] -= 1


@njit(cache=True, nogil=True)
def _ancestors(x, step, parent, active, desc, g, st, out) -> None:
    """Column ``x`` starts (``step`` 1) or ends (-1): its ancestors' active descendants
    change, and the nearest active one may stop or start being a leaf."""
    leaf = st[0]
    p, hops = parent[x], 0
    while p >= 0 and hops < len(parent):  # a cycle of parents stops after K hops
        desc[p] += step
        if step == 1 and desc[p] == 1 and leaf[p]:
            _leaf_out(p, g, st, out)
        elif step == -1 and desc[p] == 0 and active[p]:
            _leaf_in(p, g, st)
        p, hops = parent[p], hops + 1


@njit(cache=True, nogil=True)
def _shared_row(first, stop, parent, length, out) -> int:
    """`shared_wide` of one row: ``out`` per column; returns the uncovered ns."""
    k, segments = len(first), len(length)
    active = np.zeros(k, np.bool_)
    desc = np.zeros(k, np.int64)
    extra = np.zeros(k + 2, np.int64)  # Fenwick of range adds (difference array)
    st = (np.zeros(k, np.bool_), np.zeros(k + 1, np.int64), extra, np.zeros(k, np.int64),
          np.zeros(k, np.int64), np.zeros(1, np.int64))
    leaf, leaves, count = st[0], st[1], st[5]
    g, uncovered = np.int64(0), np.int64(0)
    by_first, by_stop = np.argsort(first, kind="mergesort"), np.argsort(stop, kind="mergesort")
    a_i = d_i = 0
    for s in range(segments + 1):
        while d_i < k and stop[by_stop[d_i]] <= s:  # the columns that end here
            x = by_stop[d_i]
            d_i += 1
            if active[x]:
                if leaf[x]:
                    _leaf_out(x, g, st, out)
                active[x] = False
                _ancestors(x, -1, parent, active, desc, g, st, out)
        while a_i < k and first[by_first[a_i]] <= s:  # the columns that start here
            x = by_first[a_i]
            a_i += 1
            if first[x] == s and first[x] < stop[x]:
                active[x] = True
                _ancestors(x, 1, parent, active, desc, g, st, out)
                if desc[x] == 0:
                    _leaf_in(x, g, st)
        if s == segments:
            break
        m = count[0]
        if m == 0:
            uncovered += length[s]
            continue
        g += length[s] // m
        rest = length[s] % m
        if rest:  # one more ns to each of the `rest` leaves highest in the order
            _fenwick_add(extra, _fenwick_find(leaves, m - rest + 1), 1)
            _fenwick_add(extra, k, -1)
    for x in range(k):
        if leaf[x]:
            _leaf_out(x, g, st, out)
    return uncovered


@njit(cache=True, nogil=True)
def shared_wide(first, stop, parent, length):
    """The shared policy of ``attribution._Block.shared`` for wide rows, in time linear in
    segments (times a log) and in spans times their depth, memory linear: per row, each
    segment's length split equally among its active leaves (active columns with no active
    descendant; columns in exclusive order, ``parent`` their parent's position or -1), the
    remainder one ns each to the leaves highest in that order; ``(per column ns,
    uncovered ns)``. A leaf's shares are summed lazily: a running total of the equal
    shares and a range-add tree of the remainders are read when it stops being a leaf."""
    n, k = first.shape
    per_col = np.zeros((n, k), np.int64)
    uncovered = np.zeros(n, np.int64)
    for r in range(n):
        uncovered[r] = _shared_row(first[r], stop[r], parent[r], length[r], per_col[r])
    return per_col, uncovered


@njit(cache=True, nogil=True)
def _walk_row(par, live, lo, hi, grouped, by_depth, own, nxt, chain, on, child) -> np.int64:
    """`critical_walk` of one row: ``own`` per column; returns the ns of the virtual root's
    children on the walk. ``nxt``, ``chain``, ``on`` (at least ``k`` long) and ``child``
    (``k + 1``) are scratch, overwritten (a caller walking many rows allocates them once)."""
    k = len(par)
    nxt[:k] = -1
    chain[:k] = False
    g = 0
    while g < k and live[grouped[g]]:  # groups of siblings, each by ascending rank
        e = g
        while e < k and live[grouped[e]] and par[grouped[e]] == par[grouped[g]]:
            e += 1
        for q in range(g, e):  # the highest-ranked sibling ending before x starts
            x = grouped[q]
            a, b = g, q  # ranks ascend with the end: search the ends among [g, q)
            while a < b:
                mid = (a + b) // 2
                if hi[grouped[mid]] <= lo[x]:
                    a = mid + 1
                else:
                    b = mid
            if a > g:
                nxt[x] = grouped[a - 1]
        x = grouped[e - 1]  # the walk starts at the child that ends last
        while x >= 0 and not chain[x]:
            chain[x] = True
            x = nxt[x]
        g = e
    on[:k] = chain[:k]  # on the path: on the chain, and so is every ancestor
    changed, passes = True, 0
    while changed and passes <= k:  # by depth, parents first: one pass, but any order holds
        changed, passes = False, passes + 1
        for x in by_depth:
            if on[x] and par[x] != k and not on[par[x]]:
                on[x], changed = False, True
    child[:k + 1] = 0
    for x in range(k):
        if on[x]:
            child[par[x]] += hi[x] - lo[x]
    for x in range(k):
        own[x] = hi[x] - lo[x] - child[x] if on[x] else 0
    return child[k]


@njit(cache=True, nogil=True)
def critical_walk(par, live, lo, hi, grouped, by_depth):
    """Jaeger's walk of ``attribution``'s critical-path policy for wide rows, in time
    linear in spans (times a log), memory linear: per parent (``par``; ``K``: the virtual
    root) its live children by ascending rank (``grouped``: live columns first, by parent,
    then rank, whose first key is the end), the walk from the child that ends last to the
    highest-ranked sibling ending before it starts, and so on; a column is on the path when
    its parent is (``by_depth``: parents first). ``(own ns per column, the virtual root's
    children's ns)``, as ``_critical.critical_path`` computes them with (K, K) matrices."""
    n, k = par.shape
    own = np.zeros((n, k), np.int64)
    root_children = np.zeros(n, np.int64)
    nxt, chain, on = np.empty(k, np.int64), np.empty(k, np.bool_), np.empty(k, np.bool_)
    child = np.empty(k + 1, np.int64)
    for r in range(n):
        root_children[r] = _walk_row(par[r], live[r], lo[r], hi[r], grouped[r], by_depth[r],
                                     own[r], nxt, chain, on, child)
    return own, root_children

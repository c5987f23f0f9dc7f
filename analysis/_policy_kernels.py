"""Compiled per-request sweeps (numba) of the shared and critical-path policies (private to
``analysis``): what ``attribution._Block.shared`` and ``_critical.critical_path`` compute
over a block of requests with (K, K) and (segments, K) matrices, one request at a time in
memory linear in its spans, as ``_kernels.exclusive_sweep`` does for the exclusive policy
(its clipping, order and covered unions are shared with it). Each is exact: the tests
compare it with the blocks and with the plain sweep (``analysis.reference``) on generated
traces. Compiled once per machine (``cache=True``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ttft.analysis._kernels import MAX_SWEEP, _clip, _covered, _rank
from ttft.analysis._wide_kernels import _walk_row

SHARED = 1
CRITICAL_PATH = 2
"""``policy_sweep``'s policy codes."""


@njit(cache=True, nogil=True)
def policy_sweep(policy, counts, offsets, has, a, b, root, has_cut, cut_lo, cut_hi,
                 stage, client, start, end, keep, depth, parent, sid_hi, sid_lo,
                 tables, codes, att, cov, raw, slow) -> None:
    """``attribution`` of every request with ``has`` under ``policy`` (`SHARED` or
    `CRITICAL_PATH`): ``att``, ``cov`` and ``raw`` rows as the blocks give them, the
    arguments as ``_kernels.exclusive_sweep`` takes them, with ``parent`` (each span's
    parent's column in its request, -1 for none). A request of more than `MAX_SWEEP` spans,
    or whose order the span ids and times leave tied (the blocks then compare stage names
    and trace ids), is marked in ``slow`` and left to the blocks."""
    lo = np.empty(MAX_SWEEP, np.int64)
    hi = np.empty(MAX_SWEEP, np.int64)
    key = np.empty(MAX_SWEEP, np.int64)
    inc = np.empty(MAX_SWEEP, np.bool_)
    order = np.empty(MAX_SWEEP, np.int64)
    par = np.empty(MAX_SWEEP, np.int64)
    own = np.empty(MAX_SWEEP, np.int64)
    work = np.empty((12, 2 * MAX_SWEEP + 2), np.int64)
    flags = np.empty((3, MAX_SWEEP), np.bool_)
    for r in range(len(counts)):
        k = counts[r]
        if k == 0 or not has[r]:
            continue
        if k > MAX_SWEEP:
            slow[r] = True
            continue
        o = offsets[r]
        _clip(r, k, o, a, b, root, has_cut, cut_lo, cut_hi, stage, client, start, end, keep,
              depth, tables, codes, lo, hi, key, inc)
        _parents(k, o, parent, inc, root[r], par)
        if policy == SHARED:
            if not _rank(k, o, key, sid_hi, sid_lo, stage, tables[2], order):
                slow[r] = True
                continue
            uncovered = _shared(k, a[r], b[r], lo, hi, par, order, own, work)
        else:
            uncovered = _critical(k, a[r], b[r], lo, hi, inc, par, o, depth, sid_hi, sid_lo,
                                  own, work, flags)
            if uncovered < 0:
                slow[r] = True
                continue
        for j in range(k):
            s = stage[o + j]
            raw[r, s] += hi[j] - lo[j]
            att[r, codes[0] if j == root[r] else s] += own[j]
        att[r, codes[1]] += uncovered
        _covered(r, k, o, stage, inc, lo, hi, raw, cov, order)


@njit(cache=True, nogil=True)
def _parents(k, o, parent, inc, root, par) -> None:
    """``par[:k]``: each column's nearest included ancestor (``_request_blocks
    .nearest_ancestor``: at most ``k`` hops, -1 where none is found), else the root's
    column; -1 for the root itself (``_Block.parent``)."""
    for j in range(k):
        q = parent[o + j]
        hops = 0
        while q >= 0 and not inc[q] and hops < k:
            q = parent[o + q]
            hops += 1
        if q >= 0 and not inc[q]:
            q = -1
        par[j] = -1 if j == root else (root if q < 0 else q)


@njit(cache=True, nogil=True)
def _shared(k, a, b, lo, hi, par, order, own, work) -> np.int64:
    """``_Block.shared`` of one request: ``own[:k]`` per column, each elementary segment
    split equally among its active leaves (active columns with no active descendant) and
    the remainder 1 ns each to the leaves highest in exclusive order (``order``); returns
    the ns no column covers. The segments are ``_Block._segments``' (every endpoint sorted,
    ties kept in column order); a column's active descendants are counted as columns
    start and stop, each up its ancestors (at most ``k`` hops, as the blocks' matrix of
    ancestors goes)."""
    n = 2 * k + 2
    pts, by = _sorted_segments(k, a, b, lo, hi, order, par, work)
    stop, up, inv = work[4, :k], work[5, :k], work[2, :k]
    below, mine, active = work[6, :k], work[7, :k], work[8, :k]
    below[:] = 0
    mine[:] = 0
    active[:] = 0
    uncovered = np.int64(0)
    m = 0  # active leaves
    for s in range(n - 1):
        e = by[s]  # the one endpoint at this position: a column starts or stops here
        if 1 <= e <= k:
            q = inv[e - 1]
            active[q] = 1
            m += (below[q] == 0) - _count_up(q, up, below, active, k, 1)
        elif k < e <= 2 * k:
            q = inv[e - k - 1]
            if stop[q] == s:
                active[q] = 0
                m -= (below[q] == 0) - _count_up(q, up, below, active, k, -1)
        length = pts[by[s + 1]] - pts[by[s]]
        if length == 0:
            continue
        if m == 0:
            uncovered += length
            continue
        base, rem = length // m, length % m
        for q in range(k - 1, -1, -1):  # the remainder to the highest leaves first
            if active[q] and below[q] == 0:
                mine[q] += base + (1 if rem > 0 else 0)
                rem -= 1
    for q in range(k):
        own[order[q]] = mine[q]
    return uncovered


@njit(cache=True, nogil=True)
def _sorted_segments(k, a, b, lo, hi, order, par, work):
    """`_shared`'s endpoints (``pts``, with ``by`` their ascending order: the window's
    ends, then every column's start, then every end, ties in that order) and, per column
    in exclusive order, its first and stopping segment and its parent's place in that
    order (``work`` rows 3, 4 and 5; -1 for none)."""
    n = 2 * k + 2
    pts = work[0, :n]
    pts[0], pts[n - 1] = a, b
    for j in range(k):
        pts[1 + j], pts[k + 1 + j] = lo[j], hi[j]
    by = np.argsort(pts, kind="mergesort")
    pos = work[1, :n]
    for i in range(n):
        pos[by[i]] = i
    inv = work[2, :k]
    for q in range(k):
        inv[order[q]] = q
    for q in range(k):
        c = order[q]
        work[3, q], work[4, q] = pos[1 + c], pos[k + 1 + c]
        work[5, q] = inv[par[c]] if par[c] >= 0 else -1
    return pts, by


@njit(cache=True, nogil=True)
def _count_up(q, up, below, active, k, step) -> int:
    """Add ``step`` to the active-descendant count of column ``q``'s ancestors; returns how
    many active ancestors stop being leaves by it (``step`` 1) or become leaves again
    (``step`` -1)."""
    changed = 0
    c = up[q]
    for _ in range(k):
        if c < 0:
            break
        if active[c] and below[c] == (0 if step > 0 else 1):
            changed += 1
        below[c] += step
        c = up[c]
    return changed


@njit(cache=True, nogil=True)
def _critical(k, a, b, lo, hi, inc, par, o, depth, sid_hi, sid_lo, own, work, flags
              ) -> np.int64:
    """``_critical.critical_path`` of one request: children clipped to their parents (the
    window for the virtual root, column ``k``) until nothing moves, live columns ranked by
    (end, start, span id), then ``_wide_kernels._walk_row``'s walk; ``own[:k]`` per column,
    and returns the window's ns off the walk, or -1 where two columns tie on every key (the
    blocks then compare stage names and trace ids)."""
    vpar = work[0, :k]
    for j in range(k):
        vpar[j] = k if par[j] < 0 else par[j]
    ext_lo, ext_hi = _clipped_to_parents(k, a, b, lo, hi, vpar, work)
    clo, chi = ext_lo[:k], ext_hi[:k]
    live = flags[0, :k]
    for j in range(k):
        live[j] = inc[j] and chi[j] > clo[j]
    ranked = work[5, :k]  # columns by ascending (end, start, span id)
    for j in range(k):
        ranked[j] = j
        q = j
        while q > 0 and _ends_before(ranked[q], ranked[q - 1], o, clo, chi, sid_hi, sid_lo) > 0:
            ranked[q], ranked[q - 1] = ranked[q - 1], ranked[q]
            q -= 1
    for q in range(1, k):
        if _ends_before(ranked[q - 1], ranked[q], o, clo, chi, sid_hi, sid_lo) == 0:
            return -1
    rank = work[6, :k]
    for q in range(k):
        rank[ranked[q]] = q
    grouped, by_depth = work[7, :k], work[8, :k]
    _walk_orders(k, o, live, vpar, rank, depth, grouped, by_depth)
    return (b - a) - _walk_row(vpar, live, clo, chi, grouped, by_depth, own[:k], work[9],
                               flags[1], flags[2], work[10])


@njit(cache=True, nogil=True)
def _clipped_to_parents(k, a, b, lo, hi, vpar, work):
    """Every column's bounds clipped to its parent's (``vpar``; ``k``: the window), all
    columns at once from the last pass's bounds, until nothing moves or ``k`` passes (as
    ``_critical.critical_path``); ``work`` rows 1 to 4."""
    ext_lo, ext_hi = work[1, :k + 1], work[2, :k + 1]
    new_lo, new_hi = work[3, :k], work[4, :k]
    for j in range(k):
        ext_lo[j], ext_hi[j] = lo[j], hi[j]
    ext_lo[k], ext_hi[k] = a, b
    for _ in range(k):
        moved = False
        for j in range(k):
            new_lo[j] = max(lo[j], ext_lo[vpar[j]])
            new_hi[j] = min(hi[j], ext_hi[vpar[j]])
            moved = moved or new_lo[j] != ext_lo[j] or new_hi[j] != ext_hi[j]
        if not moved:
            break
        for j in range(k):
            ext_lo[j], ext_hi[j] = new_lo[j], new_hi[j]
    return ext_lo, ext_hi


@njit(cache=True, nogil=True)
def _walk_orders(k, o, live, vpar, rank, depth, grouped, by_depth) -> None:
    """``_wide_kernels._walk_row``'s orders, into ``grouped`` and ``by_depth``: the columns
    live first, then by parent, then by rank; and by ascending depth (stable)."""
    for j in range(k):
        grouped[j] = j
        q = j
        while q > 0 and _grouped_before(grouped[q], grouped[q - 1], live, vpar, rank):
            grouped[q], grouped[q - 1] = grouped[q - 1], grouped[q]
            q -= 1
    for j in range(k):
        by_depth[j] = j
        q = j
        while q > 0 and depth[o + by_depth[q]] < depth[o + by_depth[q - 1]]:
            by_depth[q], by_depth[q - 1] = by_depth[q - 1], by_depth[q]
            q -= 1


@njit(cache=True, nogil=True)
def _ends_before(x, y, o, lo, hi, sid_hi, sid_lo) -> int:
    """1 when column ``x`` ranks before ``y`` by (end, start, span id), -1 after, 0 tied."""
    if hi[x] != hi[y]:
        return 1 if hi[x] < hi[y] else -1
    if lo[x] != lo[y]:
        return 1 if lo[x] < lo[y] else -1
    if sid_hi[o + x] != sid_hi[o + y]:
        return 1 if sid_hi[o + x] < sid_hi[o + y] else -1
    if sid_lo[o + x] != sid_lo[o + y]:
        return 1 if sid_lo[o + x] < sid_lo[o + y] else -1
    return 0


@njit(cache=True, nogil=True)
def _grouped_before(x, y, live, par, rank) -> bool:
    if live[x] != live[y]:
        return live[x]
    if par[x] != par[y]:
        return par[x] < par[y]
    return rank[x] < rank[y]

"""Per-request trees: parent links, depth, duplicate ids, roots and span-derived window
ends, computed on dense ``(requests, K)`` blocks (private to ``analysis``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ttft.analysis import _column_arrays as col
from ttft.analysis._request_blocks import iter_blocks
from ttft.tracer.schema import REQUEST_STAGES, STAGE_NAMES

NONE_NS = np.iinfo(np.int64).min
"""Marks a window end that does not exist."""
MAX_NS = np.iinfo(np.int64).max

CODE = {name: i for i, name in enumerate(STAGE_NAMES)}
"""Stage name → small integer code used in the arrays."""
N_STAGES = len(STAGE_NAMES)


@dataclass
class Spans:
    """Request-level spans (plus joined ``gpu`` copies), grouped by request: a request's
    spans are consecutive from ``offsets[request]``, requests laid out in order (a
    block of `_request_blocks.iter_blocks`, its requests of one span count, gathers them).

    All arrays have one entry per span; ``sid_hi``/``sid_lo`` are the span id as two
    words that compare like the id string; ``parent`` is the column of the parent inside the
    request's block (``-1`` = none), ``depth`` the number of ancestors, ``keep`` false for
    duplicate span ids; ``trace`` the span's trace code into ``trace_values`` (ties between
    spans of one id in two traces of a request are broken by trace id, `value_rank`).
    """

    req: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    stage: np.ndarray
    client: np.ndarray
    sid_hi: np.ndarray
    sid_lo: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    keep: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    trace: np.ndarray
    trace_values: list[str]


def value_rank(codes: np.ndarray, values: list[str]) -> np.ndarray:
    """``codes`` (into ``values``) replaced by the rank of their value among those present:
    ties broken by what the codes name, never by the order codes were given out."""
    codes = np.asarray(codes)
    # Codes into few values against the rows (an engine's gpu spans): which are present by
    # a table, not a sort of every row's code (0.35 s of 3M codes at 23.8M spans).
    dense = codes.size > 0 and codes.min() >= 0 and len(values) <= 4 * codes.size + 65_536
    if dense:
        present = np.zeros(len(values), bool)
        present[codes] = True
        used = np.flatnonzero(present)
    else:
        used, inv = np.unique(codes, return_inverse=True)
    rank = np.empty(len(used), np.int64)
    rank[np.argsort(np.asarray([values[c] for c in used], dtype=object))] = np.arange(len(used))
    if not dense:
        return rank[inv].reshape(codes.shape)
    by_code = np.empty(len(values), np.int64)
    by_code[used] = rank
    return by_code[codes]


def resolve_trees(
    spans: Spans,
    has_sid: np.ndarray,
    psid: tuple[np.ndarray, np.ndarray, np.ndarray],
    has_parent: np.ndarray,
    n_req: int,
    trace: np.ndarray,
    trace_values: list[str],
) -> dict[str, np.ndarray]:
    """Fill ``parent``, ``depth`` and ``keep`` per request block; return the roots and the
    span-derived window ends per request.

    ``trace`` is each span's trace code (into ``trace_values``), ``psid`` its parent's id
    words and the trace to find the parent in (`_links`)."""
    out = {
        name: np.full(n_req, fill, np.int64)
        for name, fill in (
            ("client_root", -1),
            ("client_start", NONE_NS),
            ("client_end", NONE_NS),
            ("server_root", -1),
            ("server_start", NONE_NS),
            ("server_end", NONE_NS),
            ("tokenize_start", NONE_NS),
            ("queue_start", NONE_NS),
            ("sample_end", NONE_NS),
            ("orphans", 0),
            ("duplicates", 0),
            ("outside", 0),
        )
    }
    request_level = np.zeros(N_STAGES + 1, bool)
    request_level[[CODE[s] for s in REQUEST_STAGES]] = True
    counts = spans.counts
    if col.compiled(len(spans.req)):  # compiled, but for the requests it leaves to blocks
        counts = np.where(_compiled(spans, has_sid, psid, has_parent, trace, request_level,
                                    out), counts, 0)
    for ids, pos in iter_blocks(counts, spans.offsets):
        k = pos.shape[1]
        hi, lo, hs = pos.take(spans.sid_hi), pos.take(spans.sid_lo), pos.take(has_sid)
        start, end, stage = pos.take(spans.start_ns), pos.take(spans.end_ns), pos.take(spans.stage)
        phi, plo, hp = pos.take(psid[0]), pos.take(psid[1]), pos.take(has_parent)
        tr, ptr = pos.take(trace), pos.take(psid[2])
        client = pos.take(spans.client)
        # What tells copies of one span id apart, so the copy kept never depends on row order:
        # last, the trace its parent is found in, by trace id (a gpu span joined through two
        # chunks of one id in two traces of the request: the copies differ only there).
        def parent_trace(cols: np.ndarray, ptr: np.ndarray = ptr) -> np.ndarray:
            return value_rank(ptr.ravel()[cols], trace_values)

        copy_key = (parent_trace, plo, phi, hp, client, stage, end, start)
        parent, keep, found = _links(hi, lo, tr, hs, phi, plo, ptr, hp, copy_key)
        pos.put(spans.parent, parent)
        pos.put(spans.depth, _depths(parent))
        pos.put(spans.keep, keep)
        out["orphans"][ids] = (hp & ~found & keep).sum(axis=1)
        out["duplicates"][ids] = (~keep).sum(axis=1)

        for name in ("client", "server"):
            mine = keep & (stage == CODE[name])
            first = _earliest(mine, start, end, hi, lo, tr, trace_values)
            has = mine.any(axis=1)
            rows = np.arange(len(ids))
            out[f"{name}_root"][ids] = np.where(has, first, -1)
            out[f"{name}_start"][ids] = np.where(has, start[rows, first], NONE_NS)
            out[f"{name}_end"][ids] = np.where(has, end[rows, first], NONE_NS)
        for name in ("tokenize", "queue"):
            mine = keep & (stage == CODE[name])
            earliest = np.where(mine, start, MAX_NS).min(axis=1)
            out[f"{name}_start"][ids] = np.where(mine.any(axis=1), earliest, NONE_NS)
        sample = keep & (stage == CODE["sample"])
        first = _earliest(sample, start, end, hi, lo, tr, trace_values)
        out["sample_end"][ids] = np.where(
            sample.any(axis=1), end[np.arange(len(ids)), first], NONE_NS
        )
        # Request-level spans wholly outside their side's root span.
        outside = np.zeros(pos.shape, bool)
        for name, side in (("client", client), ("server", ~client)):
            root = out[f"{name}_root"][ids][:, None]
            lo = out[f"{name}_start"][ids][:, None]
            hi = out[f"{name}_end"][ids][:, None]
            cand = keep & side & request_level[stage] & (root >= 0)
            cand &= np.arange(k)[None] != root
            outside |= cand & ((end < lo) | (start > hi))
        out["outside"][ids] = outside.sum(axis=1)
    return out


def _compiled(spans: Spans, has_sid: np.ndarray, psid: tuple[np.ndarray, ...],
              has_parent: np.ndarray, trace: np.ndarray, request_level: np.ndarray,
              out: dict[str, np.ndarray]) -> np.ndarray:
    """`resolve_trees` by the compiled kernel (``_tree_kernels.resolve_requests``), into
    ``spans`` and ``out``; returns which requests it left to the blocks: those repeating a
    ``(trace, span id)`` (which copy is kept is the sorting path's rule) or whose earliest
    spans differ only in trace (ranked by trace id string)."""
    from ttft.analysis._tree_kernels import resolve_requests  # numba: large tables

    n_req = len(spans.counts)
    if any(len(t) and t.dtype != np.int32 and (t.max() >= 2**31 or t.min() < -2**31)
           for t in (trace, psid[2])):  # codes the kernel's int32 would not hold
        return np.ones(n_req, bool)
    roots = np.full((2, n_req), -1, np.int64)
    ends = np.full((7, n_req), NONE_NS, np.int64)
    tallies = np.zeros((2, n_req), np.int64)
    left = np.zeros(n_req, bool)
    codes = np.asarray([CODE[s] for s in ("client", "server", "sample", "tokenize", "queue")],
                       np.int64)
    # One layout and dtype per argument, so the kernel is compiled for one signature (a
    # no-op for what assemble gives it); it writes parent and depth in place.
    inputs = [np.ascontiguousarray(v, dtype) for v, dtype in (
        (spans.counts, np.int64), (spans.offsets, np.int64), (spans.sid_hi, np.uint64),
        (spans.sid_lo, np.uint64), (has_sid, bool), (psid[0], np.uint64),
        (psid[1], np.uint64), (psid[2], np.int32), (has_parent, bool), (trace, np.int32),
        (spans.stage, np.int8), (spans.client, bool), (spans.start_ns, np.int64),
        (spans.end_ns, np.int64), (request_level, bool), (codes, np.int64))]
    assert spans.parent.dtype == np.int32 and spans.depth.dtype == np.int16
    resolve_requests(*inputs, spans.parent, spans.depth, roots, ends, tallies, left)
    out["client_root"], out["server_root"] = roots
    for name, row in zip(("client_start", "client_end", "server_start", "server_end",
                          "tokenize_start", "queue_start", "sample_end"), ends, strict=True):
        out[name] = row
    out["orphans"], out["outside"] = tallies
    return left


def _earliest(
    mine: np.ndarray, start: np.ndarray, end: np.ndarray, hi: np.ndarray, lo: np.ndarray,
    tr: np.ndarray, trace_values: list[str],
) -> np.ndarray:
    """Per row of a block, the column of the earliest-starting span among ``mine`` (0 when
    none): ties go to the longest, then to the smallest span id, then to the smallest trace
    id (one span id in two traces of a request), so which of two spans starting together
    becomes the root never depends on row order."""
    cand = _best(mine, start, True)
    tied = np.flatnonzero(cand.sum(axis=1) > 1)  # usually none: later keys only for these
    if len(tied):
        sub = cand[tied]
        for values, lowest in ((end, False), (hi, True), (lo, True)):
            sub = _best(sub, values[tied], lowest)
        still = np.flatnonzero(sub.sum(axis=1) > 1)
        if len(still):
            sub[still] = _best(sub[still], value_rank(tr[tied[still]], trace_values), True)
        cand[tied] = sub
    return cand.argmax(axis=1)


def _best(cand: np.ndarray, values: np.ndarray, lowest: bool) -> np.ndarray:
    """``cand`` narrowed, per row, to its columns of the lowest (or highest) value."""
    info = np.iinfo(values.dtype)
    fill = info.max if lowest else info.min
    masked = np.where(cand, values, fill)
    best = masked.min(axis=1, keepdims=True) if lowest else masked.max(axis=1, keepdims=True)
    return cand & (masked == best)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Ancestors of every column of a ``(requests, K)`` block by ``parent`` columns (-1 =
    none), capped at ``K`` (a cycle counts every hop) and at the int16 range: by pointer
    doubling, so ``log2 K`` passes even for a 100,000-deep chain.

    Each row gets one more column, a root of roots that is its own parent with no hops, so
    the passes are plain gathers by flat index, with no test for a missing parent."""
    n, k = parent.shape
    width = k + 1
    base = np.arange(0, n * width, width)[:, None]
    jump = np.empty((n, width), np.int64)
    jump[:, :k] = np.where(parent >= 0, parent, k)
    jump[:, k] = k
    jump += base
    jump = jump.ravel()
    hops = np.zeros((n, width), np.int64)
    hops[:, :k] = parent >= 0
    hops = hops.ravel()
    done = (base + k).ravel().repeat(width)  # each entry's own row's root of roots
    reach = 1
    while reach < k and (jump != done).any():
        hops = hops + hops.take(jump)
        jump = jump.take(jump)
        reach *= 2
    hops = hops.reshape(n, width)[:, :k]
    return np.minimum(hops, min(k, np.iinfo(np.int16).max)).astype(np.int16)


_SMALL_BLOCK = 64
"""Widest block whose parents are found by a search in each request's sorted words
(`_links_small`) rather than by sorting the block's ``(request, id)`` keys."""


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F),
        np.uint64(0x165667B19E3779F9))
"""Odd multipliers folding an id's two words and its trace into one (wrapping uint64
arithmetic)."""


def _mixed(hi: np.ndarray, lo: np.ndarray, trace: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return ((hi * _MIX[0]) ^ (lo * _MIX[1]) ^ (hi >> np.uint64(29))
                ^ (trace.astype(np.uint64) * _MIX[2]))


def _links_small(
    hi: np.ndarray, lo: np.ndarray, tr: np.ndarray, has: np.ndarray, phi: np.ndarray,
    plo: np.ndarray, ptr: np.ndarray, has_parent: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`_links` by searching each request's sorted id words, for a block without a repeated
    (trace, span id) in any request (None otherwise: choosing which copy to keep is the
    sorting path's job). With unique ids there is nothing to drop, and a span's parent is
    the one other span of its request whose (trace, id) is its (``ptr``, ``parent_id``).

    Ids are compared as one folded word each, the trace folded in (`_mixed`; a span
    without an id gets a word of its own column). Two spans of a request with one word are
    a repeated id or a collision, and both go to the sorting path; otherwise a word names
    at most one span, whose whole id and trace are then checked, so a fold never links a
    span to the wrong parent.
    """
    n, k = hi.shape
    cols = np.arange(k, dtype=np.uint64)
    word = np.where(has, _mixed(hi, lo, tr), cols[None])
    by_word = np.argsort(word, axis=1)
    ordered = np.take_along_axis(word, by_word, axis=1)
    if (ordered[:, 1:] == ordered[:, :-1]).any():
        return None
    asked = _mixed(phi, plo, ptr)
    # Each asked word's place in its row's sorted words, by a binary search on all rows at
    # once: log2(K) gathers instead of comparing every pair.
    flat = ordered.ravel()
    base = np.arange(0, n * k, k)[:, None]
    below = np.zeros((n, k), np.int64)  # how many of the row's words are < asked
    step = 1 << (k.bit_length() - 1)
    while step:
        probe = below + step
        inside = probe <= k
        less = flat.take(base + np.where(inside, probe - 1, 0)) < asked
        below = np.where(less & inside, probe, below)
        step >>= 1
    at = base + np.minimum(below, k - 1)
    hit = (below < k) & (flat.take(at) == asked)
    parent = np.where(hit, by_word.ravel().take(at), -1)
    at = (base + np.maximum(parent, 0)).ravel()  # flat, always inside the row
    same = (
        has.ravel().take(at) & (hi.ravel().take(at) == phi.ravel())
        & (lo.ravel().take(at) == plo.ravel()) & (tr.ravel().take(at) == ptr.ravel())
    ).reshape(n, k)
    parent = np.where(has_parent & (parent >= 0) & same & (parent != np.arange(k)[None]),
                      parent, -1)
    return parent, np.ones((n, k), bool), parent >= 0


def _copies_first(order: np.ndarray, first: np.ndarray, copy_key: tuple) -> np.ndarray:
    """``order`` (sorted by request and id, ``first`` marking each group's start) with each
    group of copies reordered by ``copy_key`` then column, so the kept copy (the group's
    first) never depends on row order. A key is a block-shaped array, or a function of
    the flat columns of the copies that gives their keys (one costly to compute for all)."""
    group = np.cumsum(first) - 1
    sizes = np.bincount(group)
    in_copies = sizes[group] > 1
    members = np.flatnonzero(in_copies)  # positions in ``order``, groups contiguous
    cols = order[members]
    keys = (c(cols) if callable(c) else c.ravel()[cols] for c in copy_key)
    within = np.lexsort((cols, *keys, group[members]))
    out = order.copy()
    out[members] = cols[within]
    return out


def _links(
    hi: np.ndarray,
    lo: np.ndarray,
    tr: np.ndarray,
    has: np.ndarray,
    phi: np.ndarray,
    plo: np.ndarray,
    ptr: np.ndarray,
    has_parent: np.ndarray,
    copy_key: tuple,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ``(requests, K)`` block: the parent column of every span (-1 none), ``keep``
    (false for all but one copy of a duplicated span id) and whether the parent was found.

    A span is named by its id within its trace (``tr``: the trace's code); its parent is
    looked up in trace ``ptr`` (its own; a joined gpu copy's is its chunk's). Span ids are
    unique per trace only: a request of several traces (joined by request id, or an
    engine's gpu spans joined by step) may hold one id twice without a duplicate.

    Of the copies of one span id the one kept is the first by ``copy_key`` (``np.lexsort``
    keys, the last one primary: start, end, ...), then by column; copies equal in every key
    are interchangeable, so the result never depends on row order. A span's parent is the
    kept copy of its ``parent_id`` in its request, never itself.

    Both are found by sorting the block's ``(request, id)`` keys, so time and memory are
    ``O(n K log(n K))``: 20,000 copies of one id in one request cost a few sorts, not a
    ``K x K`` comparison.
    """
    n, k = hi.shape
    if k <= _SMALL_BLOCK:
        small = _links_small(hi, lo, tr, has, phi, plo, ptr, has_parent)
        if small is not None:
            return small
    row = np.repeat(np.arange(n), k)
    hi_f, lo_f, tr_f = hi.ravel(), lo.ravel(), tr.ravel()
    with_id = np.flatnonzero(has.ravel())
    # Sort by (request, trace, id) only; ids are random, so copies are rare: the copy keys
    # order just the groups of copies (the common block has none and skips that sort).
    order = with_id[np.lexsort((lo_f[with_id], hi_f[with_id], tr_f[with_id], row[with_id]))]
    first = np.ones(len(order), bool)
    first[1:] = (
        (row[order][1:] != row[order][:-1])
        | (tr_f[order][1:] != tr_f[order][:-1])
        | (hi_f[order][1:] != hi_f[order][:-1])
        | (lo_f[order][1:] != lo_f[order][:-1])
    )
    keep = np.ones(n * k, bool)
    if not first.all():
        order = _copies_first(order, first, copy_key)
    keep[order[~first]] = False
    kept = order[first]  # one copy per (request, trace, id), sorted by those
    asking = np.flatnonzero(has_parent.ravel())
    parent = np.full(n * k, -1, np.int64)
    if len(kept) and len(asking):
        # Queries after the kept ids of equal key: each looks back at the last kept id.
        keys_row = np.concatenate([row[kept], row[asking]])
        keys_tr = np.concatenate([tr_f[kept], ptr.ravel()[asking]])
        keys_hi = np.concatenate([hi_f[kept], phi.ravel()[asking]])
        keys_lo = np.concatenate([lo_f[kept], plo.ravel()[asking]])
        is_query = np.repeat([False, True], [len(kept), len(asking)])
        merged = np.lexsort((is_query, keys_lo, keys_hi, keys_tr, keys_row))
        last_kept = np.maximum.accumulate(np.where(is_query[merged], -1, np.arange(len(merged))))
        queries = np.flatnonzero(is_query[merged])
        back = last_kept[queries]
        source = merged[np.maximum(back, 0)]
        target = merged[queries]
        match = (
            (back >= 0)
            & (keys_row[source] == keys_row[target])
            & (keys_tr[source] == keys_tr[target])
            & (keys_hi[source] == keys_hi[target])
            & (keys_lo[source] == keys_lo[target])
        )
        child = asking[target - len(kept)]
        found_at = kept[np.where(match, source, 0)]
        match &= found_at != child
        parent[child[match]] = found_at[match] - row[child[match]] * k
    parent = parent.reshape(n, k)
    found = parent >= 0
    return parent, keep.reshape(n, k), found

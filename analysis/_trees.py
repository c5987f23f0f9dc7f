"""Per-request trees: parent links, depth, duplicate ids, roots and span-derived window
ends, computed on dense ``(requests, K)`` blocks (private to ``analysis``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ttft.analysis._buckets import iter_blocks, take_rows
from ttft.tracer.schema import REQUEST_STAGES, STAGE_NAMES

NONE_NS = np.iinfo(np.int64).min
"""Marks a window end that does not exist."""
MAX_NS = np.iinfo(np.int64).max

CODE = {name: i for i, name in enumerate(STAGE_NAMES)}
"""Stage name → small integer code used in the arrays."""
N_STAGES = len(STAGE_NAMES)


@dataclass
class Spans:
    """Request-level spans (plus joined ``gpu`` copies), sorted by request.

    All arrays have one entry per span; ``sid_hi``/``sid_lo`` are the span id as two
    words that compare like the id string; ``parent`` is the column of the parent inside the
    request's block (``-1`` = none), ``depth`` the number of ancestors, ``keep`` false for
    duplicate span ids.
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


def resolve_trees(
    spans: Spans,
    has_sid: np.ndarray,
    psid: tuple[np.ndarray, np.ndarray],
    has_parent: np.ndarray,
    n_req: int,
) -> dict[str, np.ndarray]:
    """Fill ``parent``, ``depth`` and ``keep`` per request block; return the roots and the
    span-derived window ends per request."""
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
    for ids, pos in iter_blocks(spans.counts, spans.offsets):
        k = pos.shape[1]
        hi, lo, hs = spans.sid_hi[pos], spans.sid_lo[pos], has_sid[pos]
        start, end, stage = spans.start_ns[pos], spans.end_ns[pos], spans.stage[pos]
        phi, plo, hp = psid[0][pos], psid[1][pos], has_parent[pos]
        # What tells copies of one span id apart, so the copy kept never depends on row order.
        copy_key = (plo, phi, hp, spans.client[pos], stage, end, start)
        parent, keep, found = _links(hi, lo, hs, phi, plo, hp, copy_key)
        depth = np.zeros(parent.shape, np.int16)
        anc = parent.copy()
        for _ in range(k):
            step = anc >= 0
            if not step.any():
                break
            depth += step
            anc = take_rows(parent, anc, fill=-1)
        spans.parent[pos] = parent
        spans.depth[pos] = depth
        spans.keep[pos] = keep
        out["orphans"][ids] = (has_parent[pos] & ~found & keep).sum(axis=1)
        out["duplicates"][ids] = (~keep).sum(axis=1)

        for name in ("client", "server"):
            mine = keep & (stage == CODE[name])
            first = _earliest(mine, start, end, hi, lo)
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
        first = _earliest(sample, start, end, hi, lo)
        out["sample_end"][ids] = np.where(
            sample.any(axis=1), end[np.arange(len(ids)), first], NONE_NS
        )
        # Request-level spans wholly outside their side's root span.
        client = spans.client[pos]
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


def _earliest(
    mine: np.ndarray, start: np.ndarray, end: np.ndarray, hi: np.ndarray, lo: np.ndarray
) -> np.ndarray:
    """Per row of a block, the column of the earliest-starting span among ``mine`` (0 when
    none): ties go to the longest, then to the smallest span id, so which of two spans
    starting together becomes the root never depends on row order."""
    cand = mine.copy()
    for values, lowest in ((start, True), (end, False), (hi, True), (lo, True)):
        if values.dtype.kind == "u":
            fill = np.iinfo(values.dtype).max if lowest else 0
        else:
            fill = np.iinfo(values.dtype).max if lowest else np.iinfo(values.dtype).min
        masked = np.where(cand, values, fill)
        best = masked.min(axis=1, keepdims=True) if lowest else masked.max(axis=1, keepdims=True)
        cand &= masked == best
    return cand.argmax(axis=1)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _links(
    hi: np.ndarray,
    lo: np.ndarray,
    has: np.ndarray,
    phi: np.ndarray,
    plo: np.ndarray,
    has_parent: np.ndarray,
    copy_key: tuple[np.ndarray, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ``(requests, K)`` block: the parent column of every span (-1 none), ``keep``
    (false for all but one copy of a duplicated span id) and whether the parent was found.

    Of the copies of one span id the one kept is the first by ``copy_key`` (``np.lexsort``
    keys, the last one primary: start, end, ...), then by column; copies equal in every key
    are interchangeable, so the result never depends on row order.

    A 64-bit mix of the two id words finds candidates with one comparison per pair; every
    candidate is then checked on both words, and the few rows where a check fails (an
    orphan, a duplicate, a mix collision) are redone exactly.
    """
    n, k = hi.shape
    cols = np.arange(k)
    mixed = (hi * _MIX) ^ lo
    ordered = np.sort(np.where(has, mixed, cols.astype(np.uint64)), axis=1)
    maybe_dup = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
    keep = np.ones((n, k), bool)
    if maybe_dup.any():
        r = maybe_dup
        same = (hi[r][:, :, None] == hi[r][:, None, :]) & (lo[r][:, :, None] == lo[r][:, None, :])
        same &= has[r][:, :, None] & has[r][:, None, :]
        order = np.lexsort(
            (np.broadcast_to(cols, hi[r].shape),) + tuple(c[r] for c in copy_key), axis=-1
        )
        rank = np.argsort(order, axis=1)
        earlier = rank[:, None, :] < rank[:, :, None]  # [i, j]: copy j comes before i
        keep[r] = ~(earlier & same).any(axis=2)
    pmixed = (phi * _MIX) ^ plo
    parent = (pmixed[:, :, None] == mixed[:, None, :]).argmax(axis=2)
    found = (
        has_parent
        & (np.take_along_axis(hi, parent, axis=1) == phi)
        & (np.take_along_axis(lo, parent, axis=1) == plo)
        & np.take_along_axis(has & keep, parent, axis=1)
        & (parent != cols[None])
    )
    redo = (has_parent & ~found).any(axis=1)
    if redo.any():
        r = redo
        match = (phi[r][:, :, None] == hi[r][:, None, :]) & (
            plo[r][:, :, None] == lo[r][:, None, :]
        )
        match &= (has[r] & keep[r])[:, None, :] & has_parent[r][:, :, None]
        match &= ~np.eye(k, dtype=bool)[None]
        found[r] = match.any(axis=2)
        parent[r] = match.argmax(axis=2)
    return np.where(found, parent, -1), keep, found

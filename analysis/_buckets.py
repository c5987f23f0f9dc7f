"""Iterate requests in blocks of equal span count, as dense ``(requests, spans)`` arrays.

Every request has a handful of spans, so per-request work is done on 2-D arrays with one
row per request: requests with the same span count ``K`` form a bucket, and a bucket is
cut into blocks whose ``rows * K * (2K + 2)`` elements stay under a memory budget. No
padding is needed, and no Python code runs per request.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

ELEMENT_BUDGET = 4_000_000


def iter_blocks(
    counts: np.ndarray, offsets: np.ndarray, budget: int = ELEMENT_BUDGET
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(request_ids, positions)``: ``positions[i, k]`` is the flat index of the
    ``k``-th span of request ``request_ids[i]``.

    Args:
        counts: spans per request.
        offsets: flat index of each request's first span (spans sorted by request).
        budget: the most elements of an ``(rows, K, 2K + 2)`` array one block may need.
    """
    sizes = np.unique(counts)
    for k in sizes[sizes > 0]:
        k = int(k)
        ids = np.flatnonzero(counts == k)
        rows = max(1, budget // (k * (2 * k + 2)))
        cols = np.arange(k)
        for lo in range(0, len(ids), rows):
            block = ids[lo : lo + rows]
            yield block, offsets[block][:, None] + cols


def take_rows(values: np.ndarray, cols: np.ndarray, fill: int = 0) -> np.ndarray:
    """``values[i, cols[i, j]]`` per row, with ``fill`` where ``cols`` is negative or
    ``>= values.shape[1]``."""
    k = values.shape[1]
    ok = (cols >= 0) & (cols < k)
    out = np.take_along_axis(values, np.where(ok, cols, 0), axis=1)
    return np.where(ok, out, fill)


def nearest_ancestor(parent: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """For every column, the nearest ancestor (by ``parent`` columns, -1 = none) whose
    ``keep`` is true; -1 when there is none (cycles included)."""
    q = parent.copy()
    for _ in range(parent.shape[1]):
        hop = (q >= 0) & ~take_rows(keep, q, fill=True)
        if not hop.any():
            break
        q = np.where(hop, take_rows(parent, q, fill=-1), q)
    bad = (q >= 0) & ~take_rows(keep, q, fill=False)
    return np.where(bad, -1, q)

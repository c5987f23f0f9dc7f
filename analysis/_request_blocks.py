"""Iterate requests in blocks of equal span count, as dense ``(requests, spans)`` arrays.

Every request has a handful of spans, so per-request work is done on 2-D arrays with one
row per request: requests with the same span count ``K`` form a bucket, and a bucket is
cut into blocks whose ``rows * K * (2K + 2)`` elements stay under a memory budget. No
padding is needed, and no Python code runs per request.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

import numpy as np

ELEMENT_BUDGET = 4_000_000


class Positions:
    """Where one block's spans lie in the flat span arrays: ``index[i, j]`` is the flat
    index of the ``j``-th span of the block's ``i``-th request. When the block's spans are
    one contiguous run (requests of one span count lying one after another), `take` returns a
    read-only view of it instead of a gathered copy, and `put` writes a slice."""

    def __init__(self, offsets: np.ndarray, k: int):
        self.shape = (len(offsets), k)
        n = len(offsets)
        run = n == 1 or (int(offsets[-1] - offsets[0]) == (n - 1) * k
                         and bool(np.all(np.diff(offsets) == k)))
        self._run = slice(int(offsets[0]), int(offsets[0]) + n * k) if run else None
        self._offsets = offsets

    @cached_property
    def index(self) -> np.ndarray:
        return self._offsets[:, None] + np.arange(self.shape[1])

    def take(self, values: np.ndarray) -> np.ndarray:
        """``values`` at the block's spans, shaped ``(requests, K)``."""
        if self._run is None:
            return values[self.index]
        view = values[self._run].reshape(self.shape)
        view.flags.writeable = False
        return view

    def put(self, values: np.ndarray, block: np.ndarray) -> None:
        """Write ``block`` (``(requests, K)``) to ``values`` at the block's spans."""
        if self._run is None:
            values[self.index] = block
        else:
            values[self._run] = block.reshape(-1)


def iter_blocks(
    counts: np.ndarray, offsets: np.ndarray, budget: int = ELEMENT_BUDGET
) -> Iterator[tuple[np.ndarray, Positions]]:
    """Yield ``(request_ids, positions)``: where the spans of requests ``request_ids`` lie
    (`Positions`).

    Args:
        counts: spans per request.
        offsets: flat index of each request's first span (a request's spans are
            consecutive).
        budget: the most elements of an ``(rows, K, 2K + 2)`` array one block may need.
    """
    sizes = np.unique(counts)
    for k in sizes[sizes > 0]:
        k = int(k)
        ids = np.flatnonzero(counts == k)
        rows = max(1, budget // (k * (2 * k + 2)))
        for lo in range(0, len(ids), rows):
            block = ids[lo : lo + rows]
            yield block, Positions(offsets[block], k)


def take_rows(values: np.ndarray, cols: np.ndarray, fill: int = 0) -> np.ndarray:
    """``values[i, cols[i, j]]`` per row, with ``fill`` where ``cols`` is negative or
    ``>= values.shape[1]``."""
    n, k = values.shape
    padded = np.empty((n, k + 1), values.dtype)  # a last column of ``fill`` for misses
    padded[:, :k] = values
    padded[:, k] = fill
    flat = np.where((cols >= 0) & (cols < k), cols, k)
    flat += np.arange(0, n * (k + 1), k + 1, dtype=flat.dtype)[:, None]
    return padded.ravel().take(flat)


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


MAX_BITS = 52
"""Widest block whose active columns per segment are the bits of one integer below 2**53,
exact in float64 (`active_bits`)."""


def active_bits(first: np.ndarray, stop: np.ndarray, segments: int) -> np.ndarray:
    """``(N, segments)`` uint64: bit ``j`` set where column ``j`` covers the segment
    (``first[:, j] <= s < stop[:, j]``), for at most `MAX_BITS` columns.

    Each non-empty column toggles its bit where it starts and where it stops, and a prefix
    XOR along the segments accumulates the toggles: ``O(N (K + S))`` instead of a pass over
    the segments per column. Toggles meeting at one position are distinct bits (a column's
    two ends never coincide), so the float64 sums that place them are exact.
    """
    n, k = first.shape
    width = segments + 1
    live = first < stop
    base = np.arange(n)[:, None] * width
    weight = np.broadcast_to(np.ldexp(1.0, np.arange(k)), (n, k))[live]
    at = np.concatenate([(base + first)[live], (base + stop)[live]])
    toggles = np.bincount(at, weights=np.concatenate([weight, weight]), minlength=n * width)
    bits = np.bitwise_xor.accumulate(toggles.astype(np.uint64).reshape(n, width), axis=1)
    return bits[:, :segments]


def row_sums(flat: np.ndarray, ns: np.ndarray, size: int) -> np.ndarray:
    """``bincount(flat, weights=ns)`` in exact int64, for ``(N, S)`` ns values where each
    bin of ``flat`` collects values of one row only.

    float64 bincount is exact while every partial sum stays below 2^53 ns (104 days), which
    ``max |ns| * S`` bounds; windows beyond that are summed with integer ``np.add.at``.
    """
    values = ns.ravel()
    if int(np.abs(ns).max(initial=0)) * max(ns.shape[-1], 1) < 1 << 53:
        total = np.bincount(flat, weights=values.astype(np.float64), minlength=size)
        return np.rint(total).astype(np.int64)
    total = np.zeros(size, np.int64)
    np.add.at(total, flat, values.astype(np.int64))
    return total

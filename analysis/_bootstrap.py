"""The circular block bootstrap of percentiles that :mod:`ttft.analysis.compare` runs.

Requests of one load run are not independent: a request queued behind a slow one is slow
too, and requests batched into one engine step share its prefill and GPU time. Resampling
requests one by one treats them as independent and gives intervals too narrow (two runs of
one workload then differ "significantly" in most stages). So the requests of a trace are
resampled in blocks of consecutive requests, in arrival order, wrapping around at the end
(Politis and Romano's circular block bootstrap), with the block length chosen from the data
(:func:`block_length`). A block of one request is the ordinary bootstrap, drawn exactly as
it.

Each resample is held as counts per request: a metric's order statistics are then found
from the counts laid out in that metric's sorted order (block totals locate the run of
requests, a running sum inside it the position), not by sorting or partitioning the
resample, which is several times faster. Work and memory per resample are
``O(requests x metrics)``; resamples are drawn in batches of bounded size, so 10^5 requests
with 20 stages stay well under 200 MB.
"""

from __future__ import annotations

import math

import numpy as np

from ttft.analysis.summary import PERCENTILES

_DRAW_BYTES = 32 << 20
"""Upper bound on the drawn counts of one batch of resamples."""
_RUN = 256
"""Requests per run of the sorted order when locating order statistics from counts."""


def block_length(values: np.ndarray) -> int:
    """The block length (requests) of the circular block bootstrap for the rows of
    ``values`` (requests in arrival order, one column per metric): the largest over the
    columns of Politis and White's (2004) automatic choice, as corrected by Patton,
    Politis and White (2009), from each column's autocorrelation; 1 for independent
    requests, fewer than 8 requests or constant columns, at most ``min(3 sqrt(n), n / 3)``.
    """
    n = len(values)
    if n < 8:
        return 1
    lags_searched = max(5, math.ceil(math.sqrt(math.log10(n))))
    max_lag = min(math.ceil(math.sqrt(n)) + lags_searched, n - 1)
    cap = min(3 * math.sqrt(n), n / 3)
    threshold = 2 * math.sqrt(math.log10(n) / n)
    best = 1.0
    for column in np.asarray(values, np.float64).T:
        acov = _autocovariance(column, max_lag)
        if not acov[0] > 0:
            continue
        small = np.abs(acov[1:] / acov[0]) < threshold  # small[j]: lag j + 1
        # The smallest m whose next `lags_searched` autocorrelations are all negligible.
        runs = np.convolve(small, np.ones(lags_searched, int), "valid") == lags_searched
        found = np.flatnonzero(runs)
        m_hat = int(found[0]) if len(found) else max_lag
        bandwidth = min(2 * m_hat, max_lag)
        if bandwidth == 0:
            continue
        lags = np.arange(-bandwidth, bandwidth + 1)
        weight = np.clip(2 * (1 - np.abs(lags) / bandwidth), 0, 1)  # flat-top kernel
        cov = acov[np.abs(lags)]
        g = float((weight * np.abs(lags) * cov).sum())
        d = 4 / 3 * float((weight * cov).sum()) ** 2
        if d > 0:
            best = max(best, min(cap, (2 * g * g / d) ** (1 / 3) * n ** (1 / 3)))
    return max(1, math.ceil(best))


def _autocovariance(x: np.ndarray, max_lag: int) -> np.ndarray:
    """Autocovariances (divided by n) of ``x`` at lags 0..``max_lag``, by FFT."""
    n = len(x)
    x = x - x.mean()
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(x, size)
    return np.fft.irfft(spectrum * np.conj(spectrum), size)[: max_lag + 1] / n


def block_counts(rng: np.random.Generator, size: int, n: int, block: int) -> np.ndarray:
    """``size`` circular block resamples of ``n`` requests, as counts per request
    (``(size, n)`` int64, each row summing to ``n``): ``ceil(n / block)`` blocks of
    ``block`` consecutive requests, each starting at a uniform request and wrapping past
    the last, the last block cut so that a resample has ``n`` requests. The starts are one
    ``rng.integers(0, n, (size, blocks))`` draw, so ``block == 1`` is the ordinary
    bootstrap's draw."""
    blocks = -(-n // block)
    starts = rng.integers(0, n, size=(size, blocks))
    if block == 1:
        flat = (starts + np.arange(size)[:, None] * n).ravel()
        return np.bincount(flat, minlength=size * n).reshape(size, n)
    lengths = np.full(blocks, block, np.int64)
    lengths[-1] = n - block * (blocks - 1)
    width = 2 * n  # a block ends before 2n: starts < n, lengths <= n
    offset = np.arange(size)[:, None] * width
    edges = np.bincount((starts + offset).ravel(), minlength=size * width)
    edges -= np.bincount((starts + lengths + offset).ravel(), minlength=size * width)
    covered = np.cumsum(edges.reshape(size, width), axis=1)
    return covered[:, :n] + covered[:, n:]


def bootstrap_percentiles(ms: np.ndarray, resamples: int, rng: np.random.Generator,
                          block: int = 1) -> np.ndarray:
    """Percentiles (``PERCENTILES``, numpy linear) of every metric of ``resamples``
    circular block resamples (:func:`block_counts`) of the rows of ``ms`` (n, m), one set
    of rows per resample for every metric: shape (resamples, m, len(PERCENTILES))."""
    n, m = ms.shape
    # Numpy's linear method on a sorted sample x: x[lo] + g * (x[lo + 1] - x[lo]).
    h = (n - 1) * np.asarray(PERCENTILES, np.float64) / 100
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    g = h - lo
    ranks, inv = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    k = len(ranks)
    # Each metric's requests in ascending order, padded to whole runs with a request
    # index n whose count is always 0 (so a padded position is never an order statistic).
    n_runs = -(-n // _RUN)
    width = n_runs * _RUN
    order = np.full((m, width), n, np.intp)
    order[:, :n] = np.argsort(ms, axis=0, kind="stable").T
    ordered = np.take_along_axis(ms.T, order[:, :n], axis=1)
    ordered = np.concatenate([ordered, np.repeat(ordered[:, -1:], width - n, axis=1)], axis=1)
    dtype = np.int32 if n < 2**31 else np.int64
    # Row j's run totals end at n; offsetting them by j * n makes the flattened running
    # totals ascending, so one searchsorted finds every (metric, rank)'s run.
    offset = np.arange(m, dtype=np.int64)[:, None] * n
    targets = (offset + ranks[None]).ravel()  # (m * k,)
    metric = np.repeat(np.arange(m), k)
    residual_of = np.tile(ranks, m)
    running = np.empty((m, width), dtype)
    runs = running.reshape(m, n_runs, _RUN)
    out = np.empty((resamples, m, len(PERCENTILES)))
    counts = np.zeros(n + 1, dtype)
    batch = max(1, min(resamples, _DRAW_BYTES // (32 * n)))
    for first in range(0, resamples, batch):
        size = min(batch, resamples - first)
        drawn = block_counts(rng, size, n, block)
        for r in range(size):
            counts[:n] = drawn[r]
            np.take(counts, order, out=running)
            totals = np.cumsum(runs.sum(axis=2), axis=1) + offset  # (m, n_runs)
            flat = np.searchsorted(totals.ravel(), targets, side="right")
            run = flat - metric * n_runs
            before = np.where(run > 0, totals.ravel()[flat - 1] - offset[metric, 0], 0)
            # Inside the run: the k-th smallest (0-based) is the first position whose
            # running count exceeds k.
            inside = np.cumsum(runs[metric, run], axis=1)  # (m * k, _RUN)
            step = (inside <= (residual_of - before)[:, None]).sum(axis=1)
            stats = ordered[metric, run * _RUN + step].reshape(m, k)[:, inv]
            out[first + r] = _lerp(stats[:, : len(lo)], stats[:, len(lo) :], g)
    return out


def _lerp(x_lo: np.ndarray, x_hi: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Numpy's interpolation between neighbours (exact at both ends)."""
    diff = x_hi - x_lo
    return np.where(g >= 0.5, x_hi - diff * (1 - g), x_lo + diff * g)

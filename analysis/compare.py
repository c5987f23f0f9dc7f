"""Compare two attributions: percentile deltas per condition, metric and percentile, and
failure rates per condition, with bootstrap confidence intervals. TTFT and stage deltas are
over the requests that did not fail; failures are compared apart (:func:`compare_failures`).

Pure functions (no I/O, no printing). Percentiles are numpy's linear ones over the
requests of a condition, zeros included, as in :mod:`ttft.analysis.summary`; times in ms.

The bootstrap resamples the requests of each trace independently, with replacement, and
uses one set of resampled request indices for every metric of a side, so a request's
stages stay paired with its TTFT. The requests are drawn in the order of their trace ids,
so one process and a dataset's merged partitions (whose requests come in another order)
give the same table. Each resample is held as counts per request: a metric's
order statistics are then found from the counts laid out in that metric's sorted order
(block totals locate the block, a running sum inside it the position), not by sorting or
partitioning the resample, which is several times faster. Work and memory per resample
are ``O(requests x metrics)``; indices are drawn in batches of bounded size, so 10^5
requests with 20 stages stay well under 200 MB.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ttft.analysis.attribution import Attribution
from ttft.analysis.summary import PERCENTILES, Summary
from ttft.tracer.schema import CONDITIONS, OUTCOMES, STAGE_NAMES

_NS_PER_MS = 1e6
_ALL = "all"
_CONDITIONS = (_ALL, *CONDITIONS)
_DRAW_BYTES = 32 << 20
"""Upper bound on the drawn indices (and their counts) of one batch of resamples."""
_BLOCK = 256
"""Requests per block when locating order statistics from running counts."""

COLUMNS = (
    "condition",
    "metric",
    "percentile",
    "a_ms",
    "b_ms",
    "delta_ms",
    "delta_pct",
    "ci_lo_ms",
    "ci_hi_ms",
    "significant",
    "a_requests",
    "b_requests",
)
"""The columns of :func:`compare`'s table, in order."""


def compare(
    a: Attribution,
    b: Attribution,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Percentile deltas of ``b`` against ``a``, with bootstrap confidence intervals.

    Args:
        a: the baseline attribution.
        b: the attribution compared with it (same boundary and policy, as a rule).
        resamples: bootstrap resamples per side and condition (>= 1).
        seed: seed of the resampling (>= 0); the table is a function of the inputs and it.
        confidence: level of the percentile interval, in (0, 1).

    Returns:
        One row per (condition, metric, percentile): ``condition`` in ("all", "cold",
        "prefix_hit"), only those with requests in both traces, "all" first; ``metric``
        "ttft" first, then every stage with attributed time in either trace, in
        ``tracer.schema.STAGE_NAMES`` order, then any other stage column as it appears;
        ``percentile`` in (50, 90, 99). Columns (:data:`COLUMNS`): ``a_ms``, ``b_ms``,
        ``delta_ms`` (b - a), ``delta_pct`` (100 * delta / a, NaN when a == 0),
        ``ci_lo_ms`` / ``ci_hi_ms`` (the bootstrap percentile interval of the delta),
        ``significant`` (the interval excludes 0), ``a_requests``, ``b_requests``.
        Requests whose condition is unknown count only in "all".

    Raises:
        ValueError: ``resamples`` < 1, ``seed`` < 0 or ``confidence`` outside (0, 1).
    """
    _check(resamples, seed, confidence)
    stages = _stages(a, b)
    metrics = ["ttft", *stages]
    orders = [_by_trace_id(side) for side in (a, b)]
    values = [_values(side, stages)[order] for side, order in zip((a, b), orders, strict=True)]
    conds = [side.requests["condition"].to_numpy()[order]
             for side, order in zip((a, b), orders, strict=True)]
    q = ((1 - confidence) / 2, (1 + confidence) / 2)
    frames = []
    for code, cond in enumerate(_CONDITIONS):
        masks = [np.ones(len(c), bool) if cond == _ALL else c == cond for c in conds]
        n_a, n_b = (int(m.sum()) for m in masks)
        if n_a == 0 or n_b == 0:
            continue
        point, boot = [], []
        for side, (vals, mask) in enumerate(zip(values, masks, strict=True)):
            ms = vals[mask] / _NS_PER_MS  # (n, metrics)
            point.append(np.percentile(ms, PERCENTILES, axis=0).T)  # (metrics, P)
            rng = np.random.default_rng([seed, code, side])
            boot.append(_bootstrap(ms, resamples, rng))  # (R, metrics, P)
        delta = point[1] - point[0]
        lo, hi = np.quantile(boot[1] - boot[0], q, axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = np.where(point[0] != 0, 100 * delta / point[0], np.nan)
        frames.append(
            pd.DataFrame(
                {
                    "condition": cond,
                    "metric": np.repeat(metrics, len(PERCENTILES)),
                    "percentile": np.tile(PERCENTILES, len(metrics)),
                    "a_ms": point[0].ravel(),
                    "b_ms": point[1].ravel(),
                    "delta_ms": delta.ravel(),
                    "delta_pct": pct.ravel(),
                    "ci_lo_ms": lo.ravel(),
                    "ci_hi_ms": hi.ravel(),
                    "significant": ((lo > 0) | (hi < 0)).ravel(),
                    "a_requests": n_a,
                    "b_requests": n_b,
                }
            )
        )
    if not frames:
        return _empty()
    return pd.concat(frames, ignore_index=True)


_LOAD_METRICS = (
    ("requests_per_s", "requests/s", lambda s: s.load and s.load["requests_per_s"]),
    ("output_tokens_per_s", "tokens/s", lambda s: s.load and s.load["output_tokens_per_s"]),
    ("e2e_p50", "ms", lambda s: s.load and s.load["e2e_ms"] and s.load["e2e_ms"]["p50"]),
    ("e2e_p99", "ms", lambda s: s.load and s.load["e2e_ms"] and s.load["e2e_ms"]["p99"]),
    ("goodput_share", "fraction", lambda s: s.goodput and s.goodput["share"]),
    ("goodput_per_s", "requests/s", lambda s: s.goodput and s.goodput["per_s"]),
)


def compare_load(a: Summary, b: Summary) -> pd.DataFrame:
    """Load and goodput of two summaries side by side (``Summary.load``, ``goodput``): one
    row per figure either has (``metric``, ``unit``, ``a``, ``b``, ``delta`` = b - a,
    ``delta_pct`` of a), NaN where a summary lacks it (no client span, no SLOs given).

    Raises:
        ValueError: the summaries' goodput is against different SLOs.
    """
    if a.goodput and b.goodput and a.goodput["slo"] != b.goodput["slo"]:
        raise ValueError("the two summaries' goodput is against different SLOs")
    rows = []
    for metric, unit, get in _LOAD_METRICS:
        va, vb = (np.nan if (v := get(s)) is None else float(v) for s in (a, b))
        if np.isnan(va) and np.isnan(vb):
            continue
        rows.append((metric, unit, va, vb, vb - va, (vb - va) / va * 100 if va else np.nan))
    return pd.DataFrame(rows, columns=["metric", "unit", "a", "b", "delta", "delta_pct"])


def regressions(table: pd.DataFrame, max_regression_pct: float) -> pd.DataFrame:
    """Rows of :func:`compare`'s table where TTFT p50 or p99 (any condition) got worse by
    more than ``max_regression_pct`` percent and the change is significant
    (``ci_lo_ms > 0``), in the table's order, index reset."""
    worse = (
        (table["metric"] == "ttft")
        & table["percentile"].isin((50, 99))
        & (table["delta_pct"] > max_regression_pct)
        & (table["ci_lo_ms"] > 0)
    )
    return table[worse].reset_index(drop=True)


FAILURE_COLUMNS = (
    "condition",
    "a_failed",
    "a_requests",
    "b_failed",
    "b_requests",
    "a_rate",
    "b_rate",
    "delta_pp",
    "ci_lo_pp",
    "ci_hi_pp",
    "significant",
    "a_kinds",
    "b_kinds",
)
"""The columns of :func:`compare_failures`'s table, in order."""


def compare_failures(
    a: Attribution,
    b: Attribution,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Failure rates of ``b`` against ``a``, with a bootstrap confidence interval.

    A request counts when it failed (``Attribution.failed``) or was attributed; a side's
    failure count is resampled as a binomial draw of its requests at its observed rate
    (resampling its requests with replacement), ``resamples`` times, seeded per condition
    and side.

    Returns:
        One row per condition (``all`` first, then ``cold`` and ``prefix_hit`` where both
        traces have requests of it), columns :data:`FAILURE_COLUMNS`: counts, rates (a
        fraction), ``delta_pp`` (b - a, percentage points), ``ci_lo_pp``/``ci_hi_pp`` (its
        percentile interval), ``significant`` (the interval excludes 0) and ``a_kinds``/
        ``b_kinds`` (failures by outcome).

    Raises:
        ValueError: as :func:`compare`.
    """
    _check(resamples, seed, confidence)
    q = ((1 - confidence) / 2, (1 + confidence) / 2)
    rows = []
    for code, cond in enumerate(_CONDITIONS):
        sides = []
        for side in (a, b):
            failed = side.failed if cond == _ALL else side.failed[
                side.failed["condition"] == cond]
            ok = len(side.requests) if cond == _ALL else int(
                (side.requests["condition"] == cond).sum())
            sides.append((len(failed), ok + len(failed), failed["outcome"].value_counts()))
        if sides[0][1] == 0 or sides[1][1] == 0:
            continue
        rates, boots = [], []
        for index, (n_failed, n, _) in enumerate(sides):
            rng = np.random.default_rng([seed, code, index, 1])
            rates.append(n_failed / n)
            boots.append(rng.binomial(n, n_failed / n, resamples) / n)
        lo, hi = 100 * np.quantile(boots[1] - boots[0], q)
        rows.append((cond, sides[0][0], sides[0][1], sides[1][0], sides[1][1], rates[0],
                     rates[1], 100 * (rates[1] - rates[0]), lo, hi, bool(lo > 0 or hi < 0),
                     _kinds(sides[0][2]), _kinds(sides[1][2])))
    return pd.DataFrame(rows, columns=list(FAILURE_COLUMNS))


def failure_regressions(table: pd.DataFrame, max_regression_pct: float) -> pd.DataFrame:
    """Rows of :func:`compare_failures`'s table where the failure rate rose significantly
    (``ci_lo_pp > 0``) and by more than ``max_regression_pct`` percent of A's rate (any
    rise, when A had no failures), index reset."""
    worse = (table["ci_lo_pp"] > 0) & (
        table["b_rate"] > table["a_rate"] * (1 + max_regression_pct / 100)
    )
    return table[worse].reset_index(drop=True)


def _kinds(counts: pd.Series) -> dict[str, int]:
    return {kind: int(counts[kind]) for kind in OUTCOMES if kind in counts.index}


def _check(resamples: int, seed: int, confidence: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _empty() -> pd.DataFrame:
    out = pd.DataFrame({name: pd.Series(dtype=float) for name in COLUMNS})
    out = out.astype(
        {
            "condition": object,
            "metric": object,
            "percentile": np.int64,
            "significant": bool,
            "a_requests": np.int64,
            "b_requests": np.int64,
        }
    )
    return out


def _stages(a: Attribution, b: Attribution) -> list[str]:
    """Stages with attributed time in either trace: canonical ones first, then others."""
    used: list[str] = []
    for side in (a, b):
        att = side.attributed
        hit = (att.to_numpy() > 0).any(axis=0) if len(att) else np.zeros(att.shape[1], bool)
        used += [str(name) for name, h in zip(att.columns, hit, strict=True) if h]
    extra = [name for name in dict.fromkeys(used) if name not in STAGE_NAMES]
    return [name for name in STAGE_NAMES if name in used] + extra


def _by_trace_id(side: Attribution) -> np.ndarray:
    """The requests' order by trace id (a request's smallest, unique to it), the order the
    bootstrap draws them in, so the table never depends on the order they came in."""
    return np.argsort(side.requests["trace_id"].to_numpy(dtype=object), kind="stable")


def _values(side: Attribution, stages: list[str]) -> np.ndarray:
    """(requests, 1 + stages) int64 ns: TTFT, then each stage (0 where a column is absent)."""
    n = len(side.requests)
    out = np.zeros((n, 1 + len(stages)), np.int64)
    out[:, 0] = side.requests["ttft_ns"].to_numpy()
    for j, name in enumerate(stages, start=1):
        if name in side.attributed.columns:
            out[:, j] = side.attributed[name].to_numpy()
    return out


def _bootstrap(ms: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Percentiles (``PERCENTILES``, numpy linear) of every metric of ``resamples``
    resamples of the rows of ``ms`` (n, m): shape (resamples, m, len(PERCENTILES))."""
    n, m = ms.shape
    # Numpy's linear method on a sorted sample x: x[lo] + g * (x[lo + 1] - x[lo]).
    h = (n - 1) * np.asarray(PERCENTILES, np.float64) / 100
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    g = h - lo
    ranks, inv = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    k = len(ranks)
    # Each metric's requests in ascending order, padded to whole blocks with a request
    # index n whose count is always 0 (so a padded position is never an order statistic).
    n_blocks = -(-n // _BLOCK)
    width = n_blocks * _BLOCK
    order = np.full((m, width), n, np.intp)
    order[:, :n] = np.argsort(ms, axis=0, kind="stable").T
    ordered = np.take_along_axis(ms.T, order[:, :n], axis=1)
    ordered = np.concatenate([ordered, np.repeat(ordered[:, -1:], width - n, axis=1)], axis=1)
    dtype = np.int32 if n < 2**31 else np.int64
    # Row j's block totals end at n; offsetting them by j * n makes the flattened running
    # totals ascending, so one searchsorted finds every (metric, rank)'s block.
    offset = np.arange(m, dtype=np.int64)[:, None] * n
    targets = (offset + ranks[None]).ravel()  # (m * k,)
    metric = np.repeat(np.arange(m), k)
    residual_of = np.tile(ranks, m)
    running = np.empty((m, width), dtype)
    blocks = running.reshape(m, n_blocks, _BLOCK)
    out = np.empty((resamples, m, len(PERCENTILES)))
    batch = max(1, min(resamples, _DRAW_BYTES // (16 * n)))
    for first in range(0, resamples, batch):
        size = min(batch, resamples - first)
        idx = rng.integers(0, n, size=(size, n))
        idx += np.arange(size)[:, None] * (n + 1)
        counts = np.bincount(idx.ravel(), minlength=size * (n + 1))
        counts = counts.reshape(size, n + 1).astype(dtype)
        del idx
        for r in range(size):
            np.take(counts[r], order, out=running)
            totals = np.cumsum(blocks.sum(axis=2), axis=1) + offset  # (m, n_blocks)
            flat = np.searchsorted(totals.ravel(), targets, side="right")
            block = flat - metric * n_blocks
            before = np.where(block > 0, totals.ravel()[flat - 1] - offset[metric, 0], 0)
            # Inside the block: the k-th smallest (0-based) is the first position whose
            # running count exceeds k.
            inside = np.cumsum(blocks[metric, block], axis=1)  # (m * k, _BLOCK)
            step = (inside <= (residual_of - before)[:, None]).sum(axis=1)
            stats = ordered[metric, block * _BLOCK + step].reshape(m, k)[:, inv]
            out[first + r] = _lerp(stats[:, : len(lo)], stats[:, len(lo) :], g)
    return out


def _lerp(x_lo: np.ndarray, x_hi: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Numpy's interpolation between neighbours (exact at both ends)."""
    diff = x_hi - x_lo
    return np.where(g >= 0.5, x_hi - diff * (1 - g), x_lo + diff * g)

"""Compare two attributions: percentile deltas per condition, metric and percentile, and
failure rates per condition, each with a bootstrap confidence interval and a p-value
corrected for the number of comparisons made. TTFT and stage deltas are over the requests
that did not fail; failures are compared apart (:func:`compare_failures`).

Pure functions (no I/O, no printing). Percentiles are numpy's linear ones over the
requests of a condition, zeros included, as in :mod:`ttft.analysis.summary`; times in ms.

How a row is decided (:data:`CORRECTION`, :data:`FLOOR_MS`, :data:`FLOOR_PCT`):

- the bootstrap resamples each trace's requests in blocks of consecutive requests in
  arrival order (:mod:`ttft.analysis._bootstrap`: requests of one run queue behind and
  batch with each other, so they are not independent), with one set of resampled requests
  for every metric of a side, so a request's stages stay paired with its TTFT. Requests
  are ordered by window start, then trace id, so one process and a dataset's merged
  partitions (whose requests come in another order) give the same table;
- a row's p-value is two-sided, from its delta over the standard deviation of the
  bootstrap deltas (a normal approximation: it resolves p-values far below
  ``1 / resamples``, which a correction over a hundred rows needs);
- the p-values of every tested row of the table (all conditions, TTFT and stages, every
  percentile) are adjusted together by Holm's step-down method, weighted so that the TTFT
  rows carry half the error budget (:data:`TTFT_SHARE`) and the stage rows the other half:
  the chance of flagging any row of two runs of one workload is at most
  ``1 - confidence``;
- a percentile is tested only where each side has at least :data:`TAIL_REQUESTS` requests
  beyond it (p99 from 500 requests, p90 from 50, p50 from 10): a p99 of 200 requests is
  their second largest value, and no resampling of 200 requests tells how far it scatters.
  Rows not tested have no p-value and are no change;
- a row is ``significant`` (a change) when its adjusted p-value is below
  ``1 - confidence`` and its delta is at least the practical floor,
  ``max(floor_ms, floor_pct % of A's value)``: smaller changes are no change, however
  certain.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ttft.analysis._bootstrap import block_length, bootstrap_percentiles
from ttft.analysis.attribution import Attribution
from ttft.analysis.summary import PERCENTILES
from ttft.tracer.schema import CONDITIONS, OUTCOMES, STAGE_NAMES

__all__ = ["COLUMNS", "CORRECTION", "FAILURE_COLUMNS", "FLOOR_MS", "FLOOR_PCT",
           "TAIL_REQUESTS", "TTFT_SHARE", "compare", "compare_failures", "failure_regressions",
           "highest_tested", "holm", "regressions"]

_NS_PER_MS = 1e6
_ALL = "all"
_CONDITIONS = (_ALL, *CONDITIONS)
CORRECTION = "holm"
"""The multiple-comparison correction of every p-value: Holm's step-down method (weighted,
see :data:`TTFT_SHARE`)."""
FLOOR_MS = 0.1
"""The practical floor's absolute part: a smaller delta (ms) is never a change."""
TTFT_SHARE = 0.5
"""The share of the error budget of Holm's correction the TTFT rows carry together (the
stage rows, many more, carry the rest): TTFT, what users and ``--max-regression`` gate on,
is not diluted by the stages that explain it."""
TAIL_REQUESTS = 5
"""A percentile is tested only where each side has at least this many requests beyond it."""
FLOOR_PCT = 1.0
"""The practical floor's relative part: a delta under this percent of A's value is never
a change."""

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
    "p_value",
    "p_holm",
    "floor_ms",
    "significant",
    "a_requests",
    "b_requests",
    "a_block",
    "b_block",
)
"""The columns of :func:`compare`'s table, in order."""


def compare(
    a: Attribution,
    b: Attribution,
    *,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    floor_ms: float = FLOOR_MS,
    floor_pct: float = FLOOR_PCT,
) -> pd.DataFrame:
    """Percentile deltas of ``b`` against ``a``, with bootstrap intervals and Holm-adjusted
    p-values (see the module docstring).

    Args:
        a: the baseline attribution.
        b: the attribution compared with it (same boundary and policy, as a rule).
        resamples: bootstrap resamples per side and condition (>= 1).
        seed: seed of the resampling (>= 0); the table is a function of the inputs and it.
        confidence: level of the percentile interval, in (0, 1); ``1 - confidence`` is the
            level the adjusted p-values are held to.
        floor_ms, floor_pct: the practical floor, ``max(floor_ms, floor_pct % of a_ms)``.

    Returns:
        One row per (condition, metric, percentile): ``condition`` in ("all", "cold",
        "prefix_hit"), only those with requests in both traces, "all" first; ``metric``
        "ttft" first, then every stage with attributed time in either trace, in
        ``tracer.schema.STAGE_NAMES`` order, then any other stage column as it appears;
        ``percentile`` in (50, 90, 99). Columns (:data:`COLUMNS`): ``a_ms``, ``b_ms``,
        ``delta_ms`` (b - a), ``delta_pct`` (100 * delta / a, NaN when a == 0),
        ``ci_lo_ms`` / ``ci_hi_ms`` (the bootstrap percentile interval of the delta, of
        this row alone), ``p_value`` (this row alone) and ``p_holm`` (over every tested
        row; both NaN for a percentile too far in the tail, :func:`highest_tested`),
        ``floor_ms`` (this row's floor), ``significant`` (``p_holm < 1 - confidence`` and
        ``|delta_ms| >= floor_ms``), ``a_requests``, ``b_requests`` and ``a_block`` /
        ``b_block`` (each side's bootstrap block length, requests). Requests whose
        condition is unknown count only in "all".

    Raises:
        ValueError: ``resamples`` < 1, ``seed`` < 0, ``confidence`` outside (0, 1), or a
            negative floor.
    """
    _check(resamples, seed, confidence)
    if not (floor_ms >= 0 and floor_pct >= 0):
        raise ValueError(f"the floor must be non-negative, got {floor_ms} ms, {floor_pct}%")
    stages = _stages(a, b)
    metrics = ["ttft", *stages]
    orders = [_by_arrival(side) for side in (a, b)]
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
        point, boot, blocks = [], [], []
        for side, (vals, mask) in enumerate(zip(values, masks, strict=True)):
            ms = vals[mask] / _NS_PER_MS  # (n, metrics)
            point.append(np.percentile(ms, PERCENTILES, axis=0).T)  # (metrics, P)
            blocks.append(block_length(ms))
            rng = np.random.default_rng([seed, code, side])
            boot.append(bootstrap_percentiles(ms, resamples, rng, blocks[-1]))  # (R, m, P)
        delta = point[1] - point[0]
        deltas = boot[1] - boot[0]
        lo, hi = np.quantile(deltas, q, axis=0)
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
                    "p_value": np.where(np.asarray(PERCENTILES) > highest_tested(
                        min(n_a, n_b)) + 1e-9, np.nan, _p_values(delta, deltas)).ravel(),
                    "a_requests": n_a,
                    "b_requests": n_b,
                    "a_block": blocks[0],
                    "b_block": blocks[1],
                }
            )
        )
    if not frames:
        return _empty()
    out = pd.concat(frames, ignore_index=True)
    p = out["p_value"].to_numpy()
    tested = ~np.isnan(p)
    out["p_holm"] = np.nan
    out.loc[tested, "p_holm"] = holm(p[tested], _weights(out["metric"].to_numpy()[tested]))
    out["floor_ms"] = np.maximum(floor_ms, floor_pct / 100 * out["a_ms"].abs())
    out["significant"] = (out["p_holm"] < 1 - confidence) & (
        out["delta_ms"].abs() >= out["floor_ms"])
    return out[list(COLUMNS)]


def highest_tested(requests: int) -> float:
    """The highest percentile tested with ``requests`` on the smaller side: percentile
    ``P`` is tested when ``requests * (100 - P) / 100 >= TAIL_REQUESTS``."""
    return 100 * (1 - TAIL_REQUESTS / requests) if requests else 0.0


def holm(p_values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Holm's step-down adjustment of ``p_values`` (one family), weighted (Holm 1979): with
    the rows ordered by ``p / w`` ascending, the k-th adjusted value is ``max over j <= k
    of min(1, W_j p_(j) / w_(j))``, ``W_j`` the weight of the rows from the j-th on; a row
    is rejected at level alpha when its adjusted value is below alpha, and the chance of
    rejecting any true one is at most alpha. Equal weights (the default) are Holm's plain
    method, ``(m - j + 1) p_(j)``. Ties keep their order (a stable sort)."""
    p = np.asarray(p_values, np.float64)
    w = np.ones(len(p)) if weights is None else np.asarray(weights, np.float64)
    order = np.argsort(p / w, kind="stable")
    remaining = np.cumsum(w[order][::-1])[::-1]
    adjusted = np.minimum(1.0, np.maximum.accumulate(remaining * p[order] / w[order]))
    out = np.empty(len(p))
    out[order] = adjusted
    return out


def _weights(metric: np.ndarray) -> np.ndarray:
    """Holm weights of the tested rows: the TTFT rows together carry :data:`TTFT_SHARE` of
    the error budget, the stage rows the rest (all of it to one kind when the other has
    no row)."""
    ttft = metric == "ttft"
    n_ttft, n_stage = int(ttft.sum()), int((~ttft).sum())
    share = TTFT_SHARE if n_ttft and n_stage else float(n_ttft > 0)
    return np.where(ttft, share / max(n_ttft, 1), (1 - share) / max(n_stage, 1))


def _p_values(delta: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Two-sided p-values of ``delta`` against 0 with the standard deviation of its
    bootstrap ``deltas`` (resamples on axis 0): 1 for no delta, 0 for a delta no resample
    varies."""
    spread = deltas.std(axis=0, ddof=1 if len(deltas) > 1 else 0)
    out = np.ones(delta.shape)
    for index in np.ndindex(delta.shape):
        if delta[index] == 0:
            continue
        out[index] = (math.erfc(abs(delta[index]) / spread[index] / math.sqrt(2))
                      if spread[index] > 0 else 0.0)
    return out


def regressions(table: pd.DataFrame, max_regression_pct: float) -> pd.DataFrame:
    """Rows of :func:`compare`'s table where TTFT p50 or p99 (any condition) is a change
    (``significant``: after Holm's correction, at or above the floor) for the worse by more
    than ``max_regression_pct`` percent, in the table's order, index reset."""
    worse = (
        (table["metric"] == "ttft")
        & table["percentile"].isin((50, 99))
        & (table["delta_pct"] > max_regression_pct)
        & (table["delta_ms"] > 0)
        & table["significant"]
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
    "p_value",
    "p_holm",
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
    """Failure rates of ``b`` against ``a``, with a bootstrap confidence interval and a
    Holm-adjusted p-value.

    A request counts when it failed (``Attribution.failed``) or was attributed; a side's
    failure count is resampled as a binomial draw of its requests at its observed rate
    (resampling its requests with replacement), ``resamples`` times, seeded per condition
    and side. The p-value is :func:`compare`'s normal approximation; the rows of this table
    are their own family for Holm's correction.

    Returns:
        One row per condition (``all`` first, then ``cold`` and ``prefix_hit`` where both
        traces have requests of it), columns :data:`FAILURE_COLUMNS`: counts, rates (a
        fraction), ``delta_pp`` (b - a, percentage points), ``ci_lo_pp``/``ci_hi_pp`` (its
        percentile interval), ``p_value``, ``p_holm`` (adjusted over the rows),
        ``significant`` (``p_holm < 1 - confidence``) and ``a_kinds``/``b_kinds``
        (failures by outcome).

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
        delta = np.array([rates[1] - rates[0]])
        p = float(_p_values(delta, (boots[1] - boots[0])[:, None])[0])
        rows.append((cond, sides[0][0], sides[0][1], sides[1][0], sides[1][1], rates[0],
                     rates[1], 100 * delta[0], lo, hi, p, p, False,
                     _kinds(sides[0][2]), _kinds(sides[1][2])))
    out = pd.DataFrame(rows, columns=list(FAILURE_COLUMNS))
    out["p_holm"] = holm(out["p_value"].to_numpy())
    out["significant"] = out["p_holm"] < 1 - confidence
    return out


def failure_regressions(table: pd.DataFrame, max_regression_pct: float) -> pd.DataFrame:
    """Rows of :func:`compare_failures`'s table where the failure rate rose significantly
    (``significant``, after Holm's correction) and by more than ``max_regression_pct``
    percent of A's rate (any rise, when A had no failures), index reset."""
    worse = table["significant"] & (table["delta_pp"] > 0) & (
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
            "a_block": np.int64,
            "b_block": np.int64,
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


def _by_arrival(side: Attribution) -> np.ndarray:
    """The requests' order by window start, ties by trace id (a request's smallest, unique
    to it): the order the block bootstrap takes consecutive requests in, which never
    depends on the order they came in."""
    by_id = np.argsort(side.requests["trace_id"].to_numpy(dtype=object), kind="stable")
    return by_id[np.argsort(side.requests["a_ns"].to_numpy()[by_id], kind="stable")]


def _values(side: Attribution, stages: list[str]) -> np.ndarray:
    """(requests, 1 + stages) int64 ns: TTFT, then each stage (0 where a column is absent)."""
    n = len(side.requests)
    out = np.zeros((n, 1 + len(stages)), np.int64)
    out[:, 0] = side.requests["ttft_ns"].to_numpy()
    for j, name in enumerate(stages, start=1):
        if name in side.attributed.columns:
            out[:, j] = side.attributed[name].to_numpy()
    return out

"""Prefill scaling: a request's own prefill compute time against the prompt tokens computed.

The time is the request's ``prefill.chunk`` spans summed, not its ``prefill`` envelope,
which also holds the steps of other requests between its chunks. The tokens are its
chunks' ``chunk_tokens`` summed (prompt minus cached). Attention does quadratic pairwise
work and the projections linear work (DESIGN.md), so the fit is ``a + b·n + c·n²`` by least
squares, with R², separately per condition (``cold``, ``prefix_hit``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import _columns as col
from ttft.analysis._conditions import conditions, first_request_ids, max_cached
from ttft.tracer.schema import ATTR_CHUNK_TOKENS, CONDITIONS

POINT_COLUMNS = (
    "trace_id",
    "request_id",
    "condition",
    "computed_tokens",
    "cached_tokens",
    "chunks",
    "compute_ns",
)


@dataclass(frozen=True)
class QuadraticFit:
    """``time_ns ≈ a_ns + b_ns_per_token·n + c_ns_per_token2·n²`` over ``points`` requests.

    ``r2`` is the coefficient of determination ``1 - SS_res / SS_tot`` (1.0 when all
    times are equal).
    """

    a_ns: float
    b_ns_per_token: float
    c_ns_per_token2: float
    r2: float
    points: int

    def predict_ns(self, tokens: np.ndarray) -> np.ndarray:
        """The fitted time (float ns) for each token count in ``tokens``."""
        n = np.asarray(tokens, dtype=np.float64)
        return self.a_ns + n * (self.b_ns_per_token + n * self.c_ns_per_token2)


def prefill_points(table: pa.Table) -> pd.DataFrame:
    """One point per request: its prefill compute time and the tokens it computed.

    Args:
        table: spans with `ttft.tracer.schema.SPAN_SCHEMA`; a request is a trace.

    Returns:
        One row per trace with at least one ``prefill.chunk`` span, in order of the
        trace's first row: ``trace_id``, ``request_id`` (the trace's smallest non-null one),
        ``condition`` (``cold``, ``prefix_hit`` or None: ``cached_tokens`` of the
        ``server`` span, else of the ``prefill`` and ``prefill.chunk`` spans, as in
        ``analysis.assemble``), ``computed_tokens`` (the chunks' ``chunk_tokens`` summed),
        ``cached_tokens`` (the largest on its chunks and ``prefill`` spans, 0 if absent),
        ``chunks`` (count) and ``compute_ns`` (the chunks' durations summed, a negative
        duration counted as 0). A trace with a chunk lacking a non-negative integer
        ``chunk_tokens`` is dropped.
    """
    if table.num_rows == 0:
        return _empty_points()
    trace, trace_values = col.codes(table.column("trace_id"))
    stage, stage_values = col.codes(table.column("stage"))
    attrs = table.column("attributes")

    def rows_of(*names: str) -> np.ndarray:
        codes = [stage_values.index(s) for s in names if s in stage_values]
        return np.flatnonzero(np.isin(stage, codes) & (trace >= 0))

    chunk_rows = rows_of("prefill.chunk")
    if len(chunk_rows) == 0:
        return _empty_points()
    n_traces = len(trace_values)
    dur_ns = (
        col.int64(table.column("end_ns"))[chunk_rows]
        - col.int64(table.column("start_ns"))[chunk_rows]
    )
    tokens = col.int_attribute(attrs, chunk_rows, ATTR_CHUNK_TOKENS)
    owner = trace[chunk_rows]
    chunks = np.bincount(owner, minlength=n_traces)
    computed = np.zeros(n_traces, np.int64)
    np.add.at(computed, owner, np.maximum(tokens, 0))
    compute_ns = np.zeros(n_traces, np.int64)
    np.add.at(compute_ns, owner, np.maximum(dur_ns, 0))
    bad = np.zeros(n_traces, bool)
    bad[owner[tokens < 0]] = True

    cached = max_cached(attrs, rows_of("prefill", "prefill.chunk"), trace, n_traces)
    condition = conditions(max_cached(attrs, rows_of("server"), trace, n_traces), cached)

    keep = np.flatnonzero((chunks > 0) & ~bad)
    return pd.DataFrame(
        {
            # object columns keep None (pandas would infer strings with NaN)
            "trace_id": pd.Series(np.asarray(trace_values, dtype=object)[keep], dtype=object),
            "request_id": pd.Series(first_request_ids(table, trace, n_traces)[keep], dtype=object),
            "condition": pd.Series(condition[keep], dtype=object),
            "computed_tokens": computed[keep],
            "cached_tokens": np.maximum(cached[keep], 0),
            "chunks": chunks[keep].astype(np.int64),
            "compute_ns": compute_ns[keep],
        }
    )


def fit_quadratic(tokens: np.ndarray, ns: np.ndarray) -> QuadraticFit | None:
    """Least-squares fit of ``ns ≈ a + b·n + c·n²`` with ``n = tokens``.

    Solved by ``np.linalg.lstsq`` on the columns ``[1, n/s, (n/s)²]`` with ``s`` the
    largest ``|n|`` (for conditioning), then scaled back. Pairs with a non-finite value
    are ignored.

    Returns:
        The fit, or None with fewer than 3 distinct token counts.

    Raises:
        ValueError: ``tokens`` and ``ns`` differ in length.
    """
    n = np.asarray(tokens, dtype=np.float64).ravel()
    y = np.asarray(ns, dtype=np.float64).ravel()
    if len(n) != len(y):
        raise ValueError(f"tokens ({len(n)}) and ns ({len(y)}) differ in length")
    finite = np.isfinite(n) & np.isfinite(y)
    n, y = n[finite], y[finite]
    if len(np.unique(n)) < 3:
        return None
    scale = float(np.abs(n).max())
    x = n / scale
    design = np.column_stack([np.ones_like(x), x, x * x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    ss_res = float(residual @ residual)
    centred = y - y.mean()
    ss_tot = float(centred @ centred)
    r2 = 1.0 if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return QuadraticFit(
        a_ns=float(coef[0]),
        b_ns_per_token=float(coef[1] / scale),
        c_ns_per_token2=float(coef[2] / scale**2),
        r2=r2,
        points=len(n),
    )


def prefill_fits(points: pd.DataFrame) -> dict[str, QuadraticFit]:
    """The fit of ``compute_ns`` on ``computed_tokens`` per condition of `prefill_points`.

    Returns:
        ``{condition: fit}`` for ``cold`` and ``prefix_hit`` (in that order) where that
        condition has points with at least 3 distinct token counts; requests of unknown
        condition are in neither.
    """
    fits: dict[str, QuadraticFit] = {}
    if points.empty:
        return fits
    condition = points["condition"].to_numpy(dtype=object)
    for name in CONDITIONS:
        mask = condition == name
        fit = fit_quadratic(
            points["computed_tokens"].to_numpy()[mask], points["compute_ns"].to_numpy()[mask]
        )
        if fit is not None:
            fits[name] = fit
    return fits


def _empty_points() -> pd.DataFrame:
    dtypes = {"trace_id": object, "request_id": object, "condition": object}
    return pd.DataFrame({c: pd.Series(dtype=dtypes.get(c, "int64")) for c in POINT_COLUMNS})

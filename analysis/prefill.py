"""Prefill scaling: a request's own prefill compute time against the prompt tokens computed.

The time is the request's ``prefill.chunk`` spans summed, not its ``prefill`` envelope,
which also holds the steps of other requests between its chunks. The tokens are its
chunks' ``chunk_tokens`` summed (prompt minus cached). Attention does quadratic pairwise
work and the projections linear work (docs/design.md), so the fit is ``a + b·n + c·n²`` by least
squares, with R², separately per condition (``cold``, ``prefix_hit``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ttft.analysis import _column_arrays as col
from ttft.analysis._conditions import max_cached
from ttft.analysis._request_columns import request_columns
from ttft.analysis.assemble import Assembly
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
    times are equal). A least-squares fit can give a term below zero (a negative fixed
    cost or per-token cost) that no prefill has: `negative_terms` names them, and such a
    fit describes the lengths measured, not a cost model to read elsewhere.
    """

    a_ns: float
    b_ns_per_token: float
    c_ns_per_token2: float
    r2: float
    points: int

    @property
    def negative_terms(self) -> tuple[str, ...]:
        """The names (``a``, ``b``, ``c``) of the coefficients below zero, in that order."""
        terms = zip("abc", (self.a_ns, self.b_ns_per_token, self.c_ns_per_token2), strict=True)
        return tuple(name for name, value in terms if value < 0)

    def predict_ns(self, tokens: np.ndarray) -> np.ndarray:
        """The fitted time (float ns) for each token count in ``tokens``."""
        n = np.asarray(tokens, dtype=np.float64)
        return self.a_ns + n * (self.b_ns_per_token + n * self.c_ns_per_token2)


def prefill_points(asm: Assembly) -> pd.DataFrame:
    """One point per request: its prefill compute time and the tokens it computed.

    Args:
        asm: the assembled trace (`ttft.analysis.assemble.assemble`); a request is one of
            ``asm.requests`` (traces sharing a ``request_id`` are one). Only its valid rows
            are used: a chunk the assembly counts as a defect (a missing field, an end
            before the start) is no chunk.

    Returns:
        One row per request with at least one ``prefill.chunk`` span, in the order of
        ``asm.requests``: ``trace_id``, ``request_id`` and ``condition`` (``cold``,
        ``prefix_hit`` or None) of the request as ``asm.requests`` has them,
        ``computed_tokens`` (the chunks' ``chunk_tokens`` summed), ``cached_tokens`` (the
        largest on its chunks and ``prefill`` spans, 0 if absent), ``chunks`` (count) and
        ``compute_ns`` (the chunks' durations summed). A request with a chunk lacking a
        non-negative integer ``chunk_tokens`` is dropped.
    """
    rows = asm.rows
    chunk_rows = rows.of("prefill.chunk", requests_only=True)
    if len(chunk_rows) == 0:
        return _empty_points()
    n_req = len(asm.requests)
    attrs = rows.table.column("attributes")
    dur_ns = rows.end_ns[chunk_rows] - rows.start_ns[chunk_rows]
    tokens = col.int_attribute(attrs, chunk_rows, ATTR_CHUNK_TOKENS)
    owner = rows.req[chunk_rows]
    chunks = np.bincount(owner, minlength=n_req)
    computed = np.zeros(n_req, np.int64)
    np.add.at(computed, owner, np.maximum(tokens, 0))
    compute_ns = np.zeros(n_req, np.int64)
    np.add.at(compute_ns, owner, dur_ns)
    bad = np.zeros(n_req, bool)
    bad[owner[tokens < 0]] = True
    cached = max_cached(
        attrs, rows.of("prefill", "prefill.chunk", requests_only=True), rows.req, n_req
    )

    keep = np.flatnonzero((chunks > 0) & ~bad)
    return pd.DataFrame(
        {
            **request_columns(asm, keep, "trace_id", "request_id", "condition"),
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

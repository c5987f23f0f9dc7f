"""Prefill scaling: own chunk time per request, and the quadratic fit per condition."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _build import row, table, tid

from ttft.analysis.assemble import assemble
from ttft.analysis.prefill import (
    POINT_COLUMNS,
    QuadraticFit,
    fit_quadratic,
    prefill_fits,
    prefill_points,
)

COLD = (2e6, 3e4, 15.0)  # a ns, b ns/token, c ns/token²
HIT = (1e6, 5e4, 25.0)


def requests(rng: np.random.Generator, count: int, abc, cached: int, first: int) -> list[dict]:
    """``count`` requests (traces ``first``…) with 1-4 chunks whose durations sum to
    ``(a + b n + c n²) · (1 ± 1 %)``; 1 ms gaps between chunks inside the envelope."""
    a, b, c = abc
    rows = []
    for t in range(first, first + count):
        n = int(rng.integers(16, 4097))
        total_ns = int(round((a + b * n + c * n * n) * rng.uniform(0.99, 1.01)))
        k = int(rng.integers(1, 5))
        tokens = np.diff(np.r_[0, np.sort(rng.choice(np.arange(1, n), k - 1, replace=False)), n])
        durs = np.diff(np.r_[0, np.sort(rng.integers(0, total_ns, k - 1)), total_ns])
        base = t * 10**10
        starts = base + np.r_[0, np.cumsum(durs[:-1] + 1_000_000)]
        rows.append(row(t, 1, "prefill", base, int(starts[-1] + durs[-1]), cached_tokens=cached))
        for i in range(k):
            rows.append(
                row(
                    t,
                    2 + i,
                    "prefill.chunk",
                    int(starts[i]),
                    int(starts[i] + durs[i]),
                    parent=1,
                    request_id=f"r{t}",
                    step_id=t * 10 + i,
                    chunk_tokens=int(tokens[i]),
                    cached_tokens=cached,
                )
            )
    return rows


def assert_recovers(fit: QuadraticFit, abc, mean_ns: float) -> None:
    a, b, c = abc
    assert fit.b_ns_per_token == pytest.approx(b, rel=0.02)
    assert fit.c_ns_per_token2 == pytest.approx(c, rel=0.02)
    # 1 % noise on times of ~1e8 ns swamps a 1e6 ns intercept relative to itself, so the
    # intercept is checked against the mean time instead: within 1 % of it.
    assert abs(fit.a_ns - a) < 0.01 * mean_ns
    assert fit.r2 > 0.99


def test_fit_recovers_a_noisy_quadratic():
    rows = requests(np.random.default_rng(7), 200, COLD, 0, 1)
    points = prefill_points(assemble(table(rows)))
    assert len(points) == 200 and set(points["condition"]) == {"cold"}
    fit = fit_quadratic(points["computed_tokens"].to_numpy(), points["compute_ns"].to_numpy())
    assert fit is not None and fit.points == 200
    assert_recovers(fit, COLD, points["compute_ns"].mean())


def test_fits_per_condition_recover_different_quadratics():
    rng = np.random.default_rng(11)
    rows = requests(rng, 200, COLD, 0, 1) + requests(rng, 200, HIT, 256, 1001)
    points = prefill_points(assemble(table(rows)))
    fits = prefill_fits(points)
    assert list(fits) == ["cold", "prefix_hit"]
    assert fits["cold"].points == 200 and fits["prefix_hit"].points == 200
    for name, abc in (("cold", COLD), ("prefix_hit", HIT)):
        mean_ns = points.loc[points["condition"] == name, "compute_ns"].mean()
        assert_recovers(fits[name], abc, mean_ns)
    assert set(points.loc[points["condition"] == "prefix_hit", "cached_tokens"]) == {256}


def test_exact_quadratic_and_constant_times():
    n = np.array([1, 2, 3, 10, 1000])
    fit = fit_quadratic(n, 7.0 + 3.0 * n + 0.5 * n * n)
    coefs = (fit.a_ns, fit.b_ns_per_token, fit.c_ns_per_token2, fit.r2)
    assert coefs == pytest.approx((7.0, 3.0, 0.5, 1.0), rel=1e-9) and fit.points == 5
    np.testing.assert_allclose(fit.predict_ns(np.array([0, 4])), [7.0, 27.0])
    flat = fit_quadratic(np.array([1, 2, 3]), np.array([5, 5, 5]))
    assert flat.r2 == 1.0 and flat.a_ns == pytest.approx(5.0)
    assert flat.b_ns_per_token == pytest.approx(0.0, abs=1e-9)


def test_negative_terms_are_named():
    n = np.array([128, 512, 2048])
    fit = fit_quadratic(n, 1e6 - 600.0 * n + 11.0 * n * n)  # an exact fit with b < 0
    assert fit.negative_terms == ("b",)
    assert fit_quadratic(n, 1e6 + 600.0 * n + 11.0 * n * n).negative_terms == ()
    both = QuadraticFit(a_ns=-1.0, b_ns_per_token=2.0, c_ns_per_token2=-3.0, r2=0.5, points=3)
    assert both.negative_terms == ("a", "c")


def test_fewer_than_three_distinct_token_counts_give_none():
    assert fit_quadratic(np.array([10, 10, 20, 20]), np.array([1.0, 2.0, 3.0, 4.0])) is None
    assert fit_quadratic(np.array([]), np.array([])) is None
    with pytest.raises(ValueError):
        fit_quadratic(np.array([1, 2, 3]), np.array([1.0, 2.0]))
    points = prefill_points(assemble(table(requests(np.random.default_rng(1), 2, COLD, 0, 1))))
    assert prefill_fits(points) == {}


def test_compute_time_is_the_chunks_not_the_envelope():
    rows = [
        row(1, 1, "server", 0, 10_000, cached_tokens=16, request_id="r1"),
        row(1, 2, "prefill", 100, 9_000),  # holds other requests' steps between the chunks
        row(1, 3, "prefill.chunk", 100, 200, parent=2, chunk_tokens=64, cached_tokens=16),
        row(1, 4, "prefill.chunk", 8_950, 9_000, parent=2, chunk_tokens=32),
        row(2, 1, "prefill", 0, 500, cached_tokens=0),
        row(2, 2, "prefill.chunk", 0, 500, parent=1, chunk_tokens=8),
    ]
    points = prefill_points(assemble(table(rows)))
    assert points.to_dict("records") == [
        {
            "trace_id": tid(1),
            "request_id": "r1",
            "condition": "prefix_hit",
            "computed_tokens": 96,
            "cached_tokens": 16,
            "chunks": 2,
            "compute_ns": 150,
        },
        {
            "trace_id": tid(2),
            "request_id": None,
            "condition": "cold",
            "computed_tokens": 8,
            "cached_tokens": 0,
            "chunks": 1,
            "compute_ns": 500,
        },
    ]


def test_traces_sharing_a_request_id_are_one_point():
    rows = [
        row(1, 1, "server", 0, 1_000, cached_tokens=16, request_id="r1"),
        row(2, 1, "prefill.chunk", 0, 100, chunk_tokens=32, cached_tokens=16, request_id="r1"),
        row(3, 1, "prefill.chunk", 200, 250, chunk_tokens=16, request_id="r1"),
        row(4, 1, "prefill.chunk", 50, 40, chunk_tokens=4),  # end before start: no chunk
    ]
    assert prefill_points(assemble(table(rows))).to_dict("records") == [
        {
            "trace_id": tid(1),
            "request_id": "r1",
            "condition": "prefix_hit",
            "computed_tokens": 48,
            "cached_tokens": 16,
            "chunks": 2,
            "compute_ns": 150,
        }
    ]


def test_requests_without_chunk_tokens_are_dropped():
    rows = [
        row(1, 1, "prefill.chunk", 0, 10, chunk_tokens=4),
        row(1, 2, "prefill.chunk", 20, 30),  # size unknown: the request's total is unknown
        row(2, 1, "prefill.chunk", 0, 10, chunk_tokens="4"),
        row(3, 1, "prefill.chunk", 0, 10, chunk_tokens=4),
        row(4, 1, "queue", 0, 10),  # no chunks: no point
    ]
    rows[-2]["attributes"] = "{broken"
    rows.append(row(5, 1, "prefill.chunk", 0, 10, chunk_tokens=2))
    points = prefill_points(assemble(table(rows)))
    assert list(points["trace_id"]) == [tid(5)]
    assert points["condition"].tolist() == [None] and points["cached_tokens"].tolist() == [0]


def test_empty_input_gives_the_columns():
    for rows in ([], [row(1, 1, "queue", 0, 10)]):
        points = prefill_points(assemble(table(rows)))
        assert list(points.columns) == list(POINT_COLUMNS) and len(points) == 0
        assert prefill_fits(points) == {}
    assert prefill_fits(pd.DataFrame(columns=list(POINT_COLUMNS))) == {}

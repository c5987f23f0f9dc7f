"""The offered, achieved and steady rates every load-sending command reports, on known
event times: a schedule's own rate, completions that track arrivals, a closed loop's rate
with its warm-up left out and a spread that holds the true rate."""

from __future__ import annotations

import numpy as np
import pytest

from ttft.collectors import workloads
from ttft.collectors.load_rates import LoadClock, LoadRates, offered_rate, steady_rate
from ttft.collectors.loadgen import RequestResult


def test_the_offered_rate_is_the_schedules_own_not_the_nominal_one():
    assert offered_rate(workloads.constant(4.0, 9)) == pytest.approx(4.0)
    drawn = workloads.poisson(1.0, 200, seed=0)
    # this seed's 199 gaps average 1.13 s: the schedule offers 0.88/s, not 1/s
    assert offered_rate(drawn) == pytest.approx(199 / drawn[-1])
    assert offered_rate(drawn) == pytest.approx(0.884, abs=0.001)
    assert offered_rate(workloads.burst(8)) is None
    assert offered_rate([0.0]) is None and offered_rate([]) is None


def test_kept_up_compares_achieved_with_offered_at_85_percent():
    def rates(offered, achieved):
        return LoadRates(10, 10, 1.0, offered, achieved)

    assert rates(4.0, 3.5).kept_up() is True
    assert rates(4.0, 3.39).kept_up() is False  # 84.75%
    assert rates(4.0, 1.68).kept_up() is False
    assert rates(None, 1.68).kept_up() is None  # a closed loop offers no rate
    assert rates(4.0, None).kept_up() is None


def test_the_clock_counts_completions_and_skips_failures():
    clock = LoadClock()
    for i in range(3):
        clock.on_sent(i)
    clock.on_result(RequestResult(0, "a" * 32))
    clock.on_result(RequestResult(1, "b" * 32, error="HTTP 503"))
    clock.on_result(RequestResult(2, "c" * 32))
    load = clock.rates([0.0, 0.5, 1.0])
    assert (load.requests, load.completed, load.offered_rate_per_s) == (3, 2, 2.0)
    assert clock.first_error == "HTTP 503"
    span_s = (clock.completion_ns[1] - clock.completion_ns[0]) / 1e9
    assert load.achieved_rate_per_s == pytest.approx(1 / span_s)
    assert load.load_s >= span_s > 0


def _closed_loop_ns(rate_per_s: float, n: int, in_flight: int, seed: int | None,
                    warmup: int = 0, slow_s: float = 0.0) -> list[int]:
    """Completion times of a batching server: ``in_flight`` finish together, after rounds
    of mean ``in_flight / rate_per_s`` (gamma, shape 4: ±50%; exact with ``seed`` None);
    the first ``warmup`` rounds take ``slow_s`` longer."""
    mean_s = in_flight / rate_per_s
    rounds = (np.full(n // in_flight, mean_s) if seed is None
              else np.random.default_rng(seed).gamma(4.0, mean_s / 4.0, n // in_flight))
    rounds[:warmup] += slow_s
    ends_s = np.cumsum(rounds)
    return [int(t * 1e9) for t in np.repeat(ends_s, in_flight)]


def test_the_steady_rate_leaves_the_warm_up_out():
    times_ns = _closed_loop_ns(5.0, 48, 8, seed=None, warmup=1, slow_s=3.0)
    # counting from the first completion, slow round and all: 48 in 12.6 s, 3.8/s
    assert 48 / (times_ns[-1] / 1e9) == pytest.approx(3.81, abs=0.01)
    estimate = steady_rate(times_ns, skip=8, batch=8)
    assert estimate is not None
    assert (estimate.completions, estimate.seconds) == (40, pytest.approx(8.0))
    assert estimate.rate_per_s == pytest.approx(5.0)
    assert estimate.spread_per_s == pytest.approx(0.0, abs=1e-6)  # every round alike


def test_the_spread_holds_the_true_rate_about_95_times_in_100():
    held, widths = 0, []
    for seed in range(400):
        estimate = steady_rate(_closed_loop_ns(5.0, 48, 8, seed=seed), skip=8, batch=8)
        assert estimate is not None and estimate.completions == 40
        widths.append(estimate.relative_spread)
        held += abs(estimate.rate_per_s - 5.0) <= estimate.spread_per_s
    assert 360 <= held <= 400  # 95% intervals: 380 expected
    # rounds of ±50%: five pin the rate to about ±60% (t = 2.78), 45 to about ±15%
    assert 0.4 < float(np.median(widths)) < 0.8
    many = [steady_rate(_closed_loop_ns(5.0, 368, 8, seed=s), skip=8, batch=8)
            for s in range(50)]
    assert 0.1 < float(np.median([e.relative_spread for e in many])) < 0.2


def test_too_few_completions_give_no_rate():
    times_ns = _closed_loop_ns(5.0, 40, 8, seed=0)
    assert steady_rate(times_ns, skip=8, batch=8) is None  # 4 batches after the warm-up
    assert steady_rate(times_ns, skip=8, batch=8, min_batches=2) is not None
    with pytest.raises(ValueError, match="skip >= 1"):
        steady_rate(times_ns, skip=0, batch=8)

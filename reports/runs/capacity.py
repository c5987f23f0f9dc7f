"""The capacity probe ``ttft demo`` runs first: what the reference server sustains here.

A closed loop on a server of its own, untraced, until the completion rate after the warm-up
is known to ``PROBE_TOLERANCE`` (the 95% interval of batch means,
:func:`ttft.collectors.load_rates.steady_rate`), or ``PROBE_MAX_S`` passed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ttft.collectors import loadgen, workloads
from ttft.collectors.load_rates import LoadClock, RateEstimate, steady_rate
from ttft.collectors.trace_run import TraceSpec, build_workload

__all__ = ["PROBE_CONCURRENCY", "PROBE_MAX_S", "PROBE_TOLERANCE", "Capacity", "demo_mix",
           "probe_capacity"]

PROBE_CONCURRENCY = 8
"""Requests the probe keeps in flight: enough that the reference server's batches are full
on a 2-core CPU (it completes about 30% more with 8 than with 4, and no more with 16)."""
PROBE_TOLERANCE = 0.10
"""The probe stops once its rate's 95% interval is within this share of it (the stop rule
itself biases that interval a little narrow, so it aims below the 15% it promises)."""
PROBE_MAX_S = 30.0
"""…or at the first completion after this many seconds, whatever the spread then."""
PROBE_MIN_BATCHES = 5
"""Batches of ``PROBE_CONCURRENCY`` completions the rate needs at least, after the warm-up."""
PROBE_REQUESTS = 160
"""The probe's workload: more than a 2-core CPU completes in ``PROBE_MAX_S``; a faster
machine ends the probe by its tolerance long before they run out."""


@dataclass(frozen=True)
class Capacity:
    """What the reference server sustained in the probe's closed loop.

    Attributes:
        rate_per_s: completions per second after the warm-up (the first
            ``concurrency`` completions, one round of the loop, are left out).
        spread_per_s: half-width of the rate's 95% interval (batch means).
        completions: completions the rate counts.
        seconds: the time those span.
        concurrency: requests kept in flight.
        probe_s: the probe's whole closed loop, warm-up included.
    """

    rate_per_s: float
    spread_per_s: float
    completions: int
    seconds: float
    concurrency: int
    probe_s: float

    @property
    def settled(self) -> bool:
        """True when the spread is within ``PROBE_TOLERANCE`` of the rate."""
        return self.spread_per_s <= PROBE_TOLERANCE * self.rate_per_s


def demo_mix(context_tokens: int, max_tokens: int) -> dict[str, Any]:
    """The demo's requests as ``TraceSpec`` fields: prompts of varied lengths that fit the
    model's context with the output, a third of them sharing one of four prefixes."""
    longest = max(96, min(400, (context_tokens - max_tokens) * 3 // 4))
    return {"prompt_tokens": (80, longest), "output_tokens": max_tokens,
            "shared_prefix": (4, 50), "prefix_tokens": 64, "shared_fraction": 1 / 3}


async def _closed_loop(url: str, items: list[workloads.WorkItem], model: str,
                       concurrency: int, max_s: float) -> tuple[LoadClock, RateEstimate | None]:
    """Run ``items`` ``concurrency`` at a time (after one warm-up request) until the rate is
    settled or ``max_s`` passed; in-flight requests are cancelled."""
    task: asyncio.Task[list[loadgen.RequestResult]] | None = None
    estimate: RateEstimate | None = None
    stopped = False

    def stop_when_settled(result: loadgen.RequestResult) -> None:
        nonlocal estimate, stopped
        if stopped:  # completions racing the cancel must not replace the settled estimate
            return
        if result.error is None:
            estimate = steady_rate(clock.completion_ns, skip=concurrency, batch=concurrency,
                                   min_batches=PROBE_MIN_BATCHES)
        settled = estimate is not None and estimate.relative_spread <= PROBE_TOLERANCE
        if task is not None and (settled or clock.load_s >= max_s):
            stopped = True
            task.cancel()

    clock = LoadClock(on_result=stop_when_settled)
    task = asyncio.ensure_future(loadgen.run(
        url, items, model=model, concurrency=concurrency, warmup=1,
        on_sent=clock.on_sent, on_result=clock.on_result))
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # Ctrl-C, not the stop rule
            raise
    return clock, estimate


def probe_capacity(model: str = "small", *, max_tokens: int = 16, seed: int = 0,
                   concurrency: int = PROBE_CONCURRENCY,
                   max_s: float = PROBE_MAX_S) -> Capacity:
    """Measure what the reference server serving ``model`` on CPU sustains on this machine.

    A server of its own (fresh engine, same model, seed and configuration as the demo's) on
    a loopback port gets the demo's requests (same prompt mix and output length, prompts
    fitted through ``/tokenize``, seeded: the same prompts every time), ``concurrency`` in
    flight, until the rate's 95% interval is within ``PROBE_TOLERANCE`` or, at the latest,
    the first completion ``max_s`` after the first send (or the workload ran out); then, on
    a machine too slow for ``PROBE_MIN_BATCHES`` batches, the rate comes from fewer (or
    single-completion) batches, with the wider spread that gives (``Capacity.settled``
    False). The
    probe records no spans unless this process's tracing is configured (:func:`run_demo`
    configures its own only after the probe), and its engine, prefix cache included, is
    gone when it returns.

    Raises:
        RuntimeError: too few requests completed for a rate (the first failure is named),
            or the server did not start.
        OSError: no loopback port could be bound.
    """
    from ttft.engine.server import build_engine, serving

    engine = build_engine(model, device="cpu", seed=seed)
    mix = demo_mix(engine.model.config.max_seq_len, max_tokens)
    with serving(engine, model_name=model) as url:
        items = build_workload(TraceSpec(url=url, model=model, burst=PROBE_REQUESTS, seed=seed,
                                         **mix))
        items = asyncio.run(workloads.fit_to_server(url, items, model=model)) or items
        clock, estimate = asyncio.run(_closed_loop(url, items, model, concurrency, max_s))
    for batch in (concurrency, 1):  # a slow machine: fewer, then smaller batches, unsettled
        if estimate is None:
            estimate = steady_rate(clock.completion_ns, skip=concurrency, batch=batch,
                                   min_batches=2)
    if estimate is None:
        failure = f" (first failure: {clock.first_error})" if clock.first_error else ""
        raise RuntimeError(
            f"the capacity probe completed {clock.completed} requests in {clock.load_s:.0f} s, "
            f"too few for a rate (it needs {concurrency + 2})"
            + failure)
    return Capacity(estimate.rate_per_s, estimate.spread_per_s, estimate.completions,
                    estimate.seconds, concurrency, clock.load_s)

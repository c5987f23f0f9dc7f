"""``ttft demo``: the whole loop on one machine, in-process.

Starts the reference server on a free loopback port with its spans exported over OTLP/HTTP,
and traces it exactly as ``ttft trace`` traces any server (:func:`trace_server`): a mixed
Poisson workload (varied prompt lengths; a third of the requests share one of a few
prefixes, so some hit the prefix cache), the server's spans received by the OTLP receiver,
client and server spans in one Parquet trace, then the analysis of that trace.

Unless a rate is given, the load fits the machine: :func:`probe_capacity` first measures
what the reference server sustains here (a short closed loop on a server of its own, before
tracing is configured), and the demo offers ``LOAD_FRACTION`` of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttft.analysis.pipeline import Analysis, analyze
from ttft.analysis.summary import Summary
from ttft.collectors import loadgen, read_spans, workloads
from ttft.collectors.trace_run import TraceRun, TraceSpec, build_workload, trace_server

__all__ = ["Capacity", "DemoResult", "offered_rate", "probe_capacity", "run_demo"]

PROBE_CONCURRENCY = 4
"""Requests the capacity probe keeps in flight."""
PROBE_S = 4.0
"""The probe ends at the first request that completes after this many seconds."""
PROBE_REQUESTS = 32
"""The probe's workload: more than a 2-core CPU completes in ``PROBE_S`` (a faster machine
ends the probe when all of them completed), few enough to fit to ``/tokenize`` quickly."""
LOAD_FRACTION = 0.6
"""The share of the measured capacity the demo offers: busy, with headroom for Poisson
bursts and for tracing's own cost (the probe runs untraced)."""
SHED_STATUS_CODES = frozenset((429, 503))
"""Statuses that mean the server refused the load (the client's ``shed`` outcome)."""


@dataclass(frozen=True)
class Capacity:
    """What the reference server sustained in the probe's closed loop.

    Attributes:
        rate_per_s: completed requests per second, ``requests / seconds``.
        requests: requests that completed (failed ones are not counted).
        seconds: from the first request sent to the last one that completed.
        concurrency: requests kept in flight.
    """

    rate_per_s: float
    requests: int
    seconds: float
    concurrency: int


@dataclass(frozen=True)
class DemoResult:
    """Where the trace went, its analysis, how the requests fared and the load they made.

    Attributes:
        trace, analysis: the trace file and its analysis.
        requests: requests sent; ``errors`` of them failed (``shed`` of those: HTTP 429/503).
        joined: requests with at least one span from the server.
        seconds: the whole demo, probe and analysis included.
        capacity: what the probe measured; None when the rate was given.
        offered_rate_per_s: the Poisson arrival rate of the traced run.
        completed: requests that completed, in ``load_s`` (first sent → last completed).
        achieved_rate_per_s: ``completed / load_s``.
    """

    trace: Path
    analysis: Analysis
    requests: int
    errors: int
    joined: int
    seconds: float
    shed: int
    capacity: Capacity | None
    offered_rate_per_s: float
    completed: int
    load_s: float
    achieved_rate_per_s: float

    @property
    def summary(self) -> Summary:
        """What ``ttft analyze`` of the trace prints."""
        return self.analysis.summary


class _LoadClock:
    """Times a load from the load generator's callbacks, then calls the caller's: the first
    request sent, the last one completed, and how many completed (a failed one is counted
    in neither ``completed`` nor the time)."""

    def __init__(self, on_sent: Callable[[int], None] | None = None,
                 on_result: Callable[[loadgen.RequestResult], None] | None = None) -> None:
        self._sent, self._result = on_sent, on_result
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.completed = 0
        self.first_error: str | None = None

    def on_sent(self, index: int) -> None:
        if self.first_ns is None:
            self.first_ns = time.perf_counter_ns()
        if self._sent is not None:
            self._sent(index)

    def on_result(self, result: loadgen.RequestResult) -> None:
        if result.error is None:
            self.completed += 1
            self.last_ns = time.perf_counter_ns()
        elif self.first_error is None:
            self.first_error = result.error
        if self._result is not None:
            self._result(result)

    @property
    def seconds(self) -> float:
        if self.first_ns is None or self.last_ns is None:
            return 0.0
        return (self.last_ns - self.first_ns) / 1e9

    @property
    def rate_per_s(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0


def _mix(context_tokens: int, max_tokens: int) -> dict[str, Any]:
    """The demo's requests as ``TraceSpec`` fields: prompts of varied lengths that fit the
    model's context with the output, a third of them sharing one of four prefixes."""
    longest = max(96, min(400, (context_tokens - max_tokens) * 3 // 4))
    return {"prompt_tokens": (80, longest), "output_tokens": max_tokens,
            "shared_prefix": (4, 50), "prefix_tokens": 64, "shared_fraction": 1 / 3}


async def _closed_loop(url: str, items: list[workloads.WorkItem], model: str,
                       concurrency: int, probe_s: float) -> _LoadClock:
    """Run ``items`` ``concurrency`` at a time (after one warm-up request) and stop at the
    first completion ``probe_s`` after the first send; in-flight requests are cancelled."""
    task: asyncio.Task[list[loadgen.RequestResult]] | None = None

    def stop_when_done(result: loadgen.RequestResult) -> None:
        if task is not None and clock.seconds >= probe_s:
            task.cancel()

    clock = _LoadClock(on_result=stop_when_done)
    task = asyncio.ensure_future(loadgen.run(
        url, items, model=model, concurrency=concurrency, warmup=1,
        on_sent=clock.on_sent, on_result=clock.on_result))
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # Ctrl-C, not the stop rule
            raise
    return clock


def probe_capacity(model: str = "small", *, max_tokens: int = 16, seed: int = 0,
                   concurrency: int = PROBE_CONCURRENCY, probe_s: float = PROBE_S) -> Capacity:
    """Measure what the reference server serving ``model`` on CPU sustains on this machine.

    A server of its own (fresh engine, same model, seed and configuration as the demo's) on
    a loopback port gets the demo's requests (same prompt mix and output length, prompts
    fitted through ``/tokenize``, seeded: the same prompts every time), ``concurrency`` in
    flight, from ``PROBE_REQUESTS`` sent all at once, until the first completion
    ``probe_s`` after the first send (so it lasts about ``probe_s`` plus one request's
    latency, and less when every request completed sooner). The probe records no spans
    unless this process's tracing is configured (:func:`run_demo` configures its own only
    after the probe), and its engine, prefix cache included, is gone when it returns.

    Raises:
        RuntimeError: no request completed (the first failure is named), or the server did
            not start.
        OSError: no loopback port could be bound.
    """
    from ttft.engine.server import build_engine, serving

    engine = build_engine(model, device="cpu", seed=seed)
    mix = _mix(engine.model.config.max_seq_len, max_tokens)
    with serving(engine, model_name=model) as url:
        items = build_workload(TraceSpec(url=url, model=model, burst=PROBE_REQUESTS, seed=seed,
                                         **mix))
        items = asyncio.run(workloads.fit_to_server(url, items, model=model)) or items
        clock = asyncio.run(_closed_loop(url, items, model, concurrency, probe_s))
    if clock.completed == 0:
        raise RuntimeError("the capacity probe completed no request"
                           + (f" (first failure: {clock.first_error})" if clock.first_error
                              else ""))
    return Capacity(clock.rate_per_s, clock.completed, clock.seconds, concurrency)


def offered_rate(capacity: Capacity) -> float:
    """``LOAD_FRACTION`` of the measured capacity, in requests per second, to 0.01/s (at
    least 0.01/s)."""
    return max(0.01, round(LOAD_FRACTION * capacity.rate_per_s, 2))


def run_demo(
    out_dir: Path,
    *,
    requests: int = 200,
    model: str = "small",
    rate_per_s: float | None = None,
    max_tokens: int = 16,
    seed: int = 0,
    probe_s: float = PROBE_S,
    on_rate: Callable[[Capacity | None, float], None] | None = None,
    callbacks: dict[str, Callable[..., None]] | None = None,
) -> DemoResult:
    """Serve ``model`` on CPU in-process, trace ``requests`` Poisson arrivals, analyze.

    Args:
        rate_per_s: the arrival rate; None measures the capacity first
            (:func:`probe_capacity`, ``probe_s``) and offers :func:`offered_rate` of it.
        on_rate: called with the capacity (None when ``rate_per_s`` was given) and the rate
            to offer, once known, before the traced run starts.
        callbacks: progress hooks passed to :func:`trace_server`.

    Raises:
        OSError: ``out_dir`` cannot be written, or no loopback port could be bound.
        RuntimeError: the server did not start, or the probe completed no request.
    """
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    capacity = None
    if rate_per_s is None:
        capacity = probe_capacity(model, max_tokens=max_tokens, seed=seed, probe_s=probe_s)
        rate_per_s = offered_rate(capacity)
    if on_rate is not None:
        on_rate(capacity, rate_per_s)
    trace = out_dir / "demo.parquet"
    hooks = dict(callbacks or {})
    clock = _LoadClock(hooks.get("on_sent"), hooks.get("on_result"))
    hooks.update(on_sent=clock.on_sent, on_result=clock.on_result)
    run = _traced_run(trace, model, requests, rate_per_s, max_tokens, seed, hooks)
    analysis = analyze(read_spans(trace), trace=str(trace))
    shed = sum(1 for r in run.results if r.status_code in SHED_STATUS_CODES)
    return DemoResult(trace, analysis, len(run.results), run.errors, run.joined,
                      time.perf_counter() - started, shed, capacity, rate_per_s,
                      clock.completed, clock.seconds, clock.rate_per_s)


def _traced_run(trace: Path, model: str, requests: int, rate_per_s: float, max_tokens: int,
                seed: int, hooks: dict[str, Callable[..., None]]) -> TraceRun:
    """The traced run: a fresh engine served in-process, its spans exported over OTLP to the
    receiver :func:`trace_server` starts."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from ttft.engine.server import build_engine, free_port, serving
    from ttft.tracer import configure

    engine = build_engine(model, device="cpu", seed=seed)
    receiver_port = free_port()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver_port}/v1/traces")
    tracing = configure("ttft-demo-server", [exporter])
    with ExitStack() as server:
        server.callback(tracing.shutdown)  # last: flushes what the stopped server recorded
        url = server.enter_context(serving(engine, model_name=model))
        spec = TraceSpec(url=url, model=model, rate=rate_per_s, requests=requests, seed=seed,
                         receiver_port=receiver_port, span_wait_s=30.0,
                         **_mix(engine.model.config.max_seq_len, max_tokens))
        # The engine records its start-up event before the trace's receiver listens; the
        # exporter retries until it does. Its "transient error" warnings until then are
        # expected here, so they are held back until the receiver is up (failures that
        # outlast the retries are logged as errors and still show).
        exporter_log = logging.getLogger(OTLPSpanExporter.__module__)
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)
        server.callback(exporter_log.setLevel, level)
        outer_start = hooks.get("on_start")

        def on_start(n: int, endpoint: str) -> None:
            exporter_log.setLevel(level)
            if outer_start is not None:
                outer_start(n, endpoint)

        # the server stops and flushes while the receiver still listens
        return trace_server(spec, trace, after_load=server.close, **{**hooks,
                                                                      "on_start": on_start})

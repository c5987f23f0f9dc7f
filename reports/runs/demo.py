"""``ttft demo``: the whole loop on one machine, in-process.

Starts the reference server on a free loopback port with its spans exported over OTLP/HTTP,
and traces it exactly as ``ttft trace`` traces any server (:func:`trace_server`): a mixed
Poisson workload (varied prompt lengths; a third of the requests share one of a few
prefixes, so some hit the prefix cache), the server's spans received by the OTLP receiver,
client and server spans in one Parquet trace, then the analysis of that trace.

Unless a rate is given, the load fits the machine: :func:`probe_capacity` first measures
what the reference server sustains here (a closed loop on a server of its own, before
tracing is configured, until its rate is known to 10%), and the demo offers
``LOAD_FRACTION`` of it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ttft.analysis.pipeline import Analysis, analyze
from ttft.analysis.summary import Summary
from ttft.collectors import read_spans, workloads
from ttft.collectors.load_rates import LoadRates
from ttft.collectors.load_rates import offered_rate as schedule_rate
from ttft.collectors.trace_run import TraceRun, TraceSpec, trace_server
from ttft.reports.runs.capacity import PROBE_MAX_S, Capacity, demo_mix, probe_capacity

__all__ = ["Capacity", "DemoResult", "demo_requests", "offered_rate", "probe_capacity", "run_demo",
           "schedule_rate_per_s"]

LOAD_FRACTION = 0.6
"""The share of the measured capacity the demo offers: busy, with headroom for Poisson
bursts and for tracing's own cost (the probe runs untraced)."""
SHED_STATUS_CODES = frozenset((429, 503))
"""Statuses that mean the server refused the load (the client's ``shed`` outcome)."""


@dataclass(frozen=True)
class DemoResult:
    """Where the trace went, its analysis, how the requests fared and the load they made.

    Attributes:
        trace, analysis: the trace file and its analysis.
        requests: requests sent; ``errors`` of them failed (``shed`` of those: HTTP 429/503).
        joined: requests with at least one span from the server.
        seconds: the whole demo, probe and analysis included.
        capacity: what the probe measured; None when the rate was given.
        rate_per_s: the Poisson arrival rate the traced run was drawn at.
        load: what its schedule offered and what the server achieved.
    """

    trace: Path
    analysis: Analysis
    requests: int
    errors: int
    joined: int
    seconds: float
    shed: int
    capacity: Capacity | None
    rate_per_s: float
    load: LoadRates

    @property
    def summary(self) -> Summary:
        """What ``ttft analyze`` of the trace prints."""
        return self.analysis.summary


DEMO_REQUESTS = 200
"""The traced run's requests when the machine serves ``DEMO_REQUESTS / DEMO_ARRIVALS_S``
per second or more at the offered rate…"""
DEMO_ARRIVALS_S = 60.0
"""…else as many as arrive in about this many seconds at that rate, so that a busy machine's
demo still ends in minutes (at 0.5 requests/s, 200 arrivals would take 400 s)…"""
DEMO_MIN_REQUESTS = 50
"""…and never fewer than this, for p90 (and a tail) to mean something."""


def demo_requests(rate_per_s: float) -> int:
    """The traced run's requests at ``rate_per_s`` when none were asked for: about
    ``DEMO_ARRIVALS_S`` of arrivals, between ``DEMO_MIN_REQUESTS`` and ``DEMO_REQUESTS``."""
    return max(DEMO_MIN_REQUESTS, min(DEMO_REQUESTS, math.ceil(rate_per_s * DEMO_ARRIVALS_S)))


def offered_rate(capacity: Capacity) -> float:
    """``LOAD_FRACTION`` of the measured capacity, in requests per second, to 0.01/s (at
    least 0.01/s)."""
    return max(0.01, round(LOAD_FRACTION * capacity.rate_per_s, 2))


def schedule_rate_per_s(rate_per_s: float, requests: int, seed: int) -> float | None:
    """The rate the demo's seeded Poisson schedule of ``requests`` arrivals really offers
    (its mean gap's inverse), which is ``rate_per_s`` only on average over seeds."""
    return schedule_rate(workloads.poisson(rate_per_s, requests, seed))


def run_demo(
    out_dir: Path,
    *,
    requests: int | None = None,
    model: str = "small",
    rate_per_s: float | None = None,
    max_tokens: int = 16,
    seed: int = 0,
    probe_max_s: float = PROBE_MAX_S,
    on_rate: Callable[[Capacity | None, float, int], None] | None = None,
    callbacks: dict[str, Callable[..., None]] | None = None,
) -> DemoResult:
    """Serve ``model`` on CPU in-process, trace ``requests`` Poisson arrivals, analyze.

    Args:
        requests: the traced run's arrivals; None takes :func:`demo_requests` of the rate.
        rate_per_s: the arrival rate; None measures the capacity first
            (:func:`probe_capacity`, for at most ``probe_max_s``) and offers
            :func:`offered_rate` of it.
        on_rate: called with the capacity (None when ``rate_per_s`` was given), the rate
            to offer and the requests to send, once known, before the traced run starts.
        callbacks: progress hooks passed to :func:`trace_server`.

    Raises:
        OSError: ``out_dir`` cannot be written, or no loopback port could be bound.
        RuntimeError: the server did not start, or the probe completed too few requests.
    """
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    capacity = None
    if rate_per_s is None:
        capacity = probe_capacity(model, max_tokens=max_tokens, seed=seed, max_s=probe_max_s)
        rate_per_s = offered_rate(capacity)
    if requests is None:
        requests = demo_requests(rate_per_s)
    if on_rate is not None:
        on_rate(capacity, rate_per_s, requests)
    trace = out_dir / "demo.parquet"
    run = _traced_run(trace, model, requests, rate_per_s, max_tokens, seed, dict(callbacks or {}))
    analysis = analyze(read_spans(trace), trace=str(trace))
    shed = sum(1 for r in run.results if r.status_code in SHED_STATUS_CODES)
    return DemoResult(trace, analysis, len(run.results), run.errors, run.joined,
                      time.perf_counter() - started, shed, capacity, rate_per_s, run.load)


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
                         **demo_mix(engine.model.config.max_seq_len, max_tokens))
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

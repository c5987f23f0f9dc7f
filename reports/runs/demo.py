"""``ttft demo``: the whole loop on one machine, in-process.

Starts the reference server on a free loopback port with its spans exported over OTLP/HTTP,
and traces it exactly as ``ttft trace`` traces any server (:func:`trace_server`): a mixed
Poisson workload (varied prompt lengths; a third of the requests share one of a few
prefixes, so some hit the prefix cache), the server's spans received by the OTLP receiver,
client and server spans in one Parquet trace, then the analysis of that trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ttft.analysis.pipeline import Analysis, analyze
from ttft.analysis.summary import Summary
from ttft.collectors import read_spans
from ttft.collectors.trace_run import TraceSpec, trace_server

__all__ = ["DemoResult", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """Where the trace went, its analysis, and how the requests fared."""

    trace: Path
    analysis: Analysis
    requests: int
    errors: int
    joined: int
    seconds: float

    @property
    def summary(self) -> Summary:
        """What ``ttft analyze`` of the trace prints."""
        return self.analysis.summary


def run_demo(
    out_dir: Path,
    *,
    requests: int = 200,
    model: str = "small",
    rate_per_s: float = 6.0,
    max_tokens: int = 16,
    seed: int = 0,
    callbacks: dict[str, Callable[..., None]] | None = None,
) -> DemoResult:
    """Serve ``model`` on CPU in-process, trace ``requests`` Poisson arrivals, analyze.

    Args:
        callbacks: progress hooks passed to :func:`trace_server`.

    Raises:
        OSError: ``out_dir`` cannot be written, or no loopback port could be bound.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from ttft.engine.server import build_engine, free_port, serving
    from ttft.tracer import configure

    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = out_dir / "demo.parquet"
    engine = build_engine(model, device="cpu", seed=seed)
    context = engine.model.config.max_seq_len
    longest = max(96, min(400, (context - max_tokens) * 3 // 4))
    receiver_port = free_port()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver_port}/v1/traces")
    tracing = configure("ttft-demo-server", [exporter])
    with ExitStack() as server:
        server.callback(tracing.shutdown)  # last: flushes what the stopped server recorded
        url = server.enter_context(serving(engine, model_name=model))
        spec = TraceSpec(
            url=url, model=model, rate=rate_per_s, requests=requests,
            prompt_tokens=(80, longest), output_tokens=max_tokens,
            shared_prefix=(4, 50), prefix_tokens=64, shared_fraction=1 / 3, seed=seed,
            receiver_port=receiver_port, span_wait_s=30.0,
        )
        # The engine records its start-up event before the trace's receiver listens; the
        # exporter retries until it does. Its "transient error" warnings until then are
        # expected here, so they are held back until the receiver is up (failures that
        # outlast the retries are logged as errors and still show).
        hooks = dict(callbacks or {})
        exporter_log = logging.getLogger(OTLPSpanExporter.__module__)
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)
        server.callback(exporter_log.setLevel, level)
        outer_start = hooks.get("on_start")

        def on_start(n: int, endpoint: str) -> None:
            exporter_log.setLevel(level)
            if outer_start is not None:
                outer_start(n, endpoint)

        hooks["on_start"] = on_start
        # the server stops and flushes while the receiver still listens
        run = trace_server(spec, trace, after_load=server.close, **hooks)
    analysis = analyze(read_spans(trace), trace=str(trace))
    return DemoResult(trace, analysis, len(run.results), run.errors, run.joined,
                      time.perf_counter() - started)

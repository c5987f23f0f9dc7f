"""The server's Prometheus metrics, one ``CollectorRegistry`` per application (host clock,
seen by the server), named and bucketed as vLLM's are (``vllm:`` → ``ttft:``) so that a
dashboard for one reads the other, and every one labelled ``model_name``:

- ``ttft:time_to_first_token_seconds``: the endpoint received the parsed request (before
  tokenization) → the first token event reached the endpoint (buckets to 2,560 s).
- ``ttft:time_per_output_token_seconds``: per request with two or more tokens, (last token
  - first token) / (tokens - 1).
- ``ttft:inter_token_latency_seconds``: every gap between consecutive tokens of a request.
- ``ttft:request_queue_time_seconds``: the request entered the engine's waiting queue →
  the scheduler admitted it (the engine's ``queue`` span).
- ``ttft:request_prefill_time_seconds``: admission → the first token reached the
  endpoint (schedule, prefill chunks, first sample and the thread hand-over; as vLLM's
  ``request_prefill_time_seconds``, first token time minus scheduled time).
- ``ttft:e2e_request_latency_seconds``: endpoint received → last token (or stop/cancel).
- ``ttft:requests_total{status}``: ``ok``, ``cancelled`` (client went away),
  ``invalid`` (400), ``unauthorized``, ``not_found``, ``queue_full``, ``error``.
- ``ttft:prompt_tokens_total``, ``ttft:generation_tokens_total``,
  ``ttft:prefix_cache_hits_total`` (prompt tokens served from the prefix cache).
- ``ttft:num_requests_running``, ``ttft:num_requests_waiting``: the engine's batch and
  waiting queue now; ``ttft:kv_cache_usage_perc``: the fraction (0-1) of K/V blocks held by
  live requests (blocks only the prefix cache holds are reusable, as vLLM counts them).
- ``ttft:tracer_dropped_spans``: spans the tracer dropped, its queue or an exporter's
  backlog full (0 when no tracer).
- ``ttft:tracer_failed_spans``: spans the tracer's exporters failed to export (0 when no
  tracer).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from ttft.tracer import stats as tracer_stats

__all__ = ["CONTENT_TYPE_LATEST", "REQUEST_BUCKETS", "TOKEN_BUCKETS", "TTFT_BUCKETS", "Metrics"]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ranges for time to first token."""
TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ranges for time per output token and inter-token latency."""
REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's ranges for a request's end-to-end, queue and prefill times."""
_STATUSES = ("ok", "cancelled", "invalid", "unauthorized", "not_found", "queue_full", "error")


def _failed_spans() -> float:
    """Spans the configured tracer's exporters failed to export (raised or refused); 0
    without a recorder."""
    stats = tracer_stats()
    return float(stats.failed) if stats is not None else 0.0


def _dropped_spans() -> float:
    """Spans the configured tracer's recorder dropped so far; 0 without a recorder."""
    stats = tracer_stats()
    return float(stats.dropped) if stats is not None else 0.0


class Metrics:
    """The metrics of one application (module docstring), in their own registry.

    Args:
        model_name: the value of every metric's ``model_name`` label.
        engine: read at each scrape for the running/waiting/K-V gauges (None: they read 0).

    Attributes:
        ttft, tpot, itl, queue, prefill, e2e: the time histograms, in seconds.
        requests: ``ttft:requests_total`` by ``status``, every status exported from 0.
        prompt_tokens, generation_tokens, prefix_hits: the token counters.
    """

    def __init__(self, model_name: str = "", engine: Any = None) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        label = {"model_name": model_name}
        for attr, name, buckets, meaning in (
            ("ttft", "time_to_first_token", TTFT_BUCKETS,
             "Endpoint received the request -> first token."),
            ("tpot", "time_per_output_token", TOKEN_BUCKETS,
             "(Last token - first token) / (tokens - 1), per request."),
            ("itl", "inter_token_latency", TOKEN_BUCKETS, "Gap between consecutive tokens."),
            ("queue", "request_queue_time", REQUEST_BUCKETS,
             "Engine waiting queue entry -> admission."),
            ("prefill", "request_prefill_time", REQUEST_BUCKETS,
             "Admission -> first token at the endpoint."),
            ("e2e", "e2e_request_latency", REQUEST_BUCKETS,
             "Endpoint received the request -> last token."),
        ):
            metric = Histogram(f"ttft:{name}_seconds", meaning, ["model_name"],
                               buckets=buckets, registry=r)
            setattr(self, attr, metric.labels(**label))
        self._requests = Counter(
            "ttft:requests_total", "Requests by outcome.", ["model_name", "status"], registry=r
        )
        for status in _STATUSES:
            self._requests.labels(model_name=model_name, status=status)  # 0 from the start
        for attr, name, meaning in (
            ("prompt_tokens", "prompt_tokens_total", "Prompt tokens."),
            ("generation_tokens", "generation_tokens_total", "Generated tokens."),
            ("prefix_hits", "prefix_cache_hits_total",
             "Prompt tokens served from the prefix cache."),
        ):
            counter = Counter(f"ttft:{name}", meaning, ["model_name"], registry=r)
            setattr(self, attr, counter.labels(**label))
        for name, meaning, read in (
            ("num_requests_running", "Requests in the engine's batch.",
             lambda: engine.num_running if engine is not None else 0),
            ("num_requests_waiting", "Requests in the engine's waiting queue.",
             lambda: engine.num_waiting if engine is not None else 0),
            ("kv_cache_usage_perc", "Fraction of K/V blocks held by live requests (0-1).",
             lambda: _kv_usage(engine)),
            ("tracer_dropped_spans",
             "Spans the tracer dropped (queue or an exporter's backlog full).", _dropped_spans),
            ("tracer_failed_spans", "Spans the tracer's exporters failed to export.",
             _failed_spans),
        ):
            gauge = Gauge(f"ttft:{name}", meaning, ["model_name"], registry=r)
            gauge.labels(**label).set_function(read)

    def requests(self, status: str) -> Any:
        """The ``ttft:requests_total`` child of ``status`` for this model."""
        return self._requests.labels(model_name=self.model_name, status=status)

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)


def _kv_usage(engine: Any) -> float:
    if engine is None:
        return 0.0
    cache = engine.cache
    return cache.blocks_in_use() / cache.num_blocks if cache.num_blocks else 0.0

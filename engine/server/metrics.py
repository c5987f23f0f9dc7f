"""The server's Prometheus metrics, one ``CollectorRegistry`` per application (host clock,
seen by the server):

- ``ttft:time_to_first_token_seconds``: the endpoint received the parsed request (before
  tokenization) → the first token event reached the endpoint.
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
- ``ttft:tracer_dropped_spans``: spans the tracer dropped, its queue or an exporter's
  backlog full (0 when no tracer).
- ``ttft:tracer_failed_spans``: spans the tracer's exporters failed to export (0 when no
  tracer).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from ttft.tracer import stats as tracer_stats

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_TIME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
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

    Attributes:
        ttft, queue, prefill, e2e: the time histograms, in seconds.
        requests: ``ttft:requests_total`` by ``status``, every status exported from 0.
        prompt_tokens, generation_tokens, prefix_hits: the token counters.
    """

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        b = _TIME_BUCKETS
        for attr, name, meaning in (
            ("ttft", "time_to_first_token", "Endpoint received the request -> first token."),
            ("queue", "request_queue_time", "Engine waiting queue entry -> admission."),
            ("prefill", "request_prefill_time", "Admission -> first token at the endpoint."),
            ("e2e", "e2e_request_latency", "Endpoint received the request -> last token."),
        ):
            setattr(self, attr, Histogram(f"ttft:{name}_seconds", meaning, buckets=b, registry=r))
        self.requests = Counter(
            "ttft:requests_total", "Requests by outcome.", ["status"], registry=r
        )
        for status in _STATUSES:
            self.requests.labels(status=status)  # exported as 0 from the start
        self.prompt_tokens = Counter("ttft:prompt_tokens_total", "Prompt tokens.", registry=r)
        self.generation_tokens = Counter(
            "ttft:generation_tokens_total", "Generated tokens.", registry=r
        )
        self.prefix_hits = Counter(
            "ttft:prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        dropped = Gauge(
            "ttft:tracer_dropped_spans",
            "Spans the tracer dropped (queue or an exporter's backlog full).",
            registry=r,
        )
        dropped.set_function(_dropped_spans)
        failed = Gauge(
            "ttft:tracer_failed_spans", "Spans the tracer's exporters failed to export.", registry=r
        )
        failed.set_function(_failed_spans)

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)

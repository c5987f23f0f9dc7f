"""What the OTLP/HTTP and OTLP/gRPC receivers share: the sink, the bearer-token check, the
export response with its partial-success count, and the request bookkeeping."""

from __future__ import annotations

import contextlib
import hmac
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors.writer import TraceWriter

Sink = Callable[[pa.Table], None]
"""Takes one table of span rows; called from server threads, so it must be thread-safe."""

MAX_ERRORS_REPORTED = 10
"""Rejected-span messages joined into a response's ``partial_success.error_message``."""


def as_sink(sink: TraceWriter | Sink) -> Sink:
    """A writer's ``append``, or the callable itself."""
    return sink.append if isinstance(sink, TraceWriter) else sink


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>`` (scheme case-insensitive).

    The credentials are compared in constant time (``hmac.compare_digest``).
    """
    if authorization is None:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


def export_response(request: ExportTraceServiceRequest, errors: list[str]
                    ) -> tuple[ExportTraceServiceResponse, int]:
    """The answer to an export whose invalid spans are described by ``errors``.

    Returns:
        The response (with ``partial_success`` set when some spans were rejected) and the
        number of spans accepted.
    """
    spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    response = ExportTraceServiceResponse()
    if errors:
        response.partial_success.rejected_spans = len(errors)
        response.partial_success.error_message = "; ".join(errors[:MAX_ERRORS_REPORTED])
    return response, spans - len(errors)


class ReceiverBookkeeping:
    """The counters, the requests in flight and the stopped flag of a receiver, under one lock.

    A receiver subclasses it, serves each request inside :meth:`_serving` and stops with
    :meth:`_mark_stopped` then :meth:`_wait_idle`. All methods are thread-safe.

    Attributes:
        requests: requests answered, whatever the status.
        spans_received: spans accepted and handed to the sink.
        spans_rejected: invalid spans dropped from otherwise good requests.
        rejected: requests answered with an error status.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()  # guards the counters, _inflight and _stopped
        self._inflight = 0
        self._stopped = False
        self.requests = 0
        self.spans_received = 0
        self.spans_rejected = 0
        self.rejected = 0

    @contextlib.contextmanager
    def _serving(self) -> Iterator[bool]:
        """Counts one request; yields whether it is admitted (False once stopped).

        An admitted request is in flight until the block exits, however it exits.
        """
        with self._lock:
            admitted = not self._stopped
            self._inflight += admitted
            self.requests += 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._inflight -= 1
                    self._lock.notify_all()

    def _count_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def _count_spans(self, received: int, rejected: int) -> None:
        with self._lock:
            self.spans_received += received
            self.spans_rejected += rejected

    def _mark_stopped(self) -> bool:
        """Admit no more requests. Returns whether it was already stopped."""
        with self._lock:
            already, self._stopped = self._stopped, True
        return already

    def _wait_idle(self, timeout_s: float) -> bool:
        """Whether no admitted request was in flight within ``timeout_s``."""
        with self._lock:
            return self._lock.wait_for(lambda: self._inflight == 0, max(0.0, timeout_s))

"""What the OTLP/HTTP and OTLP/gRPC receivers share: the sink, the bearer-token check and
the export response with its partial-success count."""

from __future__ import annotations

import hmac
from collections.abc import Callable

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors.store import TraceWriter

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

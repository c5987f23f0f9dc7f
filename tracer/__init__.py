"""ttft.tracer: the span vocabulary and the instrumentation people put in their servers.

``configure`` starts recording; ``stage`` and ``event`` record spans and point events;
``request_context`` binds one request's W3C trace context; ``record`` takes explicit
times (GPU work); ``link_step`` links an engine step to the requests it served.
``ttft.tracer.torch_hooks`` and ``ttft.tracer.asgi`` hold the torch and ASGI hooks (they
import torch and Starlette-style ASGI respectively, so they are not imported here).
"""

from ttft.tracer.api import (
    Tracing,
    clock_ns,
    configure,
    current_span,
    event,
    link_step,
    record,
    stage,
    stats,
)
from ttft.tracer.context import (
    SpanRef,
    format_traceparent,
    parse_traceparent,
    request_context,
)
from ttft.tracer.recorder import FlushResult
from ttft.tracer.schema import SCHEMA_VERSION, SPAN_SCHEMA, STAGE_NAMES

__all__ = [
    "SCHEMA_VERSION",
    "SPAN_SCHEMA",
    "STAGE_NAMES",
    "FlushResult",
    "SpanRef",
    "Tracing",
    "clock_ns",
    "configure",
    "current_span",
    "event",
    "format_traceparent",
    "link_step",
    "parse_traceparent",
    "record",
    "request_context",
    "stage",
    "stats",
]

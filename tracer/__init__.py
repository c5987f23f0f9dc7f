"""ttft.tracer: the span vocabulary and the instrumentation people put in their servers.

``configure`` starts recording; ``stage`` and ``event`` record spans and point events;
``request_context`` binds one request's W3C trace context (``request_parent`` finds a
request's open span from any thread, ``new_request_root`` starts a trace for a request
without one); ``record`` takes explicit times (GPU work); ``link_step`` links an engine
step to the requests it served and ``add_link`` links a span to any other;
``instrument_module`` hooks a torch module's forward passes and ``TTFTMiddleware`` wraps
an ASGI app.

Import cost: ``import ttft.tracer`` (and so ``import ttft.tracer.schema``) loads only the
schema and the trace context. A name whose module pulls the OpenTelemetry SDK (the
recorder and its API) or torch (the torch hooks) is imported on first access (PEP 562),
so a reader of trace files never loads either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ttft.tracer.context import (
    SpanRef,
    format_traceparent,
    new_request_root,
    parse_traceparent,
    request_context,
    request_parent,
)
from ttft.tracer.lazy import lazy_exports
from ttft.tracer.schema import SCHEMA_VERSION, STAGE_NAMES

if TYPE_CHECKING:
    from ttft.tracer.api import (
        Tracing,
        add_link,
        clock_ns,
        configure,
        current_span,
        event,
        link_step,
        record,
        stage,
        stats,
    )
    from ttft.tracer.asgi import TTFTMiddleware
    from ttft.tracer.gpu_resolver import GpuResolver
    from ttft.tracer.recorder import FlushResult
    from ttft.tracer.schema import SPAN_SCHEMA
    from ttft.tracer.torch_hooks import Instrumentation, instrument_module

# name -> the module that defines it, imported on first access
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "Tracing",
            "add_link",
            "clock_ns",
            "configure",
            "current_span",
            "event",
            "link_step",
            "record",
            "stage",
            "stats",
        ),
        "ttft.tracer.api",
    ),
    "FlushResult": "ttft.tracer.recorder",
    "GpuResolver": "ttft.tracer.gpu_resolver",
    "Instrumentation": "ttft.tracer.torch_hooks",
    "instrument_module": "ttft.tracer.torch_hooks",
    "TTFTMiddleware": "ttft.tracer.asgi",
    "SPAN_SCHEMA": "ttft.tracer.schema",
}

__all__ = [
    "FlushResult",
    "GpuResolver",
    "Instrumentation",
    "SCHEMA_VERSION",
    "SPAN_SCHEMA",
    "STAGE_NAMES",
    "SpanRef",
    "TTFTMiddleware",
    "Tracing",
    "add_link",
    "clock_ns",
    "configure",
    "current_span",
    "event",
    "format_traceparent",
    "instrument_module",
    "link_step",
    "new_request_root",
    "parse_traceparent",
    "record",
    "request_context",
    "request_parent",
    "stage",
    "stats",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

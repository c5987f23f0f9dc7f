"""A worker's spans to the process that exports them: ``ChannelExporter`` (an OpenTelemetry
``SpanExporter`` in the prefill worker) turns finished spans into plain JSON and puts them
on the channel; ``rebuild`` makes OpenTelemetry spans of them again on the decode side,
where the server's own exporters take them (``DisaggEngine.span_sink``).

A span keeps what the worker gave it: its ids, parent (a remote parent stays remote),
links, times (the worker's epoch nanoseconds), attributes (``ttft.clock`` names the
worker's clock domain) and resource (``service.name`` is the worker's), so in the trace it
is exactly the span the worker recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from ttft.engine.disagg.channel import Outbox

__all__ = ["ChannelExporter", "rebuild"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _attrs(attributes: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def _context(ids: list[Any]) -> SpanContext:
    trace_id, span_id, remote = ids
    return SpanContext(trace_id, span_id, remote, _SAMPLED)


def flatten(span: ReadableSpan) -> dict[str, Any]:
    """``span`` as a JSON-able dict (``rebuild``'s input)."""
    ctx, parent = span.context, span.parent
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "ctx": [ctx.trace_id, ctx.span_id, False],
        "parent": None if parent is None else [parent.trace_id, parent.span_id, parent.is_remote],
        "start": span.start_time,
        "end": span.end_time,
        "attrs": _attrs(span.attributes),
        "links": [
            [[ln.context.trace_id, ln.context.span_id, False], _attrs(ln.attributes)]
            for ln in span.links
        ],
        "resource": _attrs(span.resource.attributes),
        "scope": scope.name if scope is not None else "ttft.tracer",
    }


def rebuild(flat: dict[str, Any]) -> ReadableSpan:
    """The OpenTelemetry span ``flatten`` was given."""
    parent = flat["parent"]
    return ReadableSpan(
        name=flat["name"],
        context=_context(flat["ctx"]),
        parent=None if parent is None else _context(parent),
        resource=Resource(flat["resource"]),
        attributes=flat["attrs"],
        links=[Link(_context(ids), attrs) for ids, attrs in flat["links"]],
        kind=SpanKind.INTERNAL,
        start_time=flat["start"],
        end_time=flat["end"],
        instrumentation_scope=InstrumentationScope(flat["scope"]),
    )


class ChannelExporter(SpanExporter):
    """Exports spans as one ``spans`` message per batch on ``outbox`` (never blocks: the
    outbox's thread writes it)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.outbox.broken:
            return SpanExportResult.FAILURE
        self.outbox.put({"op": "spans", "spans": [flatten(s) for s in spans]})
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing of its own to close: the worker closes the outbox after tracing."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

"""An OpenTelemetry ``SpanExporter`` that writes SDK spans as ttft span rows to a trace file."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from ttft.collectors.rows import Event, Link, span_rows
from ttft.collectors.writer import TraceWriter
from ttft.tracer.schema import ATTR_CLOCK, ATTR_REQUEST_ID

__all__ = [
    "ATTR_CLOCK",
    "ATTR_REQUEST_ID",
    "ParquetSpanExporter",
    "span_to_rows",
]

logger = logging.getLogger(__name__)


def _hex_span_id(span_id: int) -> str:
    return format(span_id, "016x")


def span_to_rows(span: ReadableSpan, *, default_clock: str) -> list[dict[str, Any]]:
    """Map one finished SDK span onto span-record rows with :func:`rows.span_rows
    <ttft.collectors.rows.span_rows>` (its rules: one row for the span, one point-event row
    per event with a span id derived from the span's and the event's index, links and a
    non-unset status in the attributes). ``service`` is the resource's ``service.name``.

    Args:
        span: an ended span.
        default_clock: the ``clock`` value when the span has no ``ttft.clock`` attribute.

    Raises:
        ValueError: the span has no context or start time, or ends before it starts.
    """
    context = span.context
    if context is None or span.start_time is None:
        raise ValueError(f"span {span.name!r} has no context or no start time")
    status = span.status.status_code
    return span_rows(
        span.name,
        trace_id=format(context.trace_id, "032x"),
        span_id=_hex_span_id(context.span_id),
        parent_id=None if span.parent is None else _hex_span_id(span.parent.span_id),
        start_ns=span.start_time,
        end_ns=span.end_time if span.end_time is not None else span.start_time,
        clock=default_clock,
        service=str(span.resource.attributes.get("service.name", "unknown_service")),
        attributes=span.attributes,
        events=[Event(e.name, e.timestamp, e.attributes or {}) for e in span.events],
        links=[Link(format(link.context.trace_id, "032x"), _hex_span_id(link.context.span_id),
                    link.attributes or {}) for link in span.links],
        status_code=None if status is StatusCode.UNSET else status.name,
        status_description=span.status.description,
    )


class ParquetSpanExporter(SpanExporter):
    """Writes finished OpenTelemetry spans to a ttft trace file through a :class:`TraceWriter`.

    Threading: :meth:`export` may be called from several threads at once (as
    ``SimpleSpanProcessor`` does); the writer serializes them.

    Failure: :meth:`export` never raises. A span that cannot be converted, or a batch the
    writer refuses, is logged, counted in ``dropped_spans`` and answered with
    ``SpanExportResult.FAILURE``. Rows lost by a failed flush of rows buffered earlier are
    counted by the writer (``writer.dropped_rows``). After :meth:`shutdown` every export fails.

    Attributes:
        writer: the trace writer spans go to; closed by :meth:`shutdown`.
        dropped_spans: spans not accepted by the writer.
    """

    def __init__(
        self,
        sink: str | os.PathLike[str] | TraceWriter,
        *,
        metadata: Mapping[str, Any] | None = None,
        **writer_options: Any,
    ) -> None:
        """Create the exporter.

        Args:
            sink: a trace path (a :class:`TraceWriter` is created for it) or a writer.
            metadata: run metadata to record (added to a given writer's metadata).
            **writer_options: keyword arguments for a created :class:`TraceWriter`
                (``flush_spans``, ``flush_interval_s``, ``merge_on_close``).

        Raises:
            TypeError: ``writer_options`` together with an existing writer.
            OSError, FileExistsError: the writer cannot be created.
        """
        if isinstance(sink, TraceWriter):
            if writer_options:
                raise TypeError(f"writer options {sorted(writer_options)} need a path, "
                                "not an existing TraceWriter")
            self.writer = sink
            if metadata:
                sink.set_metadata(**metadata)
        else:
            self.writer = TraceWriter(sink, metadata=metadata, **writer_options)
        self.dropped_spans = 0
        self._default_clock = "host:" + socket.gethostname()
        self._lock = threading.Lock()
        self._shutdown = False

    def _drop(self, count: int) -> SpanExportResult:
        with self._lock:
            self.dropped_spans += count
        return SpanExportResult.FAILURE

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans (and their events) to the writer. Never raises.

        Returns:
            ``SUCCESS`` if every span was accepted, else ``FAILURE``; the spans that could
            be converted are still appended when others could not.
        """
        if self._shutdown:
            logger.warning("export after shutdown: %d span(s) dropped", len(spans))
            return self._drop(len(spans))
        rows: list[dict[str, Any]] = []
        failed = 0
        for span in spans:
            try:
                rows.extend(span_to_rows(span, default_clock=self._default_clock))
            except Exception:
                failed += 1
                logger.exception("cannot convert span %r; dropped", getattr(span, "name", None))
        if rows:
            try:
                self.writer.append(rows)
            except Exception:
                logger.exception("%s: cannot write %d span(s)", self.writer.path, len(spans))
                return self._drop(len(spans))
        return self._drop(failed) if failed else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the writer (which merges the trace file, unless told not to), then log at
        WARNING how many rows failed writes lost, if any. Idempotent."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
        try:
            self.writer.close()
        except Exception:
            logger.exception("%s: closing the trace writer failed", self.writer.path)
        # Rows of batches export() already answered SUCCESS for are lost by a later failed
        # flush too: only the writer knows how many, so say it once here.
        if self.writer.dropped_rows:
            logger.warning("%s: %d span rows lost to failed writes, %d written",
                           self.writer.path, self.writer.dropped_rows, self.writer.rows_written)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write the buffered spans as a part file now.

        Returns:
            False if the flush failed or could not start within ``timeout_millis``.
        """
        try:
            return self.writer.flush(timeout_s=timeout_millis / 1000)
        except Exception:
            logger.exception("%s: flush failed", self.writer.path)
            return False

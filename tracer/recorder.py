"""The recorder: a cheap append on the traced thread, OpenTelemetry spans off it.

The traced thread appends one tuple per span to a bounded queue (``collections.deque``:
appends are atomic under the GIL, no lock) and never blocks or raises: when the queue
holds ``capacity`` records, the record is dropped and counted. A daemon thread drains the
queue every ``flush_interval_s`` (or as soon as it is half full), turns records into
OpenTelemetry ``ReadableSpan``s and hands them to every exporter; an exporter that raises
or returns FAILURE loses that batch for itself only, counted as ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from ttft.tracer.schema import ATTR_CLOCK, ATTR_REQUEST_ID, ATTR_STAGE, stage_of

logger = logging.getLogger(__name__)

_SCOPE = InstrumentationScope("ttft.tracer")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_STATE = DEFAULT_TRACE_STATE
_SCALARS = (str, bool, int, float)


@dataclass(frozen=True)
class FlushResult:
    """What the recorder did so far: spans exported, dropped (full queue) and failed
    (an exporter raised or refused), counted per exporter for ``failed``."""

    exported: int
    dropped: int
    failed: int
    pending: int


def _official_context(trace_id: int, span_id: int, remote: bool) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=_SAMPLED)


def _fast_context(trace_id: int, span_id: int, remote: bool) -> SpanContext:
    # SpanContext is a tuple; its constructor only validates ids, which ours always are.
    return tuple.__new__(SpanContext, (trace_id, span_id, remote, _SAMPLED, _STATE, True))


def _pick_context_factory() -> Any:
    """The fast factory if it builds exactly what the official constructor builds (the
    tuple layout is the API package's own business), else the official one."""
    try:
        fast, official = _fast_context(3, 5, True), _official_context(3, 5, True)
        same = fast == official and fast.is_valid and fast.trace_state == official.trace_state
        return _fast_context if same else _official_context
    except Exception:
        return _official_context


def _value(value: Any) -> Any:
    """An attribute value OpenTelemetry accepts: scalars and homogeneous sequences of
    scalars as they are, anything else as its ``str``."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, _SCALARS) for v in value):
        kinds = {type(v) for v in value}
        return tuple(value) if len(kinds) <= 1 else tuple(str(v) for v in value)
    return str(value)


_context = _pick_context_factory()


class Recorder:
    """Bounded queue of finished spans and the thread that exports them.

    Args:
        exporters: OpenTelemetry span exporters; each gets every batch.
        resource: the resource every span carries (``service.name``).
        capacity: the most records waiting for export; more are dropped and counted.
        flush_interval_s: the longest a record waits before its batch is exported.
        default_clock: the ``ttft.clock`` of host spans.
        offset_ns: added to a record's ``perf_counter_ns`` times to make epoch ns.

    A record is a finished ``ttft.tracer.api.stage`` (name, ids, parent, times,
    attributes, links), converted here, off the traced thread.
    """

    def __init__(
        self,
        exporters: Sequence[SpanExporter],
        resource: Resource,
        *,
        capacity: int = 1 << 16,
        flush_interval_s: float = 0.5,
        default_clock: str = "host",
        offset_ns: int = 0,
    ) -> None:
        self.exporters = list(exporters)
        self.resource = resource
        self.capacity = capacity
        self.default_clock = default_clock
        self.offset_ns = offset_ns
        self._queue: deque[Any] = deque()
        self._half = max(1, capacity // 2)
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._lock = threading.Lock()
        self._interval_s = flush_interval_s
        self._closed = False
        self._busy = False
        self.exported = 0
        self.dropped = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="ttft-recorder", daemon=True)
        self._thread.start()

    # -- hot path ------------------------------------------------------------------------
    def add(self, record: Any) -> None:
        """Queue one finished span. Called on the traced thread; never blocks or raises."""
        queue = self._queue
        size = len(queue)
        if size >= self.capacity or self._closed:
            with self._lock:
                self.dropped += 1
            return
        queue.append(record)
        if size == self._half:
            self._wake.set()

    def add_readable(self, span: ReadableSpan) -> None:
        """Queue an SDK span (from the TracerProvider) to go out with the rest."""
        self.add(("readable", span))

    # -- background thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._drain()
            if self._closed and not self._queue:
                return

    def _drain(self) -> None:
        with self._idle:
            self._busy = True
        try:
            while self._queue:
                batch = []
                pop = self._queue.popleft
                try:
                    for _ in range(4096):
                        batch.append(pop())
                except IndexError:
                    pass
                self._export(self._to_spans(batch))
        except Exception:  # never let the export thread die
            logger.exception("ttft recorder: converting spans failed")
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def _to_spans(self, batch: list[Any]) -> list[ReadableSpan]:
        """Records → SDK spans. A span's own context is made once and reused as the
        parent context of its children converted later in the batch."""
        contexts: dict[tuple[int, bool], SpanContext] = {}
        make = _context
        out = []
        for r in batch:
            if isinstance(r, tuple):  # ("readable", span) from the TracerProvider
                out.append(r[1])
                continue
            own = make(r.trace_id, r.span_id, False)
            contexts[(r.span_id, False)] = own
            parent = r.parent
            parent_context = None
            if parent is not None and parent.span_id:
                key = (parent.span_id, parent.remote)
                parent_context = contexts.get(key)
                if parent_context is None:
                    parent_context = contexts[key] = make(
                        parent.trace_id, parent.span_id, parent.remote
                    )
            attributes: dict[str, Any] = {
                ATTR_STAGE: r.stage_name or stage_of(r.name),
                ATTR_CLOCK: r.clock_name or self.default_clock,
            }
            if r.request_id is not None:
                attributes[ATTR_REQUEST_ID] = r.request_id
            for key, value in r.attributes.items():
                attributes[key] = value if type(value) in _SCALARS else _value(value)
            links = r.links
            out.append(
                ReadableSpan(
                    name=r.name,
                    context=own,
                    parent=parent_context,
                    resource=self.resource,
                    attributes=attributes,
                    links=[Link(make(t, s, False), a) for t, s, a in links] if links else (),
                    kind=SpanKind.INTERNAL,
                    start_time=r.start_ns + self.offset_ns,
                    end_time=r.end_ns + self.offset_ns,
                    instrumentation_scope=_SCOPE,
                )
            )
        return out

    def _export(self, spans: list[ReadableSpan]) -> None:
        for exporter in self.exporters:
            try:
                ok = exporter.export(spans) == SpanExportResult.SUCCESS
            except Exception:
                logger.exception("ttft recorder: %s raised", type(exporter).__name__)
                ok = False
            with self._lock:
                if ok:
                    self.exported += len(spans)
                else:
                    self.failed += len(spans)
        with self._lock:
            if not self.exporters:
                self.exported += len(spans)

    # -- control -------------------------------------------------------------------------
    def result(self) -> FlushResult:
        with self._lock:
            return FlushResult(self.exported, self.dropped, self.failed, len(self._queue))

    def flush(self, timeout_s: float = 10.0) -> FlushResult:
        """Export everything queued so far (waiting at most ``timeout_s``), then flush the
        exporters; returns the counts and logs drops."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while (self._queue or self._busy) and time.monotonic() < deadline:
                self._wake.set()
                self._idle.wait(0.01)
        for exporter in self.exporters:
            try:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                exporter.force_flush(left_ms)
            except Exception:
                logger.exception("ttft recorder: %s.force_flush raised", type(exporter).__name__)
        result = self.result()
        if result.dropped or result.failed:
            logger.warning(
                "ttft recorder: %d spans dropped (queue full), %d failed to export",
                result.dropped,
                result.failed,
            )
        return result

    def shutdown(self, timeout_s: float = 10.0) -> FlushResult:
        """Flush, stop the thread and shut the exporters down. Later spans are dropped."""
        result = self.flush(timeout_s)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:
                logger.exception("ttft recorder: %s.shutdown raised", type(exporter).__name__)
        return result

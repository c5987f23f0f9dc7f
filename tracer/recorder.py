"""The recorder: a cheap append on the traced thread, OpenTelemetry spans off it.

The traced thread appends one tuple per span to a bounded queue (``collections.deque``:
appends are atomic under the GIL, no lock) and never blocks or raises: when the queue
holds ``capacity`` records, the record is dropped and counted. A daemon thread drains the
queue every ``flush_interval_s`` (or as soon as it is half full), turns records into
OpenTelemetry ``ReadableSpan``s and hands each batch to every exporter's own thread
(``ttft.tracer._outlet``), which keeps a backlog of at most ``capacity`` spans. So an
exporter that raises or returns FAILURE loses that batch for itself only (counted as
``failed``), and one that is slow or hangs fills only its own backlog (what does not fit
is dropped and counted): the other exporters, the queue and the traced thread never wait
for it, nor does ``shutdown`` past its timeout.
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
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from ttft.tracer._outlet import Outlet
from ttft.tracer.schema import ATTR_CLOCK, ATTR_REQUEST_ID, ATTR_STAGE, stage_of

logger = logging.getLogger(__name__)

_SCOPE = InstrumentationScope("ttft.tracer")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_STATE = DEFAULT_TRACE_STATE
_SCALARS = (str, bool, int, float)


@dataclass(frozen=True)
class FlushResult:
    """What the recorder did so far, in spans.

    Attributes:
        exported: spans an exporter accepted (counted per exporter).
        dropped: spans dropped because the queue was full, plus spans an exporter's full
            backlog could not take (counted per exporter).
        failed: spans in batches an exporter raised on or refused (counted per exporter).
        pending: spans not exported yet: in the queue, plus those in an exporter's backlog
            or export (per exporter). After ``shutdown`` these are the spans an exporter
            did not finish by the timeout, lost with it.
    """

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


_NONE: dict[str, Any] = {}


class Recorder:
    """Bounded queue of finished spans and the thread that exports them.

    Args:
        exporters: OpenTelemetry span exporters; each gets every batch, on its own thread.
        resource: the resource every span carries (``service.name``).
        capacity: the most records waiting for export, and the most spans waiting in each
            exporter's backlog; more are dropped and counted.
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
        self._outlets = [Outlet(exporter, capacity) for exporter in self.exporters]
        self.resource = resource
        self.capacity = capacity
        self.default_clock = default_clock
        self.offset_ns = offset_ns
        self._queue: deque[Any] = deque()
        self._attributes: dict[int, dict[str, Any]] = {}  # of queued spans, by span id
        self._half = max(1, capacity // 2)
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._lock = threading.Lock()
        self._interval_s = flush_interval_s
        self._closed = False
        self._busy = False
        self.exported = 0  # spans converted while there is no exporter
        self.dropped = 0  # records dropped because the queue was full (or after shutdown)
        self._thread = threading.Thread(target=self._run, name="ttft-recorder", daemon=True)
        self._thread.start()

    # -- hot path ------------------------------------------------------------------------
    def add(self, record: tuple[Any, ...], attributes: dict[str, Any] | None = None) -> None:
        """Queue one finished span (``stage._record()``'s tuple) and its attributes, kept
        apart by span id so the queued tuple holds no dict. Called on the traced thread;
        never blocks or raises."""
        queue = self._queue
        size = len(queue)
        if size >= self.capacity or self._closed:
            with self._lock:
                self.dropped += 1
            return
        if attributes:
            self._attributes[record[1]] = attributes  # before the record: the drain finds it
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
        batch: list[Any] = []
        try:
            while self._queue:
                batch = []
                pop = self._queue.popleft
                try:
                    for _ in range(4096):
                        batch.append(pop())
                except IndexError:
                    pass
                if self._outlets:
                    self._export(self._to_spans(batch))
                    continue
                for r in batch:  # no exporter receives them: counted, never converted
                    if len(r) != 2:
                        self._attributes.pop(r[1], None)
                with self._lock:
                    self.exported += len(batch)
        except Exception:  # never let the export thread die
            logger.exception("ttft recorder: converting spans failed")
            for r in batch:  # the batch is lost; its attributes must not stay behind
                if len(r) != 2:
                    self._attributes.pop(r[1], None)
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
            if len(r) == 2:  # ("readable", span) from the TracerProvider
                out.append(r[1])
                continue
            (trace_id, span_id, parent_trace, parent_span, remote, name, stage_name,
             clock_name, request_id, links, start_ns, end_ns) = r
            own_attributes = self._attributes.pop(span_id, _NONE)
            own = make(trace_id, span_id, False)
            contexts[(span_id, False)] = own
            parent_context = None
            if parent_span:
                key = (parent_span, remote)
                parent_context = contexts.get(key)
                if parent_context is None:
                    parent_context = contexts[key] = make(parent_trace, parent_span, remote)
            attributes: dict[str, Any] = {
                ATTR_STAGE: stage_name or stage_of(name),
                ATTR_CLOCK: clock_name or self.default_clock,
            }
            if request_id is not None:
                attributes[ATTR_REQUEST_ID] = request_id
            for key, value in own_attributes.items():
                attributes[key] = value if type(value) in _SCALARS else _value(value)
            out.append(
                ReadableSpan(
                    name=name,
                    context=own,
                    parent=parent_context,
                    resource=self.resource,
                    attributes=attributes,
                    links=[Link(make(t, s, False), a) for t, s, a in links] if links else (),
                    kind=SpanKind.INTERNAL,
                    start_time=start_ns + self.offset_ns,
                    end_time=end_ns + self.offset_ns,
                    instrumentation_scope=_SCOPE,
                )
            )
        return out

    def _export(self, spans: list[ReadableSpan]) -> None:
        for outlet in self._outlets:
            outlet.offer(spans)

    # -- control -------------------------------------------------------------------------
    def result(self) -> FlushResult:
        """The counts so far (see :class:`FlushResult`). Cheap; does not flush."""
        with self._lock:
            totals = [self.exported, self.dropped, 0, len(self._queue)]
        for counts in (outlet.counts() for outlet in self._outlets):
            totals = [total + count for total, count in zip(totals, counts, strict=True)]
        return FlushResult(*totals)

    def by_exporter(self) -> list[FlushResult]:
        """The counts of each exporter, in ``exporters`` order: what it exported, what its
        backlog dropped, what failed and what is pending there (queue drops not included)."""
        return [FlushResult(*outlet.counts()) for outlet in self._outlets]

    def _wait_drained(self, deadline_s: float) -> None:
        """Until the queue is handed to the exporters' backlogs, or ``deadline_s``."""
        self._wake.set()
        with self._idle:
            while (self._queue or self._busy) and time.monotonic() < deadline_s:
                self._wake.set()
                self._idle.wait(0.01)

    def _wait_for(self, kind: str, deadline_s: float) -> list[str]:
        """Ask every exporter's thread for ``kind`` and wait until ``deadline_s``; returns
        the names of the exporters that did not finish in time."""
        waits = [(outlet, outlet.request(kind, deadline_s)) for outlet in self._outlets]
        late = []
        for outlet, done in waits:
            if not done.wait(max(0.0, deadline_s - time.monotonic())):
                late.append(outlet.name)
        return late

    def _report(self, result: FlushResult, late: list[str], when: str) -> None:
        if result.dropped or result.failed or late:
            logger.warning(
                "ttft recorder %s: %d spans exported, %d dropped (queue or an exporter's "
                "backlog full), %d failed to export, %d pending%s",
                when, result.exported, result.dropped, result.failed, result.pending,
                f" ({', '.join(late)} did not finish in time)" if late else "",
            )
        else:
            logger.info("ttft recorder %s: %d spans exported, none dropped or failed",
                        when, result.exported)

    def flush(self, timeout_s: float = 10.0) -> FlushResult:
        """Export everything queued so far and flush the exporters, waiting at most
        ``timeout_s`` in all (an exporter that hangs is left behind); returns the counts
        and logs them at WARNING when spans were dropped or failed."""
        deadline_s = time.monotonic() + timeout_s
        self._wait_drained(deadline_s)
        late = self._wait_for("flush", deadline_s)
        result = self.result()
        self._report(result, late, "flush")
        return result

    def shutdown(self, timeout_s: float = 10.0) -> FlushResult:
        """Export what is queued, then shut every exporter down (on its own thread, after
        its backlog), returning within ``timeout_s``: an exporter that has not finished by
        then is left behind with its backlog, counted as ``pending``. Later spans are
        dropped. Returns the counts and logs a summary line (WARNING when spans were
        dropped, failed or left pending)."""
        deadline_s = time.monotonic() + timeout_s
        self._wait_drained(deadline_s)
        self._closed = True
        self._wake.set()
        self._thread.join(max(0.0, deadline_s - time.monotonic()))
        late = self._wait_for("shutdown", deadline_s)
        result = self.result()
        self._report(result, late, "shutdown")
        return result

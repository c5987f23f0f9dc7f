"""The instrumentation API: ``configure``, ``stage``, ``event``, ``record``, ``link_step``.

Every call is safe before ``configure`` (it records nothing) and after ``shutdown``
(records are dropped and counted). None of them blocks or raises into the traced code
because of tracing: the recorder queues, a background thread exports.

Sampling is parent-based (``ttft.tracer.context``): a stage, record or event under a span
that is not sampled (a request whose ``traceparent`` has flags ``00``) records nothing,
and a link to such a span is not made.
"""

from __future__ import annotations

import functools
import inspect
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from ttft.tracer import context as ctx
from ttft.tracer.recorder import FlushResult, Recorder

F = TypeVar("F", bound=Callable[..., Any])



def anchor_ns(samples: int = 32) -> int:
    """``time_ns() - perf_counter_ns()``, read where the two clocks are read closest together:
    of ``samples`` brackets ``time_ns, perf_counter_ns, time_ns``, the narrowest, its
    midpoint. Read once, the two calls can be a scheduler slice apart on a busy machine
    (milliseconds), and two processes of one host then disagree by that much: a prefill
    worker's chunk ended after the decode side installed its blocks."""
    width, offset = None, 0
    for _ in range(samples):
        t0 = time.time_ns()
        p = time.perf_counter_ns()
        t1 = time.time_ns()
        if width is None or t1 - t0 < width:
            width, offset = t1 - t0, (t0 + t1) // 2 - p
    return offset


_OFFSET_NS = anchor_ns()
"""Added to ``perf_counter_ns`` gives epoch ns: the clock is anchored once, per process."""
_perf_ns = time.perf_counter_ns
_get_current = ctx.current.get
_set_current = ctx.current.set
_reset_current = ctx.current.reset
_span_ids = ctx._span_ids
_requests = ctx.requests  # the registry of open requests (never rebound)
_recorder: Recorder | None = None


def clock_ns() -> int:
    """Now, in Unix-epoch ns, from the monotonic clock anchored once to the epoch."""
    return _perf_ns() + _OFFSET_NS


class _Forward(SpanProcessor):
    """Sends spans the user makes through ``tracer_provider`` out with the recorder's."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def on_end(self, span: ReadableSpan) -> None:
        self.recorder.add_readable(span)


class Tracing:
    """The handle ``configure`` returns.

    Attributes:
        recorder: the recorder (counts, exporters).
        tracer_provider: an OpenTelemetry ``TracerProvider`` with the same resource, whose
            spans are exported with ttft's.
    """

    def __init__(self, recorder: Recorder, provider: TracerProvider) -> None:
        self.recorder = recorder
        self.tracer_provider = provider

    def flush(self, timeout_s: float = 10.0) -> FlushResult:
        """Export every span recorded so far, waiting at most ``timeout_s``; returns the
        exported/dropped/failed/pending counts."""
        return self.recorder.flush(timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> FlushResult:
        """Export what is queued and shut the exporters down, returning within
        ``timeout_s`` even if an exporter hangs; later spans are dropped. Returns the counts
        and logs them in one line (WARNING when spans were dropped, failed or left
        pending)."""
        global _recorder
        result = self.recorder.shutdown(timeout_s)
        if _recorder is self.recorder:
            _recorder = None
        return result


def configure(
    service: str,
    exporters: Sequence[SpanExporter] = (),
    *,
    capacity: int = 1 << 16,
    flush_interval_s: float = 0.5,
    clock: str | None = None,
    **resource_attributes: Any,
) -> Tracing:
    """Start recording for this process.

    Args:
        service: ``service.name`` of every span.
        exporters: OpenTelemetry span exporters (ttft's ``ParquetSpanExporter``, the
            OTLP/HTTP exporter, the console exporter, …).
        capacity: the most spans waiting for export; more are dropped and counted.
        flush_interval_s: the longest a span waits before it is exported.
        clock: the clock domain of host spans (default ``host:<hostname>``).
        resource_attributes: more resource attributes.

    A second ``configure`` shuts the previous recorder down first.
    """
    global _recorder
    if _recorder is not None:
        _recorder.shutdown()
    resource = Resource.create({"service.name": service, **resource_attributes})
    recorder = Recorder(
        exporters,
        resource,
        capacity=capacity,
        flush_interval_s=flush_interval_s,
        default_clock=clock or f"host:{socket.gethostname()}",
        offset_ns=_OFFSET_NS,
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_Forward(recorder))
    _recorder = recorder
    return Tracing(recorder, provider)


def _parent_for(request_id: str | None) -> tuple[ctx.SpanRef | None, str | None]:
    """The span a new one nests under, and the request it belongs to."""
    cur = ctx.current.get()
    if request_id is None:
        return cur, (cur.request_id if cur is not None else None)
    if cur is not None and cur.request_id == request_id:
        return cur, request_id
    return ctx.requests.get(request_id), request_id


class stage(ctx.SpanRef):  # noqa: N801 - a context manager used like a function
    """Record one span of a stage: ``with stage("tokenize"): ...`` or ``@stage("queue")``.

    Args:
        name: the stage (``tracer.schema`` names; other names are kept and map to
            ``other`` when analyzed); also the span name.
        request_id: the request this stage serves. Without it the span joins the current
            request (``request_context``) or, outside any, is an engine-level span in the
            engine's own trace.
        attributes: span attributes; more can be added with :meth:`set` while it is open.

    Called on the traced thread: it reads a clock twice, sets a ``ContextVar`` and
    appends itself to the recorder's queue; it never blocks or raises. The recorder's
    thread turns it into an OpenTelemetry span later. Under a parent that is not sampled
    it is not sampled either: it nests and registers as usual but is never queued.
    """

    __slots__ = (
        "name",
        "parent",
        "_token",
        "start_ns",
        "end_ns",
        "links",
        "clock_name",
        "stage_name",
        "_end_at",
    )

    def __init__(self, name: str, *, request_id: str | None = None, **attributes: Any) -> None:
        self.name = name
        self.request_id = request_id
        self.attributes = attributes
        self.links = None
        self.clock_name = self.stage_name = self._end_at = None

    def __enter__(self) -> stage:
        rid = self.request_id
        cur = _get_current()
        if rid is None:
            parent = cur
            if cur is not None:
                rid = self.request_id = cur.request_id
        elif cur is not None and cur.request_id == rid:
            parent = cur
        else:
            parent = _requests.get(rid)
        self.parent = parent
        if parent is None:
            self.trace_id = ctx.new_trace_id()
            self.sampled = True
            if rid is not None:
                _requests[rid] = self
        else:
            self.trace_id = parent.trace_id
            self.sampled = parent.sampled
            if rid is not None and _requests.get(rid) is parent:
                _requests[rid] = self  # the request's outermost open span
        self.span_id = next(_span_ids)
        self.remote = False
        self._token = _set_current(self)
        self.start_ns = _perf_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.end_ns = _perf_ns() if self._end_at is None else self._end_at
        _reset_current(self._token)
        rid = self.request_id
        if rid is not None and _requests.get(rid) is self:
            if self.parent is not None:
                _requests[rid] = self.parent
            else:
                del _requests[rid]
        if exc_type is not None:
            self.attributes["error"] = exc_type.__name__
        recorder = _recorder
        if recorder is not None and self.sampled:  # `_record`, inlined: the hot path
            parent = self.parent
            record = ((self.trace_id, self.span_id, 0, 0, False, self.name,
                       self.stage_name, self.clock_name, rid, self.links, self.start_ns,
                       self.end_ns) if parent is None else
                      (self.trace_id, self.span_id, parent.trace_id, parent.span_id,
                       parent.remote, self.name, self.stage_name, self.clock_name, rid,
                       self.links, self.start_ns, self.end_ns))
            # `Recorder.add` inlined where it queues (a call is a tenth of a span's cost);
            # a full or closed queue goes through it, which counts the drop.
            queue = recorder._queue
            size = len(queue)
            if size < recorder.capacity and not recorder._closed:
                attributes = self.attributes
                if attributes:
                    recorder._attributes[self.span_id] = attributes
                queue.append(record)
                if size == recorder._half:
                    recorder._wake.set()
            else:
                recorder.add(record, self.attributes)

    def _record(self) -> tuple[Any, ...]:
        """The finished span as the recorder queues it (`Recorder.add`, with
        ``self.attributes`` beside it): a flat tuple of plain values, not this object, so a
        queue of thousands holds nothing the garbage collector keeps traversing (such a
        tuple is untracked once a collection sees it, one holding a dict never is; with the
        objects queued, collections cost about a third of every span)."""
        parent = self.parent
        if parent is None:
            return (self.trace_id, self.span_id, 0, 0, False, self.name, self.stage_name,
                    self.clock_name, self.request_id, self.links, self.start_ns, self.end_ns)
        return (self.trace_id, self.span_id, parent.trace_id, parent.span_id, parent.remote,
                self.name, self.stage_name, self.clock_name, self.request_id, self.links,
                self.start_ns, self.end_ns)

    def set(self, **attributes: Any) -> None:
        """Add attributes to the open span (not after it ended: the recorder reads them)."""
        self.attributes.update(attributes)

    def end_at(self, epoch_ns: int) -> None:
        """Make the span end at ``epoch_ns`` (``clock_ns()`` time) instead of when the
        ``with`` block exits, e.g. a server span at the response's end while background
        work still runs in the block. Never before the span's start."""
        self._end_at = max(epoch_ns - _OFFSET_NS, self.start_ns)

    def __call__(self, fn: F) -> F:
        """Use as a decorator: every call of ``fn`` is one span (coroutines too)."""
        name, request_id, attributes = self.name, self.request_id, dict(self.attributes)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with stage(name, request_id=request_id, **attributes):
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with stage(name, request_id=request_id, **attributes):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]


def record(
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    request_id: str | None = None,
    parent: ctx.SpanRef | None = None,
    clock: str | None = None,
    stage_name: str | None = None,
    **attributes: Any,
) -> ctx.SpanRef:
    """Record a finished span with explicit times (e.g. GPU work resolved later).

    Args:
        name: span name; its stage is ``stage_name`` or, by default, the name's stage.
        start_ns, end_ns: Unix-epoch ns in the span's clock domain (``clock_ns()``).
        request_id: as for :class:`stage`.
        parent: the parent span (default: the current one, as for :class:`stage`).
        clock: the clock domain (``gpu:0`` …); default the host's.
        stage_name: the stage when it is not the name's.

    Returns:
        The span (a parent for later spans). Never raises because of tracing. Under a
        ``parent`` that is not sampled nothing is recorded and the span returned is not
        sampled either.
    """
    if parent is None:
        parent, request_id = _parent_for(request_id)
    elif request_id is None:
        request_id = parent.request_id
    span = stage(name, request_id=request_id, **attributes)
    span.parent = parent
    if parent is None:
        span.trace_id, span.sampled = ctx.new_trace_id(), True
    else:
        span.trace_id, span.sampled = parent.trace_id, parent.sampled
    span.span_id = next(_span_ids)
    span.remote = False
    span.start_ns = start_ns - _OFFSET_NS
    span.end_ns = max(end_ns, start_ns) - _OFFSET_NS
    span.clock_name = clock
    span.stage_name = stage_name
    recorder = _recorder
    if recorder is not None and span.sampled:
        recorder.add(span._record(), span.attributes)
    return span


def event(name: str, *, request_id: str | None = None, **attributes: Any) -> ctx.SpanRef:
    """A point event now (stage ``event``; e.g. ``first_byte``), a child of the current
    span of the request."""
    now = _perf_ns() + _OFFSET_NS
    return record(name, now, now, request_id=request_id, stage_name="event", **attributes)


def stats() -> FlushResult | None:
    """The configured recorder's counts so far (exported, dropped, failed, pending), or
    None when tracing is not configured. Cheap; does not flush."""
    recorder = _recorder
    return None if recorder is None else recorder.result()


def current_span() -> ctx.SpanRef | None:
    """The innermost open span of this thread or task, or None."""
    return ctx.current.get()


def link_step(step_span: stage, request_ids: Iterable[str]) -> None:
    """Link an engine-level ``step`` span to the requests it served (their outermost open
    spans; a request that is not sampled gets no link), and note their ids in its
    ``request_ids`` attribute."""
    ids = list(request_ids)
    links = step_span.links if step_span.links is not None else []
    for rid in ids:
        ref = ctx.requests.get(rid)
        if ref is not None and ref.span_id and ref.sampled:
            links.append((ref.trace_id, ref.span_id, {"request_id": rid}))
    step_span.links = links
    step_span.set(request_ids=ids)


def add_link(span: stage, target: ctx.SpanRef | None, **attributes: Any) -> bool:
    """Link the open ``span`` to ``target`` (a span in another trace, e.g. a request an
    engine step serves), with the link's ``attributes``.

    A ``target`` that is None, has no span (span id 0, a trace root such as
    ``new_request_root`` gives) or is not sampled (nothing of its trace is recorded) is
    not linked. Call before ``span`` ends: the recorder reads its links then. Never raises
    because of tracing.

    Returns:
        Whether a link was added.
    """
    if target is None or not target.span_id or not target.sampled:
        return False
    if span.links is None:
        span.links = []
    span.links.append((target.trace_id, target.span_id, attributes))
    return True

"""Request context: W3C trace context in and out, and which span a new stage nests under.

A request's stages can run on its asyncio task and on the engine's worker thread. Inside
one thread or task the current span lives in a ``ContextVar`` (copied into new asyncio
tasks by asyncio itself); across threads a stage names its request (``request_id=``) and
finds the request's outermost open span in a registry that ``request_context`` fills.

Sampling is parent-based: a span inherits ``sampled`` from its parent, and the root of a
request whose incoming ``traceparent`` says "not sampled" (W3C flags ``00``) is not
sampled, so nothing under it is recorded or linked to, on any thread (docs/design.md: a request
whose context is not sampled leaves no spans anywhere).
"""

from __future__ import annotations

import itertools
import os
import random
import re
from contextvars import ContextVar
from typing import Any

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_system = random.SystemRandom()
# Span ids come from a counter started at a random point: unique within the process,
# unlikely to meet another process's, and far cheaper than a random draw per span.
_span_ids = itertools.count(_system.getrandbits(62) + 1)
# Trace ids are drawn whole from a generator seeded from the system's entropy (and again in
# a forked child): W3C trace context asks for the right-most 7 bytes at least to be random,
# and a tool that labels requests by a part of the trace id must find them told apart there.
_trace_random = random.Random(_system.getrandbits(128))


def _reseed_after_fork() -> None:
    _trace_random.seed(_system.getrandbits(128))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_after_fork)


def new_trace_id() -> int:
    """A non-zero random 128-bit trace id (thread-safe: one C call on a shared generator)."""
    while True:
        trace_id = _trace_random.getrandbits(128)
        if trace_id:
            return trace_id


def new_span_id() -> int:
    """A non-zero 64-bit span id."""
    return next(_span_ids)


class SpanRef:
    """What a child needs of its parent: ids, the request it belongs to, attributes, and
    whether it is sampled.

    Stage handles are SpanRefs themselves; a remote parent (from ``traceparent``) is one
    too, with ``remote`` set. A span that is not ``sampled`` is never recorded, and neither
    is any span under it.
    """

    __slots__ = ("trace_id", "span_id", "request_id", "attributes", "remote", "sampled")

    def __init__(
        self,
        trace_id: int,
        span_id: int,
        request_id: str | None,
        attributes: dict[str, Any] | None = None,
        remote: bool = False,
        sampled: bool = True,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.request_id = request_id
        self.attributes = attributes
        self.remote = remote
        self.sampled = sampled

    @property
    def traceparent(self) -> str:
        """This span as a W3C ``traceparent`` header value, with its sampled flag."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)


current: ContextVar[SpanRef | None] = ContextVar("ttft_current_span", default=None)
"""The innermost open span of this thread or task."""

requests: dict[str, SpanRef] = {}
"""request id → the request's outermost open span (or its remote parent)."""


def request_parent(request_id: str) -> SpanRef | None:
    """The span a new stage of request ``request_id`` nests under, or None when the request
    has no open span: the current span of this thread or task when it belongs to that
    request, else the span registered for the request (its latest open stage, or its
    ``request_context`` root), found from any thread. Never raises.

    For a request whose context is not sampled the span is not sampled either: spans
    recorded under it (``record(..., parent=...)``, stages nested in it) are dropped and
    ``add_link`` to it links nothing, so a caller needs no check of its own."""
    cur = current.get()
    if cur is not None and cur.request_id == request_id:
        return cur
    return requests.get(request_id)


def new_request_root(request_id: str) -> SpanRef:
    """The root of a new trace for a request that has no open span (``request_parent`` is
    None): a fresh, sampled trace id and no span of its own (span id 0), so the spans
    recorded under it share one trace and are its top-level spans. Nothing is registered
    or recorded."""
    return SpanRef(new_trace_id(), 0, request_id)


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """``(trace_id, parent span id, sampled)`` of a W3C ``traceparent``; None if absent or
    invalid (version ``ff``, all-zero ids, bad format), as the W3C spec says to ignore it."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, bool(int(match.group(4), 16) & 1)


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """A W3C ``traceparent`` header value."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


class request_context:  # noqa: N801 - used like a function: ``with request_context(...)``
    """Bind one request's trace context for the stages inside.

    Args:
        traceparent: the incoming W3C ``traceparent`` (its trace continues), or None for
            a new trace.
        request_id: the serving stack's id of the request; stages elsewhere (another
            thread) that pass ``request_id=`` join this trace.
        tracestate: the incoming ``tracestate``, kept as the ``tracestate`` attribute.

    The context manager yields the request's root :class:`SpanRef` (the remote parent,
    or a fresh trace with no parent span). Leaving it unregisters the request id.

    A ``traceparent`` whose flags say "not sampled" (``00``) gives a root that is not
    sampled: the request is registered as usual (so stages on other threads find it), but
    nothing under it is recorded and no engine step links to it. An absent or invalid
    ``traceparent`` starts a sampled trace.
    """

    __slots__ = ("ref", "_token", "request_id")

    def __init__(
        self, traceparent: str | None, request_id: str, tracestate: str | None = None
    ) -> None:
        parsed = parse_traceparent(traceparent)
        attributes = {"tracestate": tracestate} if tracestate else None
        if parsed is None:
            self.ref = SpanRef(new_trace_id(), 0, request_id, attributes)
        else:
            trace_id, span_id, sampled = parsed
            self.ref = SpanRef(trace_id, span_id, request_id, attributes, True, sampled)
        self.request_id = request_id
        self._token = None

    def __enter__(self) -> SpanRef:
        self._token = current.set(self.ref)
        requests[self.request_id] = self.ref
        return self.ref

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            current.reset(self._token)
            self._token = None
        if requests.get(self.request_id) is self.ref:
            del requests[self.request_id]

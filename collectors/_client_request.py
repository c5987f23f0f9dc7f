"""One request of the load generator: the sink its connection reports the response to, the
SSE parsing that finds the client events and the stream's end (its finish reason decides
the outcome: ``_finish_reasons``), and the request's span rows when it ends (docs/design.md,
stages ``client`` and ``connect``, the client events), with the spans placed from the
timings the server reported in its response (``server_timings``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from ttft.collectors._finish_reasons import ABORTED, finish_of
from ttft.collectors._pool import Pool
from ttft.collectors._sender import Connection, StaleConnection
from ttft.collectors.rows import Event, span_rows
from ttft.collectors.server_timings import capture, reported_spans
from ttft.collectors.workloads import WorkItem
from ttft.tracer.api import clock_ns
from ttft.tracer.context import new_span_id, new_trace_id
from ttft.tracer.schema import (
    ATTR_CACHED_TOKENS,
    ATTR_ERROR,
    ATTR_ESTIMATED,
    ATTR_FINISH_REASON,
    ATTR_OUTCOME,
    ATTR_PROMPT_TOKENS,
    ATTR_STATUS_CODE,
    CLIENT_CLOCK,
    EV_FIRST_REASONING,
    EV_FIRST_TOKEN,
    EV_TOKEN,
    OUTCOME_OK,
    REPORTED_SERVICE,
)

SERVICE = "loadgen"
"""The ``service`` value of every row the load generator writes."""
SHED_STATUSES = frozenset((429, 503))
"""Statuses that mean the server refused the load (outcome ``shed``)."""


@dataclass
class RequestResult:
    """The client's view of one request.

    Attributes:
        index: position in the workload.
        trace_id: the request's trace (32 hex), sent as ``traceparent``.
        request_id: the server's response ``id``, if one arrived.
        ttft_s: client span start to the first content chunk; None without one.
        e2e_s: client span start to its last byte.
        tokens: completion tokens (from usage, else the number of content chunks).
        prompt_tokens, cached_tokens: from usage, None if the server sent none.
        status_code: HTTP status, None if no response arrived.
        outcome: one of ``tracer.schema.OUTCOMES`` (``ok`` unless it failed).
        error: why the request failed, None if it did not.
        rows: the request's span rows (SPAN_SCHEMA dicts).
    """

    index: int
    trace_id: str
    request_id: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    status_code: int | None = None
    outcome: str = OUTCOME_OK
    error: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)


class Probe:
    """Collects the timing of a connect the request waited for (``started``, ``connected``)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    def __call__(self, name: str, ns: int) -> None:
        self.ns.setdefault(name, ns)


def sse_events(buffer: bytearray) -> list[str]:
    """Pop complete SSE events from ``buffer``; return each event's joined ``data``."""
    out: list[str] = []
    while True:
        normal, crlf = buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")
        if normal < 0 and crlf < 0:
            return out
        if crlf >= 0 and (normal < 0 or crlf < normal):
            end, sep = crlf, 4
        else:
            end, sep = normal, 2
        block = bytes(buffer[:end]).decode("utf-8", "replace")
        del buffer[:end + sep]
        data = [line[5:].removeprefix(" ") for line in block.splitlines()
                if line.startswith("data:")]
        if data:
            out.append("\n".join(data))


class Request:
    """One request's state while it runs: the sink its connection reports the response to
    (``_sender.Sink``); ``finish`` turns it into a result with rows."""

    def __init__(self, index: int, scheduled_ns: int, item: WorkItem | None = None) -> None:
        self.item = item
        self.trace_id = f"{new_trace_id():032x}"
        self.span_id = new_span_id()
        self.result = RequestResult(index, self.trace_id)
        self.events: list[tuple[str, int]] = [("scheduled", scheduled_ns)]
        self.probe = Probe()
        self.start_ns = 0
        self.sent_ns: int | None = None
        self.content_chunks = 0
        self.completion_tokens: int | None = None
        self.conn: Connection | None = None
        self.done: asyncio.Future[None] | None = None
        self.tls = False
        self.buffer = bytearray()
        self.got_body = self.got_event = self.got_done = self.got_finish = False
        self.got_reasoning = self.whole = False
        self.outcome: str | None = None  # set where a failure is found; None: not (yet)
        self.finish_reason: str | None = None  # the first one a choice carried
        self.unknown_finish = False  # a string finish reason no source defines
        self.headers: dict[str, str] = {}
        self.reported: dict[str, Any] = {}  # server_timings.capture's fields

    def event(self, name: str, ns: int | None = None) -> None:
        self.events.append((name, clock_ns() if ns is None else ns))

    def send_on(self, conn: Connection, wire: bytes) -> None:
        """Write the encoded request on ``conn``; ``done`` resolves when the response ends."""
        self.conn, self.done = conn, asyncio.get_running_loop().create_future()
        conn.send(wire, self)

    def on_sent(self, ns: int) -> None:
        self.sent_ns = ns

    def on_headers(self, status: int, headers: dict[str, str], ns: int) -> None:
        self.event("headers", ns)
        self.result.status_code = status
        self.headers = headers

    def on_body(self, data: bytes, ns: int) -> None:
        if not self.got_body:
            self.got_body = True
            self.event("first_chunk", ns)
        self.buffer.extend(data)
        if self.result.status_code != 200 or "json" in self.headers.get("content-type", ""):
            return  # an error's text, or a whole JSON answer: read at the end
        for event in sse_events(self.buffer):
            if not self.got_event:
                self.got_event = True
                self.event("first_event", ns)
            if event.strip() == "[DONE]":
                self.got_done = True
                continue
            try:
                self.on_payload(json.loads(event), ns)
            except ValueError:
                self.fail("http_error", f"bad SSE data: {event[:200]!r}")

    def fail(self, outcome: str, error: str) -> None:
        """Record the request's failure; the first one found is the one it keeps."""
        if self.outcome is None:
            self.outcome, self.result.error = outcome, error

    def on_end(self, ns: int) -> None:
        """The response ended with its framing complete."""
        status = self.result.status_code
        if status != 200:
            text = self.buffer.decode("utf-8", "replace")
            self.fail("shed" if status in SHED_STATUSES else "http_error",
                      f"HTTP {status}: {text[:300]}")
        elif not self.got_event and self.buffer and not self._whole_answer(ns):
            self.fail("http_error", "HTTP 200 with neither an event stream nor a JSON answer: "
                      f"{bytes(self.buffer[:200])!r}")
        elif not (self.got_done or self.got_finish):
            self.fail("disconnected", "stream ended without [DONE] or a finish reason")
        elif not self.got_finish:
            self.fail("truncated", "stream ended with [DONE] but no finish reason")
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _whole_answer(self, ns: int) -> bool:
        """A server that answered with one JSON body although a stream was asked for: read
        it as one payload whose content (``message`` for chat) is the first token, at the
        body's end, when the client could first use it. False when the body is no JSON
        object."""
        try:
            payload = json.loads(self.buffer)
        except ValueError:
            return False
        if not isinstance(payload, dict):
            return False
        self.whole = True
        choices = payload.get("choices")
        if isinstance(choices, list):
            payload = {**payload, "choices": [
                {**c, "delta": c["message"]} if isinstance(c, dict)
                and isinstance(c.get("message"), dict) else c for c in choices]}
        self.on_payload(payload, ns)
        return True

    def on_error(self, exc: BaseException) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def on_payload(self, payload: Any, now_ns: int) -> None:
        if not isinstance(payload, dict):
            return
        if "error" in payload and payload["error"]:
            err = payload["error"]
            self.fail("http_error",
                      str(err.get("message", err) if isinstance(err, dict) else err))
            return
        if self.result.request_id is None and payload.get("id"):
            self.result.request_id = str(payload["id"])
        capture(payload, self.reported)
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.on_finish(choice["finish_reason"])
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                delta = {}  # a malformed delta carries nothing
            text = choice.get("text") if delta is None else delta.get("content")
            if delta and not self.got_reasoning and (
                    delta.get("reasoning_content") or delta.get("reasoning")):
                self.got_reasoning = True
                self.event(EV_FIRST_REASONING, now_ns)
            if text:
                self.content_chunks += 1
                self.event(EV_TOKEN if self.content_chunks > 1 else EV_FIRST_TOKEN, now_ns)
            elif delta is not None and delta.get("role") and self.content_chunks == 0:
                self.event("role_chunk", now_ns)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.result.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.result.cached_tokens = details.get("cached_tokens")

    def on_finish(self, value: Any) -> None:
        """A choice carried a finish reason: the first one is recorded; an ``abort``,
        ``error`` or failing object one makes the request ``aborted``."""
        found = finish_of(value)
        if found is None:
            return
        self.got_finish = True
        if self.finish_reason is None:
            self.finish_reason, self.unknown_finish = found.reason, not found.known
        if found.failed:
            self.fail(ABORTED, f"finish reason {found.reason!r}"
                      + (f": {found.message}" if found.message else ""))

    def _client_attributes(self) -> dict[str, Any]:
        r = self.result
        attrs: dict[str, Any] = {
            "index": r.index, ATTR_STATUS_CODE: r.status_code, ATTR_OUTCOME: r.outcome,
            ATTR_PROMPT_TOKENS: r.prompt_tokens, "completion_tokens": self.completion_tokens,
            ATTR_CACHED_TOKENS: r.cached_tokens, "content_chunks": self.content_chunks,
        }
        if self.item is not None and self.item.target_tokens is not None:
            attrs["prompt_tokens_target"] = self.item.target_tokens
            attrs["prompt_tokens_exact"] = self.item.exact
        if self.item is not None and self.item.group is not None:
            attrs["prefix_group"] = self.item.group
        if r.cached_tokens is not None:
            attrs["condition"] = "prefix_hit" if r.cached_tokens > 0 else "cold"
        if r.error is not None:
            attrs[ATTR_ERROR] = r.error
        if self.whole:
            attrs["streamed"] = False  # one JSON body: its first token is the body's end
        if self.finish_reason is not None:
            attrs[ATTR_FINISH_REASON] = self.finish_reason
            if self.unknown_finish:
                attrs["finish_reason_unknown"] = True
        return attrs

    def finish(self, end_ns: int) -> RequestResult:
        """Fill in the result and its rows (:func:`ttft.collectors.rows.span_rows`): the
        ``client`` span with the client events in time order, a ``connect`` child when
        the request waited for a new connection, and the spans placed from the timings
        the server reported (service ``REPORTED_SERVICE``, children of the client span,
        each marked ``ATTR_ESTIMATED``)."""
        r = self.result
        r.outcome = self.outcome or OUTCOME_OK
        r.e2e_s = (end_ns - self.start_ns) / 1e9
        r.tokens = self.completion_tokens if self.completion_tokens is not None \
            else self.content_chunks
        first = [ns for name, ns in self.events if name == EV_FIRST_TOKEN]
        r.ttft_s = (first[0] - self.start_ns) / 1e9 if first else None
        if self.sent_ns is not None:
            self.events.append(("sent", self.sent_ns))
        client_id = f"{self.span_id:016x}"
        common = {"trace_id": self.trace_id, "clock": CLIENT_CLOCK, "service": SERVICE,
                  "request_id": r.request_id}
        r.rows = span_rows(
            "client", span_id=client_id, parent_id=None, start_ns=self.start_ns, end_ns=end_ns,
            attributes=self._client_attributes(),
            events=[Event(name, ns) for name, ns in sorted(self.events, key=lambda e: e[1])],
            **common)
        p = self.probe.ns
        if "started" in p:
            start = p["started"]
            r.rows += span_rows(
                "connect", span_id=f"{new_span_id():016x}", parent_id=client_id,
                start_ns=start, end_ns=max(start, p.get("connected", end_ns)),
                attributes={"tls": self.tls}, **common)
        if self.headers or self.reported:
            common["service"] = REPORTED_SERVICE
            # the server starts on the request after it was sent: no reported span begins
            # before the send (or the connection, or the client span), which are measured
            sent = self.sent_ns if self.sent_ns is not None else p.get("connected",
                                                                        self.start_ns)
            for span in reported_spans(self.headers, self.reported,
                                       start_ns=max(self.start_ns, sent),
                                       first_token_ns=first[0] if first else None,
                                       end_ns=end_ns):
                r.rows += span_rows(
                    span.name, span_id=f"{new_span_id():016x}", parent_id=client_id,
                    start_ns=span.start_ns, end_ns=span.end_ns,
                    attributes={**span.attributes, ATTR_ESTIMATED: span.estimated}, **common)
        return r


async def send(pool: Pool, req: Request, wire: bytes, timeout_s: float) -> RequestResult:
    """Read one request's response to its end, sending it first unless ``req.conn`` already
    carries it; failures land in ``req.result``. A reused connection the server had closed
    is replaced once. Cancelled (the run stopped), it closes the connection and re-raises:
    the caller ends the request ``cancelled`` (``loadgen._Schedule.cancel``)."""

    async def exchange() -> None:
        for retry in (False, True):
            if req.conn is None:
                req.send_on(await pool.connect(req.probe), wire)
            assert req.done is not None
            try:
                return await req.done
            except StaleConnection:
                if retry:
                    raise
                pool.release(req.conn)
                req.conn = None

    try:
        await asyncio.wait_for(exchange(), timeout_s)
    except asyncio.TimeoutError:
        req.fail("timeout", f"timed out after {timeout_s} s")
    except (OSError, ValueError) as exc:
        # No connection: the request was never sent. Else the connection broke or the
        # response broke its framing before it ended.
        req.fail("client_error" if req.conn is None else "disconnected",
                 f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    except asyncio.CancelledError:
        if req.conn is not None:
            req.conn.close()  # the run stopped: this response will never be read
        raise
    if req.conn is not None:
        pool.release(req.conn)  # closed unless its response ended cleanly
    req.tls = pool.origin.ssl is not None
    return req.finish(clock_ns())

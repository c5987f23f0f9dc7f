"""The load generator: sends a workload to any OpenAI-compatible streaming server and records
the client's view of every request as span rows (DESIGN.md, stages ``client`` and
``connect``, the client events, the ``client`` TTFT window).

It speaks plain HTTP/1.1 through its own small keep-alive client (``_sender``: each request
is one write of bytes encoded before it is due, and response bytes are timestamped as the
event loop delivers them) and never imports the reference engine, so it traces any server.
One sender sends the requests in arrival order, each at one start time + its arrival
offset, so a slow request never delays the schedule of the next;
benchmarks/client_accuracy.py measures how closely.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ttft.collectors._sender import Connection, Origin, Pool, StaleConnection, wait_until
from ttft.collectors._spans import to_span_table
from ttft.collectors.workloads import WorkItem, Workload
from ttft.tracer.api import clock_ns
from ttft.tracer.context import format_traceparent, new_span_id, new_trace_id
from ttft.tracer.schema import (
    ATTR_CACHED_TOKENS,
    ATTR_PROMPT_TOKENS,
    CLIENT_CLOCK,
    EV_FIRST_TOKEN,
    EV_TOKEN,
)

if TYPE_CHECKING:
    from ttft.collectors.store import TraceWriter

__all__ = ["SERVICE", "RequestResult", "results_table", "run"]

SERVICE = "loadgen"
"""The ``service`` value of every row the load generator writes."""


# -- the run --------------------------------------------------------------------------------

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
    error: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)


class _Probe:
    """Collects the timing of a connect the request waited for (``started``, ``connected``)."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    def __call__(self, name: str, ns: int) -> None:
        self.ns.setdefault(name, ns)


def _sse_events(buffer: bytearray) -> list[str]:
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


class _Request:
    """One request's state while it runs: the sink its connection reports the response to
    (``_sender.Sink``); ``finish`` turns it into a result with rows."""

    def __init__(self, index: int, scheduled_ns: int, item: WorkItem | None = None) -> None:
        self.item = item
        self.trace_id = f"{new_trace_id():032x}"
        self.span_id = new_span_id()
        self.result = RequestResult(index, self.trace_id)
        self.events: list[tuple[str, int]] = [("scheduled", scheduled_ns)]
        self.probe = _Probe()
        self.start_ns = 0
        self.sent_ns: int | None = None
        self.content_chunks = 0
        self.completion_tokens: int | None = None
        self.conn: Connection | None = None
        self.done: asyncio.Future[None] | None = None
        self.tls = False
        self.buffer = bytearray()
        self.got_body = self.got_event = self.got_done = False

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

    def on_body(self, data: bytes, ns: int) -> None:
        if not self.got_body:
            self.got_body = True
            self.event("first_chunk", ns)
        self.buffer.extend(data)
        if self.result.status_code != 200:
            return
        for event in _sse_events(self.buffer):
            if not self.got_event:
                self.got_event = True
                self.event("first_event", ns)
            if event.strip() == "[DONE]":
                self.got_done = True
                continue
            try:
                self.on_payload(json.loads(event), ns)
            except ValueError:
                self.result.error = f"bad SSE data: {event[:200]!r}"

    def on_end(self, ns: int) -> None:
        if self.result.status_code != 200:
            text = self.buffer.decode("utf-8", "replace")
            self.result.error = f"HTTP {self.result.status_code}: {text[:300]}"
        elif not self.got_done and self.result.error is None:
            self.result.error = "stream ended without [DONE]"
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def on_error(self, exc: BaseException) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def on_payload(self, payload: Any, now_ns: int) -> None:
        if not isinstance(payload, dict):
            return
        if "error" in payload and payload["error"]:
            err = payload["error"]
            self.result.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        if self.result.request_id is None and payload.get("id"):
            self.result.request_id = str(payload["id"])
        for choice in payload.get("choices") or ():
            delta = choice.get("delta")
            text = choice.get("text") if delta is None else delta.get("content")
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

    def finish(self, end_ns: int) -> RequestResult:
        r = self.result
        r.e2e_s = (end_ns - self.start_ns) / 1e9
        r.tokens = self.completion_tokens if self.completion_tokens is not None \
            else self.content_chunks
        first = [ns for name, ns in self.events if name == EV_FIRST_TOKEN]
        r.ttft_s = (first[0] - self.start_ns) / 1e9 if first else None
        attrs: dict[str, Any] = {
            "index": r.index, "status_code": r.status_code,
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
            attrs["error"] = r.error
        parent = f"{self.span_id:016x}"

        def row(name: str, stage: str, start: int, end: int, span_id: str, parent_id: str | None,
                attributes: dict[str, Any] | None = None) -> dict[str, Any]:
            return {"trace_id": self.trace_id, "span_id": span_id, "parent_id": parent_id,
                    "request_id": r.request_id, "name": name, "stage": stage, "start_ns": start,
                    "end_ns": end, "clock": CLIENT_CLOCK, "service": SERVICE,
                    "attributes": json.dumps(attributes or {}, sort_keys=True)}

        r.rows = [row("client", "client", self.start_ns, end_ns, parent, None, attrs)]
        p = self.probe.ns
        if "started" in p:
            start = p["started"]
            r.rows.append(row("connect", "connect", start, max(start, p.get("connected", end_ns)),
                              f"{new_span_id():016x}", parent, {"tls": self.tls}))
        if self.sent_ns is not None:
            self.events.append(("sent", self.sent_ns))
        for name, ns in sorted(self.events, key=lambda e: e[1]):
            r.rows.append(row(name, "event", ns, ns, f"{new_span_id():016x}", parent))
        return r


async def _send(pool: Pool, req: _Request, wire: bytes, timeout_s: float) -> RequestResult:
    """Read one request's response to its end, sending it first unless ``req.conn`` already
    carries it; failures land in ``req.result``. A reused connection the server had closed
    is replaced once."""

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
        req.result.error = f"timed out after {timeout_s} s"
    except (OSError, ValueError) as exc:
        req.result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if req.conn is not None:
        pool.release(req.conn)  # closed unless its response ended cleanly
    req.tls = pool.origin.ssl is not None
    return req.finish(clock_ns())


async def run(base_url: str, workload: Workload, *, chat: bool = False, model: str | None = None,
              concurrency: int | None = None, warmup: int = 0, api_key: str | None = None,
              timeout_s: float = 60.0, writer: TraceWriter | None = None,
              on_sent: Callable[[int], None] | None = None,
              on_result: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    """Send ``workload`` to an OpenAI-compatible server, streaming, and trace each request.

    Each request is due at run start (2 ms after the warm-up) + its ``arrival_s``: the
    ``scheduled`` event is that due time. One sender sends them in arrival order, each from
    bytes encoded before it is due, on a keep-alive connection opened ahead of time when one
    is free (a ``connect`` span marks a wait for a new one). With ``concurrency`` a due
    request then waits for a slot, and the ``client`` span starts only when it is handed to
    the HTTP client. Every request gets a fresh trace (``traceparent`` carries the client
    span's id) and a total ``timeout_s``. Failures (HTTP errors, disconnects, timeouts) are
    recorded in ``error``, never raised. Plain HTTP/1.1 (``_sender``): no proxies.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1/...`` is appended).
        workload: the requests.
        chat: use ``/v1/chat/completions`` (one user message) instead of ``/v1/completions``.
        model: the ``model`` field; omitted when None.
        concurrency: the most requests in flight; None for no limit.
        warmup: this many short untraced requests are sent first, one at a time; then
            spare connections are opened before the schedule starts.
        api_key: sent as ``Authorization: Bearer``.
        timeout_s: the longest one request may take, end to end.
        writer: a ``TraceWriter``; the rows of every request are appended to it.
        on_sent: called with a request's index when it is handed to the HTTP client.
        on_result: called with each result as its request ends (for progress displays).

    Returns:
        One result per workload item, in workload order.

    Raises:
        ValueError: ``concurrency`` below 1, or ``base_url`` not an http(s) URL.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    origin = Origin(base_url)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    headers = [("content-type", "application/json"), ("accept", "text/event-stream")]
    if api_key:
        headers.append(("authorization", f"Bearer {api_key}"))
    limit = concurrency or max(1, len(workload))
    pool = Pool(origin, limit)
    loop = asyncio.get_running_loop()

    def encode(item: WorkItem, req: _Request) -> bytes:
        body: dict[str, Any] = {"max_tokens": item.max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if model is not None:
            body["model"] = model
        if chat:
            content = item.prompt if isinstance(item.prompt, str) else " ".join(
                map(str, item.prompt))
            body["messages"] = [{"role": "user", "content": content}]
        else:
            body["prompt"] = item.prompt
        # warm-up requests (index -1) say "not sampled": servers record nothing of them
        traceparent = format_traceparent(int(req.trace_id, 16), req.span_id,
                                         req.result.index >= 0)
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return origin.request("POST", path, [*headers, ("traceparent", traceparent)], data)

    results: list[RequestResult | None] = [None] * len(workload)
    tasks: list[asyncio.Task[None]] = []
    waiting: deque[tuple[_Request, bytes]] = deque()
    in_flight = 0

    def launch(req: _Request, wire: bytes) -> None:
        """Hand a due request to the client: write it now if a connection is idle."""
        nonlocal in_flight
        in_flight += 1
        req.start_ns = clock_ns()
        conn = pool.take()
        if conn is not None:
            req.send_on(conn, wire)
        if on_sent is not None:
            on_sent(req.result.index)
        tasks.append(loop.create_task(complete(req, wire)))
        pool.prepare()  # the next request should find a connection ready

    async def complete(req: _Request, wire: bytes) -> None:
        nonlocal in_flight
        result = await _send(pool, req, wire, timeout_s)
        results[result.index] = result
        in_flight -= 1
        while waiting and in_flight < limit:
            launch(*waiting.popleft())
        if on_result is not None:
            on_result(result)

    freeze = gc.get_freeze_count() == 0
    if freeze:  # collect now, not mid-run; later full collections skip what exists now
        gc.collect()
        gc.freeze()
    try:
        for i in range(warmup):
            item = WorkItem(0.0, f"Warm-up request {i}.", 1)
            req = _Request(-1, clock_ns(), item)
            wire = encode(item, req)
            req.start_ns = clock_ns()
            await _send(pool, req, wire, timeout_s)
        if warmup:  # ... and opens the spare connections the first requests will use
            pool.prepare()
            await pool.ready(timeout_s)
        start_ns = clock_ns() + 2_000_000
        for index in sorted(range(len(workload)), key=lambda i: workload[i].arrival_s):
            item = workload[index]
            req = _Request(index, start_ns + round(item.arrival_s * 1e9), item)
            wire = encode(item, req)
            await wait_until(req.events[0][1])
            if in_flight < limit:
                launch(req, wire)
            else:
                waiting.append((req, wire))
        launched = 0
        while launched < len(tasks):  # requests that waited for a slot launch meanwhile
            launched = len(tasks)
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await pool.close()
        if freeze:
            gc.unfreeze()
    done = [r for r in results if r is not None]
    if writer is not None and done:
        writer.append(results_table(done))
    return done


def results_table(results: Sequence[RequestResult]) -> pa.Table:
    """All rows of ``results`` as one table with exactly SPAN_SCHEMA."""
    return to_span_table([row for r in results for row in r.rows])

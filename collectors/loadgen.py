"""The load generator: sends a workload to any OpenAI-compatible streaming server and records
the client's view of every request as span rows (DESIGN.md, stages ``client`` and
``connect``, the client events, the ``client`` TTFT window).

It speaks plain HTTP (one pooled keep-alive ``httpx.AsyncClient``) and never imports the
reference engine, so it traces any server. Arrival offsets are computed up front from one
start time, so a slow request never delays the schedule of the next.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa

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
    """Collects connection and send times from httpcore's ``trace`` extension."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.ns.setdefault(name, clock_ns())


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
    """One request's state while it runs; ``finish`` turns it into a result with rows."""

    def __init__(self, index: int, scheduled_ns: int, item: WorkItem | None = None) -> None:
        self.item = item
        self.trace_id = f"{new_trace_id():032x}"
        self.span_id = new_span_id()
        self.result = RequestResult(index, self.trace_id)
        self.events: list[tuple[str, int]] = [("scheduled", scheduled_ns)]
        self.probe = _Probe()
        self.start_ns = 0
        self.content_chunks = 0
        self.completion_tokens: int | None = None

    def event(self, name: str, ns: int | None = None) -> None:
        self.events.append((name, clock_ns() if ns is None else ns))

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
        if "connection.connect_tcp.started" in p:
            connect_end = max(p.get(k, 0) for k in ("connection.connect_tcp.complete",
                                                    "connection.start_tls.complete"))
            start = p["connection.connect_tcp.started"]
            r.rows.append(row("connect", "connect", start, max(start, connect_end),
                              f"{new_span_id():016x}", parent, {"tls": "connection.start_tls"
                                                                 ".complete" in p}))
        for name, ns in sorted(self.events, key=lambda e: e[1]):
            r.rows.append(row(name, "event", ns, ns, f"{new_span_id():016x}", parent))
        return r


async def _send(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                headers: dict[str, str], req: _Request, timeout_s: float) -> None:
    """Send one streaming request and read it to the end; failures land in ``req.result``."""
    req.start_ns = clock_ns()
    headers = {**headers, "traceparent": format_traceparent(int(req.trace_id, 16), req.span_id)}
    request = client.build_request("POST", url, json=body, headers=headers, timeout=timeout_s,
                                   extensions={"trace": req.probe})
    response = await client.send(request, stream=True)
    try:
        p = req.probe.ns
        req.event("sent", p.get("http11.send_request_body.complete",
                                p.get("http2.send_request_body.complete")))
        req.event("headers", p.get("http11.receive_response_headers.complete",
                                   p.get("http2.receive_response_headers.complete")))
        req.result.status_code = response.status_code
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", "replace")
            req.result.error = f"HTTP {response.status_code}: {text[:300]}"
            return
        buffer = bytearray()
        done = False
        async for data in response.aiter_bytes():
            now_ns = clock_ns()
            if not data:
                continue
            if not any(name == "first_chunk" for name, _ in req.events):
                req.event("first_chunk", now_ns)
            buffer.extend(data)
            for event in _sse_events(buffer):
                if not any(name == "first_event" for name, _ in req.events):
                    req.event("first_event", now_ns)
                if event.strip() == "[DONE]":
                    done = True
                    continue
                try:
                    req.on_payload(json.loads(event), now_ns)
                except ValueError:
                    req.result.error = f"bad SSE data: {event[:200]!r}"
        if not done and req.result.error is None:
            req.result.error = "stream ended without [DONE]"
    finally:
        await response.aclose()


async def run(base_url: str, workload: Workload, *, chat: bool = False, model: str | None = None,
              concurrency: int | None = None, warmup: int = 0, api_key: str | None = None,
              timeout_s: float = 60.0, writer: TraceWriter | None = None,
              on_sent: Callable[[int], None] | None = None,
              on_result: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    """Send ``workload`` to an OpenAI-compatible server, streaming, and trace each request.

    Each request is due at run start + its ``arrival_s`` (the ``scheduled`` event); with
    ``concurrency`` it then waits for a slot, and the ``client`` span starts only when it is
    handed to the HTTP client. Every request gets a fresh trace (``traceparent`` carries the
    client span's id) and a total ``timeout_s``. Failures (HTTP errors, disconnects,
    timeouts) are recorded in ``error``, never raised.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1/...`` is appended).
        workload: the requests.
        chat: use ``/v1/chat/completions`` (one user message) instead of ``/v1/completions``.
        model: the ``model`` field; omitted when None.
        concurrency: the most requests in flight; None for no limit.
        warmup: this many short untraced requests are sent first, one at a time.
        api_key: sent as ``Authorization: Bearer``.
        timeout_s: the longest one request may take, end to end.
        writer: a ``TraceWriter``; the rows of every request are appended to it.
        on_sent: called with a request's index when it is handed to the HTTP client.
        on_result: called with each result as its request ends (for progress displays).

    Returns:
        One result per workload item, in workload order.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    url = base_url.rstrip("/") + path
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = concurrency or max(1, len(workload))
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)

    def body(item: WorkItem) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": item.max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}}
        if model is not None:
            out["model"] = model
        if chat:
            content = item.prompt if isinstance(item.prompt, str) else " ".join(
                map(str, item.prompt))
            out["messages"] = [{"role": "user", "content": content}]
        else:
            out["prompt"] = item.prompt
        return out

    async def attempt(item: WorkItem, req: _Request) -> RequestResult:
        try:
            await asyncio.wait_for(_send(client, url, body(item), headers, req, timeout_s),
                                   timeout_s)
        except asyncio.TimeoutError:
            req.result.error = f"timed out after {timeout_s} s"
        except (httpx.HTTPError, httpx.StreamError, OSError, ValueError) as exc:
            req.result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if not req.start_ns:
            req.start_ns = clock_ns()
        return req.finish(clock_ns())

    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        for i in range(warmup):
            item = WorkItem(0.0, f"Warm-up request {i}.", 1)
            await attempt(item, _Request(-1, clock_ns()))
        slots = asyncio.Semaphore(limit)
        loop = asyncio.get_running_loop()
        start_s = loop.time()

        async def one(index: int, item: WorkItem) -> RequestResult:
            await asyncio.sleep(max(0.0, start_s + item.arrival_s - loop.time()))
            req = _Request(index, clock_ns(), item)
            async with slots:
                if on_sent is not None:
                    on_sent(index)
                result = await attempt(item, req)
            if on_result is not None:
                on_result(result)
            return result

        results = await asyncio.gather(*(one(i, item) for i, item in enumerate(workload)))
    if writer is not None and results:
        writer.append(results_table(results))
    return list(results)


def results_table(results: Sequence[RequestResult]) -> pa.Table:
    """All rows of ``results`` as one table with exactly SPAN_SCHEMA."""
    return to_span_table([row for r in results for row in r.rows])

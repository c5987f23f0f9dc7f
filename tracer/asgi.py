"""ASGI middleware recording the server side of a request: ``server``, ``stream``, ``first_byte``.

``TTFTMiddleware`` is pure ASGI (no framework import), so it wraps any ASGI application
(Starlette, FastAPI, a bare callable). For each HTTP request it records (docs/design.md,
"Stages"):

- ``server``: request received → response end (the last body chunk handed to the
  server), or → the application returned or raised when no response was finished.
  Attributes ``method``, ``path``, ``http.status_code``, ``response_end_ns`` (when the
  last body chunk was handed over: the span's end), ``client_disconnected`` and
  ``tracestate`` when they apply.
- ``first_byte``: a point event, child of ``server``: the first body chunk that carries a
  token is handed to the transport, stamped just before its ``send`` is awaited (so it
  never lies after the token's bytes are on the wire).
- ``stream``: a child of ``server``: that ``send``, from the ``first_byte`` stamp until
  the ``send`` returned. A ``send`` that raises leaves ``stream`` with ``error`` and no
  ``first_byte`` (the chunk did not go out).

A chunk carries a token when the response is ``2xx`` and either it is a server-sent
event stream (``text/event-stream``) and the chunk completes an event whose ``data`` is
JSON with a non-empty ``choices[i].text`` or ``choices[i].delta.content`` (OpenAI
streaming), or it is any other response and the chunk is the first non-empty one (the
body holds all tokens). A compressed event stream (``content-encoding`` other than
``identity``) cannot be read, so it gets no ``stream``/``first_byte``; add this middleware
inside any compression middleware.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ttft.tracer.api import clock_ns, record, stage
from ttft.tracer.context import request_context
from ttft.tracer.schema import EV_FIRST_BYTE

__all__ = ["TTFTMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_EOL = re.compile(rb"\r\n|\r|\n")
_MAX_PENDING_BYTES = 1 << 20
"""An unfinished SSE line or event longer than this stops the scan (no ``first_byte``)."""
_BODY_TYPES = ("http.response.body", "http.response.zerocopysend", "http.response.pathsend")


def _carries_token(payload: bytes) -> bool:
    """True if an SSE event's data is an OpenAI chunk with a non-empty text or content."""
    try:
        chunk = json.loads(payload)
    except Exception:  # malformed, [DONE], not UTF-8, too deep: no token
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if isinstance(text, str) and text:
            return True
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            return True
    return False


class _SSETokenScan:
    """Incremental server-sent-events reader that finds the first event carrying a token.

    Events may span chunks and a chunk may hold several; lines end in CR, LF or CRLF
    (WHATWG SSE). An event is complete at its blank line, as a client's parser sees it.
    """

    __slots__ = ("_tail", "_data", "_data_bytes", "_skip_lf", "_gave_up")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._skip_lf = False
        self._gave_up = False

    def feed(self, chunk: bytes) -> bool:
        """Read one body chunk; True if it completes an event that carries a token."""
        if self._gave_up or not chunk:
            return False
        if self._skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._skip_lf = chunk.endswith(b"\r")
        lines = _EOL.split(self._tail + chunk)
        self._tail = lines.pop()
        found = False
        for line in lines:
            if not line:
                if self._data and _carries_token(b"\n".join(self._data)):
                    found = True
                self._data.clear()
                self._data_bytes = 0
            elif line.startswith(b"data"):
                field, _, value = line.partition(b":")
                if field == b"data":
                    value = value[1:] if value.startswith(b" ") else value
                    self._data.append(value)
                    self._data_bytes += len(value)
        if len(self._tail) + self._data_bytes > _MAX_PENDING_BYTES:
            self._gave_up = True
        return found


class _Exchange:
    """One request's view of the response, shared by the wrapped ``receive`` and ``send``.

    The wrappers may run in tasks other than the middleware's (Starlette streams from a
    task group), so the ``stream`` span and ``first_byte`` name the ``server`` span as
    their parent explicitly instead of relying on the current span.
    """

    __slots__ = ("server", "receive", "send", "closed", "finished", "status", "sse", "token_sent")

    def __init__(self, server: stage, receive: Receive, send: Send) -> None:
        self.server = server
        self.receive = receive
        self.send = send
        self.closed = False  # the server span ended: its attributes must not change
        self.finished = False  # the last body chunk was handed over
        self.status = 0
        self.sse: _SSETokenScan | None = None
        self.token_sent = False

    def _annotate(self, **attributes: Any) -> None:
        if not self.closed:
            self.server.set(**attributes)

    async def wrapped_receive(self) -> Message:
        message = await self.receive()
        try:
            if message["type"] == "http.disconnect" and not self.finished:
                self._annotate(client_disconnected=True)
        except Exception:
            pass  # a malformed message is the server's problem, not tracing's
        return message

    async def wrapped_send(self, message: Message) -> None:
        carries = False
        try:
            kind = message["type"]
            if kind == "http.response.start":
                self._on_start(message)
            elif kind in _BODY_TYPES and not self.token_sent and 200 <= self.status < 300:
                carries = self._carries(kind, message)
        except Exception as exc:  # tracing must never break the response
            self.token_sent = True  # stop looking
            self._annotate(ttft_asgi_error=type(exc).__name__)
        last = not self.finished and _is_last(message)
        if last:
            # before the await: the server may wake a waiting ``receive`` with
            # ``http.disconnect`` as soon as it has the last chunk
            self.finished = True
        try:
            if carries:
                self.token_sent = True
                await self._send_first(message)
            else:
                await self.send(message)
        except OSError:  # ASGI 2.4: the client went away
            if not last:
                self._annotate(client_disconnected=True)
            raise
        if last:
            end_ns = clock_ns()
            self._annotate(response_end_ns=end_ns)
            if not self.closed:
                self.server.end_at(end_ns)  # docs/design.md: the server span ends at response end

    def _on_start(self, message: Message) -> None:
        self.status = int(message["status"])
        self._annotate(**{"http.status_code": self.status})
        content_type = encoding = b""
        for name, value in message.get("headers") or ():
            name = bytes(name).lower()
            if name == b"content-type":
                content_type = bytes(value).split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding":
                encoding = bytes(value).strip().lower()
        if content_type == b"text/event-stream":
            if encoding not in (b"", b"identity"):
                self.token_sent = True  # compressed: tokens cannot be seen
                self._annotate(content_encoding=encoding.decode("latin-1"))
            else:
                self.sse = _SSETokenScan()

    def _carries(self, kind: str, message: Message) -> bool:
        if kind != "http.response.body":
            return self.sse is None  # a file body: all of it is the response
        body = message.get("body", b"")
        if self.sse is not None:
            return self.sse.feed(bytes(body))
        return bool(body)

    async def _send_first(self, message: Message) -> None:
        # the token is handed over now, before the send awaits: the server's sends can
        # put the bytes on the wire and the client can read them before the send returns
        first_byte_ns = clock_ns()
        try:
            await self.send(message)
        except BaseException as exc:
            end_ns = clock_ns()
            record("stream", first_byte_ns, end_ns, parent=self.server, error=type(exc).__name__)
            raise
        record("stream", first_byte_ns, clock_ns(), parent=self.server)
        record(EV_FIRST_BYTE, first_byte_ns, first_byte_ns, parent=self.server, stage_name="event")


def _is_last(message: Message) -> bool:
    kind = message.get("type")
    if kind == "http.response.pathsend":
        return True
    return kind in _BODY_TYPES and not message.get("more_body", False)


def _new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


class TTFTMiddleware:
    """Trace every HTTP request of an ASGI application (module docstring: what is recorded).

    Args:
        app: the ASGI application to wrap.
        request_id_header: the request header whose value is the request id (lowercase
            compared); without it a fresh ``req-<16 hex>`` id is made.
        exclude_paths: paths passed through untraced (health checks, metric scrapes, model
            lists and tokenizer calls: no inference requests).

    Per request the middleware continues the incoming W3C ``traceparent`` (``tracestate``
    kept as an attribute) under ``ttft.tracer.request_context`` and opens the ``server``
    stage around the application call, in the caller's task, so the application's own
    ``stage()`` calls (and tasks it starts) nest under ``server``. The request id is put in
    ``scope["state"]["request_id"]`` and ``scope["state"]["ttft_request_id"]`` for the
    application (e.g. as its response id). ``lifespan`` and ``websocket`` scopes pass
    through untouched.

    A request whose ``traceparent`` says "not sampled" (flags ``00``; e.g. a load
    generator's warm-up) gets its request id and a ``request_context`` that is not
    sampled, but no ``server`` span and no watching of its response: the application's
    stages, and the engine's spans of that request id on any thread, record nothing and
    engine steps do not link to it (parent-based sampling).

    Failure rules: exceptions of the application and of the server's ``send``/``receive``
    propagate unchanged (the ``server`` span records ``error``); tracing itself never
    raises into the request. A body the middleware cannot parse just gets no
    ``first_byte``; an unexpected tracing failure is noted as ``ttft_asgi_error`` on
    the ``server`` span.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        request_id_header: str = "x-request-id",
        exclude_paths: tuple[str, ...] = (
            "/health", "/metrics", "/v1/models", "/tokenize", "/detokenize",
        ),
    ) -> None:
        self.app = app
        self.request_id_header = request_id_header.lower().encode("latin-1")
        self.exclude_paths = frozenset(exclude_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in self.exclude_paths:
            # health checks and scrapes are no inference requests: not traced
            await self.app(scope, receive, send)
            return
        traceparent = tracestate = request_id = None
        try:
            for name, value in scope.get("headers") or ():
                name = bytes(name).lower()
                if name == b"traceparent" and traceparent is None:
                    traceparent = bytes(value).decode("latin-1")
                elif name == b"tracestate" and tracestate is None:
                    tracestate = bytes(value).decode("latin-1")
                elif name == self.request_id_header and request_id is None:
                    request_id = bytes(value).decode("latin-1").strip() or None
        except Exception:
            pass  # malformed headers: trace as a request without context
        request_id = request_id or _new_request_id()
        try:
            state = scope.setdefault("state", {})
            state["request_id"] = request_id
            state["ttft_request_id"] = request_id
        except Exception:
            pass  # a server's odd ``state``: the application just does not see the id
        context = request_context(traceparent, request_id, tracestate)
        if not context.ref.sampled:
            # the caller sampled this request out: the context still binds the request id,
            # so everything recorded for it (here or in the engine) is dropped, not rooted
            # in a trace of its own
            with context:
                await self.app(scope, receive, send)
            return
        attributes: dict[str, Any] = {"method": scope.get("method"), "path": scope.get("path")}
        if tracestate:
            attributes["tracestate"] = tracestate  # request_context keeps it on no span
        with context, stage("server", **attributes) as server:
            exchange = _Exchange(server, receive, send)
            try:
                await self.app(scope, exchange.wrapped_receive, exchange.wrapped_send)
            finally:
                exchange.closed = True

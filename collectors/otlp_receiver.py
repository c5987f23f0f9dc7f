"""An OTLP/HTTP trace receiver that turns exported spans into ttft span rows.

Any OpenTelemetry SDK or collector can export to it (``POST /v1/traces``, protobuf or
OTLP/JSON, optionally gzip); every span becomes rows of ``SPAN_SCHEMA`` under the same
conventions as :mod:`ttft.collectors.otel_exporter` (docs/design.md, "The span record"), by
:mod:`ttft.collectors.otlp_rows` (whose ``request_to_rows`` is re-exported here).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from ttft.collectors._otlp_chunks import Chunk, decoded_chunks, decoded_message_chunks
from ttft.collectors._otlp_common import (
    DISK_FULL,
    MAX_INFLIGHT_BYTES,
    RETRY_AFTER_S,
    ReceiverBookkeeping,
    Sink,
    as_sink,
    bearer_ok,
    disk_full,
    store_export,
)
from ttft.collectors.otlp_decode import warm_in_background
from ttft.collectors.otlp_rows import parse_json_export, request_to_rows
from ttft.collectors.writer import TraceWriter

__all__ = ["LISTEN_BACKLOG", "MAX_BODY_BYTES", "MAX_CONNECTIONS", "REQUEST_DEADLINE_S",
           "TRACES_PATH", "OTLPReceiver", "request_to_rows"]

logger = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 << 20
"""Largest accepted body, after gzip decoding; a larger one is answered 413. A million
small spans fit; a request is converted in chunks (:mod:`ttft.collectors._otlp_chunks`), so
its memory beyond the body itself does not grow with it."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues before they are accepted (``listen``'s backlog)."""
MAX_CONNECTIONS = 512
"""Connections served at once; more wait in the listen backlog until one ends."""
REQUEST_DEADLINE_S = 30.0
"""Seconds a request's line, headers and body have to arrive, however slowly they trickle."""

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 500: 13,
               503: 14}
_LINGER_BYTES = 4 << 20
"""Most unread request bytes dropped after an error answer before closing (see _linger)."""
_LINGER_S = 2.0
_SLOT_POLL_S = 0.05  # how often an accept loop waiting for a free slot checks for stop


class _Reject(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 quiet: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.quiet = quiet  # logged once as a condition, not once per request


def _hold(take: Callable[[int], bool], n_bytes: int, budget_bytes: int) -> None:
    """Hold ``n_bytes`` of the in-flight budget, or refuse the request with a retryable 503."""
    if not take(n_bytes):
        raise _Reject(503, f"busy: {budget_bytes} bytes already in flight; retry later",
                      {"Retry-After": str(RETRY_AFTER_S)})


def _parse(body: bytes, content_type: str
           ) -> tuple[Iterator[Chunk], list[str]]:
    """The request in chunks, and one message per span left out of it (JSON spans that do
    not parse). The whole body is checked first: a 400 stores nothing."""
    try:
        if content_type == _PROTOBUF:
            return decoded_chunks(body), []
        request, rejected = parse_json_export(body)
    except ValueError as exc:
        raise _Reject(400, f"body is {exc}") from exc
    return decoded_message_chunks(request), rejected


def _gunzip(body: bytes, limit: int) -> bytes:
    decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Reject(400, f"body is not valid gzip: {exc}") from exc
    if len(data) > limit:
        raise _Reject(413, f"decoded body exceeds {limit} bytes")
    if not decoder.eof:
        raise _Reject(400, "gzip body is truncated")
    return data


class _Server(ThreadingHTTPServer):
    """Serves each connection on its own thread, at most ``receiver.max_connections`` at a
    time: past that the accept loop waits, and new connections wait in the listen backlog."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    receiver: OTLPReceiver
    slots: threading.Semaphore
    stopping: threading.Event

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self.slots.acquire(timeout=_SLOT_POLL_S):
            if self.stopping.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it would have given the slot back
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _linger(handler: _Handler) -> None:
    """Half-close, then read and drop what the client still sends, up to ``_LINGER_BYTES``
    or ``_LINGER_S``, until it closes (RFC 9112, 9.6 "tear-down").

    Closing a socket with unread input resets the connection, and a client still sending
    its body (http.client, requests) then sees a broken pipe or a reset instead of the
    answer. A client that sends more than the limit after the answer still gets a reset.
    """
    deadline_s = time.monotonic() + _LINGER_S
    left = _LINGER_BYTES
    try:
        handler.wfile.flush()
        handler.connection.shutdown(socket.SHUT_WR)
        handler.connection.settimeout(_LINGER_S)
        while left > 0 and time.monotonic() < deadline_s:
            dropped = handler.rfile.read1(min(left, 1 << 16))
            if not dropped:
                return
            left -= len(dropped)
    except (OSError, ValueError):  # reset, timed out, or the client is gone
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds an idle keep-alive connection holds its thread
    server: _Server
    body_read = False  # whether the current request's body was read whole
    cut_off = False  # whether the request deadline shut the connection's reading side

    def handle_one_request(self) -> None:
        self.body_read = False
        self._watchdog = threading.Timer(self.server.receiver.request_deadline_s, self._cut_off)
        self._watchdog.daemon = True
        self._watchdog.start()
        try:
            super().handle_one_request()
        finally:
            self._watchdog.cancel()

    def arrived(self) -> None:
        """The request is read whole: its deadline no longer applies."""
        self._watchdog.cancel()
        self.body_read = True

    def _cut_off(self) -> None:
        """Past the deadline: a blocked read returns end of input, and the thread is freed."""
        self.cut_off = True
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RD)
        except OSError:  # already closed
            pass

    def do_POST(self) -> None:
        self.server.receiver._handle(self)

    def do_GET(self) -> None:
        self.server.receiver._handle(self)

    do_PUT = do_DELETE = do_PATCH = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s: " + format, self.address_string(), *args)


class OTLPReceiver(ReceiverBookkeeping):
    """Receives OTLP/HTTP trace exports on ``POST /v1/traces`` and hands rows to a sink.

    Accepts ``application/x-protobuf`` and ``application/json`` (OTLP/JSON, hex ids),
    optionally ``Content-Encoding: gzip``. Answers 200 with an ``ExportTraceServiceResponse``
    in the request's encoding (with ``partial_success`` when some spans were rejected: the
    others are stored), 400 for a body that does not parse or a bad Content-Length, 404 for
    another path, 405 for another method, 408 for a body that stops arriving for 10 s or is
    not whole within ``request_deadline_s`` (a request whose line or headers are not whole by
    then is closed unanswered), 411 without a Content-Length, 413 for a body over
    ``max_body_bytes``, 415 for another content type or encoding, 500 when the sink raises,
    503 once stopped, and 503 with ``Retry-After: 1`` when the body (its size after gzip
    decoding) would take the bytes held by requests in flight past ``max_inflight_bytes``
    (OpenTelemetry exporters retry it); with a ``token``, 401 first for a request without
    ``Authorization: Bearer <token>``. Error bodies are a ``google.rpc.Status`` (protobuf for
    protobuf requests, else JSON) naming the fault. An error answer closes the connection;
    a body left unread is first drained (up to 4 MiB, 2 s), so that the client reads the
    answer rather than a reset.

    The listen backlog is ``LISTEN_BACKLOG`` (1024), so a burst of connections waits to be
    accepted rather than being refused or timing out; at most ``max_connections`` are served
    at once (an idle keep-alive one holds its slot up to 10 s), the others wait there.

    Threading: each connection is served on its own daemon thread, so the sink is called
    from those threads, possibly concurrently; it must be thread-safe (``TraceWriter.append``
    is). Failure: bad input never escapes a server thread; it is answered, logged and counted.
    The sink is the caller's: :meth:`stop` does not close it.

    Attributes:
        requests: requests answered, whatever the status.
        spans_received: spans accepted and handed to the sink.
        spans_rejected: invalid spans dropped from otherwise good requests.
        rejected: requests answered with an error status.
    """

    def __init__(self, sink: TraceWriter | Sink, *, host: str = "127.0.0.1", port: int = 4318,
                 max_body_bytes: int = MAX_BODY_BYTES, token: str | None = None,
                 request_deadline_s: float = REQUEST_DEADLINE_S,
                 max_inflight_bytes: int = MAX_INFLIGHT_BYTES,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        """Create a stopped receiver; ``port=0`` lets :meth:`start` pick a free port."""
        super().__init__(max_inflight_bytes)
        self.max_connections = max_connections
        self.request_deadline_s = request_deadline_s
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self._token = token
        self._sink = as_sink(sink)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """The URL to give an exporter, e.g. ``OTLPSpanExporter(endpoint=...)``."""
        return f"http://{self.host}:{self.port}{TRACES_PATH}"

    def start(self) -> OTLPReceiver:
        """Bind and serve on a daemon thread; ``port`` becomes the bound port.

        Raises:
            RuntimeError: already started. OSError: the address cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("receiver already started")
        server = _Server((self.host, self.port), _Handler)
        warm_in_background()
        server.receiver = self
        server.slots = threading.BoundedSemaphore(self.max_connections)
        server.stopping = threading.Event()
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name=f"ttft-otlp:{self.port}")
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop accepting, then wait up to ``timeout_s`` for requests in flight. Idempotent.

        Returns:
            True if no request was still being served when it returned.
        """
        self._mark_stopped()
        server, thread = self._server, self._thread
        if server is not None and thread is not None and thread.is_alive():
            server.stopping.set()
            server.shutdown()
            server.server_close()
            thread.join(timeout_s)
        return self._wait_idle(timeout_s)

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _handle(self, handler: _Handler) -> None:
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        with self._serving() as admitted, self._budget() as take:
            try:
                if not admitted:
                    raise _Reject(503, "receiver is stopped")
                response = self._export(handler, content_type, take)
                if content_type == _PROTOBUF:
                    self._reply(handler, 200, response.SerializeToString(), _PROTOBUF)
                else:
                    document = json_format.MessageToDict(response)
                    self._reply(handler, 200, json.dumps(document).encode(), _JSON)
            except Exception as exc:
                self._reply_error(handler, content_type, exc)

    def _reply_error(self, handler: _Handler, content_type: str, exc: Exception) -> None:
        status, message, headers = (exc.status, exc.message, exc.headers) if isinstance(
            exc, _Reject) else (500, f"internal error: {exc}", {})
        if not getattr(exc, "quiet", False):
            log = logger.exception if status == 500 else logger.info
            log("rejected %s %s from %s: %d %s", handler.command, handler.path,
                handler.client_address[0], status, message)
        self._count_rejected()
        error = Status(code=_GRPC_CODES.get(status, 2), message=message)
        if status == 401:
            headers = {**headers, "WWW-Authenticate": "Bearer"}
        try:
            if content_type == _PROTOBUF:
                self._reply(handler, status, error.SerializeToString(), _PROTOBUF, close=True,
                            headers=headers)
            else:
                body = json.dumps(json_format.MessageToDict(error)).encode()
                self._reply(handler, status, body, _JSON, close=True, headers=headers)
        except OSError:
            handler.close_connection = True  # the client went away
            return
        if not handler.body_read and (handler.headers.get("Transfer-Encoding") is not None
                                      or (handler.headers.get("Content-Length") or "0") != "0"):
            _linger(handler)

    def _export(self, handler: _Handler, content_type: str, take: Callable[[int], bool]
                ) -> ExportTraceServiceResponse:
        if self._token is not None and not bearer_ok(handler.headers.get("Authorization"),
                                                      self._token):
            raise _Reject(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        path = urlsplit(handler.path).path
        if path != TRACES_PATH:
            raise _Reject(404, f"no such path {path!r}; export traces to {TRACES_PATH}")
        if handler.command != "POST":
            raise _Reject(405, f"method {handler.command} not allowed; use POST")
        if content_type not in (_PROTOBUF, _JSON):
            raise _Reject(415, f"content type {content_type!r} not supported; "
                               f"use {_PROTOBUF} or {_JSON}")
        encoding = (handler.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise _Reject(415, f"content encoding {encoding!r} not supported; use gzip")
        raw_length = handler.headers.get("Content-Length")
        if raw_length is None:
            raise _Reject(411, "Content-Length required")
        if not (raw_length.isascii() and raw_length.strip().isdigit()):  # not '²', '٣'
            raise _Reject(400, f"invalid Content-Length {raw_length!r}")
        length = int(raw_length)
        if length > self.max_body_bytes:
            raise _Reject(413, f"body of {length} bytes exceeds {self.max_body_bytes}")
        _hold(take, length, self.max_inflight_bytes)
        try:
            body = handler.rfile.read(length)
        except TimeoutError as exc:
            raise _Reject(408, f"body not received within {handler.timeout} s") from exc
        handler.arrived()
        if handler.cut_off:
            raise _Reject(408, f"request not received within {self.request_deadline_s} s")
        if len(body) != length:
            raise _Reject(400, f"body ended after {len(body)} of {length} bytes")
        if encoding == "gzip":
            body = _gunzip(body, self.max_body_bytes)
            _hold(take, len(body) - length, self.max_inflight_bytes)
        chunks, parse_rejected = _parse(body, content_type)
        del body  # the chunks keep what they need
        try:
            response, stored, rejected = store_export(chunks, parse_rejected, self._sink)
        except Exception as exc:
            if not disk_full(exc):
                raise
            self._disk(True, self.endpoint)
            raise _Reject(503, DISK_FULL, {"Retry-After": str(RETRY_AFTER_S)},
                          quiet=True) from exc
        self._disk(False, self.endpoint)
        self._count_spans(stored, rejected)
        return response

    @staticmethod
    def _reply(handler: _Handler, status: int, body: bytes, content_type: str,
               close: bool = False, headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        if close:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        handler.end_headers()
        handler.wfile.write(body)

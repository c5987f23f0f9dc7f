"""An OTLP/HTTP trace receiver that turns exported spans into ttft span rows.

Any OpenTelemetry SDK or collector can export to it (``POST /v1/traces``, protobuf or
OTLP/JSON, optionally gzip); every span becomes rows of ``SPAN_SCHEMA`` under the same
conventions as :mod:`ttft.collectors.otel_exporter` (DESIGN.md, "The span record"), by
:mod:`ttft.collectors.otlp_rows` (whose ``request_to_rows`` is re-exported here).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors._otlp_common import (
    ReceiverBookkeeping,
    Sink,
    as_sink,
    bearer_ok,
    export_response,
)
from ttft.collectors._spans import to_span_table
from ttft.collectors.otlp_rows import parse_json_request, parse_proto_request, request_to_rows
from ttft.collectors.writer import TraceWriter

__all__ = ["MAX_BODY_BYTES", "TRACES_PATH", "OTLPReceiver", "request_to_rows"]

logger = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 32 << 20
"""Largest accepted body, after gzip decoding; a larger one is answered 413."""

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 500: 13,
               503: 14}
_LINGER_BYTES = 4 << 20
"""Most unread request bytes dropped after an error answer before closing (see _linger)."""
_LINGER_S = 2.0


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    try:
        if content_type == _PROTOBUF:
            return parse_proto_request(body)
        return parse_json_request(body)
    except ValueError as exc:
        raise _Reject(400, f"body is {exc}") from exc


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
    daemon_threads = True
    receiver: OTLPReceiver


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

    def handle_one_request(self) -> None:
        self.body_read = False
        super().handle_one_request()

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
    in the request's encoding (with ``partial_success`` when some spans were invalid), 400 for
    a body that does not parse or a bad Content-Length, 404 for another path, 405 for another
    method, 408 for a body that does not arrive within 10 s, 411 without a Content-Length,
    413 for a body over ``max_body_bytes``, 415 for another content type or encoding, 500
    when the sink raises, 503 once stopped; with a ``token``, 401 first for a request without
    ``Authorization: Bearer <token>``. Error bodies are a ``google.rpc.Status`` (protobuf for
    protobuf requests, else JSON) naming the fault. An error answer closes the connection;
    a body left unread is first drained (up to 4 MiB, 2 s), so that the client reads the
    answer rather than a reset.

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
                 max_body_bytes: int = MAX_BODY_BYTES, token: str | None = None) -> None:
        """Create a stopped receiver; ``port=0`` lets :meth:`start` pick a free port."""
        super().__init__()
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
        server.receiver = self
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
        with self._serving() as admitted:
            try:
                if not admitted:
                    raise _Reject(503, "receiver is stopped")
                response = self._export(handler, content_type)
                if content_type == _PROTOBUF:
                    self._reply(handler, 200, response.SerializeToString(), _PROTOBUF)
                else:
                    document = json_format.MessageToDict(response)
                    self._reply(handler, 200, json.dumps(document).encode(), _JSON)
            except Exception as exc:
                self._reply_error(handler, content_type, exc)

    def _reply_error(self, handler: _Handler, content_type: str, exc: Exception) -> None:
        status, message = (exc.status, exc.message) if isinstance(exc, _Reject) else (
            500, f"internal error: {exc}")
        log = logger.exception if status == 500 else logger.info
        log("rejected %s %s from %s: %d %s", handler.command, handler.path,
            handler.client_address[0], status, message)
        self._count_rejected()
        error = Status(code=_GRPC_CODES.get(status, 2), message=message)
        challenge = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        try:
            if content_type == _PROTOBUF:
                self._reply(handler, status, error.SerializeToString(), _PROTOBUF, close=True,
                            headers=challenge)
            else:
                body = json.dumps(json_format.MessageToDict(error)).encode()
                self._reply(handler, status, body, _JSON, close=True, headers=challenge)
        except OSError:
            handler.close_connection = True  # the client went away
            return
        if not handler.body_read and (handler.headers.get("Transfer-Encoding") is not None
                                      or (handler.headers.get("Content-Length") or "0") != "0"):
            _linger(handler)

    def _export(self, handler: _Handler, content_type: str) -> ExportTraceServiceResponse:
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
        try:
            body = handler.rfile.read(length)
        except TimeoutError as exc:
            raise _Reject(408, f"body not received within {handler.timeout} s") from exc
        handler.body_read = True
        if len(body) != length:
            raise _Reject(400, f"body ended after {len(body)} of {length} bytes")
        if encoding == "gzip":
            body = _gunzip(body, self.max_body_bytes)
        request = _parse(body, content_type)
        rows, errors = request_to_rows(request)
        if rows:
            self._sink(to_span_table(rows))
        response, spans = export_response(request, errors)
        self._count_spans(spans, len(errors))
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

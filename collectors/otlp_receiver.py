"""An OTLP/HTTP trace receiver that turns exported spans into ttft span rows.

Any OpenTelemetry SDK or collector can export to it (``POST /v1/traces``, protobuf or
OTLP/JSON, optionally gzip); every span becomes rows of ``SPAN_SCHEMA`` under the same
conventions as :mod:`ttft.collectors.otel_exporter` (DESIGN.md, "The span record").
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
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
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ttft.collectors._otlp_common import Sink, as_sink, bearer_ok, export_response
from ttft.collectors._spans import ttft_fields
from ttft.collectors.store import TraceWriter, to_span_table
from ttft.tracer.schema import ATTR_CLOCK

__all__ = ["MAX_BODY_BYTES", "TRACES_PATH", "OTLPReceiver", "request_to_rows"]

logger = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 32 << 20
"""Largest accepted body, after gzip decoding; a larger one is answered 413."""

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_STATUS_NAMES = {1: "OK", 2: "ERROR"}  # OTLP Status.StatusCode, as the SDK's StatusCode names
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 500: 13, 503: 14}


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a JSON-able value (bytes as base64, as OTLP/JSON writes them)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _event_span_id(span_id: bytes, index: int) -> str:
    # Deterministic, so a retried export yields the same rows.
    return hashlib.blake2b(span_id + index.to_bytes(4, "big"), digest_size=8).hexdigest()


def _span_rows(span: Any, service: str, default_clock: str) -> list[dict[str, Any]]:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise ValueError(f"span {span.name!r}: invalid trace id {span.trace_id.hex()!r}")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise ValueError(f"span {span.name!r}: invalid span id {span.span_id.hex()!r}")
    start_ns = span.start_time_unix_nano
    end_ns = span.end_time_unix_nano or start_ns
    if end_ns < start_ns:
        raise ValueError(f"span {span.name!r} ends ({end_ns}) before it starts ({start_ns})")
    attributes = _attributes(span.attributes)
    stage, request_id, clock, point = ttft_fields(span.name, attributes, start_ns, end_ns)
    if span.status.code in _STATUS_NAMES:
        attributes["otel.status_code"] = _STATUS_NAMES[span.status.code]
        if span.status.message:
            attributes["otel.status_description"] = span.status.message
    if span.links:
        attributes["links"] = [
            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
             "attributes": _attributes(link.attributes)}
            for link in span.links
        ]
    if point and span.events:
        attributes["events"] = [
            {"name": e.name, "timestamp_ns": e.time_unix_nano,
             "attributes": _attributes(e.attributes)}
            for e in span.events
        ]
    common = {
        "trace_id": span.trace_id.hex(),
        "request_id": None if request_id is None else str(request_id),
        "clock": default_clock if clock is None else str(clock),
        "service": service,
    }
    span_id = span.span_id.hex()
    rows = [{**common, "span_id": span_id, "parent_id": span.parent_span_id.hex() or None,
             "name": span.name, "stage": stage, "start_ns": start_ns, "end_ns": end_ns,
             "attributes": _json(attributes)}]
    if not point:
        rows.extend(
            {**common, "span_id": _event_span_id(span.span_id, index), "parent_id": span_id,
             "name": event.name, "stage": "event", "start_ns": event.time_unix_nano,
             "end_ns": event.time_unix_nano, "attributes": _json(_attributes(event.attributes))}
            for index, event in enumerate(span.events)
        )
    return rows


def request_to_rows(request: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """Map every span of an OTLP export request onto span-record rows.

    Conventions are those of :func:`ttft.collectors.otel_exporter.span_to_rows`; ids become
    lowercase hex; ``service`` is the resource's ``service.name`` (``unknown_service`` if
    absent); ``clock`` is the span's ``ttft.clock``, else the resource's ``ttft.clock``, else
    ``host:<host.name>`` of the resource, else ``host:<service>``. Each event of a span
    becomes a point-event row whose span id is derived from the span's id and the event's
    index, so exporting the same span twice yields the same rows.

    Returns:
        The rows, and one message per span that was rejected (a missing or zero trace or
        span id, or an end before the start); the other spans are still converted.
    """
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name") or "unknown_service")
        clock = resource.get(ATTR_CLOCK) or "host:" + str(resource.get("host.name") or service)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    rows.extend(_span_rows(span, service, str(clock)))
                except ValueError as exc:
                    errors.append(str(exc))
    return rows, errors


def _hex_ids_to_base64(node: Any) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON parser reads bytes as base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    pass  # not hex: left to the parser, which takes base64 or fails
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        if content_type == _PROTOBUF:
            request.ParseFromString(body)
        else:
            document = json.loads(body)
            _hex_ids_to_base64(document)
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except Exception as exc:  # DecodeError, ParseError, ValueError, RecursionError, ...
        kind = "protobuf" if content_type == _PROTOBUF else "OTLP/JSON"
        raise _Reject(400, f"body is not a valid {kind} ExportTraceServiceRequest: {exc}") from exc
    return request


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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds an idle keep-alive connection holds its thread
    server: _Server

    def do_POST(self) -> None:
        self.server.receiver._handle(self)

    def do_GET(self) -> None:
        self.server.receiver._handle(self)

    do_PUT = do_DELETE = do_PATCH = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s: " + format, self.address_string(), *args)


class OTLPReceiver:
    """Receives OTLP/HTTP trace exports on ``POST /v1/traces`` and hands rows to a sink.

    Accepts ``application/x-protobuf`` and ``application/json`` (OTLP/JSON, hex ids),
    optionally ``Content-Encoding: gzip``. Answers 200 with an ``ExportTraceServiceResponse``
    in the request's encoding (with ``partial_success`` when some spans were invalid), 400 for
    a body that does not parse, 404 for another path, 405 for another method, 411 without a
    Content-Length, 413 for a body over ``max_body_bytes``, 415 for another content type or
    encoding, 500 when the sink raises, 503 once stopped; with a ``token``, 401 first for a
    request without ``Authorization: Bearer <token>``. Error bodies are a
    ``google.rpc.Status`` (protobuf for protobuf requests, else JSON) naming the fault.

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
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self._token = token
        self._sink = as_sink(sink)
        self._lock = threading.Condition()  # guards counters, _inflight and _stopped
        self._inflight = 0
        self._stopped = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.requests = 0
        self.spans_received = 0
        self.spans_rejected = 0
        self.rejected = 0

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
        with self._lock:
            self._stopped = True
        server, thread = self._server, self._thread
        if server is not None and thread is not None and thread.is_alive():
            server.shutdown()
            server.server_close()
            thread.join(timeout_s)
        with self._lock:
            return self._lock.wait_for(lambda: self._inflight == 0, timeout_s)

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _handle(self, handler: _Handler) -> None:
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        with self._lock:
            stopped = self._stopped
            self._inflight += not stopped
            self.requests += 1
        try:
            if stopped:
                raise _Reject(503, "receiver is stopped")
            response = self._export(handler, content_type)
            if content_type == _PROTOBUF:
                self._reply(handler, 200, response.SerializeToString(), _PROTOBUF)
            else:
                document = json_format.MessageToDict(response)
                self._reply(handler, 200, json.dumps(document).encode(), _JSON)
        except Exception as exc:
            status, message = (exc.status, exc.message) if isinstance(exc, _Reject) else (
                500, f"internal error: {exc}")
            log = logger.exception if status == 500 else logger.info
            log("rejected %s %s from %s: %d %s", handler.command, handler.path,
                handler.client_address[0], status, message)
            with self._lock:
                self.rejected += 1
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
        finally:
            if not stopped:
                with self._lock:
                    self._inflight -= 1
                    self._lock.notify_all()

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
        if not raw_length.strip().isdigit():
            raise _Reject(400, f"invalid Content-Length {raw_length!r}")
        length = int(raw_length)
        if length > self.max_body_bytes:
            raise _Reject(413, f"body of {length} bytes exceeds {self.max_body_bytes}")
        body = handler.rfile.read(length)
        if len(body) != length:
            raise _Reject(400, f"body ended after {len(body)} of {length} bytes")
        if encoding == "gzip":
            body = _gunzip(body, self.max_body_bytes)
        request = _parse(body, content_type)
        rows, errors = request_to_rows(request)
        if rows:
            self._sink(to_span_table(rows))
        response, spans = export_response(request, errors)
        with self._lock:
            self.spans_received += spans
            self.spans_rejected += len(errors)
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

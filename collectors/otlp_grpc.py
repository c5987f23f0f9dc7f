"""An OTLP/gRPC trace receiver, and a :class:`Collector` that runs it beside the OTLP/HTTP one.

Spans become rows of ``SPAN_SCHEMA`` exactly as on the HTTP path
(:func:`ttft.collectors.otlp_rows.request_to_rows`; a span that cannot be stored is
rejected alone, answered as partial success), so an SDK may export over either
protocol into the same trace.
"""

from __future__ import annotations

import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from ttft.collectors._otlp_chunks import decoded_chunks
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
from ttft.collectors.otlp_receiver import MAX_BODY_BYTES, OTLPReceiver
from ttft.collectors.writer import TraceWriter
from ttft.tracer.schema import smallest_examples

__all__ = ["EXPORT_METHOD", "Collector", "OTLPGrpcReceiver"]

logger = logging.getLogger(__name__)

_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
EXPORT_METHOD = f"/{_SERVICE}/Export"
"""The full gRPC method name an OTLP trace exporter calls."""


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, retry: bool = False,
                 quiet: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry = retry
        self.quiet = quiet  # logged once as a condition, not once per call


def retry_metadata(code: grpc.StatusCode, message: str) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata that tells an OTLP exporter when to retry a call answered
    ``code``: the OTLP specification makes ``RESOURCE_EXHAUSTED`` retryable only with a
    ``google.rpc.RetryInfo`` in the status details (``grpc-status-details-bin``, as the
    Go and Java exporters read it; OpenTelemetry Python reads ``google.rpc.retryinfo-bin``),
    here after `RETRY_AFTER_S`, as the HTTP receiver's ``Retry-After``."""
    from google.protobuf.any_pb2 import Any as AnyMessage
    from google.protobuf.duration_pb2 import Duration
    from google.rpc.error_details_pb2 import RetryInfo
    from google.rpc.status_pb2 import Status

    info = RetryInfo(retry_delay=Duration(seconds=RETRY_AFTER_S))
    details = AnyMessage()
    details.Pack(info)
    status = Status(code=code.value[0], message=message, details=[details])
    return (("grpc-status-details-bin", status.SerializeToString()),
            ("google.rpc.retryinfo-bin", info.SerializeToString()))


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_bindable(host: str, port: int) -> None:
    """Raise the OS's own error if ``host:port`` cannot be bound, before gRPC tries it (gRPC
    only says "failed to bind" and logs to stderr)."""
    for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            probe.bind(address)


class OTLPGrpcReceiver(ReceiverBookkeeping):
    """Receives OTLP/gRPC trace exports (``TraceService/Export``) and hands rows to a sink.

    Answers an ``ExportTraceServiceResponse`` (with ``partial_success`` when some spans were
    invalid, as on the HTTP path), or aborts the call with ``INVALID_ARGUMENT`` for a message
    that does not parse, ``UNAUTHENTICATED`` when a ``token`` is set and the metadata lacks
    ``authorization: Bearer <token>``, ``INTERNAL`` when the sink raises, ``UNAVAILABLE``
    once stopped, and ``RESOURCE_EXHAUSTED`` (which OpenTelemetry exporters retry) when the
    message would take the bytes held by calls in flight past ``max_inflight_bytes``. gRPC
    itself answers ``RESOURCE_EXHAUSTED`` for a message over ``max_message_bytes`` or when
    ``4 * max_workers`` calls are already in progress, and decodes gzip-compressed messages.

    Threading: calls are served by a pool of ``max_workers`` threads, so the sink is called
    from them, possibly concurrently; it must be thread-safe (``TraceWriter.append`` is).
    Failure: bad input never escapes a server thread; it is answered, logged and counted.
    The sink is the caller's: :meth:`stop` does not close it.

    Attributes:
        requests: calls answered, whatever the status (gRPC's own RESOURCE_EXHAUSTED
            answers never reach the receiver and are not counted).
        spans_received: spans accepted and handed to the sink.
        spans_rejected: invalid spans dropped from otherwise good requests.
        rejected: calls answered with an error status.
    """

    def __init__(self, sink: TraceWriter | Sink, *, host: str = "127.0.0.1", port: int = 4317,
                 max_message_bytes: int = MAX_BODY_BYTES, token: str | None = None,
                 max_workers: int = 8, max_inflight_bytes: int = MAX_INFLIGHT_BYTES) -> None:
        """Create a stopped receiver; ``port=0`` lets :meth:`start` pick a free port."""
        super().__init__(max_inflight_bytes)
        self.host = host
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.max_workers = max_workers
        self._token = token
        self._sink = as_sink(sink)
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def endpoint(self) -> str:
        """The URL to give an exporter, e.g. ``OTLPSpanExporter(endpoint=..., insecure=True)``."""
        return f"http://{_host_port(self.host, self.port)}"

    def start(self) -> OTLPGrpcReceiver:
        """Bind and serve on the thread pool; ``port`` becomes the bound port.

        Raises:
            RuntimeError: already started. OSError: the address cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("receiver already started")
        if self.port != 0:
            _check_bindable(self.host, self.port)
        warm_in_background()
        handler = grpc.method_handlers_generic_handler(_SERVICE, {
            # Raw bytes in: the generated servicer's deserializer would turn a malformed
            # message into INTERNAL; parsing here answers INVALID_ARGUMENT with the reason.
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export, request_deserializer=None,
                response_serializer=ExportTraceServiceResponse.SerializeToString),
        })
        executor = ThreadPoolExecutor(self.max_workers, thread_name_prefix="ttft-otlp-grpc")
        server = grpc.server(
            executor, handlers=[handler], maximum_concurrent_rpcs=4 * self.max_workers,
            options=[("grpc.max_receive_message_length", self.max_message_bytes),
                     ("grpc.so_reuseport", 0)],  # never share a port with another server
        )
        address = _host_port(self.host, self.port)
        try:
            port = server.add_insecure_port(address)
        except RuntimeError:  # grpcio >= 1.55; older versions return 0
            port = 0
        if port == 0:
            server.stop(None)
            executor.shutdown(wait=False)
            raise OSError(f"cannot bind OTLP/gRPC to {address}")
        self.port = port
        server.start()
        self._server, self._executor = server, executor
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop accepting, then give calls in flight up to ``timeout_s``. Idempotent.

        Returns:
            True if no call was still being served when it returned.
        """
        deadline_s = time.monotonic() + timeout_s
        already = self._mark_stopped()
        if self._server is not None and not already:
            self._server.stop(grace=timeout_s).wait(timeout_s)
            if self._executor is not None:
                self._executor.shutdown(wait=False)
        return self._wait_idle(deadline_s - time.monotonic())

    def __enter__(self) -> OTLPGrpcReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        with self._serving() as admitted, self._budget() as take:
            try:
                if not admitted:
                    raise _Abort(grpc.StatusCode.UNAVAILABLE, "receiver is stopped", True)
                if not take(len(body)):
                    raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"busy: {self.max_inflight_bytes} bytes already in flight; "
                                 "retry later", True)
                return self._store(body, context)
            except _Abort as exc:
                if not exc.quiet:
                    log = (logger.exception if exc.code == grpc.StatusCode.INTERNAL
                           else logger.info)
                    log("rejected OTLP/gRPC export from %s: %s %s", context.peer(),
                        exc.code.name, exc.message)
                self._count_rejected()
                if exc.retry:
                    context.set_trailing_metadata(retry_metadata(exc.code, exc.message))
                context.abort(exc.code, exc.message)  # raises
                raise  # not reached; keeps the type checker's return paths whole

    def _store(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        if self._token is not None:
            metadata = dict(context.invocation_metadata())
            authorization = metadata.get("authorization")
            if not bearer_ok(authorization if isinstance(authorization, str) else None,
                             self._token):
                raise _Abort(grpc.StatusCode.UNAUTHENTICATED,
                             "missing or wrong bearer token (authorization: Bearer <token>)")
        try:
            chunks = decoded_chunks(body)
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"message is {exc}") from exc
        try:
            response, stored, rejected = store_export(chunks, [], self._sink)
        except Exception as exc:
            if disk_full(exc):
                self._disk(True, f"OTLP/gRPC :{self.port}")
                raise _Abort(grpc.StatusCode.UNAVAILABLE, DISK_FULL, True, quiet=True) from exc
            raise _Abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}") from exc
        self._disk(False, f"OTLP/gRPC :{self.port}")
        self._count_spans(stored, rejected)
        return response


class Collector:
    """An OTLP/HTTP and an OTLP/gRPC receiver writing into one sink.

    Either receiver is disabled by passing ``None`` as its port; ``0`` picks a free port.
    The counters are the sums over both receivers. Threading and failure rules are those of
    :class:`~ttft.collectors.otlp_receiver.OTLPReceiver` and :class:`OTLPGrpcReceiver`; the
    sink must be thread-safe and stays the caller's (:meth:`stop` does not close it).

    Attributes:
        http: the OTLP/HTTP receiver, or ``None`` when disabled.
        grpc: the OTLP/gRPC receiver, or ``None`` when disabled.
    """

    def __init__(self, sink: TraceWriter | Sink, *, host: str = "127.0.0.1",
                 http_port: int | None = 4318, grpc_port: int | None = 4317,
                 token: str | None = None, max_message_bytes: int = MAX_BODY_BYTES,
                 max_inflight_bytes: int = MAX_INFLIGHT_BYTES) -> None:
        """Create both receivers, stopped; each has its own ``max_inflight_bytes`` budget.

        Raises:
            ValueError: both receivers disabled.
        """
        if http_port is None and grpc_port is None:
            raise ValueError("both OTLP/HTTP and OTLP/gRPC are disabled; nothing to listen on")
        self.host = host
        self.http = None if http_port is None else OTLPReceiver(
            sink, host=host, port=http_port, max_body_bytes=max_message_bytes, token=token,
            max_inflight_bytes=max_inflight_bytes)
        self.grpc = None if grpc_port is None else OTLPGrpcReceiver(
            sink, host=host, port=grpc_port, max_message_bytes=max_message_bytes, token=token,
            max_inflight_bytes=max_inflight_bytes)

    @property
    def _receivers(self) -> list[OTLPReceiver | OTLPGrpcReceiver]:
        return [r for r in (self.http, self.grpc) if r is not None]

    @property
    def http_endpoint(self) -> str | None:
        """The OTLP/HTTP traces URL (``.../v1/traces``), or ``None`` when disabled."""
        return None if self.http is None else self.http.endpoint

    @property
    def grpc_endpoint(self) -> str | None:
        """The OTLP/gRPC URL (``http://host:port``), or ``None`` when disabled."""
        return None if self.grpc is None else self.grpc.endpoint

    @property
    def requests(self) -> int:
        """Requests answered by both receivers, whatever the status."""
        return sum(r.requests for r in self._receivers)

    @property
    def spans_received(self) -> int:
        """Spans accepted and handed to the sink."""
        return sum(r.spans_received for r in self._receivers)

    @property
    def spans_rejected(self) -> int:
        """Invalid spans dropped from otherwise good requests."""
        return sum(r.spans_rejected for r in self._receivers)

    @property
    def rejected_examples(self) -> list[str]:
        """The smallest distinct messages of the spans rejected."""
        return smallest_examples(r.rejected_examples for r in self._receivers)

    @property
    def rejected(self) -> int:
        """Requests answered with an error status."""
        return sum(r.rejected for r in self._receivers)

    def start(self) -> Collector:
        """Start both receivers; if one cannot bind, stop the other.

        Raises:
            OSError: an address cannot be bound; the message names the protocol and port.
        """
        started: list[OTLPReceiver | OTLPGrpcReceiver] = []
        for receiver, protocol in ((self.http, "OTLP/HTTP"), (self.grpc, "OTLP/gRPC")):
            if receiver is None:
                continue
            try:
                receiver.start()
            except OSError as exc:
                for other in started:
                    other.stop()
                message = (f"cannot listen for {protocol} on "
                           f"{_host_port(receiver.host, receiver.port)}: {exc.strerror or exc}")
                raise (OSError(message) if exc.errno is None else OSError(exc.errno, message)
                       ) from exc
            started.append(receiver)
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop both receivers (each given up to ``timeout_s``). Idempotent.

        Returns:
            True if neither was still serving a request when it returned.
        """
        return all([r.stop(timeout_s) for r in self._receivers])

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

"""A real ``ttft collect`` process and concurrent OTLP senders that record, per span id,
what the collector acknowledged: a span is acknowledged only when its request was answered
200 (gRPC OK) with no span of it in ``partial_success.rejected_spans``.

Every span id is unique: its first byte is the sender's index plus one, the other seven its
running number at that sender, so a stored table can be checked span by span against what
was acknowledged and nothing is ever sent twice.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from ttft.collectors.otlp_grpc import EXPORT_METHOD

TIMEOUT_S = 15.0
"""Bound on any one wait: the collector starting, a request, a sender ending."""
SPANS_PER_REQUEST = (100, 237, 500, 163, 412, 311)
"""Sizes a sender cycles through, so requests of different sizes share each group commit."""
T0_NS = 1_700_000_000_000_000_000


def span_id(sender: int, number: int) -> bytes:
    """The unique 8-byte id of span ``number`` of ``sender``."""
    return bytes([sender + 1]) + number.to_bytes(7, "big")


def export_request(sender: int, first: int, count: int) -> ExportTraceServiceRequest:
    """An export of spans ``first`` .. ``first + count - 1`` of ``sender``, one trace."""
    trace_id = bytes([sender + 1]) + first.to_bytes(15, "big")
    spans = [Span(trace_id=trace_id, span_id=span_id(sender, number), name="forward",
                  start_time_unix_nano=T0_NS + number * 1000,
                  end_time_unix_nano=T0_NS + number * 1000 + 500)
             for number in range(first, first + count)]
    resource = {"attributes": [KeyValue(key="service.name",
                                        value=AnyValue(string_value=f"sender-{sender}"))]}
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(spans=spans)])])


def http_exporter(url: str) -> tuple[Callable[[bytes], bytes], Callable[[], None]]:
    """``(export, close)`` over one keep-alive OTLP/HTTP connection to ``url``: ``export``
    posts a serialized request and returns the response body.

    Raises (from ``export``):
        AssertionError: an answer other than 200 (nothing here should get one).
        OSError, http.client.HTTPException: the connection broke (the collector was killed).
    """
    match = re.fullmatch(r"http://([^:/]+):(\d+)(/\S*)", url)
    assert match, url
    host, port, path = match.group(1), int(match.group(2)), match.group(3)
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)

    def export(body: bytes) -> bytes:
        connection.request("POST", path, body=body,
                           headers={"Content-Type": "application/x-protobuf"})
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, (response.status, answer[:200])
        return answer

    return export, connection.close


def grpc_exporter(target: str) -> tuple[Callable[[bytes], bytes], Callable[[], None]]:
    """``(export, close)`` over one gRPC channel to ``target`` (``http://host:port``).

    Raises (from ``export``):
        grpc.RpcError: the call failed (the collector was killed).
    """
    channel = grpc.insecure_channel(target.removeprefix("http://"))
    call = channel.unary_unary(EXPORT_METHOD)  # no serializers: bytes in, bytes out

    def export(body: bytes) -> bytes:
        return call(body, timeout=TIMEOUT_S)

    return export, channel.close


class Sender(threading.Thread):
    """Exports spans in a loop until ``stop`` is set or the connection breaks.

    Attributes:
        acknowledged: ids (hex) of the spans the collector acknowledged.
        sent: ids (hex) of every span put on the wire, acknowledged or not.
        requests: requests acknowledged.
        failure: what ended the loop other than ``stop`` (the kill's connection error),
            or an unexpected answer (``unexpected`` is then True).
    """

    def __init__(self, index: int, exporter: tuple[Callable[[bytes], bytes], Callable[[], None]],
                 stop: threading.Event, acked_requests: Callable[[], None]) -> None:
        super().__init__(daemon=True, name=f"sender-{index}")
        self.index = index
        self.export, self.close = exporter
        self.stop = stop
        self.on_ack = acked_requests
        self.acknowledged: set[str] = set()
        self.sent: set[str] = set()
        self.requests = 0
        self.failure: BaseException | None = None
        self.unexpected = False

    def run(self) -> None:
        number = 0
        try:
            while not self.stop.is_set():
                count = SPANS_PER_REQUEST[self.requests % len(SPANS_PER_REQUEST)]
                ids = [span_id(self.index, n).hex() for n in range(number, number + count)]
                body = export_request(self.index, number, count).SerializeToString()
                number += count
                self.sent.update(ids)
                try:
                    answer = self.export(body)
                except (OSError, http.client.HTTPException, grpc.RpcError) as exc:
                    self.failure = exc
                    return
                partial = ExportTraceServiceResponse.FromString(answer).partial_success
                if partial.rejected_spans:
                    self.failure = AssertionError(f"rejected {partial.rejected_spans}: "
                                                  f"{partial.error_message}")
                    self.unexpected = True
                    return
                self.acknowledged.update(ids)
                self.requests += 1
                self.on_ack()
        except BaseException as exc:  # an unexpected answer: reported by the test
            self.failure = exc
            self.unexpected = True
        finally:
            self.close()


class Load:
    """Four concurrent senders, three over OTLP/HTTP and one over OTLP/gRPC."""

    def __init__(self, http_url: str, grpc_url: str, n_http: int = 3, n_grpc: int = 1) -> None:
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.requests = 0
        self.senders = [
            Sender(index, http_exporter(http_url) if index < n_http else grpc_exporter(grpc_url),
                   self.stop, self._acked)
            for index in range(n_http + n_grpc)]

    def _acked(self) -> None:
        with self._lock:
            self.requests += 1

    def start(self) -> Load:
        for sender in self.senders:
            sender.start()
        return self

    def end(self) -> None:
        """Stop the senders and wait for them (each ends within one request's timeout)."""
        self.stop.set()
        for sender in self.senders:
            sender.join(TIMEOUT_S + 5)
        assert not any(sender.is_alive() for sender in self.senders), "a sender hung"

    @property
    def acknowledged(self) -> set[str]:
        return set().union(*(sender.acknowledged for sender in self.senders))

    @property
    def sent(self) -> set[str]:
        return set().union(*(sender.sent for sender in self.senders))

    def unexpected(self) -> list[str]:
        return [f"{sender.name}: {sender.failure!r}" for sender in self.senders
                if sender.unexpected]

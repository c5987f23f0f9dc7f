"""The OTLP receivers' bounds, over real loopback sockets: a burst of connections, a request
that trickles in, bytes in flight."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pyarrow as pa
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import TRACES_PATH, OTLPReceiver

T0_NS = 1_700_000_000_000_000_000
PROTO = "application/x-protobuf"
CLIENTS = 200
TIMEOUT_S = 20.0


def small_export(index: int) -> bytes:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(name="step", trace_id=(index + 1).to_bytes(16, "big"),
                     span_id=(index + 1).to_bytes(8, "big"))
    span.start_time_unix_nano, span.end_time_unix_nano = T0_NS + index, T0_NS + index + 5
    return request.SerializeToString()


def test_200_clients_connecting_at_once_all_succeed():
    tables: list[pa.Table] = []
    lock = threading.Lock()

    def sink(table: pa.Table) -> None:
        with lock:
            tables.append(table)

    with OTLPReceiver(sink, port=0) as receiver:
        sockets = [socket.socket() for _ in range(CLIENTS)]
        for sock in sockets:
            sock.settimeout(TIMEOUT_S)
        barrier = threading.Barrier(CLIENTS)

        def post(index: int) -> int:
            sock = sockets[index]
            barrier.wait(TIMEOUT_S)
            sock.connect(("127.0.0.1", receiver.port))
            body = small_export(index)
            sock.sendall((f"POST {TRACES_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTO}\r\n"
                          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                          ).encode() + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            sock.close()
            return int(answer.split(b" ", 2)[1])

        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(post, range(CLIENTS)))
    assert statuses == [200] * CLIENTS
    assert sum(table.num_rows for table in tables) == CLIENTS
    assert receiver.spans_received == CLIENTS


def test_a_trickling_request_is_cut_off_at_the_deadline_and_its_thread_freed():
    deadline_s = 1.0
    with OTLPReceiver(lambda table: None, port=0, request_deadline_s=deadline_s) as receiver:
        threads_before = threading.active_count()
        head = (f"POST {TRACES_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTO}\r\n"
                "Content-Length: 10\r\n\r\n").encode()
        start_s = time.monotonic()
        closed_after_s = None
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=TIMEOUT_S) as sock:
            try:
                for byte in head + b"\0" * 10:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.5)
                    sock.setblocking(False)
                    try:
                        if sock.recv(65536) == b"":
                            closed_after_s = time.monotonic() - start_s
                            break
                    except BlockingIOError:
                        pass
                    finally:
                        sock.setblocking(True)
            except OSError:  # reset once the receiver has closed
                closed_after_s = time.monotonic() - start_s
        for _ in range(100):
            if threading.active_count() <= threads_before:
                break
            time.sleep(0.05)
        threads_after = threading.active_count()
        good = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=TIMEOUT_S)
        good.request("POST", TRACES_PATH, body=small_export(0), headers={"Content-Type": PROTO})
        status = good.getresponse().status
        good.close()
    assert closed_after_s is not None and deadline_s <= closed_after_s < deadline_s + 1.5
    assert threads_after <= threads_before
    assert status == 200


def test_a_body_not_whole_by_the_deadline_is_answered_408():
    with OTLPReceiver(lambda table: None, port=0, request_deadline_s=1.0) as receiver:
        head = (f"POST {TRACES_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTO}\r\n"
                "Content-Length: 10\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=TIMEOUT_S) as sock:
            sock.sendall(head)
            answer = b""
            for _ in range(3):  # 3 of 10 bytes, well within the 10 s per-read timeout
                sock.sendall(b"\0")
                time.sleep(0.25)
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request not received within 1.0 s" in answer


class BlockingSink:
    """Holds the first table until released, so its request stays in flight."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.rows = 0

    def __call__(self, table: pa.Table) -> None:
        first = not self.entered.is_set()
        self.entered.set()
        if first:
            assert self.release.wait(TIMEOUT_S)
        self.rows += table.num_rows


def test_http_beyond_the_bytes_in_flight_budget_is_503_with_retry_after():
    sink = BlockingSink()
    first, second = small_export(0), small_export(1)
    budget_bytes = len(first) + len(second) - 1  # one alone fits, both do not
    with OTLPReceiver(sink, port=0, max_inflight_bytes=budget_bytes) as receiver, \
            ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, receiver.endpoint, content=first,
                           headers={"Content-Type": PROTO}, timeout=TIMEOUT_S)
        assert sink.entered.wait(TIMEOUT_S)
        busy = httpx.post(receiver.endpoint, content=second, headers={"Content-Type": PROTO},
                          timeout=TIMEOUT_S)
        sink.release.set()
        statuses = [held.result().status_code]
        retried = httpx.post(receiver.endpoint, content=second, timeout=TIMEOUT_S,
                             headers={"Content-Type": PROTO})
        alone = httpx.post(receiver.endpoint, content=small_export(2) * 3, timeout=TIMEOUT_S,
                           headers={"Content-Type": PROTO})  # over the budget, but alone
    assert (busy.status_code, busy.headers["Retry-After"]) == (503, "1")
    assert Status.FromString(busy.content) == Status(
        code=14, message=f"busy: {budget_bytes} bytes already in flight; retry later")
    assert statuses + [retried.status_code, alone.status_code] == [200, 200, 200]
    assert (sink.rows, receiver.rejected) == (5, 1)


def test_grpc_beyond_the_bytes_in_flight_budget_is_resource_exhausted():
    sink = BlockingSink()
    first, second = small_export(0), small_export(1)
    with OTLPGrpcReceiver(sink, port=0, max_inflight_bytes=len(first) + len(second) - 1
                          ) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel, \
            ThreadPoolExecutor(1) as pool:
        call = channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        held = pool.submit(call, first, timeout=TIMEOUT_S)
        assert sink.entered.wait(TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as busy:
            call(second, timeout=TIMEOUT_S)
        sink.release.set()
        held.result()
        call(second, timeout=TIMEOUT_S)
    assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (sink.rows, receiver.rejected) == (2, 1)
    # retryable by the OTLP specification only with a RetryInfo in the status details
    trailing = dict(busy.value.trailing_metadata())
    status = Status.FromString(trailing["grpc-status-details-bin"])
    assert (status.code, status.message) == (8, f"busy: {len(first) + len(second) - 1} bytes "
                                                 "already in flight; retry later")
    (detail,) = status.details
    info = RetryInfo()
    assert detail.Unpack(info) and info.retry_delay.seconds == 1
    assert RetryInfo.FromString(trailing["google.rpc.retryinfo-bin"]) == info


def test_the_otel_grpc_exporter_retries_a_busy_answer_after_its_retry_delay():
    """OpenTelemetry's own gRPC exporter, told RESOURCE_EXHAUSTED with the RetryInfo, waits
    the delay and sends again: the spans are stored, not dropped."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    sink = BlockingSink()
    with OTLPGrpcReceiver(sink, port=0, max_inflight_bytes=len(small_export(0)) + 10
                          ) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel, \
            ThreadPoolExecutor(2) as pool:
        call = channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        held = pool.submit(call, small_export(0), timeout=TIMEOUT_S)  # holds the budget
        assert sink.entered.wait(TIMEOUT_S)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=f"127.0.0.1:{receiver.port}", insecure=True, timeout=TIMEOUT_S)))
        exported = pool.submit(lambda: provider.get_tracer("t").start_span("s").end())
        time.sleep(0.5)  # its first try is refused while the budget is held
        refused = receiver.rejected
        sink.release.set()
        held.result()
        exported.result(timeout=TIMEOUT_S)
        provider.shutdown()
    assert refused >= 1 and sink.rows == 2


def test_connections_past_the_cap_wait_for_a_free_slot():
    tables: list[pa.Table] = []
    with OTLPReceiver(tables.append, port=0, max_connections=2) as receiver, \
            ThreadPoolExecutor(1) as pool:
        idle = [socket.create_connection(("127.0.0.1", receiver.port), timeout=TIMEOUT_S)
                for _ in range(2)]
        waiting = pool.submit(httpx.post, receiver.endpoint, content=small_export(0),
                              headers={"Content-Type": PROTO}, timeout=TIMEOUT_S)
        time.sleep(0.5)
        answered_while_full = waiting.done()
        idle[0].close()
        status = waiting.result().status_code
        idle[1].close()
    assert (answered_while_full, status, len(tables)) == (False, 200, 1)

"""The OTLP/gRPC receiver, bearer tokens on both receivers, and the Collector running both:
real SDK exporters and a raw gRPC client over loopback."""

from __future__ import annotations

import socket

import grpc
import httpx
import pyarrow as pa
import pytest
from _live import Collect, ids, rows_of
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from ttft.collectors import TraceWriter, read_spans
from ttft.collectors.otlp_grpc import EXPORT_METHOD, Collector, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import OTLPReceiver

T0_NS = 1_700_000_000_000_000_000
TRACE = "5b8efff798038103d269b633813fc60c"
TIMEOUT_S = 5.0


def make_spans(count: int = 0) -> list:
    """A ``server`` span with a ``model.forward`` child carrying an event, then ``count``
    plain ``step`` spans; all finished, as the SDK hands them to an exporter."""
    collect = Collect()
    provider = TracerProvider(resource=Resource.create({"service.name": "engine"}))
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tracer = provider.get_tracer("test")
    root = tracer.start_span("server", start_time=T0_NS, attributes={"ttft.request_id": "r1"})
    forward = tracer.start_span("model.forward", context=trace.set_span_in_context(root),
                                start_time=T0_NS + 10,
                                attributes={"ttft.stage": "forward", "ttft.clock": "gpu:0"})
    forward.add_event("first_sampled", {"token_id": 42}, timestamp=T0_NS + 15)
    forward.end(end_time=T0_NS + 20)
    root.end(end_time=T0_NS + 30)
    for index in range(count):
        tracer.start_span("step", start_time=T0_NS + 100 + index,
                          attributes={"step_id": index}).end(end_time=T0_NS + 101 + index)
    provider.shutdown()
    return collect.spans


def raw_request(*, end_ns: int = T0_NS + 5, name: str = "tokenize") -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    service = resource_spans.resource.attributes.add(key="service.name")
    service.value.string_value = "api"
    span = resource_spans.scope_spans.add().spans.add()
    span.trace_id, span.span_id = bytes.fromhex(TRACE), bytes.fromhex("eee19b7ec3c1b173")
    span.name, span.start_time_unix_nano, span.end_time_unix_nano = name, T0_NS, end_ns
    return request.SerializeToString()


def export_call(channel: grpc.Channel):
    """``Export`` with raw bytes in, so a test can send what no SDK would."""
    return channel.unary_unary(EXPORT_METHOD,
                               response_deserializer=ExportTraceServiceResponse.FromString)


def status_of(call, body: bytes, metadata=None) -> tuple[grpc.StatusCode, str]:
    try:
        call(body, metadata=metadata, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip],
                         ids=["plain", "gzip"])
def test_sdk_grpc_exporter_spans_reach_the_trace_file(tmp_path, compression):
    spans = make_spans(count=25)
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path)
    with OTLPGrpcReceiver(writer, port=0) as receiver:
        exporter = GrpcSpanExporter(endpoint=receiver.endpoint, insecure=True,
                                    compression=compression, timeout=TIMEOUT_S)
        assert exporter.export(spans[:10]) == SpanExportResult.SUCCESS
        assert exporter.export(spans[10:]) == SpanExportResult.SUCCESS
        exporter.shutdown()
        counters = (receiver.requests, receiver.spans_received, receiver.spans_rejected,
                    receiver.rejected)
    writer.close()
    assert counters == (2, 27, 0, 0)

    rows = rows_of(read_spans(path))
    assert len(rows) == 28  # 27 spans and the forward span's event
    assert [row["name"] for row in rows[3:]] == ["step"] * 25
    forward, root = spans[0], spans[1]
    trace_id, root_id = ids(root)
    _, forward_id = ids(forward)
    common = {"trace_id": trace_id, "service": "engine"}
    event_id = rows[2]["span_id"]
    assert len(event_id) == 16 and event_id not in (root_id, forward_id)
    assert rows[:3] == [
        {**common, "span_id": root_id, "parent_id": None, "request_id": "r1", "name": "server",
         "stage": "server", "start_ns": T0_NS, "end_ns": T0_NS + 30, "clock": "host:engine",
         "attributes": {}},
        {**common, "span_id": forward_id, "parent_id": root_id, "request_id": None,
         "name": "model.forward", "stage": "forward", "start_ns": T0_NS + 10,
         "end_ns": T0_NS + 20, "clock": "gpu:0", "attributes": {}},
        {**common, "span_id": event_id, "parent_id": forward_id, "request_id": None,
         "name": "first_sampled", "stage": "event", "start_ns": T0_NS + 15,
         "end_ns": T0_NS + 15, "clock": "gpu:0", "attributes": {"token_id": 42}},
    ]


def test_grpc_and_http_give_the_same_rows_for_the_same_spans():
    spans = make_spans(count=3)
    over_grpc: list[pa.Table] = []
    over_http: list[pa.Table] = []
    with OTLPGrpcReceiver(over_grpc.append, port=0) as g, OTLPReceiver(over_http.append,
                                                                       port=0) as h:
        grpc_exporter = GrpcSpanExporter(endpoint=g.endpoint, insecure=True, timeout=TIMEOUT_S)
        http_exporter = HttpSpanExporter(endpoint=h.endpoint, timeout=TIMEOUT_S)
        results = [grpc_exporter.export(spans), http_exporter.export(spans)]
        grpc_exporter.shutdown()
        http_exporter.shutdown()
    assert results == [SpanExportResult.SUCCESS] * 2
    assert len(over_grpc) == len(over_http) == 1
    assert rows_of(over_grpc[0]) == rows_of(over_http[0])
    assert len(over_grpc[0]) == 6


def test_bad_messages_are_answered_and_the_receiver_keeps_serving(tmp_path):
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path)
    with OTLPGrpcReceiver(writer, port=0, max_message_bytes=1 << 12) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        call = export_call(channel)
        first = call(raw_request(name="tokenize"), timeout=TIMEOUT_S)
        garbage = status_of(call, b"\x0a\xff\xff\xff")
        too_big = status_of(call, b"\0" * (1 << 13))
        partial = call(raw_request(end_ns=T0_NS - 1), timeout=TIMEOUT_S)
        last = call(raw_request(name="queue"), timeout=TIMEOUT_S)
        counters = (receiver.requests, receiver.spans_received, receiver.spans_rejected,
                    receiver.rejected)
    writer.close()
    assert first == last == ExportTraceServiceResponse()
    assert garbage[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert garbage[1].startswith("message is not a valid protobuf ExportTraceServiceRequest")
    assert too_big[0] == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC's own limit, not counted
    assert partial.partial_success.rejected_spans == 1
    assert partial.partial_success.error_message == (
        f"span 'tokenize' ends ({T0_NS - 1}) before it starts ({T0_NS})")
    assert counters == (4, 2, 1, 1)
    assert [row["name"] for row in rows_of(read_spans(path))] == ["queue", "tokenize"]


def test_a_failing_sink_is_internal_and_stop_is_idempotent():
    def sink(table: pa.Table) -> None:
        raise OSError("disk full")

    receiver = OTLPGrpcReceiver(sink, port=0).start()
    with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        failed = status_of(export_call(channel), raw_request())
    assert receiver.stop() and receiver.stop()
    assert failed == (grpc.StatusCode.INTERNAL, "internal error: disk full")
    assert (receiver.requests, receiver.rejected, receiver.spans_received) == (1, 1, 0)
    with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        assert status_of(export_call(channel), raw_request())[0] == grpc.StatusCode.UNAVAILABLE


def test_grpc_bearer_token():
    tables: list[pa.Table] = []
    with OTLPGrpcReceiver(tables.append, port=0, token="s3cret") as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        call = export_call(channel)
        codes = [status_of(call, raw_request(), metadata)[0] for metadata in (
            None, (("authorization", "Bearer wrong"),), (("authorization", "Basic s3cret"),),
            (("authorization", "Bearer s3cret"),), (("authorization", "bearer s3cret"),))]
        exporter = GrpcSpanExporter(endpoint=receiver.endpoint, insecure=True,
                                    timeout=TIMEOUT_S, headers={"authorization": "Bearer s3cret"})
        sdk = exporter.export(make_spans())
        exporter.shutdown()
    denied = grpc.StatusCode.UNAUTHENTICATED
    assert codes == [denied, denied, denied, grpc.StatusCode.OK, grpc.StatusCode.OK]
    assert sdk == SpanExportResult.SUCCESS
    assert (receiver.requests, receiver.rejected, receiver.spans_received) == (6, 3, 4)
    assert sum(table.num_rows for table in tables) == 2 + 3


def test_http_bearer_token():
    tables: list[pa.Table] = []
    body = raw_request()
    proto = {"Content-Type": "application/x-protobuf"}
    with OTLPReceiver(tables.append, port=0, token="s3cret") as receiver, \
            httpx.Client(timeout=TIMEOUT_S) as client:
        missing = client.post(receiver.endpoint, content=body,
                              headers={"Content-Type": "application/json"})
        wrong = client.post(receiver.endpoint, content=body,
                            headers={**proto, "Authorization": "Bearer s3cre"})
        right = client.post(receiver.endpoint, content=body,
                            headers={**proto, "Authorization": "Bearer s3cret"})
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.json() == {"code": 16, "message": "missing or wrong bearer token "
                                                     "(Authorization: Bearer <token>)"}
    assert ExportTraceServiceResponse.FromString(right.content) == ExportTraceServiceResponse()
    assert (receiver.requests, receiver.rejected, receiver.spans_received) == (3, 2, 1)
    assert sum(table.num_rows for table in tables) == 1


def test_collector_runs_both_receivers_into_one_trace(tmp_path):
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path)
    spans = make_spans(count=3)
    auth = {"authorization": "Bearer t0k"}
    with Collector(writer, http_port=0, grpc_port=0, token="t0k") as collector:
        assert collector.http_endpoint == f"http://127.0.0.1:{collector.http.port}/v1/traces"
        assert collector.grpc_endpoint == f"http://127.0.0.1:{collector.grpc.port}"
        http_exporter = HttpSpanExporter(endpoint=collector.http_endpoint, headers=auth,
                                         timeout=TIMEOUT_S)
        grpc_exporter = GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True,
                                         headers=auth, timeout=TIMEOUT_S)
        results = [http_exporter.export(spans[:2]), grpc_exporter.export(spans[2:])]
        http_exporter.shutdown()
        grpc_exporter.shutdown()
    assert collector.stop()
    writer.close()
    assert results == [SpanExportResult.SUCCESS] * 2
    counters = (collector.requests, collector.spans_received, collector.spans_rejected,
                collector.rejected)
    assert counters == (2, 5, 0, 0)
    names = sorted(row["name"] for row in rows_of(read_spans(path)))
    assert names == ["first_sampled", "model.forward", "server", "step", "step", "step"]


@pytest.mark.parametrize("busy", ["http", "grpc"])
def test_collector_names_a_busy_port_and_releases_the_other(busy):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with socket.socket() as spare:  # a second free port for the receiver that can bind
            spare.bind(("127.0.0.1", 0))
            other = spare.getsockname()[1]
        ports = {"http_port": port, "grpc_port": other} if busy == "http" else {
            "http_port": other, "grpc_port": port}
        collector = Collector(lambda table: None, **ports)
        with pytest.raises(OSError) as raised:
            collector.start()
    protocol = {"http": "OTLP/HTTP", "grpc": "OTLP/gRPC"}[busy]
    assert raised.value.strerror == (
        f"cannot listen for {protocol} on 127.0.0.1:{port}: Address already in use")
    with socket.socket() as probe:  # the receiver that had started is stopped again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", other))


def test_collector_needs_a_receiver():
    with pytest.raises(ValueError, match="nothing to listen on"):
        Collector(lambda table: None, http_port=None, grpc_port=None)

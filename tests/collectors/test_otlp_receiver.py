import gzip
import json

import httpx
import pyarrow as pa
import pytest
from _live import ids, rows_of
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link

from ttft.collectors import TraceWriter, read_spans
from ttft.collectors.otlp_receiver import OTLPReceiver

T0_NS = 1_700_000_000_000_000_000
TRACE = "5b8efff798038103d269b633813fc60c"
ROOT = "eee19b7ec3c1b174"
CHILD = "eee19b7ec3c1b173"


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_sdk_exporter_spans_events_and_links_reach_the_trace_file(tmp_path, compression):
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path)
    with OTLPReceiver(writer, port=0) as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "engine"}))
        exporter = OTLPSpanExporter(endpoint=receiver.endpoint, compression=compression)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        root = tracer.start_span("server", start_time=T0_NS,
                                 attributes={"ttft.request_id": "r1", "http.method": "POST"})
        forward = tracer.start_span(
            "model.forward",
            context=trace.set_span_in_context(root),
            start_time=T0_NS + 10,
            attributes={"ttft.stage": "forward", "ttft.clock": "gpu:0", "step_id": 3,
                        "ratio": 0.5, "cached": True, "request_ids": ("r1", "r2")},
            links=[Link(root.get_span_context(), {"why": "batched"})],
        )
        forward.add_event("first_sampled", {"token_id": 42}, timestamp=T0_NS + 15)
        forward.end(end_time=T0_NS + 20)
        root.end(end_time=T0_NS + 30)
        provider.shutdown()
        assert (receiver.spans_received, receiver.spans_rejected, receiver.rejected) == (2, 0, 0)
    writer.close()

    trace_id, root_id = ids(root)
    _, forward_id = ids(forward)
    rows = rows_of(read_spans(path))
    event_id = rows[2]["span_id"]
    assert len(event_id) == 16 and event_id not in (root_id, forward_id)
    common = {"trace_id": trace_id, "service": "engine"}
    assert rows == [
        {**common, "span_id": root_id, "parent_id": None, "request_id": "r1", "name": "server",
         "stage": "server", "start_ns": T0_NS, "end_ns": T0_NS + 30, "clock": "host:engine",
         "attributes": {"http.method": "POST"}},
        {**common, "span_id": forward_id, "parent_id": root_id, "request_id": None,
         "name": "model.forward", "stage": "forward", "start_ns": T0_NS + 10,
         "end_ns": T0_NS + 20, "clock": "gpu:0",
         "attributes": {"step_id": 3, "ratio": 0.5, "cached": True, "request_ids": ["r1", "r2"],
                        "links": [{"trace_id": trace_id, "span_id": root_id,
                                   "attributes": {"why": "batched"}}]}},
        {**common, "span_id": event_id, "parent_id": forward_id, "request_id": None,
         "name": "first_sampled", "stage": "event", "start_ns": T0_NS + 15,
         "end_ns": T0_NS + 15, "clock": "gpu:0", "attributes": {"token_id": 42}},
    ]


def otlp_json(**span_extra) -> dict:
    def kv(key, value):
        return {"key": key, "value": value}

    span = {
        "traceId": TRACE, "spanId": CHILD, "parentSpanId": ROOT, "name": "tokenize",
        "kind": 1, "startTimeUnixNano": str(T0_NS), "endTimeUnixNano": str(T0_NS + 5),
        "attributes": [
            kv("ttft.request_id", {"stringValue": "r9"}),
            kv("n", {"intValue": "7"}),
            kv("x", {"doubleValue": 1.5}),
            kv("ok", {"boolValue": False}),
            kv("raw", {"bytesValue": "AAE="}),
            kv("list", {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}),
            kv("map", {"kvlistValue": {"values": [kv("k", {"stringValue": "v"})]}}),
        ],
        "events": [{"timeUnixNano": str(T0_NS + 2), "name": "first_token"}],
        "status": {"code": 2, "message": "boom"},
        **span_extra,
    }
    return {"resourceSpans": [{
        "resource": {"attributes": [kv("service.name", {"stringValue": "api"}),
                                    kv("host.name", {"stringValue": "box"})]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}],
    }]}


JSON_ROWS = [
    {"trace_id": TRACE, "span_id": CHILD, "parent_id": ROOT, "request_id": "r9",
     "name": "tokenize", "stage": "tokenize", "start_ns": T0_NS, "end_ns": T0_NS + 5,
     "clock": "host:box", "service": "api",
     "attributes": {"n": 7, "x": 1.5, "ok": False, "raw": "AAE=", "list": [1, "a"],
                    "map": {"k": "v"}, "otel.status_code": "ERROR",
                    "otel.status_description": "boom"}},
    {"trace_id": TRACE, "parent_id": CHILD, "request_id": "r9", "name": "first_token",
     "stage": "event", "start_ns": T0_NS + 2, "end_ns": T0_NS + 2, "clock": "host:box",
     "service": "api", "attributes": {}},
]


@pytest.mark.parametrize("gzipped", [False, True])
def test_otlp_json_with_hex_ids_becomes_rows(gzipped):
    tables: list[pa.Table] = []
    body = json.dumps(otlp_json()).encode()
    headers = {"Content-Type": "application/json"}
    if gzipped:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    with OTLPReceiver(tables.append, port=0) as receiver:
        response = httpx.post(receiver.endpoint, content=body, headers=headers)
        again = httpx.post(receiver.endpoint, content=body, headers=headers)
    assert (response.status_code, response.json()) == (200, {})
    assert again.status_code == 200
    first, second = rows_of(tables[0]), rows_of(tables[1])
    assert first == second  # a retried export yields the same rows, event ids included
    for row in first:
        if row["stage"] == "event":
            assert len(row.pop("span_id")) == 16
    assert first == sorted(JSON_ROWS, key=lambda row: row["start_ns"])
    assert (receiver.spans_received, receiver.rejected) == (2, 0)


def test_invalid_spans_are_reported_as_partial_success():
    tables: list[pa.Table] = []
    body = json.dumps(otlp_json(endTimeUnixNano=str(T0_NS - 1))).encode()
    with OTLPReceiver(tables.append, port=0) as receiver:
        response = httpx.post(receiver.endpoint, content=body,
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert response.json() == {"partialSuccess": {
        "rejectedSpans": "1",
        "errorMessage": f"span 'tokenize' ends ({T0_NS - 1}) before it starts ({T0_NS})"}}
    assert (tables, receiver.spans_received, receiver.spans_rejected) == ([], 0, 1)


def test_bad_requests_are_answered_and_the_receiver_keeps_serving():
    tables: list[pa.Table] = []
    proto = {"Content-Type": "application/x-protobuf"}
    with OTLPReceiver(tables.append, port=0, max_body_bytes=1 << 10) as receiver, \
            httpx.Client() as client:
        url = receiver.endpoint
        garbage = client.post(url, content=b"\xff\xff\xff\xff", headers=proto)
        syntax = client.post(url, content=b'{"resourceSpans": [', headers={
            "Content-Type": "application/json"})
        wrong_path = client.post(url.replace("/v1/traces", "/v1/metrics"), content=b"",
                                 headers=proto)
        text = client.post(url, content=b"hello", headers={"Content-Type": "text/plain"})
        big = client.post(url, content=b"\0" * (1 << 12), headers=proto)
        bomb = client.post(url, content=gzip.compress(b"\0" * (1 << 12)),
                           headers={**proto, "Content-Encoding": "gzip"})
        good = client.post(url, content=b"", headers=proto)
    assert [r.status_code for r in (garbage, syntax, wrong_path, text, big, bomb, good)] == [
        400, 400, 404, 415, 413, 413, 200]
    assert "not a valid protobuf ExportTraceServiceRequest" in garbage.text
    assert syntax.json()["code"] == 3
    assert syntax.json()["message"].startswith("body is not a valid OTLP/JSON")
    assert text.json() == {"code": 3, "message": "content type 'text/plain' not supported; "
                                                 "use application/x-protobuf or application/json"}
    assert ExportTraceServiceResponse.FromString(good.content) == ExportTraceServiceResponse()
    assert (receiver.rejected, receiver.spans_received, tables) == (6, 0, [])


def test_a_failing_sink_answers_500_and_stop_is_idempotent():
    def sink(table: pa.Table) -> None:
        raise OSError("disk full")

    receiver = OTLPReceiver(sink, port=0).start()
    response = httpx.post(receiver.endpoint, content=json.dumps(otlp_json()).encode(),
                          headers={"Content-Type": "application/json"})
    assert receiver.stop() and receiver.stop()
    assert response.status_code == 500
    assert response.json() == {"code": 13, "message": "internal error: disk full"}
    assert receiver.rejected == 1
    with pytest.raises(httpx.ConnectError):
        httpx.post(receiver.endpoint, content=b"", headers={"Content-Type": "application/json"})

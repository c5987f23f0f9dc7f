"""One span that cannot be stored is rejected alone: the rest of its request is stored and
the answer is OTLP partial success, over real loopback HTTP (JSON and protobuf) and gRPC."""

from __future__ import annotations

import json

import grpc
import httpx
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from ttft.collectors.otlp_grpc import OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import OTLPReceiver
from ttft.collectors.otlp_rows import parse_json_export, parse_proto_request, request_to_rows

T0_NS = 1_700_000_000_000_000_000
TRACE = "5b8efff798038103d269b633813fc60c"
N_VALID = 880  # the adversarial run lost 880 valid spans to one bad neighbour
TIMEOUT_S = 10.0
HUGE_NS = 1 << 63
HUGE_MESSAGE = (f"span 'huge': start_time_unix_nano {HUGE_NS} is beyond int64 nanoseconds "
                "(2^63 - 1)")
PROTO = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def span_id(index: int) -> str:
    return f"{index + 1:016x}"


def json_span(index: int, **fields: object) -> dict[str, object]:
    start_ns = T0_NS + index
    return {"traceId": TRACE, "spanId": span_id(index), "name": f"step{index}",
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 5),
            **fields}


def json_request(spans: list[dict[str, object]]) -> dict[str, object]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "e"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}


def with_huge_span() -> list[dict[str, object]]:
    """``N_VALID`` valid spans with one whose start is 2^63 ns in the middle."""
    spans = [json_span(index) for index in range(N_VALID)]
    spans.insert(N_VALID // 2, json_span(N_VALID, name="huge", startTimeUnixNano=str(HUGE_NS),
                                         endTimeUnixNano=str(HUGE_NS)))
    return spans


def proto_of(document: dict[str, object]) -> ExportTraceServiceRequest:
    request, rejected = parse_json_export(document)
    assert rejected == []
    return request


def stored_ids(tables: list[pa.Table]) -> list[str]:
    return sorted(i for table in tables for i in table.column("span_id").to_pylist())


def test_a_time_beyond_int64_is_rejected_alone_over_http_json_and_protobuf():
    document = json_request(with_huge_span())
    tables: list[pa.Table] = []
    with OTLPReceiver(tables.append, port=0) as receiver, httpx.Client() as client:
        as_json = client.post(receiver.endpoint, content=json.dumps(document), headers=JSON,
                              timeout=TIMEOUT_S)
        as_proto = client.post(receiver.endpoint, headers=PROTO, timeout=TIMEOUT_S,
                               content=proto_of(document).SerializeToString())
    assert (as_json.status_code, as_proto.status_code) == (200, 200)
    assert as_json.json() == {"partialSuccess": {"rejectedSpans": "1",
                                                 "errorMessage": HUGE_MESSAGE}}
    partial = ExportTraceServiceResponse.FromString(as_proto.content).partial_success
    assert (partial.rejected_spans, partial.error_message) == (1, HUGE_MESSAGE)
    assert stored_ids(tables) == sorted([span_id(i) for i in range(N_VALID)] * 2)
    assert (receiver.spans_received, receiver.spans_rejected, receiver.rejected) == (
        2 * N_VALID, 2, 0)


def test_a_time_beyond_int64_is_rejected_alone_over_grpc():
    tables: list[pa.Table] = []
    with OTLPGrpcReceiver(tables.append, port=0) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        response = TraceServiceStub(channel).Export(proto_of(json_request(with_huge_span())),
                                                    timeout=TIMEOUT_S)
    assert (response.partial_success.rejected_spans,
            response.partial_success.error_message) == (1, HUGE_MESSAGE)
    assert stored_ids(tables) == sorted(span_id(i) for i in range(N_VALID))
    assert (receiver.spans_received, receiver.spans_rejected, receiver.rejected) == (
        N_VALID, 1, 0)


BAD_JSON_SPANS = [  # (fields of span 1, the start of its message)
    ({"traceId": "zz" * 16}, "resourceSpans[0].scopeSpans[0].spans[1].traceId: 'zzzz"),
    ({"spanId": "abc"}, "resourceSpans[0].scopeSpans[0].spans[1].spanId: 'abc' is neither "
                        "16 hex digits nor base64 of 8 bytes"),
    ({"startTimeUnixNano": "-5"}, "resourceSpans[0].scopeSpans[0].spans[1]: Failed to parse "
                                  "startTimeUnixNano field: Value out of range: -5."),
    ({"startTimeUnixNano": {}}, "resourceSpans[0].scopeSpans[0].spans[1]: Failed to parse "
                                "startTimeUnixNano field"),
    ({"name": 5}, "resourceSpans[0].scopeSpans[0].spans[1]: Failed to parse name field"),
    ({"endTimeUnixNano": str(1 << 64)}, "resourceSpans[0].scopeSpans[0].spans[1]: Failed to "
                                        "parse endTimeUnixNano field: Value out of range"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_JSON_SPANS)
def test_a_json_span_that_does_not_parse_is_rejected_alone(fields, message):
    document = json_request([json_span(0), json_span(1, **fields), json_span(2)])
    tables: list[pa.Table] = []
    with OTLPReceiver(tables.append, port=0) as receiver:
        response = httpx.post(receiver.endpoint, content=json.dumps(document), headers=JSON,
                              timeout=TIMEOUT_S)
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert partial["errorMessage"].startswith(message)
    assert stored_ids(tables) == [span_id(0), span_id(2)]
    assert (receiver.spans_received, receiver.spans_rejected) == (2, 1)


def test_bad_ids_are_rejected_alike_in_json_and_protobuf():
    document = json_request([json_span(0), json_span(1, parentSpanId="ab" * 9),
                             json_span(2, links=[{"traceId": TRACE, "spanId": "00"}])])
    json_request_, rejected = parse_json_export(document)
    rows_json, errors_json = request_to_rows(json_request_)
    proto = proto_of(json_request([json_span(0), json_span(1), json_span(2)]))
    spans = proto.resource_spans[0].scope_spans[0].spans
    spans[1].parent_span_id = bytes(9)
    spans[2].links.add(trace_id=bytes.fromhex(TRACE), span_id=b"\0")
    rows_proto, errors_proto = request_to_rows(parse_proto_request(proto.SerializeToString()))
    assert [row["span_id"] for row in rows_json] == [row["span_id"] for row in rows_proto] == [
        span_id(0)]
    assert len(rejected) + len(errors_json) == len(errors_proto) == 2
    assert errors_proto == ["span 'step1': invalid parent span id '000000000000000000'",
                            f"span 'step2': invalid link ids '{TRACE}'/'00'"]


def test_a_known_protobuf_field_with_the_wrong_wire_type_is_a_rejection():
    proto = proto_of(json_request([json_span(0)]))
    good = proto.SerializeToString()
    wrong = ExportTraceServiceRequest()
    wrong.ParseFromString(good)
    span = wrong.resource_spans[0].scope_spans[0].spans[0]
    span.name = ""
    # field 5 (name, a string: wire type 2) sent as a varint (wire type 0)
    span.MergeFromString(bytes([5 << 3 | 0, 7]))
    rows, errors = request_to_rows(wrong)
    assert (rows, errors) == ([], ["span '': field name has wire type 0"])


def test_non_finite_attributes_are_stored_as_valid_json_strings():
    attributes = [{"key": key, "value": {"doubleValue": value}}
                  for key, value in (("nan", "NaN"), ("up", "Infinity"), ("down", "-Infinity"),
                                     ("one", 1.5))]
    rows, errors = request_to_rows(proto_of(json_request([json_span(0, attributes=attributes)])))

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    assert errors == []
    assert json.loads(rows[0]["attributes"], parse_constant=refuse) == {
        "nan": "NaN", "up": "Infinity", "down": "-Infinity", "one": 1.5}

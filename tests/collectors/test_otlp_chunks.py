"""Large OTLP exports are converted in chunks (collectors/_otlp_chunks.py): the chunks hold
exactly the spans, resources and scopes of the whole request, a body that does not parse
stores nothing, and a request of many chunks reaches the trace whole over HTTP and gRPC."""

import gzip
import http.client
import json
import os

import grpc
import pytest
from _collect import one_scope_export
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors import TraceWriter, read_spans
from ttft.collectors._otlp_chunks import message_chunks, parsed_chunks, proto_chunks
from ttft.collectors.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import OTLPReceiver
from ttft.collectors.otlp_rows import parse_proto_request, request_to_rows

_names = st.text(alphabet="abcxyz/é", min_size=1, max_size=6)


@st.composite
def requests(draw):
    request = ExportTraceServiceRequest()
    for r in range(draw(st.integers(0, 3))):
        resource_spans = request.resource_spans.add()
        if draw(st.booleans()):
            attribute = resource_spans.resource.attributes.add()
            attribute.key, attribute.value.string_value = "service.name", f"svc-{r}"
        resource_spans.schema_url = draw(st.sampled_from(["", "https://x/1"]))
        for s in range(draw(st.integers(0, 3))):
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = f"scope-{s}"
            for _ in range(draw(st.integers(0, 9))):
                span = scope_spans.spans.add()
                span.trace_id = os.urandom(16)
                span.span_id = draw(st.sampled_from([os.urandom(8), b"", b"\x01" * 4]))
                span.name = draw(_names)
                span.start_time_unix_nano = draw(st.integers(0, 2**63 + 5))
                span.end_time_unix_nano = span.start_time_unix_nano + draw(st.integers(0, 9))
                attribute = span.attributes.add()
                attribute.key = "k"
                attribute.value.double_value = draw(st.floats(allow_nan=True))
    return request


def rows_and_errors(chunks):
    rows, errors = [], []
    for chunk in chunks:
        chunk_rows, chunk_errors = request_to_rows(chunk)
        rows += chunk_rows
        errors += chunk_errors
    return rows, errors


@settings(max_examples=150, deadline=None)
@given(request=requests(), max_spans=st.sampled_from([1, 2, 3, 7, 100]))
def test_chunks_give_the_rows_and_rejections_of_the_whole_request(request, max_spans):
    whole = request_to_rows(request)
    body = request.SerializeToString()
    chunks = [parse_proto_request(c) for c in proto_chunks(body, max_spans)]
    assert all(sum(len(s.spans) for r in c.resource_spans for s in r.scope_spans) <= max_spans
               for c in chunks) or len(chunks) == 1
    assert rows_and_errors(chunks) == whole
    assert rows_and_errors(message_chunks(request, max_spans)) == whole


def test_spans_interleaved_with_other_fields_keep_them_in_every_chunk():
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for i in range(5):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), f"s{i}"
        span.start_time_unix_nano = span.end_time_unix_nano = 1 + i
    body = bytearray(request.SerializeToString())
    # a schema_url (field 3) of the scope between spans, and an unknown top-level field
    scope = ExportTraceServiceRequest()
    scope.resource_spans.add().scope_spans.add().schema_url = "https://x/2"
    body += scope.SerializeToString() + b"\x28\x07"  # field 5, varint 7
    chunks = [parse_proto_request(c) for c in proto_chunks(bytes(body), 2)]
    assert rows_and_errors(chunks) == request_to_rows(parse_proto_request(bytes(body)))


@pytest.mark.parametrize("body", [
    b"\x0a\x05\x12\x03\x12\x01",  # a span whose length runs past its scope
    b"\x0b",  # a group that never ends: left to the parser
    b"\x0a\xff\xff\xff\xff\x0f",  # a length beyond the body
])
def test_a_body_that_does_not_parse_is_refused_before_any_chunk(body):
    with pytest.raises(ValueError, match="not a valid protobuf ExportTraceServiceRequest"):
        list(parsed_chunks(body))


def many_spans(n: int) -> ExportTraceServiceRequest:
    request = one_scope_export(n)
    request.resource_spans[0].scope_spans[0].spans[7].trace_id = b""  # rejected alone
    return request


N_SPANS = 40_000  # three chunks of 16,384


@pytest.mark.parametrize("encoding", ["protobuf", "json-gzip"])
def test_a_request_of_several_chunks_is_stored_whole_over_http(tmp_path, encoding):
    request = many_spans(N_SPANS)
    if encoding == "protobuf":
        body, headers = request.SerializeToString(), {"Content-Type": "application/x-protobuf"}
    else:
        body = gzip.compress(json.dumps(json_format.MessageToDict(request)).encode())
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with TraceWriter(tmp_path / "t.parquet", log=True) as writer:
        with OTLPReceiver(writer, port=0) as receiver:
            connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=60)
            connection.request("POST", "/v1/traces", body, headers)
            response = connection.getresponse()
            answer = response.read()
            connection.close()
            assert response.status == 200
            counts = (receiver.spans_received, receiver.spans_rejected)
    if encoding == "protobuf":
        assert ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans == 1
    else:
        assert json.loads(answer)["partialSuccess"]["rejectedSpans"] == "1"
    assert counts == (N_SPANS - 1, 1)
    stored = read_spans(tmp_path / "t.parquet").column("span_id").to_pylist()
    expected = [s.span_id.hex() for i, s in enumerate(request.resource_spans[0].scope_spans[0]
                                                       .spans) if i != 7]
    assert sorted(stored) == sorted(expected)


def test_a_request_of_several_chunks_is_stored_whole_over_grpc(tmp_path):
    request = many_spans(N_SPANS)
    with TraceWriter(tmp_path / "t.parquet", log=True) as writer:
        with OTLPGrpcReceiver(writer, port=0) as receiver:
            with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
                export = channel.unary_unary(
                    EXPORT_METHOD, request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=ExportTraceServiceResponse.FromString)
                answer = export(request, timeout=60)
    assert answer.partial_success.rejected_spans == 1
    assert read_spans(tmp_path / "t.parquet").num_rows == N_SPANS - 1


JUNK = b"\x08\x00" * (4 << 20)  # field 1 as a varint, four million times


@pytest.mark.parametrize("body", [bytes(8 << 20), JUNK,
                                  b"\x0a\x80\x80\x80\x04" + JUNK],
                         ids=["zeros", "unknown top-level fields", "a resource of junk"])
def test_junk_is_left_to_the_parser_after_a_few_fields(body, monkeypatch):
    """8 MiB of zero bytes, or millions of tiny fields no exporter writes, is not walked
    field by field in Python (60 MiB of zeros took 9 s of CPU before): the walk stops at the
    first field that cannot be OTLP's and the C parser gives its verdict on the whole."""
    from ttft.collectors import _otlp_chunks

    calls = []
    real = _otlp_chunks._varint
    monkeypatch.setattr(_otlp_chunks, "_varint", lambda *a: calls.append(1) or real(*a))
    try:
        assert _otlp_chunks.proto_chunks(body) == [body]  # unknown fields: parsed, no spans
    except ValueError:
        pass  # refused by the parser
    assert len(calls) < 200

"""The compiled OTLP decoder against the reference (parse, then ``request_to_rows``): every
body it takes gives the reference's rows exactly; every body it leaves, the reference
decides; the shapes exporters send are taken, not left."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ttft.collectors import otlp_decode
from ttft.collectors._otlp_chunks import decoded_chunks, decoded_message_chunks
from ttft.collectors._otlp_common import store_export
from ttft.collectors._spans import to_span_table
from ttft.collectors.otlp_rows import parse_json_export, parse_proto_request, request_to_rows
from ttft.tracer.schema import STAGE_BY_NAME

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(autouse=True, scope="module")
def _warm():
    assert otlp_decode.warm()


def reference(body: bytes) -> tuple[list[dict], list[str]] | None:
    """The reference's rows and rejections, or None where the body does not parse."""
    try:
        request = parse_proto_request(body)
    except ValueError:
        return None
    rows, errors = request_to_rows(request)
    return to_span_table(rows).to_pylist(), errors


def spans_in(body: bytes) -> int:
    request = parse_proto_request(body)
    return sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)


def check(body: bytes) -> bool:
    """Assert the compiled path agrees where it answers; whether it answered."""
    found = otlp_decode.export_table(body)
    if found is None:
        return False
    expected = reference(body)
    assert expected is not None, "the compiled path took a body protobuf rejects"
    rows, errors = expected
    assert errors == [], "the compiled path took a body with a rejected span"
    table, spans = found
    assert table.schema == to_span_table([]).schema
    assert table.to_pylist() == rows
    assert spans == spans_in(body)
    return True


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
KEYS = st.one_of(st.sampled_from(["ttft.stage", "ttft.request_id", "request_id", "ttft.clock",
                                  "a", "b", "gen_ai.x", "k\u00e9", "\U0001f600", ""]), TEXT)
STAGE_TEXT = st.one_of(st.sampled_from(sorted(STAGE_BY_NAME) + ["prefill.chunk", ""]), TEXT)


@st.composite
def any_value(draw, depth: int = 0):
    kind = draw(st.sampled_from(["string", "bool", "int", "double", "none", "bytes", "array"]
                                if depth < 2 else ["string", "int"]))
    if kind == "string":
        return ("string_value", draw(st.one_of(STAGE_TEXT, TEXT)))
    if kind == "bool":
        return ("bool_value", draw(st.booleans()))
    if kind == "int":
        return ("int_value", draw(st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                                            st.sampled_from([0, -1, 9, 10, -(1 << 63)]))))
    if kind == "double":
        return ("double_value", draw(st.one_of(st.floats(), st.sampled_from(
            [0.1, -0.0, 1e16, 1e-7, math.inf, -math.inf, math.nan]))))
    if kind == "bytes":
        return ("bytes_value", draw(st.binary(max_size=4)))
    if kind == "array":
        return ("array_value", draw(st.lists(any_value(depth + 1), max_size=2)))
    return ("none", None)


def put(target, value) -> None:
    field, item = value
    if field == "none":
        return
    if field == "array_value":
        target.array_value.SetInParent()
        for inner in item:
            put(target.array_value.values.add(), inner)
        return
    setattr(target, field, item)


@st.composite
def attributes(draw, plain: bool):
    values = any_value() if not plain else any_value(depth=2)
    pairs = draw(st.lists(st.tuples(KEYS, values), max_size=6))
    if plain:  # unique keys; ttft's keys hold strings, as instrumentations write them
        seen: dict = {}
        for key, value in pairs:
            if key in ("ttft.stage", "ttft.request_id", "request_id", "ttft.clock"):
                value = ("string_value", draw(STAGE_TEXT))
            seen[key] = value
        pairs = list(seen.items())
    return pairs


def add_attributes(target, pairs) -> None:
    for key, value in pairs:
        put(target.add(key=key).value, value)


@st.composite
def requests(draw, plain: bool = False):
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1 if plain else 0, 3))):
        resource_spans = request.resource_spans.add()
        resource = draw(st.lists(st.tuples(st.sampled_from(
            ["service.name", "host.name", "ttft.clock", "other"]), st.one_of(
                st.tuples(st.just("string_value"), TEXT),
                st.tuples(st.just("none"), st.none()) if not plain else st.nothing(),
                any_value() if not plain else st.nothing())), max_size=4))
        add_attributes(resource_spans.resource.attributes, resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = draw(TEXT)
        for _ in range(draw(st.integers(0, 4))):
            span = scope_spans.spans.add(name=draw(STAGE_TEXT))
            zero = not plain and draw(st.integers(0, 20)) == 0
            span.trace_id = bytes(16) if zero else draw(st.binary(min_size=16, max_size=16)
                                                        .filter(any))
            span.span_id = draw(st.binary(min_size=8, max_size=8).filter(any))
            if draw(st.booleans()):
                span.parent_span_id = draw(st.binary(min_size=8, max_size=8))
            start = draw(st.integers(0, 1 << 62))
            span.start_time_unix_nano = start
            span.end_time_unix_nano = draw(st.sampled_from(
                [start, start + 5, 0] + ([] if plain else [max(start - 1, 0)])))
            pairs = draw(attributes(plain))
            add_attributes(span.attributes, pairs)
            # a point: no duration, or the event stage by its name or its ttft.stage
            point = (span.end_time_unix_nano in (0, start) or span.name == "event"
                     or ("ttft.stage", ("string_value", "event")) in pairs)
            for _ in range(draw(st.integers(0, 0 if plain and point else 2))):
                event = span.events.add(name=draw(TEXT),
                                         time_unix_nano=draw(st.integers(0, 1 << 62)))
                add_attributes(event.attributes, draw(attributes(plain)))
            if draw(st.booleans()):
                span.status.code = draw(st.integers(0, 2))
                span.status.message = draw(TEXT)
            if not plain and draw(st.integers(0, 5)) == 0:
                span.links.add(trace_id=bytes(range(16)), span_id=bytes(range(8)))
    return request.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_body_it_takes_gives_the_references_rows(body):
    check(body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(plain=True))
def test_the_shapes_exporters_send_are_taken(body):
    """Unique keys, valid ids and times, scalar values, no links: never left to the
    reference (so the property above is not met by answering None)."""
    assert check(body), "a plain export was left to the reference"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(plain=True), st.data())
def test_a_damaged_body_is_taken_only_where_protobuf_takes_it_whole(body, data):
    """Bytes flipped, cut or inserted: where the compiled path still answers, protobuf
    parses the body and rejects no span, and the rows are the same."""
    damaged = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        if not damaged:
            break
        at = data.draw(st.integers(0, len(damaged) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del damaged[at:]
        else:
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    check(bytes(damaged))


def sdk_body(n_spans: int = 40) -> bytes:
    """An export encoded by the OpenTelemetry exporter's own encoder from spans of a real
    ``TracerProvider``: attributes of every scalar kind, events, statuses, nesting."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "engine",
                                                        "host.name": "node-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("ttft.test")
    rng = random.Random(7)
    with tracer.start_as_current_span("server", attributes={"ttft.request_id": "r1"}):
        for index in range(n_spans):
            stage = rng.choice(["queue", "prefill", "tokenize", "prefill.chunk", "other"])
            with tracer.start_as_current_span(stage, attributes={
                    "ttft.stage": stage, "tokens": rng.randrange(1 << 20),
                    "ratio": rng.random(), "cached": rng.random() < 0.5,
                    "text": "é\n\"\U0001f600\x7f"}) as span:
                if index % 3 == 0:
                    span.add_event("first_token", {"index": index})
                if index % 5 == 0:
                    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, "boom"))
    provider.shutdown()
    return encode_spans(exporter.get_finished_spans()).SerializeToString()


def test_the_sdk_exporters_encoding_is_taken_and_agrees():
    assert check(sdk_body())


def test_json_bodies_go_through_the_same_columns():
    body = sdk_body(10)
    request = parse_proto_request(body)
    from google.protobuf import json_format

    document = json_format.MessageToDict(request)
    parsed, rejected = parse_json_export(document)
    assert rejected == []
    chunks = list(decoded_message_chunks(parsed))
    assert len(chunks) == 1 and isinstance(chunks[0], tuple)
    assert chunks[0][0].to_pylist() == reference(body)[0]


def test_an_export_stores_the_same_spans_and_answer_either_way():
    """``store_export`` with the compiled chunks and with parsed ones: the same tables, the
    same counts, the same (empty) rejections; a rejected span sends the body to the
    reference, which names it."""
    body = sdk_body(30)
    fast: list = []
    slow: list = []
    got = store_export(decoded_chunks(body), [], fast.append)
    want = store_export([parse_proto_request(body)], [], slow.append)
    assert got[1:] == want[1:]
    assert [t.to_pylist() for t in fast] == [t.to_pylist() for t in slow]
    request = parse_proto_request(body)
    request.resource_spans[0].scope_spans[0].spans[3].trace_id = bytes(16)
    bad = request.SerializeToString()
    assert otlp_decode.export_table(bad) is None
    response, stored, rejected = store_export(decoded_chunks(bad), [], fast.append)
    assert stored == 30 and len(rejected) == 1 and "invalid trace id" in rejected[0]
    assert response.partial_success.rejected_spans == 1


def test_a_body_of_more_spans_than_a_chunk_is_chunked_and_still_compiled():
    body = sdk_body(25)
    chunks = list(decoded_chunks(body, max_spans=10))
    assert len(chunks) == 3 and all(isinstance(c, tuple) for c in chunks)
    rows = [row for table, _ in chunks for row in table.to_pylist()]
    assert rows == reference(body)[0]
    assert sum(n for _, n in chunks) == spans_in(body)


def test_a_body_denser_than_the_first_guess_is_walked_again():
    """200 one-letter keys without values take 5 bytes each, past the first walk's table
    of key-values; the second walk, sized by the count, still agrees."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(name="queue")
    span.trace_id, span.span_id = bytes(15) + b"\1", bytes(7) + b"\1"
    for index in range(200):
        span.attributes.add(key=chr(0x100 + index))
    assert check(request.SerializeToString())


def test_the_reference_alone_when_the_compiled_path_is_off():
    body = sdk_body(5)
    otlp_decode._enable(False)
    try:
        assert otlp_decode.export_table(body) is None
        assert all(not isinstance(c, tuple) for c in decoded_chunks(body))
    finally:
        otlp_decode._enable(True)
    assert otlp_decode.export_table(body) is not None

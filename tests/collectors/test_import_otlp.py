"""OTLP trace files (OpenTelemetry Collector file exporter, JSON and protobuf) → span table.

Inputs are spans of the real OpenTelemetry SDK, encoded by the real OTLP encoder
(``opentelemetry-exporter-otlp-proto-common``) and written in each form such files take.
"""

import base64
import gzip
import json

import pytest
from _live import ids, rows_of
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode

from ttft.collectors import TraceFileError, guess_format, write_trace
from ttft.collectors.importers import IMPORTERS
from ttft.collectors.importers import _base as importers_base
from ttft.collectors.otlp_rows import parse_json_request
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

T0_NS = 1_700_000_000_000_000_000
ATTRIBUTES = {
    "text": "hi", "flag": True, "count": 7, "ratio": 0.5, "raw": b"\x00\x01",
    "texts": ["a", "b"], "flags": [True, False], "counts": [1, -2], "ratios": [0.5, 1.5],
    "raws": [b"\x02"], "map": {"k": "v", "n": 1}, "none": None,
}
ATTRIBUTES_JSON = {
    "text": "hi", "flag": True, "count": 7, "ratio": 0.5, "raw": "AAE=",
    "texts": ["a", "b"], "flags": [True, False], "counts": [1, -2], "ratios": [0.5, 1.5],
    "raws": ["Ag=="], "map": {"k": "v", "n": 1}, "none": None,
}
JSON_READER, PROTO_READER = IMPORTERS["otlp-json"], IMPORTERS["otlp-proto"]


@pytest.fixture(scope="module")
def sdk():
    """``(spans, expected rows, export requests)``: an engine step, a server span with an
    event and a child prefill span linked to the step, from the SDK; two export requests."""
    provider = TracerProvider(resource=Resource.create({"service.name": "engine",
                                                        "host.name": "box"}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    step = tracer.start_span("engine.step", start_time=T0_NS,
                             attributes={"ttft.stage": "step", "step_id": 3})
    server = tracer.start_span("http.request", start_time=T0_NS + 1,
                               attributes={**ATTRIBUTES, "ttft.request_id": "r1"})
    server.add_event("first_byte", {"bytes": 12}, timestamp=T0_NS + 40)
    prefill = tracer.start_span(
        "prefill", context=trace.set_span_in_context(server), start_time=T0_NS + 5,
        attributes={"ttft.stage": "prefill", "ttft.request_id": "r1"},
        links=[Link(step.get_span_context(), {"why": "batched"})])
    prefill.set_status(Status(StatusCode.ERROR, "oom"))
    prefill.end(end_time=T0_NS + 30)
    server.end(end_time=T0_NS + 50)
    step.end(end_time=T0_NS + 35)
    provider.shutdown()
    spans = exporter.get_finished_spans()
    (step_trace, step_id), (trace_id, server_id) = ids(step), ids(server)
    _, prefill_id = ids(prefill)
    common = {"clock": "host:box", "service": "engine"}
    rows = [
        {**common, "trace_id": step_trace, "span_id": step_id, "parent_id": None,
         "request_id": None, "name": "engine.step", "stage": "step", "start_ns": T0_NS,
         "end_ns": T0_NS + 35, "attributes": {"step_id": 3}},
        {**common, "trace_id": trace_id, "span_id": server_id, "parent_id": None,
         "request_id": "r1", "name": "http.request", "stage": "other", "start_ns": T0_NS + 1,
         "end_ns": T0_NS + 50, "attributes": ATTRIBUTES_JSON},
        {**common, "trace_id": trace_id, "span_id": prefill_id, "parent_id": server_id,
         "request_id": "r1", "name": "prefill", "stage": "prefill", "start_ns": T0_NS + 5,
         "end_ns": T0_NS + 30, "attributes": {
             "links": [{"trace_id": step_trace, "span_id": step_id,
                        "attributes": {"why": "batched"}}],
             "otel.status_code": "ERROR", "otel.status_description": "oom"}},
        {**common, "trace_id": trace_id, "span_id": "(event)", "parent_id": server_id,
         "request_id": "r1", "name": "first_byte", "stage": "event", "start_ns": T0_NS + 40,
         "end_ns": T0_NS + 40, "attributes": {"bytes": 12}},
    ]
    return spans, rows, [encode_spans(spans[:1]), encode_spans(spans[1:])]


def lines(documents) -> bytes:
    return "".join(f"{d}\n" for d in documents).encode()


def collector_hex(request: ExportTraceServiceRequest, *, snake: bool = False,
                  upper: bool = False) -> dict:
    """The request as OTLP/JSON with hex ids, as the Collector's file exporter writes it."""
    document = json_format.MessageToDict(request, preserving_proto_field_name=snake)
    key = ("resource_spans", "scope_spans") if snake else ("resourceSpans", "scopeSpans")
    for resource in document[key[0]]:
        for scope in resource[key[1]]:
            for span in scope["spans"]:
                for node in (span, *span.get("links", [])):
                    for name in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id",
                                 "parent_span_id"):
                        if name in node:
                            hexed = base64.b64decode(node[name]).hex()
                            node[name] = hexed.upper() if upper else hexed
    return document


def numbers(node):
    """``node`` with 64-bit integers as JSON numbers instead of strings."""
    if isinstance(node, dict):
        return {k: int(v) if k.endswith("UnixNano") or k == "intValue" else numbers(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [numbers(item) for item in node]
    return node


def url_safe_ids(request: ExportTraceServiceRequest) -> dict:
    document = collector_hex(request)
    for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for node in (span, *span.get("links", [])):
            for name in ("traceId", "spanId", "parentSpanId"):
                if name in node:
                    raw = bytes.fromhex(node[name])
                    node[name] = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return document


def framed(messages) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def merged(requests) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for part in requests:
        request.MergeFrom(part)
    return request


FORMS = {  # name: (file name, importer, bytes of the file from the export requests)
    "sdk-json-lines": ("spans.jsonl", "otlp-json", lambda rs: lines(
        json_format.MessageToJson(r, indent=None) for r in rs)),
    "collector-hex-lines": ("spans.jsonl", "otlp-json", lambda rs: lines(
        json.dumps(collector_hex(r)) for r in rs)),
    "times-as-numbers": ("spans.jsonl", "otlp-json", lambda rs: lines(
        json.dumps(numbers(collector_hex(r))) for r in rs)),
    "snake-case-upper-hex": ("spans.jsonl", "otlp-json", lambda rs: lines(
        json.dumps(collector_hex(r, snake=True, upper=True)) for r in rs)),
    "url-safe-base64": ("spans.jsonl", "otlp-json", lambda rs: lines(
        json.dumps(url_safe_ids(r)) for r in rs)),
    "pretty-document": ("spans.json", "otlp-json", lambda rs: json_format.MessageToJson(
        merged(rs)).encode()),
    "json-array": ("spans.json", "otlp-json", lambda rs: json.dumps(
        [collector_hex(r) for r in rs], indent=1).encode()),
    "gzip-collector-hex": ("spans.jsonl.gz", "otlp-json", lambda rs: gzip.compress(lines(
        json.dumps(collector_hex(r)) for r in rs))),
    "proto-framed": ("spans.pb", "otlp-proto", lambda rs: framed(
        r.SerializeToString() for r in rs)),
    "proto-unframed": ("spans.pb", "otlp-proto", lambda rs: merged(rs).SerializeToString()),
    "gzip-proto-framed": ("spans.pb.gz", "otlp-proto", lambda rs: gzip.compress(framed(
        r.SerializeToString() for r in rs))),
}


def write(tmp_path, form: str, requests):
    name, importer, encode = FORMS[form]
    path = tmp_path / name
    path.write_bytes(encode(requests))
    return path, importer


def metadata(table) -> dict:
    return json.loads(table.schema.metadata[METADATA_KEY])


@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_guessed_and_reads_to_the_sdk_spans(tmp_path, sdk, form):
    _, expected, requests = sdk
    path, importer = write(tmp_path, form, requests)
    assert guess_format(path) == importer
    table = IMPORTERS[importer].read(path)
    assert table.schema.remove_metadata() == SPAN_SCHEMA
    rows = rows_of(table)
    event = rows[-1]
    assert len(event["span_id"]) == 16 and int(event["span_id"], 16) >= 0
    assert event["span_id"] not in {row["span_id"] for row in rows[:-1]}
    event["span_id"] = "(event)"
    assert rows == expected
    messages = 1 if form in ("pretty-document", "proto-unframed") else 2
    assert metadata(table) == {"schema_version": SCHEMA_VERSION, "source_format": importer,
                               "source": str(path), "requests": messages,
                               "rejected": {"count": 0, "examples": []}}


def test_every_form_reads_to_the_same_table(tmp_path, sdk):
    tables = []
    for form in FORMS:
        (tmp_path / form).mkdir()
        path, importer = write(tmp_path / form, form, sdk[2])
        tables.append(rows_of(IMPORTERS[importer].read(path)))
    assert all(table == tables[0] for table in tables)  # event ids included


def test_other_files_are_not_claimed(tmp_path, sdk):
    parquet = tmp_path / "trace.parquet"
    write_trace(parquet, PROTO_READER.read(write(tmp_path, "proto-framed", sdk[2])[0]))
    other_json = tmp_path / "other.json"
    other_json.write_text('{"a": 1}\n')
    text = tmp_path / "notes.txt"
    text.write_text("\n\nhello\n")
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")
    assert guess_format(parquet) == "ttft"
    for path in (parquet, other_json, text, empty, tmp_path / "missing.jsonl", tmp_path):
        assert (JSON_READER.guess_can_open(path), PROTO_READER.guess_can_open(path)) == (
            False, False)
    with pytest.raises(TraceFileError) as error:
        guess_format(other_json)
    assert error.value.path == str(other_json)
    assert str(error.value).startswith(f"{other_json}: not a trace format ttft reads; ")


def test_a_line_that_is_not_json_is_named(tmp_path, sdk):
    path = tmp_path / "spans.jsonl"
    path.write_bytes(FORMS["collector-hex-lines"][2](sdk[2][:1]) + b"\n{not json\n")
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert (error.value.path, error.value.reason) == (
        str(path), "line 3: not JSON (Expecting property name enclosed in double quotes, "
                   "column 2)")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("traceId", "abcd", "traceId: 'abcd' is neither 32 hex digits nor base64 of 16 bytes"),
    ("spanId", "ab" * 9, f"spanId: '{'ab' * 9}' is neither 16 hex digits nor base64 of 8 bytes"),
    ("parentSpanId", 7, "parentSpanId: an id must be a string, not int"),
    ("links", [{"traceId": "0" * 32, "spanId": "xyz!"}],
     "links[0].spanId: 'xyz!' is neither 16 hex digits nor base64 of 8 bytes"),
])
def test_a_bad_id_names_the_line_and_field(tmp_path, sdk, field, value, message):
    good, bad = collector_hex(sdk[2][0]), collector_hex(sdk[2][1])
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][1][field] = value
    path = tmp_path / "spans.jsonl"
    path.write_bytes(lines([json.dumps(good), json.dumps(bad)]))
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert error.value.reason == ("line 2: not a valid OTLP/JSON ExportTraceServiceRequest: "
                                  f"resourceSpans[0].scopeSpans[0].spans[1].{message}")


def test_json_that_is_no_trace_export_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{}\n{"resourceMetrics": []}\n')
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert error.value.reason == ("line 2: not an OTLP trace export (no resourceSpans; keys: "
                                  "resourceMetrics)")
    path.write_text('[{"resourceSpans": []}, 3]')
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert error.value.reason == "element 1: a JSON number, not an export request object"


def test_a_truncated_frame_is_named(tmp_path, sdk):
    messages = [r.SerializeToString() for r in sdk[2]]
    path = tmp_path / "spans.pb"
    path.write_bytes(framed(messages)[:-3])
    with pytest.raises(TraceFileError) as error:
        PROTO_READER.read(path)
    first, second = (len(m) for m in messages)
    assert error.value.reason == (f"frame 2 (byte {4 + first}): truncated: {second - 3} of "
                                  f"{second} bytes")
    path.write_bytes(framed(messages) + b"\0\0")
    with pytest.raises(TraceFileError) as error:
        PROTO_READER.read(path)
    assert error.value.reason == (f"frame 3 (byte {8 + first + second}): truncated length "
                                  "prefix (2 of 4 bytes)")


def test_a_frame_that_does_not_parse_is_named(tmp_path, sdk):
    path = tmp_path / "spans.pb"
    path.write_bytes(framed([sdk[2][0].SerializeToString(), b"\xff\xff\xff\xff"]))
    with pytest.raises(TraceFileError) as error:
        PROTO_READER.read(path)
    assert error.value.reason.startswith(
        f"frame 2 (byte {4 + sdk[2][0].ByteSize()}): not a valid protobuf "
        "ExportTraceServiceRequest: ")
    path.write_bytes(framed([b"\x28\xb5\x2f\xfd" + b"\0" * 8]))
    with pytest.raises(TraceFileError) as error:
        PROTO_READER.read(path)
    assert error.value.reason.startswith("frame 1 (byte 0): zstd-compressed (the Collector's "
                                         "compression: zstd)")


def test_invalid_spans_are_counted_and_the_rest_is_read(tmp_path, sdk):
    request = merged(sdk[2])
    spans = request.resource_spans[0].scope_spans[0].spans
    backwards = spans.add()
    backwards.CopyFrom(spans[0])
    backwards.name, backwards.end_time_unix_nano = "backwards", T0_NS - 1
    no_trace = spans.add()
    no_trace.CopyFrom(spans[0])
    no_trace.name, no_trace.trace_id = "no trace", bytes(16)
    path = tmp_path / "spans.pb"
    path.write_bytes(framed([request.SerializeToString()]))
    table = PROTO_READER.read(path)
    assert sorted(table.column("name").to_pylist()) == [
        "engine.step", "first_byte", "http.request", "prefill"]
    start_ns = spans[0].start_time_unix_nano
    assert metadata(table)["rejected"] == {"count": 2, "examples": [
        f"frame 1 (byte 0): span 'backwards' ends ({T0_NS - 1}) before it starts ({start_ns})",
        f"frame 1 (byte 0): span 'no trace': invalid trace id '{'0' * 32}'",
    ]}


def test_gzip_is_bounded_and_checked(tmp_path, sdk, monkeypatch):
    path, _ = write(tmp_path, "gzip-collector-hex", sdk[2])
    monkeypatch.setattr(importers_base, "MAX_DECOMPRESSED_BYTES", 100)
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert error.value.reason == ("decompresses to more than 100 bytes "
                                  "(the limit MAX_DECOMPRESSED_BYTES)")
    monkeypatch.undo()
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(TraceFileError) as error:
        JSON_READER.read(path)
    assert error.value.reason == ("not valid gzip: Compressed file ended before the "
                                  "end-of-stream marker was reached")


def test_a_missing_file_is_named(tmp_path):
    for reader in (JSON_READER, PROTO_READER):
        with pytest.raises(TraceFileError) as error:
            reader.read(tmp_path / "missing")
        assert (error.value.path, error.value.reason) == (
            str(tmp_path / "missing"), "No such file or directory")


def test_json_ids_may_be_hex_or_any_base64_and_the_input_is_kept():
    raw = bytes.fromhex("fbff" * 8)
    forms = [raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode(),
             base64.b64encode(raw).decode().rstrip("="),
             base64.urlsafe_b64encode(raw).decode().rstrip("=")]
    for form in forms:
        document = {"resource_spans": [{"scope_spans": [{"spans": [{
            "trace_id": form, "span_id": "00" * 7 + "01", "parent_span_id": "",
            "links": [{"traceId": form, "spanId": "AAAAAAAAAAI="}]}]}]}]}
        before = json.dumps(document)
        span = parse_json_request(document).resource_spans[0].scope_spans[0].spans[0]
        assert json.dumps(document) == before
        assert (span.trace_id, span.span_id, span.parent_span_id) == (
            raw, bytes(7) + b"\1", b"")
        assert (span.links[0].trace_id, span.links[0].span_id) == (raw, bytes(7) + b"\2")

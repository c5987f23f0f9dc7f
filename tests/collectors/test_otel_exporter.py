import json
import logging
import re
import shutil
import socket

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from ttft.collectors import TraceWriter, read_spans, run_metadata
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.tracer.schema import SCHEMA_VERSION

T0_NS = 1_700_000_000_000_000_000
HOST_CLOCK = "host:" + socket.gethostname()


def provider_for(exporter, service: str = "api") -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def hex_ids(span) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_spans_events_and_links_from_a_real_tracer_provider(tmp_path):
    path = tmp_path / "trace.parquet"
    provider = provider_for(ParquetSpanExporter(path, metadata={"workload": "unit"}))
    tracer = provider.get_tracer("test")

    root = tracer.start_span(
        "server", start_time=T0_NS, attributes={"ttft.request_id": "r1", "http.method": "POST"}
    )
    in_root = trace.set_span_in_context(root)
    tokenize = tracer.start_span("tokenize", context=in_root, start_time=T0_NS + 10)
    tokenize.add_event("first_sampled", {"token_id": 42}, timestamp=T0_NS + 15)
    tokenize.end(end_time=T0_NS + 20)
    forward = tracer.start_span(
        "model.forward",
        context=trace.set_span_in_context(tokenize),
        start_time=T0_NS + 20,
        attributes={
            "ttft.stage": "forward",
            "ttft.clock": "gpu:0",
            "step_id": 3,
            "request_ids": ("r1", "r2"),
        },
        links=[Link(root.get_span_context(), {"why": "batched"})],
    )
    forward.end(end_time=T0_NS + 50)
    marker = tracer.start_span("first_byte", context=in_root, start_time=T0_NS + 60)
    marker.end(end_time=T0_NS + 60)
    root.end(end_time=T0_NS + 70)
    provider.shutdown()

    rows = read_spans(path).to_pylist()

    trace_id, root_id = hex_ids(root)
    tokenize_id, forward_id, marker_id = (hex_ids(s)[1] for s in (tokenize, forward, marker))
    event_id = rows[1]["span_id"]
    assert re.fullmatch("[0-9a-f]{16}", event_id)
    assert event_id not in {root_id, tokenize_id, forward_id, marker_id}
    common = {"trace_id": trace_id, "service": "api"}
    assert rows == [
        {
            **common,
            "span_id": tokenize_id,
            "parent_id": root_id,
            "request_id": None,
            "name": "tokenize",
            "stage": "tokenize",
            "start_ns": T0_NS + 10,
            "end_ns": T0_NS + 20,
            "clock": HOST_CLOCK,
            "attributes": "{}",
        },
        {
            **common,
            "span_id": event_id,
            "parent_id": tokenize_id,
            "request_id": None,
            "name": "first_sampled",
            "stage": "event",
            "start_ns": T0_NS + 15,
            "end_ns": T0_NS + 15,
            "clock": HOST_CLOCK,
            "attributes": '{"token_id":42}',
        },
        {
            **common,
            "span_id": forward_id,
            "parent_id": tokenize_id,
            "request_id": None,
            "name": "model.forward",
            "stage": "forward",
            "start_ns": T0_NS + 20,
            "end_ns": T0_NS + 50,
            "clock": "gpu:0",
            "attributes": json.dumps(
                {
                    "links": [
                        {"attributes": {"why": "batched"}, "span_id": root_id, "trace_id": trace_id}
                    ],
                    "request_ids": ["r1", "r2"],
                    "step_id": 3,
                },
                sort_keys=True,
                separators=(",", ":"),
            ),
        },
        {
            **common,
            "span_id": marker_id,
            "parent_id": root_id,
            "request_id": None,
            "name": "first_byte",
            "stage": "event",
            "start_ns": T0_NS + 60,
            "end_ns": T0_NS + 60,
            "clock": HOST_CLOCK,
            "attributes": "{}",
        },
        {
            **common,
            "span_id": root_id,
            "parent_id": None,
            "request_id": "r1",
            "name": "server",
            "stage": "server",
            "start_ns": T0_NS,
            "end_ns": T0_NS + 70,
            "clock": HOST_CLOCK,
            "attributes": '{"http.method":"POST"}',
        },
    ]
    assert run_metadata(read_spans(path)) == {"workload": "unit", "schema_version": SCHEMA_VERSION}


def test_point_spans_stay_one_row_and_unknown_stages_are_kept(tmp_path):
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path, flush_interval_s=None)
    provider = provider_for(ParquetSpanExporter(writer, metadata={"run": 3}), service="client")
    tracer = provider.get_tracer("test")

    point = tracer.start_span(
        "first_token", start_time=T0_NS, attributes={"ttft.stage": "event", "request_id": 17}
    )
    point.add_event("chunk", {"bytes": 5}, timestamp=T0_NS + 1)
    point.end(end_time=T0_NS + 2)
    odd = tracer.start_span("warmup", start_time=T0_NS, attributes={"ttft.stage": "warm"})
    odd.set_status(Status(StatusCode.ERROR, "cuda oom"))
    odd.end(end_time=T0_NS + 9)
    provider.shutdown()

    assert writer.closed
    rows = read_spans(path).to_pylist()
    assert [(r["name"], r["stage"], r["request_id"], r["attributes"]) for r in rows] == [
        (
            "first_token",
            "event",
            "17",
            '{"events":[{"attributes":{"bytes":5},"name":"chunk",'
            f'"timestamp_ns":{T0_NS + 1}}}]}}',
        ),
        (
            "warmup",
            "other",
            None,
            '{"otel.status_code":"ERROR","otel.status_description":"cuda oom","ttft.stage":"warm"}',
        ),
    ]
    assert run_metadata(read_spans(path)) == {"run": 3, "schema_version": SCHEMA_VERSION}


def finished_spans(count: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = provider_for(memory)
    tracer = provider.get_tracer("test")
    for i in range(count):
        tracer.start_span(f"span-{i}", start_time=T0_NS + i).end(end_time=T0_NS + i + 1)
    spans = list(memory.get_finished_spans())
    provider.shutdown()
    return spans


def test_a_closed_writer_makes_export_fail_without_raising(tmp_path, caplog):
    writer = TraceWriter(tmp_path / "trace.parquet")
    writer.close()
    exporter = ParquetSpanExporter(writer)

    with caplog.at_level(logging.ERROR, logger="ttft.collectors.otel_exporter"):
        result = exporter.export(finished_spans(3))

    assert result is SpanExportResult.FAILURE
    assert exporter.dropped_spans == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'trace.parquet'}: cannot write 3 span(s)"
    ]


def test_a_failing_disk_makes_export_fail_and_shutdown_quiet(tmp_path, caplog):
    exporter = ParquetSpanExporter(tmp_path / "trace.parquet", flush_spans=1, flush_interval_s=None)
    parts = tmp_path / "trace.parquet.parts"
    shutil.rmtree(parts)
    parts.write_bytes(b"")  # a file where the parts directory was: every write fails

    with caplog.at_level(logging.ERROR, logger="ttft.collectors.otel_exporter"):
        result = exporter.export(finished_spans(2))
        exporter.shutdown()
        exporter.shutdown()

    assert result is SpanExportResult.FAILURE
    assert (exporter.dropped_spans, exporter.writer.dropped_rows) == (2, 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'trace.parquet'}: cannot write 2 span(s)",
        f"{tmp_path / 'trace.parquet'}: closing the trace writer failed",
    ]
    assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
    assert exporter.dropped_spans == 3


def test_a_bad_span_is_dropped_and_the_rest_written(tmp_path, caplog):
    path = tmp_path / "trace.parquet"
    exporter = ParquetSpanExporter(path)
    good = finished_spans(2)
    backwards = ReadableSpan(
        name="backwards",
        context=SpanContext(1, 2, is_remote=False),
        start_time=10,
        end_time=5,
    )

    with caplog.at_level(logging.ERROR, logger="ttft.collectors.otel_exporter"):
        result = exporter.export([good[0], backwards, good[1]])
    assert exporter.force_flush(timeout_millis=1000) is True
    flushed = read_spans(tmp_path / "trace.parquet.parts")
    exporter.shutdown()

    assert result is SpanExportResult.FAILURE
    assert exporter.dropped_spans == 1
    assert [r.getMessage() for r in caplog.records] == ["cannot convert span 'backwards'; dropped"]
    assert flushed.column("name").to_pylist() == ["span-0", "span-1"]
    assert read_spans(path).column("name").to_pylist() == ["span-0", "span-1"]

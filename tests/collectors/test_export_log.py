"""`OneLineFailures` around OpenTelemetry's real OTLP/HTTP exporter: no receiver yet is one
line naming the endpoint, not a warning per batch and retry; the receiver coming up is one
more line."""

from __future__ import annotations

import logging
import threading

from _live import Collect
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from ttft.collectors.otlp_receiver import OTLPReceiver
from ttft.engine.server import free_port
from ttft.tracer.export_log import OneLineFailures


def _spans(n: int) -> list:
    collect = Collect()
    provider = TracerProvider(resource=Resource.create({"service.name": "engine"}))
    provider.add_span_processor(SimpleSpanProcessor(collect))
    for index in range(n):
        provider.get_tracer("test").start_span(f"s{index}").end()
    provider.shutdown()
    return collect.spans


def test_no_receiver_yet_is_one_line_then_one_when_it_is_up(caplog):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    # each refused batch is retried until the timeout: long enough for a loaded machine
    exporter = OneLineFailures(OTLPSpanExporter(endpoint=endpoint, timeout=2), endpoint)
    spans = _spans(3)
    with caplog.at_level(logging.DEBUG):
        assert [exporter.export(spans[i:i + 1]) for i in range(2)] == [
            SpanExportResult.FAILURE] * 2
        received: list = []
        with OTLPReceiver(received.append, port=port):
            assert exporter.export(spans[2:]) == SpanExportResult.SUCCESS
        exporter.shutdown()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.getMessage()) for r in warnings] == [
        ("ttft.tracer.export", f"cannot export spans to {endpoint} (nothing listening there "
                               "yet?): spans are dropped until it is up"),
        ("ttft.tracer.export", f"span export to {endpoint} is up again (2 batches dropped "
                               "while it was down)"),
    ]
    assert sum(t.num_rows for t in received) == 1


def test_the_exporters_logger_stays_open_to_other_threads(caplog):
    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces"
    inner = OTLPSpanExporter(endpoint=endpoint, timeout=0.3)
    exporter = OneLineFailures(inner, endpoint)
    other = logging.getLogger(type(inner).__module__)
    with caplog.at_level(logging.DEBUG):
        thread = threading.Thread(target=other.warning, args=("someone else's line",))
        thread.start()
        thread.join()
        exporter.export(_spans(1))
        exporter.shutdown()
        other.warning("after shutdown")
    assert [r.getMessage() for r in caplog.records if r.name == other.name] == [
        "someone else's line", "after shutdown"]

"""Any OpenTelemetry exporter works behind the recorder: OTLP/HTTP to a real loopback
receiver, and the console exporter."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

import ttft.tracer as tt

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Receiver(BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        Receiver.received.append((self.path, request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args) -> None:
        pass


def test_otlp_http_exporter_delivers_spans_to_a_loopback_receiver():
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        tracing = tt.configure(
            "engine", [OTLPSpanExporter(endpoint=endpoint, timeout=5)], flush_interval_s=0.01
        )
        with tt.request_context(PARENT, "r1"), tt.stage("server"):
            with tt.stage("tokenize", prompt_tokens=7):
                pass
        result = tracing.shutdown(timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.exported, result.failed) == (2, 0)
    spans = {}
    for path, request in Receiver.received:
        assert path == "/v1/traces"
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert service["service.name"] == "engine"
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    spans[span.name] = span
    assert set(spans) == {"server", "tokenize"}
    assert spans["server"].trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert spans["server"].parent_span_id.hex() == "b7ad6b7169203331"
    assert spans["tokenize"].parent_span_id == spans["server"].span_id
    attrs = {a.key: a.value for a in spans["tokenize"].attributes}
    assert attrs["ttft.stage"].string_value == "tokenize"
    assert attrs["prompt_tokens"].int_value == 7


def test_console_exporter_prints_each_span():
    out = io.StringIO()
    tracing = tt.configure("engine", [ConsoleSpanExporter(out=out)], flush_interval_s=0.01)
    with tt.stage("step", step_id=1):
        pass
    tracing.shutdown()
    printed = json.loads(out.getvalue())
    assert printed["name"] == "step"
    assert printed["attributes"]["step_id"] == 1

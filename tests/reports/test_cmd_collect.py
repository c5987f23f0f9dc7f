"""`ttft collect`: a real process on loopback receiving real SDK exports over OTLP/HTTP and
OTLP/gRPC, stopped by a signal; its errors, in-process."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time

import grpc
import pytest
from _collect import CollectProcess, one_scope_export
from _live import Collect
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.collectors.otlp_grpc import EXPORT_METHOD
from ttft.reports.cli import app

T0_NS = 1_700_000_000_000_000_000
TIMEOUT_S = 15.0
runner = CliRunner()


def finished_spans(names: list[str]) -> list:
    collect = Collect()
    provider = TracerProvider(resource=Resource.create({"service.name": "engine"}))
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tracer = provider.get_tracer("test")
    for index, name in enumerate(names):
        tracer.start_span(name, start_time=T0_NS + index).end(end_time=T0_NS + index + 1)
    provider.shutdown()
    return collect.spans


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_collect_end_to_end_over_http_and_grpc(tmp_path, stop_signal):
    out = tmp_path / "spans"
    collect = CollectProcess(out, "--token", "t0k", "--duration", "60")
    process = collect.process
    try:
        deadline_s = time.monotonic() + TIMEOUT_S
        http_url, grpc_url, trace = collect.http_url, collect.grpc_url, str(collect.trace)
        auth = {"authorization": "Bearer t0k"}
        exporters = [
            HttpSpanExporter(endpoint=http_url, headers=auth, timeout=5),
            GrpcSpanExporter(endpoint=grpc_url, insecure=True, headers=auth, timeout=5),
            GrpcSpanExporter(endpoint=grpc_url, insecure=True, timeout=5),  # no token
        ]
        results = [
            exporters[0].export(finished_spans(["server", "tokenize", "queue"])),
            exporters[1].export(finished_spans(["step", "forward"])),
            exporters[2].export(finished_spans(["lost"])),
        ]
        for exporter in exporters:
            exporter.shutdown()
        process.send_signal(stop_signal)
        assert process.wait(timeout=TIMEOUT_S) == 0
        summary = collect.next_line(r"^collected ", deadline_s).string
    finally:
        collect.kill()
    assert results == [SpanExportResult.SUCCESS, SpanExportResult.SUCCESS,
                       SpanExportResult.FAILURE]
    assert summary == (f"collected 5 spans from 3 requests (1 requests rejected, "
                       f"0 spans rejected) into {trace}")
    assert [path.name for path in out.iterdir()] == [trace.rsplit("/", 1)[1]]
    table = read_spans(out)
    assert sorted(table.column("name").to_pylist()) == [
        "forward", "queue", "server", "step", "tokenize"]
    assert run_metadata(read_spans(out))["workload"] == {
        "command": "ttft collect", "otlp_http": http_url, "otlp_grpc": grpc_url}


def test_collect_stops_after_duration_and_leaves_an_empty_trace(tmp_path):
    out = tmp_path / "new" / "spans"
    result = runner.invoke(app, ["collect", "-o", str(out), "--http-port", "0",
                                 "--grpc-port", "0", "--duration", "0.1"])
    assert result.exit_code == 0, result.output
    (trace,) = out.iterdir()
    assert result.stderr.splitlines()[-1] == (
        f"collected 0 spans from 0 requests (0 requests rejected, 0 spans rejected) "
        f"into {trace}")
    assert read_spans(out).num_rows == 0


@pytest.mark.parametrize("busy", ["http", "grpc"])
def test_collect_names_a_port_in_use(tmp_path, busy):
    out = tmp_path / "spans"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = (["--http-port", str(port), "--grpc-port", "0"] if busy == "http"
                 else ["--grpc-port", str(port), "--no-http"])
        result = runner.invoke(app, ["collect", "-o", str(out), *ports, "--duration", "5"])
    protocol = {"http": "OTLP/HTTP", "grpc": "OTLP/gRPC"}[busy]
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: cannot listen for {protocol} on 127.0.0.1:{port}: Address already in use")
    assert list(out.iterdir()) == []  # no trace from a run that never started


def test_collect_errors_a_user_can_act_on(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = {
        (str(a_file),): f"error: {a_file}: not a directory",
        (str(a_file / "sub"),): f"error: {a_file / 'sub'}: cannot write a trace there "
                                "(Not a directory)",
        (str(tmp_path / "d"), "--no-http", "--no-grpc"):
            "error: --no-http and --no-grpc together leave nothing to listen on",
    }
    for (out, *flags), message in cases.items():
        result = runner.invoke(app, ["collect", "-o", out, *flags, "--duration", "0"])
        assert (result.exit_code, result.stderr.strip()) == (2, message)


def test_spans_collect_rejected_are_counted_by_analyze(tmp_path):
    """A span ``ttft collect`` dropped (no trace id) is a ``rejected_span`` of the trace it
    wrote, with its message, over HTTP and gRPC alike (before: only the stop line said
    so, and analyze found no defect in a trace missing spans)."""
    out = tmp_path / "spans"
    collect = CollectProcess(out, "--duration", "60")
    try:
        sent = []
        for n_bad in (1, 2):  # one export over each protocol
            request = one_scope_export(5)
            for span in request.resource_spans[0].scope_spans[0].spans[:n_bad]:
                span.trace_id = b""
            sent.append(request)
        connection = http.client.HTTPConnection("127.0.0.1", collect.http_port, timeout=10)
        connection.request("POST", "/v1/traces", sent[0].SerializeToString(),
                           {"Content-Type": "application/x-protobuf"})
        answers = [ExportTraceServiceResponse.FromString(connection.getresponse().read())]
        connection.close()
        with grpc.insecure_channel(collect.grpc_url.removeprefix("http://")) as channel:
            export = channel.unary_unary(
                EXPORT_METHOD, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=ExportTraceServiceResponse.FromString)
            answers.append(export(sent[1], timeout=10))
        collect.process.send_signal(signal.SIGINT)
        assert collect.process.wait(timeout=TIMEOUT_S) == 0
        line = collect.next_line(r"^collected ", time.monotonic() + TIMEOUT_S).string
    finally:
        collect.kill()
    assert [a.partial_success.rejected_spans for a in answers] == [1, 2]
    assert "7 spans from 2 requests (0 requests rejected, 3 spans rejected)" in line
    rejected = run_metadata(read_spans(out))["rejected"]
    assert rejected["count"] == 3 and rejected["examples"]
    assert all("trace" in message for message in rejected["examples"])
    result = runner.invoke(app, ["analyze", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["quality"]["rejected_span"] == 3


def test_a_killed_collect_still_counts_what_it_rejected(tmp_path):
    """The rejected count reaches the span log while collect runs, not only at its stop:
    after SIGKILL, the unfinished run it leaves still says what it dropped."""
    out = tmp_path / "spans"
    collect = CollectProcess(out, "--duration", "60", "--no-grpc")
    try:
        request = one_scope_export(4)
        for span in request.resource_spans[0].scope_spans[0].spans[:2]:
            span.trace_id = b""
        connection = http.client.HTTPConnection("127.0.0.1", collect.http_port, timeout=10)
        connection.request("POST", "/v1/traces", request.SerializeToString(),
                           {"Content-Type": "application/x-protobuf"})
        answer = ExportTraceServiceResponse.FromString(connection.getresponse().read())
        connection.close()
        assert answer.partial_success.rejected_spans == 2
        deadline_s = time.monotonic() + TIMEOUT_S
        while run_metadata(read_spans(out)).get("rejected", {}).get("count") != 2:
            assert time.monotonic() < deadline_s, "the live run never recorded its rejects"
            time.sleep(0.1)
        collect.process.kill()
        assert collect.process.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
    finally:
        collect.kill()
    table = read_spans(out)
    assert table.num_rows == 2
    assert run_metadata(table)["rejected"]["count"] == 2
    result = runner.invoke(app, ["analyze", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["quality"]["rejected_span"] == 2

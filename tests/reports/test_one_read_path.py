"""One read path: what `ttft trace` prints of the run it just traced is what `ttft analyze`
prints of the file it wrote, for a server whose spans need the stage mapping (vLLM's one
`llm_request` span per request with `gen_ai.latency.*` durations, exported over real
OTLP/HTTP by the OpenTelemetry SDK to the command's receiver)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from _live import running
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from ttft.collectors import read_spans
from ttft.reports.cli import app

runner = CliRunner()
QUEUE_S, PREFILL_S, TTFT_S = 0.004, 0.006, 0.012


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_like(receiver_port: int) -> tuple[Starlette, TracerProvider]:
    """A streaming completions server that traces as vLLM does: one `llm_request` span per
    request, child of the incoming traceparent, latencies as seconds in attributes."""
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver_port}/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.fake")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        arrival_ns = time.time_ns()
        parent = propagate.extract(dict(request.headers))
        request_id = f"cmpl-{arrival_ns}"

        async def stream():
            await asyncio.sleep(TTFT_S)
            n = int(body.get("max_tokens", 2))
            for i in range(n):
                finish = "length" if i == n - 1 else None
                chunk = {"id": request_id, "object": "text_completion",
                         "choices": [{"index": 0, "text": f" t{i}", "finish_reason": finish}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            span = tracer.start_span("llm_request", context=parent, start_time=arrival_ns,
                                     kind=trace.SpanKind.SERVER)
            span.set_attributes({
                "gen_ai.request.id": request_id,
                "gen_ai.latency.time_in_queue": QUEUE_S,
                "gen_ai.latency.time_in_model_prefill": PREFILL_S,
                "gen_ai.latency.time_to_first_token": TTFT_S,
            })
            span.end()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"x-request-id": request_id})

    routes = [Route("/v1/models", models), Route("/v1/completions", completions,
                                                  methods=["POST"])]
    return Starlette(routes=routes), provider


def test_trace_summary_is_analyze_of_the_written_file_for_vllm_spans(tmp_path):
    out = tmp_path / "run.parquet"
    port = _free_port()
    server, provider = vllm_like(port)
    try:
        with running(server) as url:
            traced = runner.invoke(app, [
                "trace", url, "--rate", "50", "--requests", "6", "--prompt-tokens", "8",
                "--output-tokens", "2", "--warmup", "0", "--receiver-port", str(port),
                "--span-wait", "10", "--json", "-o", str(out),
            ])
    finally:
        provider.shutdown()
    assert traced.exit_code == 0, traced.output
    analyzed = runner.invoke(app, ["analyze", str(out), "--json"])
    assert analyzed.exit_code == 0, analyzed.output
    assert traced.stdout == analyzed.stdout
    summary = json.loads(analyzed.stdout)
    assert summary["requests"] == 6 and summary["boundary"] == "client"
    # the vLLM span's durations became stages: mapped once, at read, for both commands
    assert {"server", "queue", "prefill"} <= set(summary["stages"])
    assert abs(summary["stages"]["queue"]["mean"] - QUEUE_S * 1e3) < 0.01
    stages = set(read_spans(out).column("stage").to_pylist())
    assert {"server", "queue", "prefill"} <= stages

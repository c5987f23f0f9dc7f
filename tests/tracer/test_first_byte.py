"""``first_byte`` is stamped before the token's bytes go out, so the boundaries nest: over a
real uvicorn on loopback (the reference server, traced by ``ttft trace``'s own run), every
request's client TTFT >= its server TTFT >= its engine TTFT."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pyarrow.compute as pc
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

import ttft.tracer as tt
from ttft.analysis import analyze
from ttft.collectors import read_spans
from ttft.collectors.trace_run import TraceSpec, trace_server
from ttft.engine.server import build_engine, free_port, serving

MODEL = "tiny"
REQUESTS = 30


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tokenizer"))


def traced_run(out, endpoint: str, tokenizer_dir: str):
    """30 requests at concurrency 4 (after one warm-up, sent not sampled) against the
    reference server, which exports its spans to the run's OTLP receiver."""
    port = free_port()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    tracing = tt.configure("ttft-server", [exporter], flush_interval_s=0.05)
    engine = build_engine(MODEL, device="cpu", tokenizer_cache_dir=tokenizer_dir)
    with ExitStack() as server:
        server.callback(tracing.shutdown)  # last: flushes what the stopped server recorded
        url = server.enter_context(serving(engine, model_name=MODEL))
        spec = TraceSpec(
            url=url, model=MODEL, endpoint=endpoint, concurrency=4, requests=REQUESTS,
            warmup=1, prompt_tokens=(20, 80), output_tokens=6, seed=5,
            receiver_port=port, span_wait_s=15.0,
        )
        run = trace_server(spec, out, after_load=server.close)
    assert (len(run.results), run.errors, run.joined) == (REQUESTS, 0, REQUESTS)
    return read_spans(out)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_client_ttft_covers_server_ttft_covers_engine_ttft(tmp_path, tokenizer_dir, endpoint):
    table = traced_run(tmp_path / "run.parquet", endpoint, tokenizer_dir)
    analysis = analyze(table)
    assert analysis.summary.to_dict()["quality"]["no_window"] == 0  # the warm-up left nothing
    requests = analysis.assembly.requests
    assert len(requests) == REQUESTS
    ttft_ns = {}
    for boundary in ("client", "server", "engine"):
        assert analysis.assembly.has_window(boundary).all(), boundary
        ttft_ns[boundary] = (requests[f"{boundary}_b"] - requests[f"{boundary}_a"]).to_numpy()
    assert (ttft_ns["client"] >= ttft_ns["server"]).all(), ttft_ns["client"] - ttft_ns["server"]
    assert (ttft_ns["server"] >= ttft_ns["engine"]).all(), ttft_ns["server"] - ttft_ns["engine"]
    # one host, one clock: the windows are taken as recorded, no offset applied
    first_byte = table.filter(pc.equal(table.column("name"), "first_byte"))
    by_trace = dict(zip(first_byte.column("trace_id").to_pylist(),
                        first_byte.column("start_ns").to_pylist(), strict=True))
    assert np.array_equal(requests["server_b"].to_numpy(),
                          [by_trace[t] for t in requests["trace_id"]])

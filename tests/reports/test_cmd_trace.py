"""`ttft trace` and `ttft join` as a user types them, against the reference server on
loopback exporting its spans over real OTLP/HTTP to the command's receiver."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _live import running
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from typer.testing import CliRunner

import ttft.tracer as tt
from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors import read_spans, run_metadata, write_trace
from ttft.engine.server import build_engine, create_app, free_port, serving
from ttft.reports.cli import app

runner = CliRunner()
MODEL = "tiny"


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tokenizer"))
    return lambda: build_engine("tiny", device="cpu", tokenizer_cache_dir=cache)


@pytest.fixture(scope="module")
def traced_run(engine_factory, tmp_path_factory):
    """One `ttft trace` run against a server that exports to the command's receiver."""
    out = tmp_path_factory.mktemp("trace") / "run.parquet"
    port = free_port()
    tracing = tt.configure("ttft-server", [OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{port}/v1/traces")], flush_interval_s=0.05)
    try:
        with serving(engine_factory(), model_name=MODEL) as url:
            result = runner.invoke(app, [
                "trace", url, "--rate", "40", "--requests", "12", "--prompt-tokens", "20:60",
                "--output-tokens", "4", "--shared-prefix", "2:3", "--prefix-tokens", "10",
                "--seed", "3", "--receiver-port", str(port), "--api-key", "secret-key",
                "--span-wait", "15", "-o", str(out),
            ])
    finally:
        tracing.shutdown()
    assert result.exit_code == 0, result.output
    return out, result.output


def test_trace_joins_client_and_server_spans_into_one_trace(traced_run):
    out, output = traced_run
    table = read_spans(out)
    services = pc.unique(table.column("service")).to_pylist()
    assert sorted(services) == ["loadgen", "ttft-server"]
    clients = table.filter(pc.equal(table.column("stage"), "client"))
    servers = table.filter(pc.equal(table.column("stage"), "server"))
    assert clients.num_rows == 12
    # every traced request joined; the warm-up (not sampled) left nothing behind
    assert set(servers.column("trace_id").to_pylist()) == set(
        clients.column("trace_id").to_pylist())
    attrs = [json.loads(a) for a in clients.column("attributes").to_pylist()]
    assert all(a["prompt_tokens_exact"] and a["prompt_tokens"] == a["prompt_tokens_target"]
               for a in attrs)
    assert {a["condition"] for a in attrs} == {"cold", "prefix_hit"}
    asm = assemble(table)
    assert asm.default_boundary() == "client" and asm.quality.total == 0
    result = attribute(asm, "client", "exclusive")
    parts = result.per_request()
    assert set(parts.stage) >= {"network", "queue", "tokenize", "prefill.chunk"}
    assert "12 requests (0 failed)" in output and "12/12 requests joined" in output


def test_trace_metadata_holds_arguments_models_and_versions_but_no_secret(traced_run):
    out, _ = traced_run
    meta = run_metadata(read_spans(out))
    assert meta["command"] == "ttft trace"
    assert meta["arguments"]["rate"] == 40 and meta["arguments"]["shared_prefix"] == [2, 3]
    assert meta["server"]["models"]["data"][0]["id"] == MODEL
    assert meta["prompt_lengths"].startswith("exact")
    assert "ttft" in meta["versions"] and "python" in meta["versions"]
    assert "secret-key" not in out.read_bytes().decode("latin-1")


def test_trace_against_a_server_without_spans_gives_the_clients_view(engine_factory, tmp_path):
    out = tmp_path / "plain.parquet"
    with running(create_app(engine_factory(), model_name=MODEL, traced=False)) as url:
        result = runner.invoke(app, [
            "trace", url, "--concurrency", "2", "--requests", "4", "--prompt-tokens", "16",
            "--output-tokens", "2", "--receiver-port", "0", "--span-wait", "0.2",
            "--endpoint", "chat", "-o", str(out),
        ])
    assert result.exit_code == 0, result.output
    assert "sent no spans" in result.output
    asm = assemble(read_spans(out))
    assert asm.requests.shape[0] == 4
    stages = set(attribute(asm, "client", "exclusive").per_request().stage)
    # No server span: the root's time is the server and the network together, unseen.
    assert stages <= {"client", "connect", "untraced"} and "untraced" in stages


@pytest.mark.parametrize(("args", "message"), [
    (["--rate", "5", "--burst", "3"], "exactly one of"),
    (["--rate", "5"], "--requests N or --duration S"),
    (["--burst", "2", "--prompt-tokens", "9:x"], "--prompt-tokens '9:x'"),
    (["--burst", "2", "--shared-prefix", "2:2", "--prompt-tokens", "4",
      "--prefix-tokens", "4"], "prefix tokens"),
])
def test_trace_rejects_bad_options_with_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["trace", "http://127.0.0.1:9", *args, "-o",
                                 str(tmp_path / "x.parquet")])
    assert result.exit_code == 2 and message in result.output


def test_trace_names_an_unreachable_server(tmp_path):
    result = runner.invoke(app, ["trace", "http://127.0.0.1:9", "--burst", "1", "-o",
                                 str(tmp_path / "x.parquet")])
    assert result.exit_code == 2 and "cannot reach the server" in result.output
    assert not (tmp_path / "x.parquet").exists()


def _split(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    is_client = pc.equal(table.column("service"), "loadgen")
    return table.filter(is_client), table.filter(pc.invert(is_client))


def test_join_by_trace_id_and_by_request_id_restores_the_attribution(traced_run, tmp_path):
    out, _ = traced_run
    table = read_spans(out)
    client, server = _split(table)
    # half the server traces lost their context: fresh trace ids, the request id kept
    traces = sorted(set(server.column("trace_id").to_pylist()))
    lost = {t: f"{i:032x}" for i, t in enumerate(traces[::2], start=1)}
    server = server.set_column(server.schema.get_field_index("trace_id"), "trace_id", pa.array(
        [lost.get(t, t) for t in server.column("trace_id").to_pylist()], pa.string()))
    write_trace(tmp_path / "client.parquet", client, run_metadata(read_spans(out)))
    write_trace(tmp_path / "server.parquet", server)
    stray = server.slice(0, 1).set_column(0, "trace_id", pa.array(["f" * 32]))
    stray = stray.set_column(stray.schema.get_field_index("request_id"), "request_id",
                             pa.array([None], pa.string()))
    write_trace(tmp_path / "stray.parquet", stray)
    joined = tmp_path / "joined.parquet"
    result = runner.invoke(app, ["join", str(tmp_path / "client.parquet"),
                                 str(tmp_path / "server.parquet"), str(tmp_path / "stray.parquet"),
                                 "-o", str(joined)])
    assert result.exit_code == 0, result.output
    assert "matched no client request (kept)" in result.output
    # engine-level traces (steps, forwards) belong to no client request: kept, counted
    engine_rows = sum(t not in set(client.column("trace_id").to_pylist())
                      for t in _split(table)[1].column("trace_id").to_pylist())
    counts = run_metadata(read_spans(joined))["joined"]
    assert engine_rows > 0 and counts["unmatched"] == engine_rows + 1
    assert counts["by_request_id"] > 0 and counts["by_trace_id"] > 0
    original = attribute(assemble(table), "client", "exclusive").per_request()
    again = attribute(assemble(read_spans(joined)), "client", "exclusive").per_request()
    key = ["trace_id", "stage"]
    assert original.sort_values(key).attributed_ns.tolist() == \
        again[again.trace_id.isin(original.trace_id)].sort_values(key).attributed_ns.tolist()


def test_join_reads_collector_otlp_json_lines(tmp_path, collect):
    exporter, tracing = collect
    with tt.request_context(None, "req-json-1"), tt.stage("server"):
        with tt.stage("queue"):
            pass
    tracing.flush()
    request = encode_spans(exporter.spans)
    document = json_format.MessageToDict(request)
    for rs in document["resourceSpans"]:  # the Collector writes ids in hex
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    lines = tmp_path / "collector.jsonl"
    lines.write_text(json.dumps(document) + "\n")
    server_trace = next(iter({s.context.trace_id for s in exporter.spans}))
    write_trace(tmp_path / "client.parquet", client_rows(server_trace))
    result = runner.invoke(app, ["join", str(tmp_path / "client.parquet"), str(lines), "-o",
                                 str(tmp_path / "joined.parquet")])
    assert result.exit_code == 0, result.output
    joined = read_spans(tmp_path / "joined.parquet")
    assert sorted(joined.column("name").to_pylist()) == ["client", "queue", "server"]
    assert set(joined.column("trace_id").to_pylist()) == {f"{server_trace:032x}"}


def client_rows(trace_id: int) -> pa.Table:
    from ttft.collectors._spans import to_span_table

    return to_span_table([{
        "trace_id": f"{trace_id:032x}", "span_id": "1" * 16, "parent_id": None,
        "request_id": "req-json-1", "name": "client", "stage": "client", "start_ns": 1,
        "end_ns": 2, "clock": "client", "service": "loadgen", "attributes": "{}"}])


def test_join_names_a_file_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\n")
    write_trace(tmp_path / "client.parquet", client_rows(5))
    result = runner.invoke(app, ["join", str(tmp_path / "client.parquet"), str(bad), "-o",
                                 str(tmp_path / "j.parquet")])
    assert result.exit_code == 2 and "bad.txt" in result.output and "OTLP/JSON" in result.output

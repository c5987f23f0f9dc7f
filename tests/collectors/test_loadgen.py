"""The load generator against the real reference server over loopback (uvicorn in a thread,
the tiny model on CPU): events in order, server ids, trace context honoured, concurrency
waits recorded; arrival patterns and replay parsing without a server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from _live import Collect, running

import ttft.tracer as tt
from ttft.collectors import TraceWriter, read_spans
from ttft.collectors.loadgen import results_table, run
from ttft.collectors.workloads import WorkItem, burst, poisson, workload
from ttft.engine.server import build_engine, create_app
from ttft.tracer.schema import CLIENT_CLOCK

MODEL = "tiny"
TIMEOUT_S = 20.0
PROMPTS = ["Once upon a time", "The little dog ran across the field", "Hello there"]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    engine = build_engine(
        "tiny", device="cpu", tokenizer_cache_dir=str(tmp_path_factory.mktemp("tokenizer"))
    )
    with running(create_app(engine, model_name=MODEL)) as base_url:
        yield base_url


def events_of(result) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in result.rows:
        if row["stage"] == "event":
            out.setdefault(row["name"], []).append(row["start_ns"])
    return out


def client_span(result) -> dict:
    (span,) = [row for row in result.rows if row["stage"] == "client"]
    return span


def check_request(result) -> None:
    assert result.error is None, result.error
    assert result.status_code == 200 and result.tokens >= 1
    assert result.request_id and result.request_id.startswith("req-")
    assert 0 < result.ttft_s <= result.e2e_s
    span = client_span(result)
    ev = events_of(result)
    first_token = ev["first_token"][0]
    assert span["start_ns"] <= ev["sent"][0] <= ev["headers"][0] <= ev["first_chunk"][0]
    assert ev["first_chunk"][0] <= ev["first_event"][0] <= first_token <= span["end_ns"]
    assert ev["scheduled"][0] <= span["start_ns"]
    assert all(first_token <= ns <= span["end_ns"] for ns in ev.get("token", []))
    assert len(ev["first_token"]) == 1
    assert all(row["request_id"] == result.request_id for row in result.rows)
    assert all(
        row["trace_id"] == result.trace_id
        and row["clock"] == CLIENT_CLOCK
        and row["service"] == "loadgen"
        for row in result.rows
    )
    attrs = json.loads(span["attributes"])
    assert attrs["status_code"] == 200 and attrs["condition"] in ("cold", "prefix_hit")
    assert attrs["prompt_tokens"] >= 1 and attrs["completion_tokens"] == result.tokens


def test_poisson_workload_is_traced_and_joins_the_servers_trace(url, tmp_path):
    exporter = Collect()
    tracing = tt.configure("loadgen-test", [exporter], flush_interval_s=0.02)
    writer = TraceWriter(tmp_path / "trace.parquet", flush_interval_s=None)
    try:
        work = workload(poisson(20.0, 6, seed=1), PROMPTS, max_tokens=4)
        results = asyncio.run(run(url, work, model=MODEL, warmup=1, writer=writer))
        deadline = time.monotonic() + TIMEOUT_S
        # the warm-up went out "not sampled": the server traced only the six
        while sum(s.name == "server" for s in exporter.spans) < 6:
            assert time.monotonic() < deadline, "server spans did not arrive"
            tracing.flush(5.0)
            time.sleep(0.02)
    finally:
        tracing.shutdown()
        writer.close()
    assert [r.index for r in results] == list(range(6))
    for r in results:
        check_request(r)
    # a connection was opened for the warm-up, so the first traced request may reuse it;
    # any connect span sits inside its client span
    for r in results:
        span = client_span(r)
        for row in r.rows:
            if row["stage"] == "connect":
                assert span["start_ns"] <= row["start_ns"] <= row["end_ns"] <= span["end_ns"]
    servers = {s.attributes.get("ttft.request_id"): s for s in exporter.spans if s.name == "server"}
    for r in results:
        server = servers[r.request_id]
        assert f"{server.context.trace_id:032x}" == r.trace_id
        assert f"{server.parent.span_id:016x}" == client_span(r)["span_id"]
    table = read_spans(tmp_path / "trace.parquet")
    assert table.num_rows == results_table(results).num_rows == sum(len(r.rows) for r in results)
    assert set(table.column("trace_id").to_pylist()) == {r.trace_id for r in results}


def test_a_sampling_share_marks_that_share_sampled_and_the_server_traces_only_those(url):
    """``run(sample=f)``: a request's ``traceparent`` says sampled when its trace id's low
    64 bits fall under ``f``·2^64 (a ratio sampler's rule), so the server records exactly
    those requests; a share below 1 with a trace writer is refused (its client spans would
    stand for requests no server recorded)."""
    exporter = Collect()
    tracing = tt.configure("sample-test", [exporter], flush_interval_s=0.02)
    try:
        work = workload([0.0] * 24, PROMPTS, max_tokens=2)
        results = asyncio.run(run(url, work, model=MODEL, concurrency=4, sample=0.5))
        time.sleep(0.5)  # the last server spans end just after the stream
        tracing.flush(5.0)
    finally:
        tracing.shutdown()
    assert all(r.error is None for r in results)
    chosen = {r.request_id for r in results if int(r.trace_id[16:], 16) < 0.5 * 2.0**64}
    traced = {s.attributes.get("ttft.request_id") for s in exporter.spans
              if s.name == "server"}
    assert traced == chosen and 0 < len(chosen) < 24
    with pytest.raises(ValueError, match="sample"):
        asyncio.run(run(url, work, model=MODEL, sample=0.5, writer=object()))


def test_closed_loop_records_the_wait_for_a_slot_before_the_client_span(url):
    work = workload(burst(5), PROMPTS, max_tokens=6)
    results = asyncio.run(run(url, work, model=MODEL, concurrency=2, chat=True))
    for r in results:
        check_request(r)
        assert "role_chunk" in events_of(r)
    spans = sorted((client_span(r)["start_ns"], client_span(r)["end_ns"]) for r in results)
    # never more than two in flight
    for start, _ in spans:
        assert sum(s <= start < e for s, e in spans) <= 2
    waited = [
        r for r in results if client_span(r)["start_ns"] - events_of(r)["scheduled"][0] > 1_000_000
    ]
    assert len(waited) >= 3  # the three that found both slots taken
    connects = [row for r in results for row in r.rows if row["stage"] == "connect"]
    assert 1 <= len(connects) <= 2  # a pool of two keep-alive connections


def test_failures_are_recorded_not_raised(url):
    work = [WorkItem(0.0, "Hello", 2), WorkItem(0.0, "Hello", 2)]
    bad_model = asyncio.run(run(url, work, model="no-such-model"))
    assert [r.status_code for r in bad_model] == [404, 404]
    assert all("HTTP 404" in r.error and r.ttft_s is None for r in bad_model)
    assert [r.outcome for r in bad_model] == ["http_error", "http_error"]
    assert json.loads(client_span(bad_model[0])["attributes"])["error"].startswith("HTTP 404")
    refused = asyncio.run(run("http://127.0.0.1:9", work[:1], timeout_s=5.0))
    assert refused[0].status_code is None and refused[0].error
    assert refused[0].outcome == "client_error"
    assert len(results_table(refused)) >= 2  # the client span and its scheduled event

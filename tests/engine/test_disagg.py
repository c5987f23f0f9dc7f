"""Disaggregated prefill and decode (``ttft.engine.disagg``): a real prefill worker process,
K/V blocks over a loopback socket. Outputs equal the co-located engine's, the worker's
spans join the request's trace in their own clock domain, the first-token mode places the
transfer before or after the first token, and a dying worker fails its requests cleanly
and leaves no process behind."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
from _live import Collect, running, wait_until

import ttft.tracer as tt
from ttft.engine import Engine, EngineConfig, EngineStopped, ModelConfig, Tokenizer, Transformer
from ttft.engine.disagg import DisaggEngine
from ttft.engine.disagg.channel import block_bytes, install_blocks, pack_blocks
from ttft.engine.disagg.span_wire import flatten, rebuild
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.sampler import SamplingParams
from ttft.engine.server import create_app, forward_worker_spans

CONFIG = EngineConfig(num_blocks=128, block_size=16, chunk_size=32, max_batch_tokens=64)
PROMPTS = [
    "Once upon a time there was a little cat who liked the sun. " * 3,  # 2 chunks
    "The dog ran.",  # one block, one chunk
    "Once upon a time there was a little cat who liked the sun. " * 3,  # prefix hit
]
FRESH = "A new story of a dog who walked by the river bank every day, " * 2  # no hit
SAMPLING = [SamplingParams(), SamplingParams(), SamplingParams(temperature=0.8, seed=7)]


@pytest.fixture(scope="module", autouse=True)
def tokenizer_cache(tmp_path_factory):
    """One tokenizer cache for the module (the worker inherits it), no peak measurement."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TTFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        mp.setenv("TTFT_SKIP_PEAKS", "1")
        yield


def _parts() -> tuple[Transformer, Tokenizer]:
    config = ModelConfig.preset("tiny")
    return Transformer.from_config(config, seed=0), Tokenizer.load(vocab_size=config.vocab_size)


def _disagg(first_token: str = "decode") -> DisaggEngine:
    return DisaggEngine(*_parts(), CONFIG, first_token=first_token, measure_peaks=False)


async def _generate(engine: Engine, max_tokens: int = 10, **kw) -> list[tuple[list[int], int]]:
    """Each prompt's token ids and cached tokens, one request after the other."""
    out = []
    for prompt, sampling in zip(PROMPTS, SAMPLING, strict=True):
        events = [e async for e in await engine.submit(prompt, max_tokens, sampling, **kw)]
        out.append(([e.token_id for e in events], events[-1].usage.cached_tokens))
    return out


@pytest.fixture(scope="module")
def colocated():
    engine = Engine(*_parts(), CONFIG, measure_peaks=False).start()
    try:
        yield asyncio.run(_generate(engine))
    finally:
        engine.stop()


@pytest.fixture(scope="module", params=["decode", "prefill"])
def disagg(request):
    """A started engine per first-token mode, shared by the module's tests (this one
    first: its prefix cache starts empty); stopped cleanly (the worker exits 0)."""
    engine = _disagg(request.param).start()
    yield engine
    engine.stop()
    assert engine.worker.proc is not None and engine.worker.proc.poll() == 0


def test_outputs_equal_the_colocated_engine(colocated, disagg):
    got = asyncio.run(_generate(disagg))
    assert got == colocated  # greedy and seeded sampling, token for token
    assert got[2][1] > 0  # the repeated prompt hit the prefill worker's prefix cache
    assert disagg.run_metadata()["engine"]["disaggregated"]["first_token"] == disagg.first_token


def test_blocks_pack_and_install_round_trip():
    cache = PagedKVCache(2, 2, 4, num_blocks=6, block_size=3)
    for layer in range(2):
        cache.k[layer].normal_()
        cache.v[layer].normal_()
    payload = memoryview(bytearray(pack_blocks(cache, [4, 1, 2]).numpy().tobytes()))
    assert payload.nbytes == 3 * block_bytes(cache) == 3 * 2 * 2 * 3 * 2 * 4 * 4
    other = PagedKVCache(2, 2, 4, num_blocks=6, block_size=3)
    install_blocks(other, [0, 3, 5], payload, keep_from=1)
    for layer in range(2):
        assert torch.equal(other.k[layer][0], torch.zeros(3, 2, 4))  # kept as it was
        assert torch.equal(other.k[layer][3], cache.k[layer][1])
        assert torch.equal(other.v[layer][5], cache.v[layer][2])
    with pytest.raises(ValueError, match="payload"):
        install_blocks(other, [0, 1], payload)


def test_a_worker_span_is_rebuilt_as_it_was(collect):
    exporter, tracing = collect
    parent = tt.new_request_root("r1")
    tt.record("queue", 10, 20, request_id="r1", parent=parent, **{"ttft.kv.blocks": 3})
    tracing.flush()
    span = exporter.spans[0]
    again = rebuild(json.loads(json.dumps(flatten(span))))
    assert (again.name, again.start_time, again.end_time) == ("queue", 10, 20)
    assert again.context.trace_id == span.context.trace_id == parent.trace_id
    assert dict(again.attributes) == dict(span.attributes)
    assert again.resource.attributes["service.name"] == "engine"


def _server_trace(rows: list, trace_id: int) -> dict[str, list]:
    by_name: dict[str, list] = {}
    for span in rows:
        if span.context.trace_id == trace_id:
            by_name.setdefault(span.name, []).append(span)
    return by_name


def test_spans_cross_processes_in_the_request_trace(disagg):
    engine, exporter = disagg, Collect()
    tracing = tt.configure("ttft-server", [exporter], flush_interval_s=0.02)
    forward_worker_spans(engine, tracing)
    try:
        async def one() -> int:
            with tt.request_context(None, "req-1") as root:
                stream = await engine.submit(FRESH, 3, request_id="req-1")
                assert len([e async for e in stream]) == 3
            return root.trace_id

        trace_id = asyncio.run(one())
        # the worker's spans come over the channel in its own time: wait for its last
        assert wait_until(lambda: any(s.name == "first_sampled" and s.context.trace_id
                                      == trace_id for s in exporter.spans), 10)
    finally:
        tracing.shutdown()
        engine.span_sink = None
    spans = _server_trace(exporter.spans, trace_id)
    service = {n: {s.resource.attributes["service.name"] for s in v} for n, v in spans.items()}
    clock = {n: {s.attributes["ttft.clock"] for s in v} for n, v in spans.items()}
    assert service["queue"] == {"ttft-server", "ttft-prefill"}
    for name in ("prefill", "prefill.chunk", "sample", "first_sampled"):
        assert service[name] == {"ttft-prefill"}
        assert clock[name] == {f"host:{os.uname().nodename}/prefill"}
    n_prompt = len(engine.tokenizer.encode(FRESH))
    assert len(spans["prefill.chunk"]) == -(-n_prompt // CONFIG.chunk_size) >= 2
    (transfer,) = spans["kv_transfer"]
    blocks = -(-n_prompt // CONFIG.block_size)
    assert transfer.attributes["ttft.kv.blocks"] == blocks
    assert transfer.attributes["ttft.kv.bytes"] == blocks * block_bytes(engine.cache)
    assert transfer.attributes["ttft.kv.first_token"] == engine.first_token
    chunks = sorted(spans["prefill.chunk"], key=lambda s: s.start_time)
    # the first chunk's blocks leave as it ends: the transfer overlaps the later chunks
    assert chunks[0].end_time <= transfer.start_time < chunks[1].end_time
    assert transfer.end_time >= chunks[-1].end_time
    (sample,) = spans["sample"]
    if engine.first_token == "decode":  # every block went before the first token
        assert sample.start_time >= transfer.start_time
    steps = [s for s in exporter.spans if s.name == "step"
             and s.resource.attributes["service.name"] == "ttft-server"]
    assert any(link.context.trace_id == trace_id for s in steps for link in s.links)


def test_the_first_token_mode_places_the_transfer(disagg):
    delay_ms = 400.0

    async def times() -> list[float]:
        t0 = time.perf_counter()
        stream = await disagg.submit(PROMPTS[1], 2, inject_delay_ms={"kv_transfer": delay_ms})
        return [(time.perf_counter() - t0) * 1e3 async for _ in stream]

    first_ms, second_ms = asyncio.run(times())
    if disagg.first_token == "decode":
        assert first_ms >= delay_ms  # TTFT includes the transfer
    else:
        # The first token comes before the transfer ends; the second waits for it. (The
        # transfer starts before the first token is sent, so the gap between the two
        # tokens can be a little under the delay: a run measured 398 ms for 400.)
        assert first_ms < delay_ms <= second_ms


def test_a_dying_worker_fails_its_requests_and_the_server_stops():
    stuck = dataclasses.replace(CONFIG, inject_delay_ms={"kv_transfer": 60_000.0})
    engine = DisaggEngine(*_parts(), stuck, measure_peaks=False).start()
    answers: list[httpx.Response] = []
    with running(create_app(engine, model_name="tiny")) as url:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}

        def send() -> None:
            with httpx.Client(timeout=30) as client:
                answers.append(client.post(f"{url}/v1/completions", json=body))

        sender = threading.Thread(target=send)
        sender.start()
        assert wait_until(lambda: engine.num_running == 1, 20)
        engine.worker.proc.kill()
        sender.join(20)
        assert not sender.is_alive()
        later = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
    assert answers[0].status_code == 503
    assert "prefill worker is gone" in answers[0].json()["error"]["message"]
    assert later.status_code == 503
    assert engine.worker.proc.poll() == -signal.SIGKILL


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_ttft_serve_disaggregate_serves_and_stops_without_orphans(tmp_path):
    trace = tmp_path / "serve.parquet"
    cmd = [sys.executable, "-m", "ttft.reports.cli", "serve", "--model", "tiny", "--port",
           "0", "--disaggregate", "--trace-out", str(trace)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while (found := re.search(r"http://\S+/v1", seen)) is None:
            line = proc.stderr.readline()
            assert line, f"ttft serve exited before serving: {seen}"
            seen += line
        url = found.group(0)
        assert wait_until(lambda: _ok(url), 60)
        (worker,) = _children(proc.pid)
        answer = httpx.post(f"{url}/completions", timeout=30,
                            json={"model": "tiny", "prompt": "Once upon", "max_tokens": 3})
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) in (0, 130)  # uvicorn re-raises the SIGINT it handled
        proc.stderr.close()  # the rest of its log is not read
    assert wait_until(lambda: not os.path.exists(f"/proc/{worker}"), 10)  # reaped, not orphaned
    from typer.testing import CliRunner

    from ttft.collectors import read_spans, run_metadata
    from ttft.reports.cli import app

    spans = read_spans(trace)
    assert set(spans.column("service").to_pylist()) >= {"ttft-server", "ttft-prefill"}
    # The server's trace has no run metadata: its report says the deployment from the spans.
    assert "engine" not in run_metadata(spans)
    report = CliRunner().invoke(app, ["report", str(trace)], env={"COLUMNS": "200"})
    assert report.exit_code == 0, report.output
    assert report.stdout.splitlines()[1] == (
        "deployment: disaggregated (first token: decode): TTFT includes the K/V transfer")


def _ok(url: str) -> bool:
    try:
        return httpx.get(url.removesuffix("/v1") + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_submit_after_stop_and_a_bad_mode_are_refused():
    with pytest.raises(ValueError, match="first_token"):
        DisaggEngine(*_parts(), CONFIG, first_token="middle")
    engine = _disagg()
    with pytest.raises(EngineStopped):
        asyncio.run(engine.submit("hi", 2))

"""The reference server's reported timings (``create_app(report_timings=True)``, ``ttft serve
--report-timings``): a llama.cpp-style ``timings`` object in a stream's final chunk and a
whole answer's body, a ``Server-Timing`` header on whole answers; none of it by default.
Over loopback, read back with the client's own parsers."""

from __future__ import annotations

import json

import httpx
import pytest
from _live import running

from ttft.collectors.server_timings import server_timing_metrics
from ttft.engine.server import build_engine, create_app

MODEL = "tiny"
QUEUE_MS = 20
TIMINGS = {"prompt_n", "cache_n", "prompt_ms", "predicted_n", "predicted_ms", "queue_ms"}


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    """A server reporting its timings (each request waits ``QUEUE_MS`` in the queue) and
    one that does not."""
    tok_dir = str(tmp_path_factory.mktemp("tokenizer"))
    engines = [build_engine(MODEL, device="cpu", tokenizer_cache_dir=tok_dir,
                            inject_delay_ms={"queue": QUEUE_MS}) for _ in range(2)]
    with running(create_app(engines[0], model_name=MODEL, report_timings=True,
                            traced=False)) as on, \
            running(create_app(engines[1], model_name=MODEL, traced=False)) as off:
        yield on, off


def streamed(url: str) -> list[dict]:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        assert "server-timing" not in reply.headers  # sent before anything is known
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_stream_ends_with_llama_cpp_timings_in_its_finish_chunk(urls):
    chunks = streamed(urls[0])
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and [c for c in chunks if "timings" in c] == final
    timings = final[0]["timings"]
    usage = chunks[-1]["usage"]
    assert set(timings) == TIMINGS
    assert (timings["prompt_n"], timings["predicted_n"], timings["cache_n"]) == (
        usage["prompt_tokens"], usage["completion_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"])
    assert timings["queue_ms"] >= QUEUE_MS and timings["prompt_ms"] > 0


def test_a_whole_answer_has_timings_and_a_server_timing_header(urls):
    reply = httpx.post(f"{urls[0]}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert reply.status_code == 200
    metrics = server_timing_metrics(reply.headers["server-timing"])
    assert set(metrics) == {"server_queue", "server_ttft", "server_e2e"}
    assert QUEUE_MS <= metrics["server_queue"] <= metrics["server_ttft"] <= metrics["server_e2e"]
    timings = reply.json()["timings"]
    assert set(timings) == TIMINGS and timings["queue_ms"] == metrics["server_queue"]


def test_nothing_is_reported_by_default(urls):
    assert not any("timings" in c for c in streamed(urls[1]))
    reply = httpx.post(f"{urls[1]}/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert "server-timing" not in reply.headers and "timings" not in reply.json()

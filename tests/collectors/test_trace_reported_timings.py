"""`trace_server` against a stand-in llama.cpp server on loopback that exports no spans but
ends each stream with llama.cpp's ``timings`` object: the trace holds a ``prefill`` span per
request placed from ``prompt_ms``, marked estimated and counted so, and the analysis names
``prefill`` beside the ``untraced`` rest instead of one ``untraced`` part."""

from __future__ import annotations

import asyncio
import itertools
import json

from _live import running, sse, stand_in_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ttft.analysis import analyze
from ttft.collectors import TraceSpec, read_spans, run_metadata, trace_server
from ttft.tracer.schema import ATTR_ESTIMATED, REPORTED_SERVICE

REQUESTS = 6
PROMPT_MS = 20.0
WAIT_S = 0.05  # before the first token: more than the reported prompt time


def llama_cpp() -> Starlette:
    """Chat completions as llama.cpp's server streams them: a role chunk, content chunks, a
    final chunk with the finish reason and ``timings``, then [DONE]."""
    served = itertools.count()

    async def chat(request: Request) -> Response:
        body = await request.json()
        rid = f"chatcmpl-{next(served)}"

        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            payload = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
                       "created": 1735689600, "id": rid, "model": "m",
                       "object": "chat.completion.chunk", **extra}
            return sse(payload)

        async def stream():
            yield chunk({"role": "assistant", "content": None})
            await asyncio.sleep(WAIT_S)
            for i in range(body["max_tokens"]):
                yield chunk({"content": f" w{i}"})
            timings = {"prompt_n": 8, "prompt_ms": PROMPT_MS, "prompt_per_token_ms": 2.5,
                       "prompt_per_second": 400.0, "predicted_n": body["max_tokens"],
                       "predicted_ms": 3.0, "predicted_per_token_ms": 1.0,
                       "predicted_per_second": 1000.0, "cache_n": 0}
            yield chunk({}, "length", timings=timings)
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return stand_in_app("chat/completions", chat)


def test_llama_cpp_timings_become_an_estimated_prefill_before_the_first_token(tmp_path):
    out = tmp_path / "run.parquet"
    with running(llama_cpp()) as url:
        spec = TraceSpec(url=url, endpoint="chat", concurrency=2, requests=REQUESTS,
                         prompt_tokens=(4, 8), output_tokens=3, seed=1, receiver_port=0,
                         span_wait_s=0)
        run = trace_server(spec, out)
    assert (run.errors, run.joined) == (0, 0)  # no spans came from the server
    table = read_spans(out)
    rows = table.to_pylist()
    reported = [r for r in rows if r["service"] == REPORTED_SERVICE]
    firsts = {r["trace_id"]: r["start_ns"] for r in rows if r["name"] == "first_token"}
    assert len(reported) == REQUESTS
    assert {(r["name"], r["stage"], r["clock"], r["end_ns"] - r["start_ns"]) for r in reported} \
        == {("prefill", "prefill", "client", round(PROMPT_MS * 1e6))}
    assert all(r["end_ns"] == firsts[r["trace_id"]] for r in reported)
    assert {json.loads(r["attributes"])[ATTR_ESTIMATED] for r in reported} == {
        "llama.cpp timings prompt_ms (20 ms), placed to end at the client's first token"}
    meta = run_metadata(table)
    assert meta["estimated"]["count"] == REQUESTS
    assert sorted(meta["estimated"]["examples"]) == sorted(firsts)[:10]

    summary = analyze(table).summary
    assert summary.quality["estimated_span"] == REQUESTS
    # the client span is the window's root: listed (its raw time), never attributed
    assert {k for k, v in summary.stages.items() if v["mean"] > 0} == {"prefill", "untraced"}
    assert summary.stages["prefill"]["p50"] == summary.stages["prefill"]["p99"] == PROMPT_MS
    assert summary.stages["untraced"]["p50"] > 0

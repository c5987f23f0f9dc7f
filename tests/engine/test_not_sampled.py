"""Not sampled means not recorded: a request whose ``traceparent`` says "not sampled" (flags
``00``) leaves no span at the reference server, neither the middleware's nor the engine's,
and no engine step links to it; the steps themselves are still recorded."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from _live import wait_until

from ttft.engine.server import build_engine, serving
from ttft.tracer.schema import ATTR_REQUEST_ID, ATTR_STAGE, REQUEST_STAGES

MODEL = "ttft-tiny"
SAMPLED_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("tokenizer"))
    engine = build_engine("tiny", device="cpu", tokenizer_cache_dir=cache)
    with serving(engine, model_name=MODEL) as base_url:
        yield base_url


def traceparent(trace_id: str, sampled: bool) -> str:
    return f"00-{trace_id}-00f067aa0ba902b7-{'01' if sampled else '00'}"


async def post(client: httpx.AsyncClient, path: str, body: dict, trace_id: str,
               sampled: bool) -> str:
    """One request; returns its id (the server's request id) once the body is read."""
    headers = {"traceparent": traceparent(trace_id, sampled)}
    response = await client.post(path, json={"model": MODEL, **body}, headers=headers)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()["id"]
    first = response.text.split("\n\n", 1)[0]
    assert first.startswith("data: ")
    return json.loads(first[len("data: "):])["id"]


def send_all(base_url: str, unsampled: dict[str, tuple[str, dict]]) -> tuple[str, list[str]]:
    """The sampled request alongside every not-sampled one, concurrently: the sampled
    request's id and the others' ids."""
    sampled_body = {"prompt": "Once upon a time", "max_tokens": 8, "stream": True}

    async def go() -> list[str]:
        async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S) as client:
            return await asyncio.gather(
                post(client, "/v1/completions", sampled_body, SAMPLED_TRACE, True),
                *(post(client, path, body, trace_id, False)
                  for trace_id, (path, body) in unsampled.items()),
            )

    rid, *others = asyncio.run(go())
    return rid, others


def test_a_request_not_sampled_leaves_no_span_and_no_link(url, collect):
    exporter, tracing = collect
    chat = [{"role": "user", "content": "Hello there"}]
    unsampled = {
        f"{i + 1:032x}": request
        for i, request in enumerate([
            ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "stream": True}),
            ("/v1/completions", {"prompt": "The little fox", "max_tokens": 6}),
            ("/v1/chat/completions", {"messages": chat, "max_tokens": 6, "stream": True}),
            ("/v1/chat/completions", {"messages": chat, "max_tokens": 6}),
        ] * 2)
    }
    rid, others = send_all(url, unsampled)
    assert len(set(others)) == len(unsampled) and rid not in others
    assert wait_until(lambda: tracing.flush(5.0) is not None and any(
        s.name == "server" and s.attributes.get(ATTR_REQUEST_ID) == rid for s in exporter.spans
    ))
    spans = exporter.spans
    trace_of = {s: f"{s.context.trace_id:032x}" for s in spans}

    # nothing in the not-sampled traces, nothing under their request ids, on any trace
    assert not {trace_of[s] for s in spans} & set(unsampled)
    assert not {s.attributes.get(ATTR_REQUEST_ID) for s in spans} & set(others)
    # every request-level span and event of a request is the sampled request's
    requests = [s for s in spans if s.attributes.get(ATTR_REQUEST_ID) is not None
                or s.attributes.get(ATTR_STAGE) in REQUEST_STAGES]
    assert {trace_of[s] for s in requests} == {SAMPLED_TRACE}
    assert {s.attributes.get(ATTR_REQUEST_ID) for s in requests} == {rid}
    names = {s.name for s in requests}
    for name in ("server", "tokenize", "queue", "schedule", "prefill", "prefill.chunk",
                 "sample", "first_sampled", "detokenize", "stream", "first_byte"):
        assert name in names, name

    # the engine's steps are recorded, served the not-sampled requests too, and link
    # to the sampled request only
    steps = [s for s in spans if s.name == "step"]
    served = {r for s in steps for r in s.attributes.get("request_ids", ())}
    assert served >= {rid, *others}
    links = [link for s in steps for link in s.links]
    assert links and {f"{link.context.trace_id:032x}" for link in links} == {SAMPLED_TRACE}
    assert {link.attributes["request_id"] for link in links} == {rid}

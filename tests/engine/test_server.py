"""The OpenAI-compatible server over a real loopback socket (uvicorn in a thread, the tiny
model on CPU), driven by the official ``openai`` client and httpx: response shapes,
streaming, usage, errors, cancellation on disconnect, metrics and tracing."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from _live import Collect, running, wait_until
from prometheus_client.parser import text_string_to_metric_families

import ttft.tracer as tt
from ttft.engine.server import build_engine, create_app

MODEL = "ttft-tiny"
KEY = "sekret"
TIMEOUT_S = 20.0
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def live(tok_dir):
    engine = build_engine("tiny", device="cpu", tokenizer_cache_dir=tok_dir)
    with running(create_app(engine, model_name=MODEL)) as url:
        yield engine, url


@pytest.fixture(scope="module")
def guarded(tok_dir):
    """An app with an API key and a one-request queue whose requests wait 1.5 s."""
    engine = build_engine(
        "tiny",
        device="cpu",
        max_queue=1,
        inject_delay_ms={"queue": 1500},
        tokenizer_cache_dir=tok_dir,
    )
    with running(create_app(engine, model_name=MODEL, api_key=KEY)) as url:
        yield engine, url


_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def close_clients():
    yield
    while _clients:
        _clients.pop().close()


def client(url: str, key: str = "none") -> openai.OpenAI:
    c = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=TIMEOUT_S)
    _clients.append(c)
    return c


def metrics(url: str) -> dict[str, dict]:
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("model_name", None) == MODEL, s  # every metric names the model
            out.setdefault(s.name, {})[tuple(sorted(labels.items()))] = s.value
    return out


def test_completion_not_streamed(live):
    engine, url = live
    r = client(url).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("req-")
    assert r.choices[0].finish_reason in ("length", "stop")
    assert isinstance(r.choices[0].text, str)
    u = r.usage
    assert u.prompt_tokens == engine.tokenizer.count_tokens("Once upon a time")
    assert 1 <= u.completion_tokens <= 8 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_completion_streamed_matches_non_streamed_and_reports_cached_tokens(live):
    _, url = live
    prompt = "The little dog ran across the green field and then it stopped to look " * 3
    c = client(url)
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(ch.object == "text_completion" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and not any(reasons[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    # the second run of the same prompt reuses the first one's full K/V blocks
    assert last.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_not_streamed_and_streamed(live):
    _, url = live
    c = client(url)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens <= 6
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True
        )
    )
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert not chunks[0].choices[0].delta.content
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_string_cuts_the_text(live):
    _, url = live
    c = client(url)
    full = c.completions.create(model=MODEL, prompt="Once upon", max_tokens=24, temperature=0)
    text = full.choices[0].text
    # greedy decoding with a seeded model: always the same text, long enough to cut
    assert len(text.strip()) >= 2, text
    stop = text.strip()[1:3]
    cut = text[: text.index(stop)]
    for stream in (False, True):
        r = c.completions.create(
            model=MODEL,
            prompt="Once upon",
            max_tokens=24,
            temperature=0,
            stop=[stop],
            stream=stream,
        )
        got = "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text
        assert got == cut


def test_tokenize_detokenize_models_health(live):
    engine, url = live
    r = httpx.post(f"{url}/tokenize", json={"prompt": "Once upon a time"}, timeout=TIMEOUT_S)
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == engine.tokenizer.encode("Once upon a time")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    r = httpx.post(f"{url}/detokenize", json={"tokens": body["tokens"]}, timeout=TIMEOUT_S)
    assert r.json() == {"prompt": "Once upon a time"}
    models = client(url).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_bad_requests_get_openai_errors(live):
    _, url = live
    c = client(url)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    assert e.value.status_code == 404 and "gpt-9" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="word " * 600, max_tokens=2)
    assert "max_seq_len" in e.value.body["message"] and e.value.body["param"] == "prompt"

    post = f"{url}/v1/completions"
    for headers in ({"content-type": "application/json"}, {}):
        r = httpx.post(post, content=b"{not json", headers=headers, timeout=TIMEOUT_S)
        assert r.status_code == 400 and "JSON" in error_of(r)["message"]
    r = httpx.post(post, json={"model": MODEL, "prompt": "hi", "max_tokens": "3"}, timeout=5)
    assert r.status_code == 400 and error_of(r)["param"] == "max_tokens"
    r = httpx.post(post, json={"model": MODEL, "prompt": 7}, timeout=TIMEOUT_S)
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL}, timeout=TIMEOUT_S)
    assert r.status_code == 400 and error_of(r)["param"] == "messages"


def test_api_key_and_full_queue(guarded):
    engine, url = guarded
    with pytest.raises(openai.AuthenticationError) as e:
        client(url, "wrong").models.list()
    assert e.value.status_code == 401
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}, timeout=5).status_code == 401
    assert httpx.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200

    c = client(url, KEY)
    results: list = []
    first = threading.Thread(
        target=lambda: results.append(
            c.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=0)
        )
    )
    first.start()
    try:
        assert wait_until(lambda: engine.num_waiting == 1)
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=TIMEOUT_S,
        )
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert error_of(r)["type"] == "rate_limit_error"
    finally:
        first.join(TIMEOUT_S)
    assert len(results) == 1 and results[0].usage.completion_tokens >= 1
    counts = metrics(url)["ttft:requests_total"]
    assert counts[(("status", "queue_full"),)] == 1 and counts[(("status", "unauthorized"),)] >= 1


def test_disconnect_mid_stream_frees_the_kv_cache(live):
    engine, url = live
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "max_tokens": 450,
        "temperature": 1.0,
        "seed": 3,
        "stream": True,
    }
    before = metrics(url)["ttft:requests_total"].get((("status", "cancelled"),), 0)
    with httpx.Client(timeout=TIMEOUT_S) as http:
        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            was_running = engine.num_running > 0
    assert wait_until(lambda: engine.cache.blocks_in_use() == 0 and engine.num_running == 0)
    if was_running:
        assert wait_until(
            lambda: (
                metrics(url)["ttft:requests_total"].get((("status", "cancelled"),), 0) == before + 1
            )
        )


def test_metrics_after_requests(live):
    _, url = live
    client(url).completions.create(model=MODEL, prompt="Hello there", max_tokens=3)
    m = metrics(url)
    assert m["ttft:time_to_first_token_seconds_count"][()] > 0
    assert m["ttft:request_queue_time_seconds_count"][()] > 0
    assert m["ttft:request_prefill_time_seconds_count"][()] > 0
    assert m["ttft:e2e_request_latency_seconds_count"][()] > 0
    assert m["ttft:requests_total"][(("status", "ok"),)] > 0
    assert m["ttft:generation_tokens_total"][()] > 0 and m["ttft:prompt_tokens_total"][()] > 0
    assert "ttft:prefix_cache_hits_total" in m
    assert m["ttft:tracer_dropped_spans"][()] == 0


def test_spans_join_the_clients_trace_and_first_byte_is_the_first_content(live):
    _, url = live
    exporter = Collect()
    tracing = tt.configure("server-test", [exporter], flush_interval_s=0.02)
    try:
        chunks = list(
            client(url).chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4,
                temperature=0,
                stream=True,
                extra_headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            )
        )
        rid = chunks[0].id
        assert wait_until(
            lambda: (
                tracing.flush(5.0) is not None and any(s.name == "server" for s in exporter.spans)
            )
        )
    finally:
        tracing.shutdown()
    mine = [s for s in exporter.spans if s.attributes.get("ttft.request_id") == rid]
    by_name: dict[str, list] = {}
    for s in mine:
        by_name.setdefault(s.name, []).append(s)
    for name in ("server", "tokenize", "queue", "prefill.chunk", "stream", "first_byte"):
        assert name in by_name, name
        assert all(f"{s.context.trace_id:032x}" == TRACE_ID for s in by_name[name]), name
    assert len(by_name["stream"]) == 1 and len(by_name["first_byte"]) == 1
    stream, first_byte = by_name["stream"][0], by_name["first_byte"][0]
    first_sampled = by_name["first_sampled"][0]
    # stamped before the token's send: the stream span (the send) starts there
    assert first_byte.start_time == stream.start_time >= first_sampled.start_time
    # the role-only chunk went out before any token existed: first_byte is a content chunk
    assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)

"""The server under hostile requests: sampling that gives no distribution, text that is
not valid Unicode and too many or too long stop strings are 400s in OpenAI's error shape
(counted in the metrics) while ten valid neighbours stream to ``[DONE]``; and ``/health``,
timed from a concurrent client thread, answers within 50 ms (p99) while each hostile
request runs. The server is a real ``ttft serve`` process on loopback, so the clients'
threads do not share its interpreter. Exposure: with an API key the OpenAPI schema needs
it, the docs are off, and a 401 says ``WWW-Authenticate: Bearer``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from _live import running, wait_healthy
from prometheus_client.parser import text_string_to_metric_families

from ttft.engine.server import build_engine, create_app

MODEL = "tiny"
KEY = "sekret"
TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
HEALTH_P99_S = 0.250
"""The floor of the /health p99 bound: the stalls it guards against were 5-55 s, and a
shared 2-core machine answered a probe in 56 ms while other work ran."""
NEIGHBOURS = 10


@contextlib.contextmanager
def serve_process(tmp: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``ttft serve`` (tiny model, CPU) on a free loopback port; yields its base URL and
    stops it with SIGINT (bounded) afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(sys.executable).parent / "ttft"
    argv = [str(script) if script.exists() else "ttft", "serve", "--device", "cpu"]
    full_env = {**os.environ, "TTFT_CACHE_DIR": str(tmp), "TTFT_SKIP_PEAKS": "1", **(env or {})}
    log_path = tmp / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)], env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, START_TIMEOUT_S)
        yield url
    finally:
        proc.send_signal(2)
        try:
            proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT_S)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with serve_process(tmp_path_factory.mktemp("serve")) as url:
        yield url


def post_raw(url: str, path: str, body: str | bytes) -> httpx.Response:
    """POST ``body`` as it is: JSON's ``\\ud800`` escapes and ``NaN`` reach the server."""
    content = body.encode() if isinstance(body, str) else body
    headers = {"content-type": "application/json"}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=TIMEOUT_S)


def error_of(r: httpx.Response) -> dict:
    assert r.headers["content-type"] == "application/json", r.text[:200]
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def invalid_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ttft:requests_total" and s.labels.get("status") == "invalid":
                return s.value
    raise AssertionError("no ttft:requests_total{status=invalid}")


def stream_text(url: str, prompt: str, **fields) -> list[str]:
    """The SSE data lines of one streamed completion."""
    body = {"model": MODEL, "prompt": prompt, "stream": True, **fields}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT_S) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


POISONED = {
    "temperature 1e-300": ('"temperature": 1e-300', "temperature", "at least 1e-06"),
    "top_p 1e-300": ('"top_p": 1e-300', "top_p", "top_p must be in [1e-06, 1]"),
    "temperature NaN": ('"temperature": NaN', "temperature", "finite number"),
}


@pytest.mark.parametrize("name", POISONED)
def test_poisoned_sampling_is_a_400_and_ten_neighbours_complete(live, name):
    field, param, message = POISONED[name]
    poison = f'{{"model": "{MODEL}", "prompt": "Once", "max_tokens": 8, {field}}}'
    with ThreadPoolExecutor(NEIGHBOURS + 1) as pool:
        good = [
            pool.submit(stream_text, live, f"Tale {i}:", max_tokens=24, temperature=0.8, seed=i)
            for i in range(NEIGHBOURS)
        ]
        bad = pool.submit(post_raw, live, "/v1/completions", poison)
        results = [f.result(timeout=TIMEOUT_S) for f in good]
        refused = bad.result(timeout=TIMEOUT_S)
    assert refused.status_code == 400
    err = error_of(refused)
    assert err["param"] == param and message in err["message"], err
    assert [lines[-1] for lines in results] == ["[DONE]"] * NEIGHBOURS
    for lines in results:
        assert json.loads(lines[-2])["choices"][0]["finish_reason"] in ("length", "stop")


BAD_TEXT = {
    "prompt": ("/v1/completions", f'{{"model": "{MODEL}", "prompt": "ab\\ud800c"}}', "prompt"),
    "chat": (
        "/v1/chat/completions",
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "\\udc00"}}]}}',
        "messages.0.content",
    ),
    "tokenize": ("/tokenize", '{"prompt": "x\\ud83d"}', "prompt"),
    "stop": (
        "/v1/completions",
        f'{{"model": "{MODEL}", "prompt": "a", "stop": "\\ud800"}}',
        "stop",
    ),
}


def test_text_that_is_not_unicode_is_a_counted_400(live):
    before = invalid_count(live)
    for path, body, param in BAD_TEXT.values():
        r = post_raw(live, path, body)
        assert r.status_code == 400, (path, r.text)
        err = error_of(r)
        assert (
            err["param"] == param
            and "not valid Unicode: surrogates not allowed" in (err["message"])
        ), err
    assert invalid_count(live) == before + len(BAD_TEXT)


@pytest.mark.parametrize(
    ("stop", "message"),
    [
        (["a", "b", "c", "d", "e"], "at most 4 stop strings, got 5"),
        ([str(i) for i in range(100_000)], "at most 4 stop strings, got 100000"),
        (["x" * 257], "a stop string is at most 256 characters, got 257"),
        ("y" * 300, "a stop string is at most 256 characters, got 300"),
    ],
)
def test_stop_strings_are_bounded(live, stop, message):
    body = {"model": MODEL, "prompt": "Once", "stop": stop}
    r = httpx.post(f"{live}/v1/completions", json=body, timeout=TIMEOUT_S)
    assert r.status_code == 400
    err = error_of(r)
    assert err["param"] == "stop" and message in err["message"], err


class HealthProbe:
    """``GET /health`` back to back from a thread of its own, each answer timed."""

    def __init__(self, url: str) -> None:
        self.url, self.latencies_s = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=TIMEOUT_S) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                assert c.get(f"{self.url}/health").status_code == 200
                self.latencies_s.append(time.perf_counter() - t0)
                time.sleep(0.001)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        time.sleep(0.1)  # probing before the hostile request starts
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.1)
        self._stop.set()
        self._thread.join(TIMEOUT_S)

    def p99_s(self) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


FOUR_MB = ("the quick brown fox jumps over the lazy dog " * 100_000)[:4_000_000]
# serialized once, before any probing: the client's own JSON encoding is not the server's
HUGE_PROMPT = json.dumps({"model": MODEL, "prompt": FOUR_MB, "max_tokens": 4}).encode()
HUGE_TOKENIZE = json.dumps({"prompt": FOUR_MB}).encode()


def _huge_prompt(url: str) -> httpx.Response:
    return post_raw(url, "/v1/completions", HUGE_PROMPT)


def _huge_tokenize(url: str) -> httpx.Response:
    return post_raw(url, "/tokenize", HUGE_TOKENIZE)


def _long_stops(url: str) -> list[str]:
    stops = [c * 256 for c in "QXZJ"]  # never generated whole: each token checks all four
    return stream_text(url, "Once upon a time", max_tokens=400, temperature=1.0, seed=3, stop=stops)


def _poisoned(url: str) -> httpx.Response:
    return post_raw(
        url, "/v1/completions", f'{{"model": "{MODEL}", "prompt": "a", "top_p": 1e-300}}'
    )


HOSTILE = {
    "4 MB prompt": (_huge_prompt, lambda r: r.status_code == 400),
    "4 MB /tokenize": (_huge_tokenize, lambda r: r.status_code == 200 and r.json()["count"] > 0),
    "4 long stops, long output": (_long_stops, lambda lines: lines[-1] == "[DONE]"),
    "poisoned sampling": (_poisoned, lambda r: r.status_code == 400),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_health_answers_while_a_hostile_request_runs(live, name):
    send, ok = HOSTILE[name]
    with HealthProbe(live) as idle:
        time.sleep(0.5)
    with HealthProbe(live) as probe:
        result = send(live)
    assert ok(result)
    p99_s = probe.p99_s()
    worst_s = max(probe.latencies_s)
    n = len(probe.latencies_s)
    print(
        f"/health during {name}: {n} probes, p99 {p99_s * 1e3:.1f} ms, max {worst_s * 1e3:.1f} ms"
        f" (idle p99 {idle.p99_s() * 1e3:.1f} ms)"
    )
    # 250 ms at least; a busy machine slows every answer, so the bound also scales with
    # the same server's idle p99 measured just before (the stalls this guards were 5-55 s)
    assert n >= 20 and p99_s < max(HEALTH_P99_S, 5 * idle.p99_s())


def test_openapi_needs_the_key_and_the_docs_are_off(tok_dir):
    engine = build_engine("tiny", device="cpu", tokenizer_cache_dir=tok_dir)
    with running(create_app(engine, model_name=MODEL, api_key=KEY)) as url:
        refused = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT_S)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert error_of(refused)["code"] == "invalid_api_key"
        completion = httpx.post(f"{url}/v1/completions", json={}, timeout=TIMEOUT_S)
        assert completion.status_code == 401
        assert completion.headers["www-authenticate"] == "Bearer"
        auth = {"authorization": f"Bearer {KEY}"}
        schema = httpx.get(f"{url}/openapi.json", headers=auth, timeout=TIMEOUT_S)
        assert schema.status_code == 200 and "/v1/completions" in schema.json()["paths"]
        assert "/openapi.json" not in schema.json()["paths"]
        for path in ("/docs", "/redoc"):
            assert httpx.get(f"{url}{path}", headers=auth, timeout=TIMEOUT_S).status_code == 404


def test_openapi_is_served_without_a_key_when_none_is_set(live):
    r = httpx.get(f"{live}/openapi.json", timeout=TIMEOUT_S)
    assert r.status_code == 200 and r.json()["info"]["title"] == "ttft"


def test_ttft_serve_takes_its_key_from_the_environment(tmp_path):
    with serve_process(tmp_path, {"TTFT_API_KEY": KEY}) as url:
        refused = httpx.get(f"{url}/v1/models", timeout=TIMEOUT_S)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{url}/openapi.json", timeout=TIMEOUT_S).status_code == 401
        auth = {"authorization": f"Bearer {KEY}"}
        models = httpx.get(f"{url}/v1/models", headers=auth, timeout=TIMEOUT_S)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
        assert httpx.get(f"{url}/openapi.json", headers=auth, timeout=TIMEOUT_S).status_code == 200

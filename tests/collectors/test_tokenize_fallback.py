"""Prompt lengths through whichever tokenizer dialect a server speaks (vLLM, llama-cpp-python,
TGI), and approximate lengths with the reason for every other answer: small servers of our
own over loopback, one per dialect, and hostile ones (400, 500, HTML, JSON of another shape,
a connection dropped, no answer at all)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from _live import running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ttft.collectors.workloads import constant, fit_prompts, fit_to_server, generated_prompts

MODEL = "m"


def words(text: str) -> int:
    """The test servers' tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def items():
    return generated_prompts(constant(10.0, 8), prompt_tokens=(12, 40), max_tokens=2,
                             shared_prefix=(2, 2), prefix_tokens=6, seed=4)


def fit(url: str, timeout_s: float = 5.0):
    return asyncio.run(fit_prompts(url, items(), model=MODEL, timeout_s=timeout_s))


def app(*routes: tuple[str, object]) -> Starlette:
    return Starlette(routes=[Route(path, handler, methods=["POST"]) for path, handler in routes])


async def vllm(request: Request) -> Response:
    body = await request.json()
    if "prompt" not in body:
        return JSONResponse({"detail": "prompt: field required"}, status_code=422)
    assert body["model"] == MODEL
    return JSONResponse({"count": words(body["prompt"]), "max_model_len": 4096,
                         "tokens": list(range(words(body["prompt"])))})


async def llama_cpp_python(request: Request) -> Response:
    return JSONResponse({"count": words((await request.json())["input"])})


async def tgi(request: Request) -> Response:
    body = await request.json()
    if "inputs" not in body:
        return JSONResponse({"error": "missing field `inputs`", "error_type": "validation"},
                            status_code=422)
    return JSONResponse([{"id": i, "text": w, "start": 0, "stop": 0}
                         for i, w in enumerate(body["inputs"].split())])


@pytest.mark.parametrize(("routes", "tokenizer"), [
    ([("/tokenize", vllm)], "vLLM /tokenize"),
    ([("/extras/tokenize/count", llama_cpp_python)], "llama-cpp-python /extras/tokenize/count"),
    ([("/tokenize", tgi)], "TGI /tokenize"),
])
def test_each_dialect_fits_every_prompt_exactly(routes, tokenizer):
    with running(app(*routes)) as url:
        result = fit(url)
    assert result.exact and result.reason is None and result.tokenizer == tokenizer
    before = items()
    assert [words(it.prompt) for it in result.items] == [it.target_tokens for it in before]
    assert all(it.exact for it in result.items)
    for old, new in zip(before, result.items, strict=True):
        assert new.prompt[:new.shared_chars] == old.prompt[:old.shared_chars]


async def status_400(request: Request) -> Response:
    return JSONResponse({"error": {"message": "text: field required"}}, status_code=400)


async def status_500(request: Request) -> Response:
    return Response("Internal Server Error", status_code=500)


async def html(request: Request) -> Response:
    return HTMLResponse("<html><body><h1>Welcome to nginx!</h1></body></html>")


async def other_shape(request: Request) -> Response:
    return JSONResponse({"tokens": [1, 2, 3], "count": "3"})  # no integer count, no list


async def bare_list(request: Request) -> Response:
    return JSONResponse([1, 2, 3])  # a list, but not of TGI's token objects


@pytest.mark.parametrize(("handler", "answer"), [
    (status_400, "HTTP 400"),
    (status_500, "HTTP 500"),
    (html, "the answer is not JSON"),
    (other_shape, "no token count in the answer"),
    (bare_list, "no token count in the answer"),
])
def test_a_hostile_tokenize_leaves_lengths_approximate_with_the_reason(handler, answer):
    hostile = app(("/tokenize", handler), ("/extras/tokenize/count", handler))
    with running(hostile) as url:
        result = fit(url)
        assert asyncio.run(fit_to_server(url, items(), model=MODEL)) is None
    assert not result.exact and result.tokenizer is None
    assert result.items == items()  # as they were
    assert result.reason == (
        f"no tokenizer endpoint counted tokens (vLLM /tokenize: {answer}; "
        f"llama-cpp-python /extras/tokenize/count: {answer}; TGI /tokenize: {answer})")


def test_no_tokenizer_at_all_names_every_404():
    with running(Starlette()) as url:
        result = fit(url)
    assert result.reason == (
        "no tokenizer endpoint counted tokens (vLLM /tokenize: HTTP 404; llama-cpp-python "
        "/extras/tokenize/count: HTTP 404; TGI /tokenize: HTTP 404)")


def test_a_tokenize_that_hangs_is_given_up_within_its_timeout():
    release = threading.Event()

    async def hang(request: Request) -> Response:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return JSONResponse({"count": 1})

    with running(app(("/tokenize", hang), ("/extras/tokenize/count", hang))) as url:
        try:
            started = time.monotonic()
            result = fit(url, timeout_s=0.3)
            elapsed_s = time.monotonic() - started
        finally:
            release.set()
    # one timeout ends the search: the server is not answering
    assert result.reason == ("no tokenizer endpoint counted tokens (vLLM /tokenize: no answer "
                             "within 0.3 s)")
    assert result.items == items() and elapsed_s < 2.0


def test_a_server_that_drops_the_connection_leaves_lengths_approximate():
    with running(Starlette()) as url:
        port = url.rsplit(":", 1)[1]
    result = fit(f"http://127.0.0.1:{port}")  # nothing listens there any more
    assert result.tokenizer is None and result.items == items()
    assert result.reason == ("no tokenizer endpoint counted tokens (vLLM /tokenize: "
                             "ConnectError)")


def test_a_tokenizer_that_fails_during_the_fit_leaves_every_prompt_approximate():
    calls = []

    async def flaky(request: Request) -> Response:
        calls.append(1)
        if len(calls) > 3:
            return Response("overloaded", status_code=503)
        return JSONResponse({"count": words((await request.json())["prompt"])})

    with running(app(("/tokenize", flaky))) as url:
        result = fit(url)
    assert result.tokenizer is None and result.items == items()
    assert result.reason == "vLLM /tokenize failed during the fit (vLLM /tokenize: HTTP 503)"


def test_a_tokenizer_that_merges_words_gives_mostly_exact_lengths():
    async def pairs(request: Request) -> Response:  # two words a token: odd targets miss
        return JSONResponse({"count": -(-words((await request.json())["prompt"]) // 2) * 2})

    with running(app(("/tokenize", pairs))) as url:
        result = fit(url)
    odd = sum(1 for it in items() if it.target_tokens % 2)
    assert odd and result.tokenizer == "vLLM /tokenize" and not result.exact
    assert result.reason == (f"{odd} of 8 prompts kept the closest length vLLM /tokenize "
                             "allows")
    assert [it.exact for it in result.items] == [it.target_tokens % 2 == 0 for it in items()]

"""`ttft trace` against OpenAI-compatible servers that are not the reference one: a server's
optional endpoints (``/v1/models``, a tokenizer) missing or hostile never end the run,
approximate prompt lengths say why in one yellow line and in the metadata, and a run with no
model to ask for stops with one line. Small Starlette servers over loopback."""

from __future__ import annotations

import json

import pytest
from _live import running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.reports.cli import app

runner = CliRunner()


async def completions(request: Request) -> Response:
    """A streaming completion of ``max_tokens`` one-word chunks, a finish reason, [DONE]."""
    body = await request.json()

    async def chunks():
        for i in range(body["max_tokens"]):
            chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": f" w{i}",
                                                  "finish_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        done = {"id": "cmpl-1", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        yield f"data: {json.dumps(done)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})


async def no_models(request: Request) -> Response:
    return JSONResponse({"detail": "Not Found"}, status_code=404)


async def html_models(request: Request) -> Response:
    return HTMLResponse("<html>\n<body>login [here]</body>\n</html>")


async def unauthorized(request: Request) -> Response:
    return JSONResponse({"errors": ["[bold]bad key[/bold]"]}, status_code=401)


async def tokenize_400(request: Request) -> Response:
    return JSONResponse({"error": {"message": "text: field required"}}, status_code=400)


async def tgi_tokenize(request: Request) -> Response:
    body = await request.json()
    if "inputs" not in body:
        return JSONResponse({"error": "missing field `inputs`"}, status_code=422)
    return JSONResponse([{"id": i, "text": w, "start": 0, "stop": 0}
                         for i, w in enumerate(body["inputs"].split())])


def server(models_handler, tokenize_handler) -> Starlette:
    return Starlette(routes=[
        Route("/v1/models", models_handler),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize_handler, methods=["POST"]),
    ])


def trace(url: str, out, *extra: str):
    return runner.invoke(app, [
        "trace", url, "--concurrency", "2", "--requests", "4", "--prompt-tokens", "12:20",
        "--output-tokens", "3", "--receiver-port", "0", "--span-wait", "0", "-o", str(out),
        *extra,
    ])


def test_a_server_without_models_or_a_tokenizer_is_traced_with_the_model_given(tmp_path):
    out = tmp_path / "run.parquet"
    with running(server(no_models, tokenize_400)) as url:
        result = trace(url, out, "--model", "m")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "4 requests (0 failed)" in result.output
    assert "prompt lengths approximate;" in result.output
    lines = result.output.splitlines()
    reason = ("no tokenizer endpoint counted tokens (vLLM /tokenize: HTTP 400; llama-cpp-python "
              "/extras/tokenize/count: HTTP 404; TGI /tokenize: HTTP 400)")
    assert lines.count(f"prompt lengths approximate (one word per token; {reason})") == 1
    assert (f"model 'm' not checked: {url}/v1/models: HTTP 404 ({{\"detail\":\"Not Found\"}})"
            in lines)
    meta = run_metadata(read_spans(out))
    assert meta["prompt_lengths"] == f"approximate (one word per token; {reason})"
    assert meta["prompt_tokenizer"] is None
    assert meta["server"]["model"] == "m"
    assert meta["server"]["models"] == {"error": f'{url}/v1/models: HTTP 404 '
                                                 '({"detail":"Not Found"})'}


@pytest.mark.parametrize(("handler", "why"), [
    (no_models, 'HTTP 404 ({"detail":"Not Found"})'),
    (html_models, "the answer is not JSON"),
    (unauthorized, 'HTTP 401 ({"errors":["[bold]bad key[/bold]"]})'),  # printed verbatim
])
def test_no_model_to_ask_for_is_one_line(handler, why, tmp_path):
    out = tmp_path / "run.parquet"
    with running(server(handler, tokenize_400)) as url:
        result = trace(url, out)
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.strip()] == [
        f"error: {url}/v1/models: {why}: no model to ask for; pass --model"]
    assert not out.exists()


def test_a_tgi_tokenizer_makes_prompt_lengths_exact(tmp_path):
    out = tmp_path / "run.parquet"
    with running(server(models, tgi_tokenize)) as url:
        result = trace(url, out)
    assert result.exit_code == 0, result.output
    assert "prompt lengths exact;" in result.output and "approximate" not in result.output
    table = read_spans(out)
    meta = run_metadata(table)
    assert meta["prompt_lengths"] == "exact (TGI /tokenize)"
    assert meta["prompt_tokenizer"] == "TGI /tokenize" and meta["server"]["model"] == "m"
    clients = [json.loads(a) for a, stage in zip(table.column("attributes").to_pylist(),
                                                   table.column("stage").to_pylist(), strict=True)
               if stage == "client"]
    assert len(clients) == 4 and all(a["prompt_tokens_exact"] for a in clients)

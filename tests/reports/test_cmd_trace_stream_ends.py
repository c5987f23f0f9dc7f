"""Outcomes from the stream's end (docs/attribution.md): `ttft trace` against small stand-in
servers on loopback that end their streams as other servers do, then `ttft analyze --json`
on the trace. A cut stream (`[DONE]` without a finish reason) is `truncated`, vLLM's
`abort` and SGLang's abort object are `aborted`, both failures outside TTFT; a
`content_filter` finish is ok and counted apart; an unknown finish reason is ok and kept."""

from __future__ import annotations

import itertools
import json

import pytest
from _live import running, sse, stand_in_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from typer.testing import CliRunner

from ttft.collectors import read_spans
from ttft.reports.cli import app

runner = CliRunner()
REQUESTS = 4


def stand_in(finish: object, *, with_finish: bool = True) -> Starlette:
    """A streaming completions server: ``max_tokens`` one-word chunks, then (unless
    ``with_finish`` is false) a chunk whose finish reason is ``finish``, then [DONE]; each
    response has an id of its own (requests sharing one would be joined as one)."""
    served = itertools.count()

    async def completions(request: Request) -> Response:
        body = await request.json()
        rid = f"cmpl-{next(served)}"

        async def chunks():
            for i in range(body["max_tokens"]):
                yield sse({"id": rid, "choices": [{"index": 0, "text": f" w{i}",
                                                   "finish_reason": None}]})
            if with_finish:
                yield sse({"id": rid, "choices": [{"index": 0, "text": "",
                                                   "finish_reason": finish}]})
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return stand_in_app("completions", completions)


def traced(server: Starlette, tmp_path) -> tuple[dict, list[dict]]:
    """`ttft trace` against ``server``, then `ttft analyze --json`: the summary and the
    client spans' attributes."""
    out = tmp_path / "run.parquet"
    with running(server) as url:
        result = runner.invoke(app, [
            "trace", url, "--concurrency", "2", "--requests", str(REQUESTS),
            "--prompt-tokens", "4:8", "--output-tokens", "3", "--receiver-port", "0",
            "--span-wait", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    analysed = runner.invoke(app, ["analyze", str(out), "--json"])
    assert analysed.exit_code == 0, analysed.output
    rows = read_spans(out).to_pylist()
    clients = [json.loads(r["attributes"]) for r in rows if r["stage"] == "client"]
    assert len(clients) == REQUESTS
    return json.loads(analysed.stdout), clients


@pytest.mark.parametrize(("finish", "with_finish", "kind", "error"), [
    (None, False, "truncated", "stream ended with [DONE] but no finish reason"),
    ("abort", True, "aborted", "finish reason 'abort'"),
    ({"type": "abort", "message": "Abort before prefill"}, True, "aborted",
     "finish reason 'abort': Abort before prefill"),
])
def test_a_stream_ended_without_completing_is_a_failure_outside_ttft(
        finish, with_finish, kind, error, tmp_path):
    summary, clients = traced(stand_in(finish, with_finish=with_finish), tmp_path)
    assert [c["outcome"] for c in clients] == [kind] * REQUESTS
    assert {c["error"] for c in clients} == {error}
    assert summary["failures"] == {kind: REQUESTS}
    assert summary["requests"] == REQUESTS and summary["requests_ok"] == 0
    assert summary["ttft_ms"] is None and summary["stages"] == {}
    assert [e["error"] for e in summary["failure_examples"][kind]] == [error] * 3
    assert summary["load"]["requests"] == 0  # none completed: no throughput over them
    # they did see a first token: reported apart, never in TTFT
    assert summary["failed_first_token"]["requests"] == REQUESTS


def test_a_content_filter_finish_is_ok_and_counted_apart(tmp_path):
    summary, clients = traced(stand_in("content_filter"), tmp_path)
    assert {(c["outcome"], c["finish_reason"]) for c in clients} == {("ok", "content_filter")}
    assert summary["failures"] == {} and summary["requests_ok"] == REQUESTS
    assert summary["load"]["content_filter"] == REQUESTS
    assert summary["load"]["requests"] == REQUESTS
    printed = runner.invoke(app, ["analyze", str(tmp_path / "run.parquet")])
    assert f"{REQUESTS} of them ended by the content filter" in printed.stdout
    html = tmp_path / "report.html"
    reported = runner.invoke(app, ["report", str(tmp_path / "run.parquet"), "-o", str(html)])
    assert reported.exit_code == 0, reported.output
    assert f"{REQUESTS} ended by the content filter" in html.read_text()


@pytest.mark.parametrize(("finish", "recorded", "unknown"), [
    ("length", "length", False),
    ({"type": "stop", "matched": 2}, "stop", False),  # SGLang's object for a completed one
    ("eos_token", "eos_token", True),
])
def test_a_completed_or_unknown_finish_is_ok_and_recorded(finish, recorded, unknown, tmp_path):
    summary, clients = traced(stand_in(finish), tmp_path)
    assert {(c["outcome"], c["finish_reason"], c.get("finish_reason_unknown", False))
            for c in clients} == {("ok", recorded, unknown)}
    assert summary["failures"] == {} and summary["load"]["content_filter"] == 0


def whole_answers(kind: str) -> Starlette:
    """A server that ignores ``stream: true`` and answers each request with one JSON body
    (chat's ``message``), pretty-printed with blank lines inside it."""
    served = itertools.count()

    async def chat(request: Request) -> Response:
        await request.json()
        rid = f"chatcmpl-{next(served)}"
        if kind == "not-json":
            return Response("all done\n\n", media_type="application/json")
        body = {"id": rid, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "w0 w1 w2"},
             "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            "timings": {"prompt_ms": 2.0, "prompt_n": 5}}
        return Response(json.dumps(body, indent=2).replace("\n", "\n\n", 1),
                        media_type="application/json")

    return stand_in_app("chat/completions", chat)


def test_a_whole_json_answer_is_ok_with_its_first_token_at_the_body_s_end(tmp_path):
    out = tmp_path / "whole.parquet"
    with running(whole_answers("json")) as url:
        result = runner.invoke(app, [
            "trace", url, "--endpoint", "chat", "--concurrency", "2", "--requests",
            str(REQUESTS), "--prompt-tokens", "4:8", "--output-tokens", "3",
            "--receiver-port", "0", "--span-wait", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = read_spans(out).to_pylist()
    clients = [r for r in rows if r["stage"] == "client"]
    attrs = [json.loads(r["attributes"]) for r in clients]
    assert {(a["outcome"], a["streamed"], a["finish_reason"], a["completion_tokens"])
            for a in attrs} == {("ok", False, "length", 3)}
    # its timings are read too: one reported prefill per request
    assert sum(r["service"] == "server-reported" for r in rows) == REQUESTS


def test_a_200_that_is_neither_a_stream_nor_json_is_an_http_error(tmp_path):
    out = tmp_path / "odd.parquet"
    with running(whole_answers("not-json")) as url:
        result = runner.invoke(app, [
            "trace", url, "--endpoint", "chat", "--concurrency", "1", "--requests", "2",
            "--prompt-tokens", "4:8", "--output-tokens", "3", "--receiver-port", "0",
            "--span-wait", "0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    attrs = [json.loads(r["attributes"]) for r in read_spans(out).to_pylist()
             if r["stage"] == "client"]
    assert [a["outcome"] for a in attrs] == ["http_error"] * 2
    assert all("neither an event stream nor a JSON answer" in a["error"] for a in attrs)

"""TTFTMiddleware: ``server``, ``stream`` and ``first_byte`` over in-process ASGI
(``httpx.ASGITransport``) and a real uvicorn server on loopback, plus the SSE token rules
driven through a bare ASGI application."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time

import httpx
import pandas as pd
import pytest
from _live import running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

import ttft.tracer as tt
from ttft.collectors import read_spans
from ttft.collectors.otel_exporter import ParquetSpanExporter
from ttft.tracer.asgi import TTFTMiddleware

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TIMEOUT_S = 10.0


def traceparent(trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{PARENT_SPAN}-01"


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def delta(**fields: str) -> bytes:
    return sse({"id": "c1", "choices": [{"index": 0, "delta": fields}]})


ROLE = delta(role="assistant")
DONE = b"data: [DONE]\n\n"

_ids = itertools.count()
MARKS: dict[str, dict[str, int]] = {}
"""request id → mark → ``tt.clock_ns()``, written by the app (any thread)."""


# -- the application ----------------------------------------------------------------------
def request_id_of(request: Request) -> str:
    return request.scope["state"]["ttft_request_id"]


def event_stream(request: Request, body) -> StreamingResponse:
    headers = {"x-request-id": request_id_of(request)}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


async def chat_stream(request: Request) -> StreamingResponse:
    marks = MARKS.setdefault(request_id_of(request), {})
    first = delta(content="Hel")

    async def body():
        yield ROLE
        marks["role_written"] = tt.clock_ns()
        yield b": ping\n\n" + delta(content="")
        yield first[:20]  # the first token's event, split across two chunks
        marks["half_written"] = tt.clock_ns()
        await asyncio.sleep(0.01)
        marks["token_sending"] = tt.clock_ns()
        yield first[20:] + delta(content="lo")
        marks["token_written"] = tt.clock_ns()
        await asyncio.sleep(0.01)
        yield delta(content="!")
        await asyncio.sleep(0.01)
        yield DONE

    return event_stream(request, body())


async def no_token_stream(request: Request) -> StreamingResponse:
    async def body():
        for chunk in (ROLE, b": ping\n\n", delta(content=""), b"data: {oops\n\n", DONE):
            yield chunk
            await asyncio.sleep(0.001)

    return event_stream(request, body())


async def slow_stream(request: Request) -> StreamingResponse:
    async def body():
        yield ROLE
        for _ in range(250):  # at most ~5 s: the client leaves long before
            await asyncio.sleep(0.02)
            yield delta(content="x")

    return event_stream(request, body())


async def completion(request: Request) -> JSONResponse:
    rid = request_id_of(request)
    payload = {"id": rid, "choices": [{"index": 0, "message": {"content": "Hello!"}}]}
    return JSONResponse(payload, headers={"x-request-id": rid})


async def tokenized(request: Request) -> JSONResponse:
    with tt.stage("tokenize", prompt_tokens=3):
        await asyncio.sleep(0.002)
    return JSONResponse({"id": request_id_of(request)})


async def boom(request: Request) -> JSONResponse:
    raise RuntimeError("boom")


class Finished:
    """Outermost ASGI wrapper: notes each request id once its traced call has returned,
    so a test reads the trace only after the ``server`` span ended."""

    def __init__(self, app) -> None:
        self.app = app
        self.ids: set[str] = set()
        self.done = threading.Condition()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                with self.done:
                    self.ids.add(scope["state"]["ttft_request_id"])
                    self.done.notify_all()

    def wait(self, request_id: str) -> None:
        with self.done:
            assert self.done.wait_for(lambda: request_id in self.ids, TIMEOUT_S), request_id


ROUTES = [
    Route("/sse", chat_stream),
    Route("/no-token", no_token_stream),
    Route("/slow", slow_stream),
    Route("/json", completion),
    Route("/tokenized", tokenized),
    Route("/boom", boom),
]
APP = Finished(TTFTMiddleware(Starlette(routes=ROUTES)))


# -- fixtures -------------------------------------------------------------------------------
class Traced:
    """One recorder writing a Parquet trace; :meth:`rows` stops it and reads the file."""

    def __init__(self, path) -> None:
        self.path = path
        self.tracing = tt.configure("server", [ParquetSpanExporter(path)], flush_interval_s=0.05)

    def rows(self) -> pd.DataFrame:
        self.tracing.shutdown()
        rows = read_spans(self.path).to_pandas()
        rows["stage"] = rows["stage"].astype(str)
        rows["attributes"] = rows["attributes"].map(json.loads)
        return rows


@pytest.fixture
def traced(tmp_path):
    handle = Traced(tmp_path / "t.parquet")
    try:
        yield handle
    finally:
        handle.tracing.shutdown()


@pytest.fixture(scope="module")
def live_url():
    with running(APP, TIMEOUT_S) as url:
        yield url


def asgi_get(path: str, headers: dict[str, str]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as client:
            return await client.get(path, headers=headers, timeout=TIMEOUT_S)

    return asyncio.run(go())


@pytest.fixture(params=["asgi", "uvicorn"])
def get(request):
    """``get(path, headers)``: one request in-process or over loopback HTTP, returning once
    the server span has ended."""
    if request.param == "asgi":
        return asgi_get
    base_url = request.getfixturevalue("live_url")

    def live_get(path: str, headers: dict[str, str]) -> httpx.Response:
        with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
            response = client.get(path, headers=headers)
        APP.wait(headers.get("x-request-id") or response.headers["x-request-id"])
        return response

    return live_get


def spans(rows: pd.DataFrame, request_id: str) -> dict[str, pd.Series]:
    """The request's rows by name; each name must occur once."""
    mine = rows[rows["request_id"] == request_id]
    assert mine["name"].is_unique, sorted(mine["name"])
    return {row["name"]: row for _, row in mine.iterrows()}


def check_tree(found: dict[str, pd.Series], names: list[str], trace_id: str = TRACE_ID) -> None:
    """``server`` continues the incoming trace; every other row is its direct child."""
    assert sorted(found) == sorted(names)
    server = found["server"]
    assert (server["trace_id"], server["parent_id"], server["stage"]) == (
        trace_id,
        PARENT_SPAN,
        "server",
    )
    for name, row in found.items():
        assert row["trace_id"] == trace_id
        assert row["service"] == "server"
        if name != "server":
            assert row["parent_id"] == server["span_id"], name
            assert server["start_ns"] <= row["start_ns"] <= row["end_ns"] <= server["end_ns"]


def check_first_byte(found: dict[str, pd.Series]) -> None:
    """``first_byte`` is stamped before the token's send: ``stream`` (the send) starts
    there."""
    stream, first_byte = found["stream"], found["first_byte"]
    assert stream["stage"] == "stream"
    assert first_byte["stage"] == "event"
    assert first_byte["start_ns"] == first_byte["end_ns"] == stream["start_ns"]
    assert stream["end_ns"] >= stream["start_ns"]


# -- over HTTP: in-process and loopback ----------------------------------------------------
def test_sse_first_byte_is_the_first_content_chunk(traced, get):
    rid = f"req-sse-{next(_ids)}"
    response = get("/sse", {"traceparent": traceparent(), "tracestate": "k=v", "x-request-id": rid})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == rid  # the app saw the id in scope state
    assert b'"Hel"' in response.content and response.content.endswith(DONE)

    found = spans(traced.rows(), rid)
    check_tree(found, ["server", "stream", "first_byte"])
    check_first_byte(found)
    server, stream, first_byte = found["server"], found["stream"], found["first_byte"]
    attributes = dict(server["attributes"])
    response_end_ns = attributes.pop("response_end_ns")
    assert attributes == {
        "method": "GET",
        "path": "/sse",
        "tracestate": "k=v",
        "http.status_code": 200,
    }
    assert first_byte["end_ns"] < response_end_ns == server["end_ns"]  # ends at response end
    marks = MARKS[rid]
    # the role chunk, the empty content and the first half of the token's event all went
    # out before the stream span; it is the send of the chunk completing that event
    assert marks["role_written"] < marks["half_written"] < marks["token_sending"]
    assert marks["token_sending"] <= stream["start_ns"]
    assert first_byte["end_ns"] <= marks["token_written"]


def test_stream_without_a_token_has_no_first_byte(traced, get):
    rid = f"req-none-{next(_ids)}"
    response = get("/no-token", {"traceparent": traceparent(), "x-request-id": rid})
    assert response.status_code == 200
    found = spans(traced.rows(), rid)
    check_tree(found, ["server"])
    assert found["server"]["attributes"]["http.status_code"] == 200
    assert "client_disconnected" not in found["server"]["attributes"]


def test_non_streamed_response_first_byte_and_generated_request_id(traced, get):
    response = get("/json", {"traceparent": traceparent()})
    rid = response.headers["x-request-id"]
    assert re.fullmatch(r"req-[0-9a-f]{16}", rid)
    assert response.json()["id"] == rid
    found = spans(traced.rows(), rid)
    check_tree(found, ["server", "stream", "first_byte"])
    check_first_byte(found)
    assert found["server"]["attributes"]["http.status_code"] == 200


def test_app_stages_nest_under_server(traced, get):
    rid = f"req-tok-{next(_ids)}"
    response = get("/tokenized", {"traceparent": traceparent(), "x-request-id": rid})
    assert response.json() == {"id": rid}
    found = spans(traced.rows(), rid)
    check_tree(found, ["server", "tokenize", "stream", "first_byte"])
    assert found["tokenize"]["stage"] == "tokenize"
    assert found["tokenize"]["attributes"] == {"prompt_tokens": 3}
    assert found["tokenize"]["end_ns"] <= found["stream"]["start_ns"]


def test_app_exception_propagates_and_is_recorded(traced, get):
    rid = f"req-boom-{next(_ids)}"
    response = get("/boom", {"traceparent": traceparent(), "x-request-id": rid})
    assert response.status_code == 500
    found = spans(traced.rows(), rid)
    check_tree(found, ["server"])  # an error body carries no token
    attributes = dict(found["server"]["attributes"])
    attributes.pop("response_end_ns")
    assert attributes == {
        "method": "GET",
        "path": "/boom",
        "http.status_code": 500,
        "error": "RuntimeError",
    }


def test_concurrent_requests_keep_their_own_traces(traced):
    trace_ids = [f"{i + 1:032x}" for i in range(5)]

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as client:
            return await asyncio.gather(
                *(
                    client.get("/sse", headers={"traceparent": traceparent(t), "x-request-id": t})
                    for t in trace_ids
                )
            )

    assert [r.status_code for r in asyncio.run(go())] == [200] * 5
    rows = traced.rows()
    for trace_id in trace_ids:
        found = spans(rows, trace_id)
        check_tree(found, ["server", "stream", "first_byte"], trace_id=trace_id)
        check_first_byte(found)


def test_client_disconnect_is_recorded(traced, live_url):
    rid = "req-disconnect"
    headers = {"traceparent": traceparent(), "x-request-id": rid}
    received = b""
    start_s = time.monotonic()
    with httpx.Client(base_url=live_url, timeout=TIMEOUT_S) as client:
        with client.stream("GET", "/slow", headers=headers) as response:
            for chunk in response.iter_raw():
                received += chunk
                if b'"content"' in received:
                    break  # leaving the block closes the connection mid-response
    APP.wait(rid)
    assert time.monotonic() - start_s < 4.0  # the app stopped early, not after ~5 s

    found = spans(traced.rows(), rid)
    check_tree(found, ["server", "stream", "first_byte"])
    check_first_byte(found)
    attributes = found["server"]["attributes"]
    assert attributes["client_disconnected"] is True
    assert "response_end_ns" not in attributes


# -- SSE rules, through a bare ASGI application ----------------------------------------------
def run_bare(status: int, headers: list[tuple[bytes, bytes]], chunks: list[bytes], rid: str):
    """Send a response chunk by chunk through the middleware; returns each chunk's
    ``(before, after)`` send times, the messages the server received and when the server
    got each of them (before it wrote anything)."""
    times: list[tuple[int, int]] = []
    sent: list[dict] = []
    handed_ns: list[int] = []

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for chunk in chunks:
            before = tt.clock_ns()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            times.append((before, tt.clock_ns()))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message) -> None:
        handed_ns.append(tt.clock_ns())
        sent.append(message)
        await asyncio.sleep(0.001)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"x-request-id", rid.encode())],
    }
    asyncio.run(TTFTMiddleware(app)(scope, receive, send))
    assert scope["state"] == {"request_id": rid, "ttft_request_id": rid}
    return times, sent, handed_ns


SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
TEXT = sse({"choices": [{"index": 0, "text": "a"}]})
CASES = {
    "role then content": (200, SSE, [ROLE, delta(content="a")], 1),
    "event split across chunks": (200, SSE, [ROLE, TEXT[:12], TEXT[12:-1], b"\n"], 3),
    # the LF of a CRLF split across chunks is no blank line of its own
    "crlf split across chunks": (200, SSE, [TEXT[:-2] + b"\r", b"\n", b"\r\n"], 2),
    "cr then blank line": (200, SSE, [TEXT[:-2] + b"\r", b"\n\r"], 1),
    "cr line ends": (200, SSE, [TEXT[:-2] + b"\r\r"], 0),
    "several events in one chunk": (200, SSE, [ROLE + delta(content="") + TEXT + DONE], 0),
    "multi-line data": (200, SSE, [b'data: {"choices":\ndata: [{"text":"x"}]}\n\n'], 0),
    "empty text then text": (200, SSE, [sse({"choices": [{"text": ""}]}), TEXT], 1),
    "second choice carries": (200, SSE, [sse({"choices": [{}, {"delta": {"content": "b"}}]})], 0),
    "no token": (
        200,
        SSE,
        [
            b": ping\n\n",
            b"data: {oops\n\n",
            b"data: [1]\n\n",
            b'data: {"choices": "x"}\n\n',
            b"event: x\ndata:\n\n",
            b"\xff\xfe\n\n",
            DONE,
            TEXT[:-1],  # never completed
        ],
        None,
    ),
    "oversized line stops the scan": (200, SSE, [b"data: " + b" " * 2**20, b"\n\n" + TEXT], None),
    "compressed event stream": (200, SSE + [(b"content-encoding", b"gzip")], [TEXT], None),
    "json body": (200, [(b"content-type", b"application/json")], [b"", b"{}", b"{}"], 1),
    "error body": (404, [(b"content-type", b"application/json")], [b'{"error":{}}'], None),
}


@pytest.mark.parametrize("case", CASES)
def test_which_chunk_carries_the_first_token(traced, case):
    status, headers, chunks, expected = CASES[case]
    times, sent, handed_ns = run_bare(status, headers, chunks, "req-bare")
    assert [m.get("body") for m in sent[1:]] == [*chunks, b""]  # the server got it all
    found = spans(traced.rows(), "req-bare")
    if expected is None:
        assert sorted(found) == ["server"]
        return
    assert sorted(found) == ["first_byte", "server", "stream"]
    check_first_byte(found)
    stream = found["stream"]
    start_ns, end_ns = stream["start_ns"], stream["end_ns"]
    carried = [i for i, (a, b) in enumerate(times) if a <= start_ns <= end_ns <= b]
    assert carried == [expected]
    # stamped before the server's send got the chunk; the stream span covers that send
    assert start_ns == found["first_byte"]["start_ns"] <= handed_ns[1 + expected] <= end_ns


def test_a_send_that_raises_leaves_a_stream_span_and_no_first_byte(traced):
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": TEXT, "more_body": True})

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client went away")  # ASGI 2.4

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"x-request-id", b"req-gone")]}
    with pytest.raises(OSError):
        asyncio.run(TTFTMiddleware(app)(scope, receive, send))
    found = spans(traced.rows(), "req-gone")
    assert sorted(found) == ["server", "stream"]
    assert found["stream"]["attributes"] == {"error": "OSError"}
    assert found["server"]["attributes"]["client_disconnected"] is True


def test_tracing_failure_does_not_break_the_response(traced):
    odd_headers = [(b"content-type",)]  # not (name, value) pairs: parsing them fails
    times, sent, _ = run_bare(200, odd_headers, [TEXT], "req-odd")  # type: ignore[arg-type]
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 2
    found = spans(traced.rows(), "req-odd")
    assert sorted(found) == ["server"]
    assert found["server"]["attributes"] == {
        "method": "POST",
        "path": "/v1/completions",
        "http.status_code": 200,
        "ttft_asgi_error": "ValueError",
        "response_end_ns": found["server"]["attributes"]["response_end_ns"],
    }


def test_lifespan_and_websocket_pass_through_untouched():
    seen = []

    async def app(scope, receive, send) -> None:
        seen.append((scope, receive, send))

    async def receive() -> dict:
        return {}

    async def send(message) -> None:
        pass

    for kind in ("lifespan", "websocket"):
        scope = {"type": kind}
        asyncio.run(TTFTMiddleware(app)(scope, receive, send))
        assert seen.pop() == (scope, receive, send)
        assert scope == {"type": kind}


def test_non_inference_paths_and_unsampled_requests_are_not_traced(tmp_path):
    seen_ids = []

    async def app(scope, receive, send):
        rid = scope.get("state", {}).get("ttft_request_id")
        if rid is not None:  # traced paths only: the application's stages, and an engine
            seen_ids.append(rid)  # thread's spans of this request id, follow its sampling
            with tt.stage("tokenize"):
                worker = threading.Thread(target=lambda: tt.record("queue", 1, 2, request_id=rid))
                worker.start()
                worker.join()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    tracing = tt.configure(
        "server", [ParquetSpanExporter(tmp_path / "t.parquet")], flush_interval_s=0.01
    )
    try:
        middleware = TTFTMiddleware(app)

        async def call(path: str, headers: dict[str, str] | None = None) -> None:
            transport = httpx.ASGITransport(app=middleware)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                assert (await client.get(path, headers=headers)).status_code == 200

        for path in ("/health", "/metrics", "/v1/models", "/tokenize", "/detokenize"):
            asyncio.run(call(path))
        unsampled = f"00-{'ab' * 16}-{'cd' * 8}-00"
        asyncio.run(call("/v1/completions", {"traceparent": unsampled}))
        asyncio.run(call("/v1/completions", {"traceparent": unsampled[:-2] + "01"}))
    finally:
        tracing.shutdown()
    rows = read_spans(tmp_path / "t.parquet").to_pandas()
    servers = rows[rows.name == "server"]
    assert [json.loads(a)["path"] for a in servers.attributes] == ["/v1/completions"]
    assert list(servers.trace_id) == ["ab" * 16]
    # the not-sampled request had its id, yet left no row: only the sampled one did
    unsampled_id, sampled_id = seen_ids
    assert unsampled_id and sampled_id and unsampled_id != sampled_id
    assert set(rows.request_id) == {sampled_id}
    assert sorted(rows.name) == ["first_byte", "queue", "server", "stream", "tokenize"]
    assert set(rows.trace_id) == {"ab" * 16}

"""An OpenAI-compatible HTTP server over ``Engine``, traced by ``TTFTMiddleware``.

``create_app(engine, model_name=...)`` is a FastAPI application wrapped in
``ttft.tracer.asgi.TTFTMiddleware``; its lifespan starts the engine and stops it (bounded)
on shutdown. ``build_engine`` makes an engine from a model preset; ``serve`` configures
the tracer with the caller's span exporters, runs uvicorn and flushes spans on exit.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as
server-sent events or not, OpenAI shapes), ``POST /tokenize``, ``POST /detokenize``
(as vLLM has them), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus).

Errors have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: unknown
model 404; invalid JSON, wrong types, ``max_tokens < 1``, a prompt that does not fit the
context 400; a body over ``MAX_BODY_BYTES`` (4 MiB) 413; a full waiting queue 429 with
``Retry-After``; a missing or wrong
``Authorization: Bearer`` key 401 (``/health`` and ``/metrics`` stay open).

Metrics (per application ``CollectorRegistry``; times are host clock, seen by the server):

- ``ttft:time_to_first_token_seconds``: the endpoint received the parsed request (before
  tokenization) → the first token event reached the endpoint.
- ``ttft:request_queue_time_seconds``: the request entered the engine's waiting queue →
  the scheduler admitted it (the engine's ``queue`` span; read from the request's span
  record, skipped when the engine does not expose it).
- ``ttft:request_prefill_time_seconds``: admission → the first token reached the
  endpoint (schedule, prefill chunks, first sample and the thread hand-over; as vLLM's
  ``request_prefill_time_seconds``, first token time minus scheduled time).
- ``ttft:e2e_request_latency_seconds``: endpoint received → last token (or stop/cancel).
- ``ttft:requests_total{status}``: ``ok``, ``cancelled`` (client went away),
  ``invalid`` (400), ``unauthorized``, ``not_found``, ``queue_full``, ``error``.
- ``ttft:prompt_tokens_total``, ``ttft:generation_tokens_total``,
  ``ttft:prefix_cache_hits_total`` (prompt tokens served from the prefix cache).
- ``ttft:tracer_dropped_spans``: spans the tracer dropped, its queue or an exporter's backlog
  full (0 when no tracer).
- ``ttft:tracer_failed_spans``: spans the tracer's exporters failed to export (0 when no
  tracer).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from ttft.engine._body_limit import BodyLimit
from ttft.engine.model import ModelConfig, Transformer
from ttft.engine.sampler import SamplingParams
from ttft.engine.scheduler import Engine, EngineConfig, EngineStopped, QueueFull, RequestStream
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer import stats as tracer_stats
from ttft.tracer.asgi import TTFTMiddleware

__all__ = ["ServerConfig", "build_engine", "create_app", "serve"]

log = logging.getLogger(__name__)

StrictFloat = Annotated[float, Strict()]
_TIME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_RETRY_AFTER_S = 1
_STOP_TIMEOUT_S = 5.0


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """What ``build_engine`` and ``serve`` need to run a server from the command line."""

    model: str = "tiny"
    device: str = "auto"
    seed: int = 0
    max_batch_tokens: int = 512
    chunk_size: int = 256
    max_queue: int = 64
    inject_delay_ms: dict[str, float] = field(default_factory=dict)
    tokenizer_cache_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None

    @property
    def model_name(self) -> str:
        return f"ttft-{self.model}"


def build_engine(
    model: str = "tiny",
    device: str = "auto",
    seed: int = 0,
    max_batch_tokens: int = 512,
    chunk_size: int = 256,
    max_queue: int = 64,
    inject_delay_ms: dict[str, float] | None = None,
    tokenizer_cache_dir: str | None = None,
    measure_peaks: bool | None = None,
) -> Engine:
    """A (not yet started) engine over a random-weight model of preset ``model``.

    ``measure_peaks``: measure the device's peaks at start-up for the ``engine_info``
    event (``Engine.start``); None measures only when tracing is configured.

    Raises:
        ValueError: unknown preset or an invalid engine configuration.
    """
    config = ModelConfig.preset(model)
    net = Transformer.from_config(config, seed=seed, device=device)
    tokenizer = Tokenizer.load(vocab_size=config.vocab_size, cache_dir=tokenizer_cache_dir)
    engine_config = EngineConfig(
        max_batch_tokens=max_batch_tokens,
        chunk_size=min(chunk_size, max_batch_tokens),
        max_queue=max_queue,
        max_running=min(16, max_batch_tokens),
        inject_delay_ms=dict(inject_delay_ms or {}),
    )
    return Engine(net, tokenizer, engine_config, measure_peaks=measure_peaks)


# -- errors ----------------------------------------------------------------------------


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def _error_response(err: APIError) -> JSONResponse:
    body = {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }
    return JSONResponse(body, status_code=err.status, headers=err.headers)


MAX_BODY_BYTES = 4 << 20
"""Largest request body accepted; a larger one is answered 413 before it is parsed."""

_STATUS_LABEL = {400: "invalid", 401: "unauthorized", 404: "not_found", 429: "queue_full"}
_STATUSES = ("ok", "cancelled", "invalid", "unauthorized", "not_found", "queue_full", "error")


# -- request bodies --------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=1)


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr = "text"
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    prompt: StrictStr
    model: StrictStr | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    tokens: list[StrictInt]
    model: StrictStr | None = None


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """``"role: content\\n"`` per message, then ``"assistant:"``."""
    lines = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        lines.append(f"{m.role}: {content or ''}\n")
    return "".join(lines) + "assistant:"


# -- metrics ---------------------------------------------------------------------------


def _failed_spans() -> float:
    """Spans the configured tracer's exporters failed to export (raised or refused); 0
    without a recorder."""
    stats = tracer_stats()
    return float(stats.failed) if stats is not None else 0.0


def _dropped_spans() -> float:
    """Spans the configured tracer's recorder dropped so far; 0 without a recorder."""
    stats = tracer_stats()
    return float(stats.dropped) if stats is not None else 0.0


class _Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        b = _TIME_BUCKETS
        for attr, name, meaning in (
            ("ttft", "time_to_first_token", "Endpoint received the request -> first token."),
            ("queue", "request_queue_time", "Engine waiting queue entry -> admission."),
            ("prefill", "request_prefill_time", "Admission -> first token at the endpoint."),
            ("e2e", "e2e_request_latency", "Endpoint received the request -> last token."),
        ):
            setattr(self, attr, Histogram(f"ttft:{name}_seconds", meaning, buckets=b, registry=r))
        self.requests = Counter(
            "ttft:requests_total", "Requests by outcome.", ["status"], registry=r
        )
        for status in _STATUSES:
            self.requests.labels(status=status)  # exported as 0 from the start
        self.prompt_tokens = Counter("ttft:prompt_tokens_total", "Prompt tokens.", registry=r)
        self.generation_tokens = Counter(
            "ttft:generation_tokens_total", "Generated tokens.", registry=r
        )
        self.prefix_hits = Counter(
            "ttft:prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        dropped = Gauge(
            "ttft:tracer_dropped_spans",
            "Spans the tracer dropped (queue or an exporter's backlog full).",
            registry=r,
        )
        dropped.set_function(_dropped_spans)
        failed = Gauge(
            "ttft:tracer_failed_spans", "Spans the tracer's exporters failed to export.", registry=r
        )
        failed.set_function(_failed_spans)


def _admission_times(stream: RequestStream) -> tuple[float, int] | None:
    """(queue seconds, admission perf-counter ns) from the request's ``queue`` span, or
    None when the engine does not expose it."""
    queue_s, admitted_ns = stream.queue_seconds, stream.admitted_ns
    if queue_s is None or admitted_ns is None:
        return None
    return queue_s, admitted_ns


# -- generation ------------------------------------------------------------------------


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` may begin a stop string."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


@dataclass
class _Outcome:
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class _Generation:
    """Runs one submitted request: yields text pieces, applies stop strings, records
    metrics, and cancels the engine request when it is left early."""

    def __init__(
        self,
        stream: RequestStream,
        stops: Sequence[str],
        metrics: _Metrics,
        received_perf_ns: int,
    ) -> None:
        self.stream = stream
        self.stops = [s for s in stops if s]
        self.metrics = metrics
        self.received = received_perf_ns
        self.outcome = _Outcome()
        self._accounted = False

    async def pieces(self) -> AsyncIterator[str]:
        full, emitted, first, last = "", 0, True, None
        try:
            async for ev in self.stream:
                if first:
                    first = False
                    self._first_token()
                last = ev
                full += ev.text
                cut = min((i for i in (full.find(s) for s in self.stops) if i >= 0), default=-1)
                if cut >= 0:
                    if cut > emitted:
                        yield full[emitted:cut]
                    emitted = cut
                    self.outcome.finish_reason = "stop"
                    self.stream.cancel()
                    break
                if ev.finished:
                    if len(full) > emitted:
                        yield full[emitted:]
                    emitted = len(full)
                    self.outcome.finish_reason = ev.finish_reason or "stop"
                    break
                safe = len(full) - _held_back(full, self.stops)
                if safe > emitted:
                    yield full[emitted:safe]
                    emitted = safe
            if last is not None:
                u = last.usage
                self.outcome.usage = {
                    "prompt_tokens": u.prompt_tokens,
                    "completion_tokens": u.completion_tokens,
                    "total_tokens": u.prompt_tokens + u.completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
                }
            self._account("ok", last)
        except BaseException:
            self.stream.cancel()
            self._account("cancelled", last)
            raise

    def close(self) -> None:
        """Cancel the engine request unless it finished (idempotent)."""
        self.stream.cancel()
        self._account("cancelled", None)

    def _first_token(self) -> None:
        now = time.perf_counter_ns()
        m = self.metrics
        m.ttft.observe((now - self.received) / 1e9)
        admitted = _admission_times(self.stream)
        if admitted is not None:
            m.queue.observe(admitted[0])
            m.prefill.observe(max(0, now - admitted[1]) / 1e9)

    def _account(self, status: str, last: Any) -> None:
        if self._accounted:
            return
        self._accounted = True
        m = self.metrics
        m.requests.labels(status=status).inc()
        m.e2e.observe((time.perf_counter_ns() - self.received) / 1e9)
        if last is not None:
            m.prompt_tokens.inc(last.usage.prompt_tokens)
            m.generation_tokens.inc(last.usage.completion_tokens)
            m.prefix_hits.inc(last.usage.cached_tokens)


class _EngineStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that cancels its engine request however the response
    ends (client disconnect, server shutdown, an error)."""

    def __init__(self, content: AsyncIterator[bytes], generation: _Generation) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._generation.close()


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


# -- the application -------------------------------------------------------------------


def _request_id(request: Request) -> str:
    state = request.scope.get("state") or {}
    rid = state.get("ttft_request_id") if isinstance(state, dict) else None
    if not rid:
        rid = "req-" + uuid.uuid4().hex[:16]
        request.scope.setdefault("state", {})["ttft_request_id"] = rid
    return rid


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    err = errors[0]
    loc = [str(x) for x in err.get("loc", ())]
    if err.get("type") == "json_invalid":
        return APIError(400, f"invalid JSON body: {err.get('ctx', {}).get('error', err['msg'])}")
    if loc and loc[0] == "body":
        loc = loc[1:]
    if not loc and err.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return APIError(400, "the request body must be a JSON object")
    # a union adds its member's type to the location (``stop.list[str].0``): keep fields
    fields = [x for x in loc if x not in _TYPE_NAMES and "[" not in x and "-" not in x]
    param = ".".join(fields) or None
    where = param or "request body"
    return APIError(400, f"{where}: {err.get('msg', 'invalid')}", param=param)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "function-after"}


def _engine_facts(engine: Engine) -> dict[str, Any]:
    """``model_config`` (the model's config with its dtype) and ``device`` (name, type and,
    when measured at start-up, peaks) for the model card."""
    meta = engine.run_metadata()["engine"]
    device = engine.device_info or {"name": meta["device_name"], "type": meta["device"]}
    return {"model_config": {**meta["model"], "dtype": meta["dtype"]}, "device": device}


def create_app(
    engine: Engine,
    *,
    model_name: str,
    api_key: str | None = None,
    traced: bool = True,
    stop_timeout_s: float = _STOP_TIMEOUT_S,
) -> Any:
    """An OpenAI-compatible ASGI application serving ``engine`` as model ``model_name``.

    Args:
        engine: started by the application's lifespan (if not yet) and stopped on shutdown.
        model_name: the only model the server accepts (404 for others).
        api_key: when set, ``/v1/*``, ``/tokenize`` and ``/detokenize`` need
            ``Authorization: Bearer <api_key>``.
        traced: wrap the application in ``TTFTMiddleware`` (default).
        stop_timeout_s: the longest shutdown waits for the engine's worker.
    """
    metrics = _Metrics()
    max_len = engine.model.config.max_seq_len
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            engine.start()
        except RuntimeError:
            pass  # already started by the caller
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop, stop_timeout_s)

    app = FastAPI(title="ttft", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.model_name = model_name

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        metrics.requests.labels(status=_STATUS_LABEL.get(exc.status, "error")).inc()
        return _error_response(exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return await api_error(request, _validation_error(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = APIError(exc.status_code, str(exc.detail), type=kind, headers=exc.headers)
        return _error_response(err)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)

    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop (and
    # GIL hand-overs with the engine's worker) for every request, 429s included.
    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), api_key.encode()
        ):
            raise APIError(
                401,
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
                type="authentication_error",
                code="invalid_api_key",
            )

    auth = [Depends(authorize)]

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )

    async def start(body: _Sampling, prompt: str | list[int], request: Request) -> _Generation:
        received = time.perf_counter_ns()
        check_model(body.model)
        max_tokens = body.max_tokens
        if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        max_tokens = 16 if max_tokens is None else max_tokens
        try:
            sampling = SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=body.seed,
            )
        except ValueError as e:
            param = next((p for p in ("temperature", "top_p", "seed") if p in str(e)), None)
            raise APIError(400, str(e), param=param) from None
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        try:
            stream = await engine.submit(
                prompt, max_tokens, sampling, request_id=_request_id(request)
            )
        except QueueFull as e:
            raise APIError(
                429,
                str(e),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(_RETRY_AFTER_S)},
            ) from None
        except EngineStopped as e:
            raise APIError(503, str(e), type="server_error", code="engine_stopped") from None
        except ValueError as e:
            msg = str(e)
            param = "messages" if isinstance(body, ChatRequest) else "prompt"
            if "max_tokens" in msg and "prompt" not in msg:
                param = "max_tokens"
            code = "context_length_exceeded" if "max_seq_len" in msg else None
            raise APIError(400, msg, param=param, code=code) from None
        return _Generation(stream, stops, metrics, received)

    async def respond(body: _Sampling, gen: _Generation, request: Request, chat: bool) -> Any:
        rid = _request_id(request)
        now = int(time.time())
        if not body.stream:
            try:
                text = "".join([p async for p in gen.pieces()])
            except EngineStopped as e:
                raise APIError(503, str(e), type="server_error", code="engine_stopped") from None
            except Exception as e:
                log.exception("ttft server: request %s failed", rid)
                raise APIError(500, f"generation failed: {e}", type="server_error") from None
            finally:
                gen.close()
            reason = gen.outcome.finish_reason
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": now,
                "model": model_name,
                "choices": [choice],
                "usage": gen.outcome.usage,
            }

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            payload: dict[str, Any] = {
                "id": rid,
                "object": kind,
                "created": now,
                "model": model_name,
                "choices": choices,
            }
            if include_usage:
                payload["usage"] = None
            payload.update(extra)
            return _sse(payload)

        def choice(text: str | None, reason: str | None, role: bool = False) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

        async def events() -> AsyncIterator[bytes]:
            if chat:
                yield chunk([choice(None, None, role=True)])
            try:
                async for piece in gen.pieces():
                    if piece:
                        yield chunk([choice(piece, None)])
            except EngineStopped as e:
                err = {"message": str(e), "type": "server_error", "param": None, "code": None}
                yield _sse({"error": err})
                yield b"data: [DONE]\n\n"
                return
            yield chunk([choice(None, gen.outcome.finish_reason)])
            if include_usage:
                yield chunk([], usage=gen.outcome.usage)
            yield b"data: [DONE]\n\n"

        return _EngineStreamingResponse(events(), gen)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        gen = await start(body, body.prompt, request)
        return await respond(body, gen, request, chat=False)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        gen = await start(body, chat_prompt(body.messages), request)
        return await respond(body, gen, request, chat=True)

    @app.post("/tokenize", dependencies=auth)
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        tokens = engine.tokenizer.encode(body.prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": max_len}

    @app.post("/detokenize", dependencies=auth)
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        try:
            return {"prompt": engine.tokenizer.decode(body.tokens)}
        except ValueError as e:
            raise APIError(400, str(e), param="tokens") from None

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "ttft",
            "max_model_len": max_len,
            # What a client-side trace needs for the prefill regime (ttft's own field;
            # OpenAI clients ignore it): the model shape and the device with its peaks.
            "ttft": _engine_facts(engine),
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    limited = BodyLimit(app, MAX_BODY_BYTES)
    return TTFTMiddleware(limited) if traced else limited


def serve(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    exporters: Sequence[Any] = (),
    model_name: str = "ttft-tiny",
    drain_s: float = 5.0,
    log_level: str = "info",
) -> None:
    """Serve ``engine`` with uvicorn until SIGINT/SIGTERM, tracing to ``exporters``.

    On a signal uvicorn stops accepting, lets live requests finish for at most ``drain_s``,
    runs the lifespan shutdown (the engine stops), then the tracer flushes its spans.
    """
    import uvicorn

    from ttft.tracer import configure

    tracing = configure("ttft-server", exporters)
    try:
        app = create_app(engine, model_name=model_name, api_key=api_key)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=max(1, round(drain_s)),
        )
        uvicorn.Server(config).run()
    finally:
        tracing.shutdown()

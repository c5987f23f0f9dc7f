"""The server's endpoints, as module-level handlers on one ``APIRouter``; each reads what
it serves from the application's ``ServerState`` (``app.state.ttft``).

``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed as server-sent events or
not, OpenAI shapes), ``POST /tokenize``, ``POST /detokenize`` (as vLLM has them),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus), ``GET /openapi.json``
(``/docs`` and ``/redoc`` are off). With an API key set, every endpoint but ``/health`` and
``/metrics`` needs ``Authorization: Bearer <key>`` (a 401 says ``WWW-Authenticate: Bearer``).
A long ``/tokenize`` input is tokenized off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response as HTTPResponse

from ttft.engine.admission import INLINE_TOKENIZE_BYTES
from ttft.engine.engine import Engine, EngineStopped, QueueFull
from ttft.engine.sampler import SamplingParams
from ttft.engine.server.errors import APIError
from ttft.engine.server.generation import Generation, complete, stream
from ttft.engine.server.metrics import CONTENT_TYPE_LATEST, Metrics
from ttft.engine.server.models import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Response,
    SamplingRequest,
    TokenizeRequest,
    chat_prompt,
)
from ttft.tracer import clock_ns

__all__ = ["ServerState", "router"]

_RETRY_AFTER_S = 1
_DEFAULT_MAX_TOKENS = 16
_IDS_PER_SLICE = 8192


@dataclass(frozen=True)
class ServerState:
    """What the handlers serve, kept in ``app.state.ttft``.

    Attributes:
        engine: the engine answering every request.
        model_name: the only model served (404 for others).
        metrics: the application's Prometheus metrics.
        api_key: the bearer key every endpoint but ``/health`` and ``/metrics`` needs;
            None for none.
        created: the model card's ``created`` (Unix seconds the app was made).
        stop_timeout_s: the longest shutdown waits for the engine's worker.
        report_timings: answers say their generation's times (``ttft serve
            --report-timings``; ``ttft.engine.server.timings``).
    """

    engine: Engine
    model_name: str
    metrics: Metrics
    api_key: str | None
    created: int
    stop_timeout_s: float
    report_timings: bool = False

    @property
    def max_model_len(self) -> int:
        return self.engine.model.config.max_seq_len


def _state(request: Request) -> ServerState:
    return request.app.state.ttft


# async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop (and GIL
# hand-overs with the engine's worker) for every request, 429s included.
async def authorize(request: Request) -> None:
    """Refuse (401) a request without the server's bearer key, compared in constant time."""
    api_key = _state(request).api_key
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
            headers={"WWW-Authenticate": "Bearer"},
        )


router = APIRouter()
_AUTH = [Depends(authorize)]


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise APIError(
            404,
            f"model {name!r} does not exist; this server serves {state.model_name!r}",
            param="model",
            code="model_not_found",
        )


def _request_id(request: Request) -> str:
    """The request's id from ``TTFTMiddleware`` (``req-`` and 16 hex digits made here
    when untraced), so the response's ``id`` is the id its spans carry."""
    state = request.scope.get("state") or {}
    rid = state.get("ttft_request_id") if isinstance(state, dict) else None
    if not rid:
        rid = "req-" + uuid.uuid4().hex[:16]
        request.scope.setdefault("state", {})["ttft_request_id"] = rid
    return rid


def _sampling(body: SamplingRequest) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
        )
    except ValueError as e:
        param = next((p for p in ("temperature", "top_p", "seed") if p in str(e)), None)
        raise APIError(400, str(e), param=param) from None


def _max_tokens(body: SamplingRequest) -> int:
    max_tokens = body.max_tokens
    if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    return _DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens


def _submit_error(e: Exception, body: SamplingRequest) -> APIError:
    """The answer to the engine refusing a request."""
    if isinstance(e, QueueFull):
        headers = {"Retry-After": str(_RETRY_AFTER_S)}
        return APIError(429, str(e), type="rate_limit_error", code="queue_full", headers=headers)
    if isinstance(e, EngineStopped):
        return APIError(503, str(e), type="server_error", code="engine_stopped")
    msg = str(e)
    param = "messages" if isinstance(body, ChatRequest) else "prompt"
    if "max_tokens" in msg and "prompt" not in msg:
        param = "max_tokens"
    code = "context_length_exceeded" if "max_seq_len" in msg else None
    return APIError(400, msg, param=param, code=code)


async def _generate(body: SamplingRequest, prompt: str | list[int], request: Request) -> Any:
    """Submit ``prompt`` to the engine and answer with its generation, whole or streamed.

    Raises:
        APIError: an unknown model, bad sampling values, a full queue, a stopped engine, a
            prompt that does not fit.
    """
    received_ns = clock_ns()
    state = _state(request)
    _check_model(state, body.model)
    max_tokens, sampling = _max_tokens(body), _sampling(body)
    rid = _request_id(request)
    try:
        submitted = await state.engine.submit(prompt, max_tokens, sampling, request_id=rid)
    except (QueueFull, EngineStopped, ValueError) as e:
        raise _submit_error(e, body) from None
    gen = Generation(submitted, body.stops, state.metrics, received_ns, state.report_timings)
    response = Response(rid, int(time.time()), state.model_name, isinstance(body, ChatRequest))
    if body.stream:
        return stream(gen, response, body.include_usage)
    return await complete(gen, response)


@router.post("/v1/completions", dependencies=_AUTH)
async def completions(body: CompletionRequest, request: Request) -> Any:
    return await _generate(body, body.prompt, request)


@router.post("/v1/chat/completions", dependencies=_AUTH)
async def chat_completions(body: ChatRequest, request: Request) -> Any:
    return await _generate(body, chat_prompt(body.messages), request)


@router.post("/tokenize", dependencies=_AUTH)
async def tokenize(body: TokenizeRequest, request: Request) -> HTTPResponse:
    state = _state(request)
    _check_model(state, body.model)
    answer = functools.partial(_tokenized, state.engine.tokenizer, body.prompt, state.max_model_len)
    if len(body.prompt) <= INLINE_TOKENIZE_BYTES // 4:  # at most 4 UTF-8 bytes a character
        return answer()
    return await asyncio.to_thread(answer)


def _tokenized(tokenizer: Any, prompt: str, max_model_len: int) -> HTTPResponse:
    """The ``/tokenize`` body, serialized here in slices of ids: each slice is one short
    hold of the GIL, so the event loop runs between them when this runs in a thread."""
    tokens = tokenizer.encode(prompt)
    ids = ",".join(
        ",".join(map(str, tokens[i : i + _IDS_PER_SLICE]))
        for i in range(0, len(tokens), _IDS_PER_SLICE)
    )
    body = f'{{"tokens":[{ids}],"count":{len(tokens)},"max_model_len":{max_model_len}}}'
    return HTTPResponse(body.encode(), media_type="application/json")


@router.post("/detokenize", dependencies=_AUTH)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = _state(request)
    _check_model(state, body.model)
    try:
        return {"prompt": state.engine.tokenizer.decode(body.tokens)}
    except ValueError as e:
        raise APIError(400, str(e), param="tokens") from None


def _engine_facts(engine: Engine) -> dict[str, Any]:
    """``model_config`` (the model's config with its dtype) and ``device`` (name, type and,
    when measured at start-up, peaks) for the model card."""
    meta = engine.run_metadata()["engine"]
    device = engine.device_info or {"name": meta["device_name"], "type": meta["device"]}
    return {"model_config": {**meta["model"], "dtype": meta["dtype"]}, "device": device}


@router.get("/v1/models", dependencies=_AUTH)
async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    card = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "ttft",
        "max_model_len": state.max_model_len,
        # What a client-side trace needs for the prefill regime (ttft's own field; OpenAI
        # clients ignore it): the model shape and the device with its peaks.
        "ttft": _engine_facts(state.engine),
    }
    return {"object": "list", "data": [card]}


@router.get("/openapi.json", dependencies=_AUTH, include_in_schema=False)
async def openapi(request: Request) -> dict[str, Any]:
    """The OpenAPI schema, behind the API key like the endpoints it describes."""
    return request.app.openapi()


@router.get("/health")
async def health() -> HTTPResponse:
    return HTTPResponse(status_code=200)


@router.get("/metrics")
async def prometheus(request: Request) -> HTTPResponse:
    return HTTPResponse(_state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

"""The application: ``create_app`` (the routes, the error handlers, the body limit and
``TTFTMiddleware`` around them), ``build_engine`` (an engine from a model preset) and
``serve`` (uvicorn with the tracer configured, spans flushed on exit)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI

from ttft.engine.config import EngineConfig
from ttft.engine.engine import Engine
from ttft.engine.model import ModelConfig, Transformer
from ttft.engine.server.body_limit import MAX_BODY_BYTES, BodyLimit
from ttft.engine.server.errors import add_error_handlers
from ttft.engine.server.metrics import Metrics
from ttft.engine.server.routes import ServerState, router
from ttft.engine.tokenizer import Tokenizer
from ttft.tracer.asgi import TTFTMiddleware

__all__ = ["build_engine", "create_app", "forward_worker_spans", "serve"]

_STOP_TIMEOUT_S = 5.0


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
    disaggregate: bool = False,
    first_token: str = "decode",
    kv_channel: str = "socket",
    preemption: str = "off",
    num_blocks: int | None = None,
) -> Engine:
    """A (not yet started) engine over a random-weight model of preset ``model``.

    ``measure_peaks``: measure the device's peaks at start-up for the ``engine_info``
    event (``Engine.start``); None measures only when tracing is configured.
    ``disaggregate``: a ``ttft.engine.disagg.DisaggEngine`` (a prefill worker process and
    the decode worker here; ``first_token``: ``decode`` or ``prefill``, where the first
    token is delivered from; ``kv_channel``: ``socket`` or ``shm``, how K/V blocks travel).
    ``preemption``: ``EngineConfig.preemption``; ``num_blocks``: the K/V cache's blocks
    (default ``EngineConfig``'s).

    Raises:
        ValueError: unknown preset, an invalid engine configuration, a bad ``first_token``
            or ``kv_channel``.
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
        preemption=preemption,
        **({} if num_blocks is None else {"num_blocks": num_blocks}),
    )
    if disaggregate:
        from ttft.engine.disagg import DisaggEngine

        return DisaggEngine(net, tokenizer, engine_config, seed=seed, first_token=first_token,
                            tokenizer_dir=tokenizer_cache_dir, measure_peaks=measure_peaks,
                            kv_channel=kv_channel)
    return Engine(net, tokenizer, engine_config, measure_peaks=measure_peaks)


def forward_worker_spans(engine: Engine, tracing: Any) -> None:
    """Send the spans of ``engine``'s worker processes (a ``DisaggEngine``'s prefill
    worker) out with this process's, through ``tracing`` (``ttft.tracer.configure``'s
    handle); nothing for an engine without workers."""
    from ttft.engine.disagg import DisaggEngine

    if isinstance(engine, DisaggEngine):
        engine.span_sink = tracing.recorder.add_readable


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engine (unless the caller did); stop it, bounded, on shutdown."""
    state: ServerState = app.state.ttft
    with contextlib.suppress(RuntimeError):  # already started by the caller
        state.engine.start()
    try:
        yield
    finally:
        await asyncio.to_thread(state.engine.stop, state.stop_timeout_s)


def create_app(
    engine: Engine,
    *,
    model_name: str,
    api_key: str | None = None,
    traced: bool = True,
    stop_timeout_s: float = _STOP_TIMEOUT_S,
    report_timings: bool = False,
) -> Any:
    """An OpenAI-compatible ASGI application serving ``engine`` as model ``model_name``
    (endpoints: ``ttft.engine.server.routes``).

    A body over ``MAX_BODY_BYTES`` is answered 413 before it is parsed.

    Args:
        engine: started by the application's lifespan (if not yet) and stopped on shutdown.
        model_name: the only model the server accepts (404 for others).
        api_key: when set, ``/v1/*``, ``/tokenize``, ``/detokenize`` and
            ``/openapi.json`` need ``Authorization: Bearer <api_key>``; ``/docs`` and
            ``/redoc`` are never served.
        traced: wrap the application in ``TTFTMiddleware`` (default).
        stop_timeout_s: the longest shutdown waits for the engine's worker.
        report_timings: answers carry their generation's times, as llama.cpp's ``timings``
            and (whole answers) a ``Server-Timing`` header (``ttft.engine.server.timings``).
    """
    # the schema is served by a route behind the API key (routes.openapi), the docs not at all
    app = FastAPI(title="ttft", lifespan=_lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ttft = ServerState(
        engine, model_name, Metrics(model_name, engine), api_key, int(time.time()),
        stop_timeout_s, report_timings
    )
    add_error_handlers(app)
    app.include_router(router)
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
    sock: socket.socket | None = None,
    report_timings: bool = False,
) -> None:
    """Serve ``engine`` with uvicorn until SIGINT/SIGTERM, tracing to ``exporters``.

    On a signal uvicorn stops accepting, lets live requests finish for at most ``drain_s``,
    runs the lifespan shutdown (the engine stops), then the tracer flushes its spans.

    Args:
        sock: a socket already bound (``ttft serve`` binds before it loads the model, so a
            busy port fails at once); uvicorn listens on it and closes it. None: uvicorn
            binds ``host``:``port`` itself.
        report_timings: see `create_app`.
    """
    import uvicorn

    from ttft.tracer import configure

    tracing = configure("ttft-server", exporters)
    forward_worker_spans(engine, tracing)
    # uvicorn re-raises the signal it stopped on once it has shut down; SIGTERM's default
    # action would then kill the process before the tracer flushes (the parts of a
    # --trace-out file never merged): a handler makes it an exit, with the usual status.
    previous = _exit_on(signal.SIGTERM)
    try:
        app = create_app(engine, model_name=model_name, api_key=api_key,
                         report_timings=report_timings)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=max(1, round(drain_s)),
        )
        uvicorn.Server(config).run(sockets=None if sock is None else [sock])
    finally:
        tracing.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on(signum: int) -> Any:
    """Turn ``signum`` into ``SystemExit(128 + signum)`` (so ``finally`` blocks run); the
    handler it replaces, or None off the main thread (where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def leave(sig: int, frame: Any) -> None:
        raise SystemExit(128 + sig)

    return signal.signal(signum, leave)

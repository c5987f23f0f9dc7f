"""An OpenAI-compatible HTTP server over ``Engine``, traced by ``TTFTMiddleware``.

``create_app(engine, model_name=...)`` is a FastAPI application wrapped in
``ttft.tracer.asgi.TTFTMiddleware``; its lifespan starts the engine and stops it (bounded)
on shutdown. ``build_engine`` makes an engine from a model preset; ``serve`` configures
the tracer with the caller's span exporters, runs uvicorn and flushes spans on exit;
``serving`` runs the server in this process for a ``with`` block (``free_port`` picks a
port).

Errors have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: unknown
model 404; invalid JSON, wrong types, ``max_tokens < 1``, a prompt that does not fit the
context 400; a body over ``MAX_BODY_BYTES`` (4 MiB) 413; a full waiting queue 429 with
``Retry-After``; a stopped engine 503; a missing or wrong ``Authorization: Bearer`` key
401 (``/health`` and ``/metrics`` stay open).

Modules: ``app`` (the application), ``routes`` (the endpoints), ``models`` (request and
response bodies), ``errors``, ``generation`` (stop strings, usage, server-sent events),
``metrics`` (Prometheus), ``body_limit``, ``inprocess``.
"""

from ttft.engine.server.app import build_engine, create_app, forward_worker_spans, serve
from ttft.engine.server.body_limit import MAX_BODY_BYTES
from ttft.engine.server.inprocess import free_port, serving

__all__ = [
    "MAX_BODY_BYTES",
    "build_engine",
    "create_app",
    "forward_worker_spans",
    "free_port",
    "serve",
    "serving",
]

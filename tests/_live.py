"""Helpers shared by tests: a collecting span exporter, a uvicorn server on loopback and the
frame of a stand-in OpenAI-compatible server.

Importable from every test module (``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import uvicorn
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

TIMEOUT_S = 20.0


class Collect(SpanExporter):
    """Keeps every exported span (a real SDK exporter interface)."""

    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


@contextlib.contextmanager
def running(app, timeout_s: float = TIMEOUT_S) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields the base URL and stops
    the server (bounded) afterwards."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        assert not thread.is_alive(), "uvicorn did not stop"


def rows_of(table: pa.Table) -> list[dict]:
    """A trace table's rows, attributes decoded, sorted by start then name."""
    rows = table.to_pylist()
    for row in rows:
        row["attributes"] = json.loads(row["attributes"])
    return sorted(rows, key=lambda row: (row["start_ns"], row["name"]))


def ids(span) -> tuple[str, str]:
    """An SDK span's (trace id, span id) as ttft writes them: lowercase hex."""
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def wait_until(predicate, timeout_s: float = TIMEOUT_S) -> bool:
    """Poll ``predicate`` every 10 ms until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def wait_healthy(proc: subprocess.Popen, url: str, log: Path | None = None,
                 timeout_s: float = 60.0) -> None:
    """Poll ``url``/health until it answers 200; the process must stay alive meanwhile
    (its ``log`` is the failure message) and answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text() if log else "the server exited"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{url} did not start"
        time.sleep(0.2)


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> None:
    """Send ``sig`` and wait for the exit; a process still running after ``timeout_s`` is
    killed and the timeout raised."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def sse(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload)}\n\n"


def stand_in_app(endpoint: str, handler: Callable, model: str = "m") -> Starlette:
    """A stand-in OpenAI-compatible server: ``/v1/models`` lists ``model`` and
    ``POST /v1/{endpoint}`` (``completions`` or ``chat/completions``) is ``handler``."""
    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

    return Starlette(routes=[Route("/v1/models", models),
                             Route(f"/v1/{endpoint}", handler, methods=["POST"])])

"""The reference server in this process, on a free loopback port, for as long as a
``with`` block lasts (``ttft demo``, ``ttft validate``, tests)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ttft.engine.engine import Engine
from ttft.engine.server.app import create_app

__all__ = ["free_port", "serving"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(
    engine: Engine,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    start_timeout_s: float = 60.0,
) -> Iterator[str]:
    """Serve ``engine`` over HTTP in a background thread; yield its base URL.

    Spans go wherever the process's tracing is configured (:func:`ttft.tracer.configure`).
    On exit the server stops and the engine is closed by the app's lifespan.

    Raises:
        RuntimeError: the server did not start within ``start_timeout_s``.
    """
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, model_name=model_name, api_key=api_key),
            host=host,
            port=0,
            log_level="warning",
            lifespan="on",
        )
    )
    thread = threading.Thread(target=server.run, name="ttft-inprocess-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the in-process server on {host} did not start")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)

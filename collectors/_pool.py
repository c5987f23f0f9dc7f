"""The load generator's connection pool: keep-alive connections (``_sender.Connection``) to
one origin, some opened ahead of time so a request due soon finds one ready."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ttft.collectors._sender import Connection, Origin
from ttft.tracer.api import clock_ns


class Pool:
    """Keep-alive connections to one origin, at most ``max_connections`` open at once.

    ``take`` returns an idle connection or None, without waiting; ``connect`` opens one
    (or takes one being opened ahead) and reports its timing; ``prepare`` opens connections
    in the background until ``spare`` are idle or on their way, so a request due soon finds
    one ready instead of waiting for a connect.
    """

    def __init__(self, origin: Origin, max_connections: int, spare: int = 4) -> None:
        self.origin = origin
        self.max_connections = max_connections
        self.spare = spare
        self.idle: list[Connection] = []
        self.open = 0
        self._pending: list[asyncio.Task[Connection]] = []

    def take(self) -> Connection | None:
        if self._pending and self._pending[0].done():
            for task in [t for t in self._pending if t.done()]:
                self._pending.remove(task)
                if not task.cancelled() and task.exception() is None:
                    self.idle.append(task.result())
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._lost(conn)
        return None

    async def connect(self, on_timing: Callable[[str, int], None] | None = None) -> Connection:
        """A new connection; ``on_timing("started"|"connected", ns)`` brackets the wait for
        it (TCP connect and, for https, the TLS handshake)."""
        if on_timing is not None:
            on_timing("started", clock_ns())
        while self._pending:  # one opened ahead is on its way: use it
            try:
                conn = await self._pending.pop(0)
            except OSError:
                continue  # a failure ahead of time is not this request's: try again
            if on_timing is not None:
                on_timing("connected", clock_ns())
            return conn
        conn = await self._open()
        if on_timing is not None:
            on_timing("connected", clock_ns())
        return conn

    async def _open(self) -> Connection:
        self.open += 1
        try:
            o = self.origin
            _, conn = await asyncio.get_running_loop().create_connection(
                Connection, o.host, o.port, ssl=o.ssl, server_hostname=o.host if o.ssl else None)
        except BaseException:
            self.open -= 1
            raise
        return conn

    def prepare(self) -> None:
        """Start opening connections until ``spare`` are idle or opening (within the limit)."""
        ready = sum(c.reusable for c in self.idle) + len(self._pending)
        for _ in range(min(self.spare - ready, self.max_connections - self.open)):
            task = asyncio.get_running_loop().create_task(self._open())
            task.add_done_callback(_ignore_failure)
            self._pending.append(task)

    async def ready(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the connections being opened ahead."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=timeout_s)

    def release(self, conn: Connection) -> None:
        """Give back a connection whose request is over (closed ones are dropped)."""
        if conn.reusable and conn.transport is not None:
            self.idle.append(conn)
        else:
            self._lost(conn)

    def _lost(self, conn: Connection) -> None:
        conn.close()
        self.open -= 1

    async def close(self) -> None:
        """Close every idle connection and stop those being opened."""
        for task in self._pending:
            task.cancel()
        for task in self._pending:
            try:
                self.idle.append(await task)
            except (asyncio.CancelledError, OSError):
                pass
        self._pending.clear()
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        await asyncio.sleep(0)  # let the transports close


def _ignore_failure(task: asyncio.Task[Connection]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a failed early connect is retried by the request

"""``WorkerProcess``: one prefill worker as a child process and the channel to it.

The decode side listens on an ephemeral port of ``host`` (127.0.0.1 by default), starts
``python -m ttft.engine.disagg.worker SPEC`` and accepts the worker's one connection: the
first whose ``hello`` carries the secret the worker was given in its environment
(`TOKEN_ENV`, not its command line, which other users can read), so another local process
that connects first is turned away. The worker answers ``ready`` once its model is built.
``stop`` asks it to stop, waits for it (its last spans come first), and kills it when it
does not exit in time, so no worker outlives its server. The worker exits by itself when
the connection ends.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from typing import Any

from ttft.engine.disagg.channel import ChannelClosed, Outbox, recv, recv_header

__all__ = ["TOKEN_ENV", "WorkerFailed", "WorkerProcess"]

TOKEN_ENV = "TTFT_PREFILL_WORKER_TOKEN"
"""The environment variable that hands the worker the secret of its ``hello``."""
_HELLO_S = 1.0  # how long a connection may take to say hello (it holds up the accept loop)


class WorkerFailed(Exception):
    """The prefill worker did not start (not a ``RuntimeError``: a server's start-up must
    not take it for "already started")."""


class WorkerProcess:
    """A prefill worker process (not started until ``start``).

    Args:
        spec: the worker's ``SPEC`` (``ttft.engine.disagg.worker``) without ``host``/``port``.
        host: where the channel listens.
    """

    def __init__(self, spec: dict[str, Any], host: str = "127.0.0.1") -> None:
        self.spec = dict(spec)
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.outbox: Outbox | None = None
        self.metadata: dict[str, Any] = {}
        self.early: list[tuple[dict[str, Any], memoryview]] = []  # spans sent before ready

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the worker and wait for its ``ready``.

        Raises:
            WorkerFailed: it exited, or was not ready within ``timeout_s`` (it is killed).
        """
        listener = socket.create_server((self.host, 0))
        try:
            spec = {**self.spec, "host": self.host, "port": listener.getsockname()[1]}
            cmd = [sys.executable, "-m", "ttft.engine.disagg.worker", json.dumps(spec)]
            token = secrets.token_hex(16)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         env={**os.environ, TOKEN_ENV: token})
            self.sock = self._accept(listener, time.monotonic() + timeout_s, token)
        except BaseException:
            self.kill()
            raise
        finally:
            listener.close()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock.settimeout(max(1.0, timeout_s))
            header = self._ready()
            self.sock.settimeout(None)
        except (ChannelClosed, OSError) as exc:
            self.kill()
            raise WorkerFailed(
                f"the prefill worker failed to start ({self._exit()}): {exc}") from None
        self.metadata = header.get("metadata", {})
        self.outbox = Outbox(self.sock, "ttft-decode-outbox")

    def _ready(self) -> dict[str, Any]:
        """The worker's ``ready`` header; span batches its exporter sent before it are kept
        in ``early`` for the receiver, and any other message fails the start."""
        while True:
            header, payload = recv(self.sock)
            if header.get("op") == "ready":
                return header
            if header.get("op") != "spans":
                raise ChannelClosed(f"a {header.get('op')!r} message before ready")
            self.early.append((header, payload))

    def _accept(self, listener: socket.socket, deadline_s: float, token: str
                ) -> socket.socket:
        """The first connection whose ``hello`` carries ``token``; others are closed."""
        listener.settimeout(0.2)
        assert self.proc is not None
        while True:
            try:
                sock, _ = listener.accept()
                if _says_hello(sock, token):
                    return sock
                sock.close()
            except TimeoutError:
                if self.proc.poll() is not None:
                    raise WorkerFailed(f"the prefill worker exited ({self._exit()})") from None
                if time.monotonic() > deadline_s:
                    raise WorkerFailed("the prefill worker did not connect in time") from None

    def _exit(self) -> str:
        code = None if self.proc is None else self.proc.poll()
        return "still running" if code is None else f"exit code {code}"

    def describe_exit(self) -> str:
        """``exit code N`` once the worker has exited, else ``still running``."""
        return self._exit()

    def put(self, header: dict[str, Any], payload: Any = None) -> None:
        """Send a message to the worker (dropped once the channel broke)."""
        if self.outbox is not None:
            self.outbox.put(header, payload)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to stop and wait for it, at most ``timeout_s``, then kill it.
        The channel's socket is closed by ``close``. Idempotent."""
        if self.outbox is not None:
            self.outbox.put({"op": "stop"})
            self.outbox.close(timeout_s)
        if self.proc is not None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """Kill the worker now (if running) and reap it; close the socket."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()


def _says_hello(sock: socket.socket, token: str) -> bool:
    """Whether the first message on ``sock`` is the worker's ``hello`` with ``token``."""
    sock.settimeout(_HELLO_S)
    try:
        header, body_n = recv_header(sock, max_header_bytes=256)
    except (ChannelClosed, OSError, ValueError):
        return False
    given = header.get("token") if header.get("op") == "hello" and not body_n else None
    return isinstance(given, str) and hmac.compare_digest(given, token)

"""The load generator's HTTP/1.1 client: keep-alive connections (pooled by ``_pool.Pool``)
that write a pre-encoded request in one call and timestamp the response as the event loop
hands its bytes over.

Why not httpx: on a 2-core machine httpx took ~0.45 ms from ``send()`` to the request's last
byte and ~3 ms of process CPU per streamed request, and its connection pool's bookkeeping
grows with the connections held (``_assign_requests_to_connections`` checks every one of
them per request), so at 200 requests/s the sender fell tens to hundreds of ms behind its
schedule (benchmarks/client_accuracy.py). Here a request is one ``transport.write`` of
bytes built before it is due, and the response is parsed in ``data_received``, each piece
stamped with the time the loop delivered it.

``sent`` is when the write that handed the kernel every byte of the request began. Not
when it returned: on loopback the kernel delivers inside that call and may run the woken
server before it returns, so a stamp after it comes later than the server's receipt.

Scope: HTTP/1.1 over TCP or TLS, one request at a time per connection, responses framed by
``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's end. No proxies, no
redirects, no content codings (requests say ``Accept-Encoding: identity``).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import ClassVar, Protocol, cast
from urllib.parse import urlsplit

from ttft.tracer.api import clock_ns

SPIN_S = 0.002
"""``wait_until`` sleeps until this long before the deadline, then polls the loop. The
selector event loop's timers round up to whole milliseconds and waking an idle CPU took
up to ~0.7 ms more on a 2-core VM; with 1.5 ms the send error p99 at 50 requests/s was
~0.5 ms, with 2 ms ~0.1 ms, for ~0.4 ms more CPU per request (benchmarks/client_accuracy.py)."""


class ProtocolError(ValueError):
    """The server's response is not valid HTTP/1.1."""


class StaleConnection(ConnectionError):
    """A reused keep-alive connection was closed before any byte of the response came;
    the request can be sent again on a new connection."""


class Sink(Protocol):
    """Receives one response; called on the event loop, must not block."""

    def on_sent(self, ns: int) -> None: ...
    def on_headers(self, status: int, headers: dict[str, str], ns: int) -> None: ...
    def on_body(self, data: bytes, ns: int) -> None: ...
    def on_end(self, ns: int) -> None: ...
    def on_error(self, exc: BaseException) -> None: ...


async def wait_until(deadline_ns: int, now: Callable[[], int] = clock_ns) -> None:
    """Return at ``deadline_ns`` (``clock_ns``), late by about one loop iteration at most.

    Sleeps until ``SPIN_S`` before the deadline, then yields to the loop until it passes,
    so other callbacks (responses being read) still run while it waits.
    """
    lead_s = (deadline_ns - now()) / 1e9 - SPIN_S
    if lead_s > 0:
        await asyncio.sleep(lead_s)
    while now() < deadline_ns:
        await asyncio.sleep(0)


class Origin:
    """Where requests go: scheme, host, port, TLS context and the base URL's path."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/path], got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        default = 443 if self.ssl else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if self.port == default else f"{host}:{self.port}"
        self.path = parts.path.rstrip("/")

    def request(self, method: str, path: str, headers: Iterable[tuple[str, str]],
                body: bytes) -> bytes:
        """One request, encoded: ``path`` is appended to the base URL's path."""
        head = [f"{method} {self.path}{path} HTTP/1.1", f"host: {self.authority}",
                f"content-length: {len(body)}", "accept-encoding: identity",
                "user-agent: ttft-loadgen"]
        head.extend(f"{k}: {v}" for k, v in headers)
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE = range(7)
_GO_ON, _WAIT, _ENDED = range(3)
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_DIGITS = re.compile(r"[0-9]+")


class Connection(asyncio.Protocol):
    """One keep-alive connection; ``send`` a request with a sink, read its response.

    ``reusable`` is True once a response ended and the connection may carry another.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.reusable = False
        self.used = False
        self._reused = False
        self._buffer = bytearray()
        self._state = _HEAD
        self._left = 0
        self._got_bytes = False
        self._paused = False
        self._keep_alive = True

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=0)  # resume_writing says when all is sent
        self.reusable = True

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self.sink is not None:
            self.sink.on_sent(clock_ns())

    def data_received(self, data: bytes) -> None:
        ns = clock_ns()
        if self.sink is None:  # nothing asked for: the connection cannot be trusted
            self.close()
            return
        self._got_bytes = True
        self._buffer += data
        try:
            self._parse(ns)
        except ProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.reusable = False
        if self.sink is None:
            return
        if self._state == _UNTIL_CLOSE and exc is None:
            sink, self.sink = self.sink, None
            if self._buffer:
                sink.on_body(bytes(self._buffer), clock_ns())
            sink.on_end(clock_ns())
        elif not self._got_bytes and self._reused:
            self._fail(StaleConnection("the server closed a kept-alive connection"))
        else:
            self._fail(exc or ConnectionError("the server closed the connection before the "
                                              "response ended"))

    # -- use ---------------------------------------------------------------------------------
    def send(self, data: bytes, sink: Sink) -> None:
        """Write one encoded request. ``sink.on_sent`` gets the time the write began if the
        kernel took every byte in it, else the time the last byte was taken."""
        assert self.transport is not None and self.sink is None
        self.sink, self.reusable, self._got_bytes = sink, False, False
        self._reused, self.used = self.used, True
        self._buffer.clear()
        self._state = _HEAD
        ns = clock_ns()  # not after: the kernel may run the server before the write returns
        self.transport.write(data)
        if not self._paused:
            sink.on_sent(ns)

    def close(self) -> None:
        """Abort the connection; its sink, if any, hears nothing more."""
        self.sink, self.reusable = None, False
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        sink, self.sink = self.sink, None
        self.close()
        if sink is not None:
            sink.on_error(exc)

    def _parse(self, ns: int) -> None:
        """Take what the buffer holds of the response, one framing step at a time; the body
        bytes found go to the sink in one piece when the buffer runs dry."""
        body: list[bytes] = []
        while self.sink is not None:
            outcome = self._STEPS[self._state](self, body, ns)
            if outcome != _GO_ON:
                if outcome == _WAIT:
                    self._flush(body, ns)
                return
        self._flush(body, ns)

    # Each step parses one piece in its state and says what follows: _GO_ON (the next
    # piece), _WAIT (the buffer holds no whole piece: deliver the body so far and wait) or
    # _ENDED (the response ended; ``_end`` delivered the body).

    def _step_head(self, body: list[bytes], ns: int) -> int:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return _WAIT
        block = bytes(self._buffer[:end])
        del self._buffer[:end + 4]
        self._head(block, ns)
        return _GO_ON

    def _step_until_close(self, body: list[bytes], ns: int) -> int:
        if self._buffer:
            body.append(bytes(self._buffer))
            self._buffer.clear()
        return _WAIT

    def _step_chunk_size(self, body: list[bytes], ns: int) -> int:
        buf = self._buffer
        end = buf.find(b"\r\n")
        if end < 0:
            return _WAIT
        size = bytes(buf[:end]).split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size):  # int() would take "-5", "0x5", "1_0"
            raise ProtocolError(f"bad chunk size line {bytes(buf[:end])[:40]!r}")
        self._left = int(size, 16)
        del buf[:end + 2]
        self._state = _CHUNK_DATA if self._left else _TRAILER
        return _GO_ON

    def _step_data(self, body: list[bytes], ns: int) -> int:
        """Chunk data, or a body of known length (``_LENGTH``)."""
        take = min(self._left, len(self._buffer))
        if take:
            body.append(bytes(self._buffer[:take]))
            del self._buffer[:take]
            self._left -= take
        if self._left:
            return _WAIT
        if self._state == _LENGTH:
            self._end(body, ns)
            return _ENDED
        self._state = _CHUNK_END
        return _GO_ON

    def _step_chunk_end(self, body: list[bytes], ns: int) -> int:
        if len(self._buffer) < 2:
            return _WAIT
        if self._buffer[:2] != b"\r\n":
            raise ProtocolError("chunk data not followed by CRLF")
        del self._buffer[:2]
        self._state = _CHUNK_SIZE
        return _GO_ON

    def _step_trailer(self, body: list[bytes], ns: int) -> int:
        """Trailer lines up to an empty one, which ends the response."""
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return _WAIT
        del self._buffer[:end + 2]
        if end == 0:
            self._end(body, ns)
            return _ENDED
        return _GO_ON

    _STEPS: ClassVar[dict[int, Callable[[Connection, list[bytes], int], int]]] = {
        _HEAD: _step_head, _UNTIL_CLOSE: _step_until_close, _CHUNK_SIZE: _step_chunk_size,
        _CHUNK_DATA: _step_data, _LENGTH: _step_data, _CHUNK_END: _step_chunk_end,
        _TRAILER: _step_trailer,
    }

    def _head(self, block: bytes, ns: int) -> None:
        lines = block.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest.partition(" ")[0]
        if not version.startswith("HTTP/1.") or len(code) != 3 or not _DIGITS.fullmatch(code):
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200:
            return  # an interim response; the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers \
                else value.strip()
        self._keep_alive = version == "HTTP/1.1" and \
            "close" not in headers.get("connection", "").lower()
        if status in (204, 304):
            self._state, self._left = _LENGTH, 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            length = headers["content-length"]
            if not _DIGITS.fullmatch(length):  # int() would take "-1", "+3", "1_0"
                raise ProtocolError(f"bad content-length {length[:40]!r}")
            self._left = int(length)
            self._state = _LENGTH
        else:
            self._state, self._keep_alive = _UNTIL_CLOSE, False
        assert self.sink is not None
        self.sink.on_headers(status, headers, ns)
        if self._state == _LENGTH and not self._left:
            self._end([], ns)

    def _flush(self, body: list[bytes], ns: int) -> None:
        if body and self.sink is not None:
            self.sink.on_body(b"".join(body), ns)

    def _end(self, body: list[bytes], ns: int) -> None:
        self._flush(body, ns)
        sink, self.sink = self.sink, None
        self.reusable = self._keep_alive and self.transport is not None and not self._buffer
        if not self.reusable:
            self.close()
        if sink is not None:
            sink.on_end(ns)

"""A minimal OpenAI-style streaming server that logs when it wrote each response's bytes.

    python benchmarks/sse_server.py [--chunks 8] [--first-ms 2] [--gap-ms 2]

Plain asyncio, raw HTTP/1.1 with keep-alive, bound to 127.0.0.1 on a free port; it prints
``PORT <n>`` on stdout once it listens and runs until stdin closes (or a signal). Any POST
(``/v1/completions``, ``/v1/chat/completions``) is answered with a chunked
``text/event-stream``: headers at once, then after ``--first-ms`` the first SSE chunk, then
``--chunks - 1`` more ``--gap-ms`` apart (the last with finish reason ``length``), a
usage chunk and ``data: [DONE]``.

``GET /log`` returns, as a JSON object, the log of every completion request answered since
the last ``GET /log`` (which it then clears): one record per request, keyed by the trace id
of its ``traceparent`` header, with ``received_ns`` (the request's last byte parsed),
``first_byte_ns`` (just before the first body chunk was handed to the socket, so it never
comes after the client can see that chunk) and ``end_ns``. All times are
``time.perf_counter_ns()``: ``CLOCK_MONOTONIC`` on Linux (likewise system-wide on macOS and
Windows), one clock for every process on the host, so they compare directly with another
process's ``perf_counter_ns``. Benchmark benchmarks/client_accuracy.py and the test
tests/collectors/test_client_accuracy.py start it as a separate process by its path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

_now_ns = time.perf_counter_ns
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    """``payload`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Server:
    """The server's settings, request counter and log."""

    def __init__(self, chunks: int, first_s: float, gap_s: float) -> None:
        self.chunks, self.first_s, self.gap_s = chunks, first_s, gap_s
        self.count = 0
        self.log: dict[str, dict[str, int]] = {}

    def stream(self, chat: bool) -> list[bytes]:
        """The chunked body of one response: one element per write."""
        self.count += 1
        rid = f"req-{self.count}"
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0, "model": "sse-test"}

        def choice(text: str, finish: str | None) -> dict[str, object]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        # the last content chunk carries the finish reason: without one the client counts
        # the stream as cut short (truncated)
        out = [_chunk(_event({**base, "choices": [
            choice(f" tok{i}", "length" if i == self.chunks - 1 else None)]}))
            for i in range(self.chunks)]
        usage = {"prompt_tokens": 4, "completion_tokens": self.chunks, "total_tokens":
                 4 + self.chunks}
        out[-1] += _chunk(_event({**base, "choices": [], "usage": usage}))
        out[-1] += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        return out


class Connection(asyncio.Protocol):
    """One keep-alive connection; requests on it are answered one after another."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def next_request(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return
        received_ns = _now_ns()
        del self.buffer[:end + 4 + length]
        method, target, _ = lines[0].split(" ", 2)
        if method == "GET" and target == "/log":
            body = json.dumps({"clock": "perf_counter_ns", "requests": self.server.log}).encode()
            self.server.log = {}
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
            self.next_request()
            return
        if method != "POST":
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            self.next_request()
            return
        parts = headers.get("traceparent", "").split("-")
        key = parts[1] if len(parts) == 4 else f"untraced-{self.server.count}"
        record = {"received_ns": received_ns}
        self.server.log[key] = record
        self.busy = True
        self.transport.write(HEAD)
        writes = self.server.stream(chat="chat" in target)
        loop = asyncio.get_running_loop()
        loop.call_later(self.server.first_s, self.write, writes, 0, record)

    def write(self, writes: list[bytes], i: int, record: dict[str, int]) -> None:
        if self.transport is None:
            return
        if i == 0:
            record["first_byte_ns"] = _now_ns()
        self.transport.write(writes[i])
        if i + 1 < len(writes):
            asyncio.get_running_loop().call_later(self.server.gap_s, self.write, writes, i + 1,
                                                  record)
            return
        record["end_ns"] = _now_ns()
        self.busy = False
        self.next_request()


async def serve(chunks: int, first_ms: float, gap_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = Server(chunks, first_ms / 1e3, gap_ms / 1e3)
    listener = await loop.create_server(lambda: Connection(server), "127.0.0.1", 0, backlog=1024)
    print(f"PORT {listener.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.buffer.read1() or stop.set())
    async with listener:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--first-ms", type=float, default=2.0)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    args = parser.parse_args()
    asyncio.run(serve(args.chunks, args.first_ms, args.gap_ms))


if __name__ == "__main__":
    main()

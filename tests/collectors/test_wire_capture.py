"""benchmarks/_wire.py: when requests and their first tokens crossed the wire.

The parser on pcap files written here byte by byte (both timestamp magics, both byte orders,
each link type tcpdump may record loopback as), with the awkward cases placed on purpose; and
one real capture on ``lo`` of requests to benchmarks/sse_server.py, skipped where tcpdump cannot
capture.
"""

from __future__ import annotations

import http.client
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _benchmarks import benchmark_module

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
SERVER = BENCHMARKS / "sse_server.py"
FIRST_MS = 2.0
"""The server's delay before the first chunk (its default)."""


@pytest.fixture(scope="module")
def wire():
    """benchmarks/_wire.py as a module (benchmarks/ is no package)."""
    with benchmark_module("_wire.py", "wire_benchmark") as module:
        yield module


# --- synthetic captures ------------------------------------------------------------------

SERVER_PORT = 8000
V4 = (bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))
V6 = (bytes(15) + b"\x01", bytes(15) + b"\x01")
SYN, ACK, PSH = 0x02, 0x10, 0x08
TRACE = ["4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7a3ce929d0e0e4736"]
BASE_NS = 1_700_000_000_000_000_000
LINKS = {"EN10MB": 1, "LINUX_SLL": 113, "LINUX_SLL2": 276, "NULL": 0}


def _ip_tcp(addrs: tuple[bytes, bytes], sport: int, dport: int, seq: int, flags: int,
            payload: bytes) -> bytes:
    """An IP packet (v4 or v6 by the addresses' length) holding one TCP segment, with 12
    bytes of TCP options, as Linux sends them (a data offset of 8 words)."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq % (1 << 32), 0, 8 << 4, flags, 65535, 0,
                      0) + b"\x01\x01\x08\x0a" + bytes(8) + payload
    if len(addrs[0]) == 4:
        return struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0) + \
            addrs[0] + addrs[1] + tcp
    return struct.pack("!IHBB", 6 << 28, len(tcp), 6, 64) + addrs[0] + addrs[1] + tcp


def _frame(link: str, packet: bytes) -> bytes:
    v6 = packet[0] >> 4 == 6
    kind = 0x86DD if v6 else 0x0800
    if link == "EN10MB":
        return bytes(12) + struct.pack("!H", kind) + packet
    if link == "LINUX_SLL":
        return struct.pack("!HHH8sH", 0, 772, 6, bytes(8), kind) + packet
    if link == "LINUX_SLL2":
        return struct.pack("!HHIHBB8s", kind, 0, 1, 772, 0, 6, bytes(8)) + packet
    return struct.pack("<I", 10 if v6 else 2) + packet  # NULL: AF_INET(6), this host's order


def _pcap(path: Path, link: str, nano: bool, order: str,
          packets: list[tuple[int, bytes]]) -> None:
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 262144, LINKS[link])]
    for ts, packet in packets:
        frame = _frame(link, packet)
        sec, frac = divmod(ts, 1_000_000_000)
        out.append(struct.pack(order + "IIII", sec, frac if nano else frac // 1000, len(frame),
                               len(frame)) + frame)
    path.write_bytes(b"".join(out))


def _request(path: str, trace: str | None, body: bytes = b'{"stream":true}',
             method: str = "POST") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
    if trace:
        head += f"traceparent: 00-{trace}-00f067aa0ba902b7-01\r\n"
    return head.encode() + b"\r\n" + body


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
ROLE = _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
CHAT = _event({"choices": [{"index": 0, "delta": {"content": " Hello"}}]})
EMPTY_TEXT = _event({"choices": [{"index": 0, "text": ""}]})
TEXT = _event({"choices": [{"index": 0, "text": " Hi", "finish_reason": None}]})
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
END = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Conn:
    """Packets of one TCP connection, stamped 1 ms apart (plus ``odd`` ns)."""

    def __init__(self, packets: list[tuple[int, bytes]], addrs: tuple[bytes, bytes],
                 port: int, isn: tuple[int, int], odd: int) -> None:
        self.packets, self.addrs, self.port, self.odd = packets, addrs, port, odd
        self.next = [isn[0] + 1, isn[1] + 1]  # sequence numbers of the next data bytes

    def send(self, side: int, payload: bytes, flags: int = ACK | PSH,
             seq: int | None = None) -> int:
        """Send from the client (side 0) or the server (1); returns the packet's time."""
        if seq is None:
            seq = self.next[side]
            self.next[side] += len(payload)
        ports = (self.port, SERVER_PORT) if side == 0 else (SERVER_PORT, self.port)
        addrs = self.addrs if side == 0 else self.addrs[::-1]
        ts = BASE_NS + (len(self.packets) + 1) * 1_000_000 + self.odd
        self.packets.append((ts, _ip_tcp(addrs, *ports, seq, flags, payload)))
        return ts

    def handshake(self) -> None:
        self.send(0, b"", SYN, self.next[0] - 1)
        self.send(1, b"", SYN | ACK, self.next[1] - 1)
        self.send(0, b"", ACK)


def _scenario(odd: int) -> tuple[list[tuple[int, bytes]], list[tuple]]:
    """The packets of four connections, and the requests read_pcap must find in them."""
    packets: list[tuple[int, bytes]] = []
    expected = []
    # 1: two requests on one keep-alive connection; the server's sequence numbers wrap
    a = Conn(packets, V4, 40000, (1000, (1 << 32) - 300), odd)
    a.handshake()
    req = _request("/v1/chat/completions", TRACE[0])
    seq = a.next[0]
    post = a.send(0, req[:2])  # "PO" | "ST ..."
    sent = a.send(0, req[2:])
    a.send(0, req[:2], seq=seq)  # a retransmission of the first segment
    a.send(1, HEAD)
    # the role-only chunk, then a token event split inside its chunk-size line and its JSON
    cut = len(ROLE) + 1
    body = ROLE + CHAT + CHAT + USAGE + END
    assert body[cut - 1:cut + 2] == CHAT[:3] and CHAT[2:4] == b"\r\n"  # 2 hex digits
    assert 4 < 40 < len(CHAT) - 4
    seq = a.next[1]
    a.send(1, body[:cut])
    a.send(1, body[cut:cut + 40])
    first = a.send(1, body[cut + 40:cut + len(CHAT) + 10])
    a.send(1, body[cut:cut + 60], seq=seq + cut)  # retransmitted, overlapping both
    a.send(1, body[cut + len(CHAT):], seq=seq + cut + len(CHAT))  # repacketized: 10 bytes again
    a.next[1] = seq + len(body)
    expected.append(((40000, SERVER_PORT), post, first, TRACE[0], sent))
    # the second: its token event's two segments arrive in the wrong order
    post = a.send(0, _request("/v1/completions", TRACE[1]))
    a.send(1, HEAD + EMPTY_TEXT)
    body = TEXT + USAGE + END
    seq = a.next[1]
    a.send(1, body[30:], seq=seq + 30)
    a.next[1] += len(body)
    first = a.send(1, body[:30], seq=seq)
    expected.append(((40000, SERVER_PORT), post, first, TRACE[1], post))
    # 2: IPv6; a GET answered first (a plain body), then a POST without a traceparent
    b = Conn(packets, V6, 40001, (7, 9), odd)
    b.handshake()
    b.send(0, _request("/log", None, b"", "GET"))
    reply = b'{"requests": {}}'
    b.send(1, b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(reply), reply))
    post = b.send(0, _request("/v1/completions", None))
    first = b.send(1, HEAD + TEXT)
    b.send(1, USAGE + END)
    expected.append(((40001, SERVER_PORT), post, first, None, post))
    # 3, 4: the capture began mid-connection: after a request's head (its response seen
    # whole), and in the middle of a response
    c = Conn(packets, V4, 40002, (5000, 6000), odd)
    c.send(0, b'"stream": true}')
    c.send(1, HEAD + CHAT)
    c.send(1, END)
    post = c.send(0, _request("/v1/chat/completions", TRACE[0]))
    c.send(1, HEAD + ROLE)
    first = c.send(1, CHAT + END)
    expected.append(((40002, SERVER_PORT), post, first, TRACE[0], post))
    d = Conn(packets, V6, 40003, (1 << 31, 3), odd)
    d.send(1, b"6a\r\n" + CHAT[4:])
    d.send(1, TEXT + END)
    post = d.send(0, _request("/v1/completions", TRACE[1]))
    first = d.send(1, HEAD + TEXT)
    expected.append(((40003, SERVER_PORT), post, first, TRACE[1], post))
    return packets, expected


@pytest.mark.parametrize("link", list(LINKS))
@pytest.mark.parametrize("nano,order", [(True, "<"), (True, ">"), (False, "<"), (False, ">")])
def test_the_parser_picks_the_packets_that_began_requests_and_completed_first_tokens(
        wire, tmp_path, link, nano, order):
    packets, expected = _scenario(789 if nano else 0)  # microsecond files keep whole µs
    path = tmp_path / "synthetic.pcap"
    _pcap(path, link, nano, order, packets)
    found = wire.read_pcap(path, SERVER_PORT)
    assert [(r.conn, r.post_ns, r.first_token_ns, r.trace_id, r.sent_ns)
            for r in found] == expected


def test_a_request_without_a_token_and_an_unfinished_one(wire, tmp_path):
    """A response with no token text (an error) gets None; so does a request the capture
    ends before answering; a gap in the captured bytes is warned about."""
    packets: list[tuple[int, bytes]] = []
    a = Conn(packets, V4, 40000, (10, 20), 0)
    a.handshake()
    post = a.send(0, _request("/v1/completions", TRACE[0]))
    error = b'{"error": "bad"}'
    a.send(1, b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error))
    late = a.send(0, _request("/v1/completions", TRACE[1]))
    a.send(1, HEAD + ROLE)
    a.send(1, TEXT, seq=a.next[1] + 5)  # the 5 bytes before it were never captured
    path = tmp_path / "gap.pcap"
    _pcap(path, "EN10MB", True, "<", packets)
    with pytest.warns(RuntimeWarning, match="lost track"):
        found = wire.read_pcap(path, SERVER_PORT)
    assert [(r.post_ns, r.first_token_ns, r.trace_id) for r in found] == [
        (post, None, TRACE[0]), (late, None, TRACE[1])]


def test_not_a_pcap_file(wire, tmp_path):
    path = tmp_path / "x.pcapng"
    path.write_bytes(b"\n\r\r\n" + bytes(40))
    with pytest.raises(ValueError, match="pcapng"):
        wire.read_pcap(path, SERVER_PORT)


# --- a real capture ----------------------------------------------------------------------

@contextmanager
def _server() -> Iterator[int]:
    """benchmarks/sse_server.py in a separate process; yields its port."""
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield int(line.split()[1])
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _post(conn: http.client.HTTPConnection, chat: bool, trace: str) -> tuple[int, int]:
    """One streaming request, read to its end; ``time.time_ns()`` just before and after."""
    body = {"model": "m", "stream": True, "max_tokens": 8}
    body |= {"messages": [{"role": "user", "content": "Hi."}]} if chat else {"prompt": "Hi."}
    before = time.time_ns()
    conn.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                 json.dumps(body).encode(), {"content-type": "application/json",
                                             "traceparent": f"00-{trace}-00f067aa0ba902b7-01"})
    response = conn.getresponse()
    assert response.status == 200 and b"data: [DONE]" in response.read()
    return before, time.time_ns()


def test_a_live_capture_finds_every_request_once_with_its_first_token(wire, tmp_path):
    reason = wire.capture_available()
    if reason is not None:  # as test_client_accuracy: CI installs tcpdump (README)
        message = f"no packet capture on loopback: {reason} (apt-get install tcpdump)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    path = tmp_path / "live.pcap"
    windows: dict[str, tuple[int, int]] = {}  # trace id -> client clock before and after
    traces = iter(f"{i + 1:032x}" for i in range(100))
    lock = threading.Lock()

    def client(port: int, n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
        try:
            for i in range(n):
                with lock:
                    trace = next(traces)
                windows[trace] = _post(conn, i % 2 == 0, trace)
        finally:
            conn.close()

    with _server() as port:
        with wire.capture(port, path):
            client(port, 4)  # one keep-alive connection
            threads = [threading.Thread(target=client, args=(port, 2)) for _ in range(3)]
            for thread in threads:  # and three more at once
                thread.start()
            for thread in threads:
                thread.join()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
            conn.request("GET", "/log")
            log = json.loads(conn.getresponse().read())["requests"]
            conn.close()
        found = wire.read_pcap(path, port)

    assert sorted(r.trace_id for r in found) == sorted(windows) == sorted(log)
    by_conn: dict[tuple[int, int], int] = {}
    for r in found:
        by_conn[r.conn] = by_conn.get(r.conn, 0) + 1
    assert sorted(by_conn.values()) == [2, 2, 2, 4] and {c[1] for c in by_conn} == {port}
    for r in found:
        assert r.first_token_ns is not None and r.sent_ns is not None
        before, after = windows[r.trace_id]
        # the capture clock is the client's time.time_ns() clock
        assert before <= r.post_ns <= r.sent_ns < r.first_token_ns <= after
        wire_ttft_ns = r.first_token_ns - r.post_ns
        server = log[r.trace_id]  # perf_counter_ns: the server's view lies inside the wire's
        assert server["first_byte_ns"] - server["received_ns"] <= wire_ttft_ns
        assert FIRST_MS * 1e6 <= wire_ttft_ns < 200e6

"""When each HTTP request and its first token crossed the wire, from a packet capture on loopback.

A client stamps when its code handed a request to the kernel and when it read the first token
back; the server stamps when it parsed the request and began writing. The wire is the judge
between them: ``capture`` runs tcpdump on ``lo`` for one server port while a benchmark sends
its requests, and ``read_pcap`` finds in the capture, per request, the packet that began it
(its ``POST`` line) and the packet that completed the first SSE event carrying token text, so
either side's figures can be checked against when the bytes actually moved.

Times are the kernel's capture timestamps, ns on ``CLOCK_REALTIME`` (``time.time_ns()``'s
clock). tcpdump records ``lo`` on Linux as Ethernet with zeroed addresses. Each packet passes
the capture point twice there, leaving and arriving (tcpdump's "received by filter" counts
both); libpcap keeps the arriving copy, which the kernel stamps as the sender's write hands
the packet to the loopback device: within the sender's system call, before the receiver can
read the bytes.

The parser is our own (standard library only): pcap files, microsecond or nanosecond, either
byte order; Ethernet (what tcpdump records on ``lo`` on Linux), Linux cooked (SLL, SLL2),
BSD loopback (NULL, LOOP) and raw IP frames; IPv4 and IPv6; TCP reassembled per direction by
sequence number, so a retransmitted or duplicated segment counts once and an event split over
segments is still found (at the packet whose bytes complete it). Each direction is then parsed
as HTTP/1.1 messages, chunked bodies decoded (a chunk-size line may split an event), and the
n-th response on a connection paired with its n-th request: requests on a keep-alive
connection are answered in order, so every response byte belongs to the latest request sent
before its response began.
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_MAGIC_US, _MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
_NULL, _ETHERNET, _RAW, _LOOP, _SLL, _IPV4, _IPV6, _SLL2 = 0, 1, 101, 108, 113, 228, 229, 276
_LINKS = {_NULL: "NULL", _ETHERNET: "EN10MB", _RAW: "RAW", _LOOP: "LOOP", _SLL: "LINUX_SLL",
          _IPV4: "IPV4", _IPV6: "IPV6", _SLL2: "LINUX_SLL2"}
_IP_ETHERTYPES = (0x0800, 0x86DD)
_SYN, _ACK = 0x02, 0x10
_SEQ = 1 << 32
_REQUEST_LINE = re.compile(
    rb"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS|TRACE|CONNECT) \S+ HTTP/1\.[01]\r\n")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] \d{3}")
_MAX_HEAD = 1 << 16
"""A message head longer than this means the parser lost its place in the stream."""


@dataclass
class WireRequest:
    """One POST request seen on the wire.

    Attributes:
        conn: ``(client port, server port)`` of its TCP connection.
        post_ns: capture time of the first packet carrying its ``POST`` line (its first byte).
        first_token_ns: capture time of the packet whose bytes completed the first SSE event of
            its response carrying token text; None if none did.
        trace_id: the 32-hex trace id of its ``traceparent`` header; None without one.
        sent_ns: capture time of the packet carrying its last byte (head and body), when the
            server could first act on it; None if the capture ends before.
        syn_ns: for the first request of a connection whose opening was captured, the
            capture time of the client's SYN (a client that opened the connection for this
            request began it then); None otherwise.
    """

    conn: tuple[int, int]
    post_ns: int
    first_token_ns: int | None
    trace_id: str | None
    sent_ns: int | None = None
    syn_ns: int | None = None


# --- capturing ---------------------------------------------------------------------------

def _tcpdump() -> str | None:
    return shutil.which("tcpdump") or next(
        (p for p in ("/usr/sbin/tcpdump", "/usr/bin/tcpdump", "/sbin/tcpdump")
         if Path(p).is_file()), None)


_SNAPLEN = 16384
"""Bytes kept of each packet (``-s``): in immediate mode libpcap's ring has one frame of
this size per packet, so the whole 256 KiB default left 8 MiB room for 32 packets and the
kernel dropped some while a CPU-bound server shared the cores. A longer packet is refused
by `read_pcap`, never half read."""
_BUFFER_KIB = 131072
"""The capture's kernel buffer (``-B``, KiB): 8,192 frames."""


@contextmanager
def capture(port: int, path: Path, interface: str = "lo",
            start_timeout_s: float = 10.0) -> Iterator[None]:
    """Capture TCP port ``port`` on ``interface`` to the pcap file ``path`` meanwhile.

    tcpdump writes nanosecond timestamps, whole packets, each as soon as it has it (``-U``,
    ``--immediate-mode``: without the latter libpcap hands packets over a ring-buffer block at
    a time, and the packets of a block not yet handed over when tcpdump stops are lost), into
    a kernel buffer of `_BUFFER_KIB` (``-B``) holding `_SNAPLEN`-byte frames. It yields
    once tcpdump says it is listening, so whatever the body sends is captured. On exit it
    waits for the file to stop growing, stops tcpdump with SIGINT (which makes it flush and
    print its counts) and raises RuntimeError if the
    kernel dropped packets: a capture with holes would silently lose requests.
    """
    exe = _tcpdump()
    if exe is None:
        raise RuntimeError("tcpdump is not installed")
    cmd = [exe, "-i", interface, "-w", str(path), "--time-stamp-precision=nano",
           "-B", str(_BUFFER_KIB), "-s", str(_SNAPLEN), "-U", "--immediate-mode",
           f"tcp port {int(port)}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    lines: list[str] = []
    listening = threading.Event()

    def pump() -> None:  # tcpdump's stderr: "listening on ...", then its counts at the end
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace").rstrip())
            if lines[-1].startswith("tcpdump: listening on"):
                listening.set()
        listening.set()  # it ended

    reader = threading.Thread(target=pump, name="tcpdump-stderr", daemon=True)
    reader.start()
    try:
        listening.wait(start_timeout_s)
        if not any(line.startswith("tcpdump: listening on") for line in lines):
            raise RuntimeError(f"tcpdump did not start capturing: {' / '.join(lines)!r}")
        yield
        _settle(path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5.0)
        assert proc.stderr is not None
        proc.stderr.close()
    counts = {m[2]: int(m[1]) for line in lines
              if (m := re.fullmatch(r"(\d+) packets? (captured|received by filter|dropped by "
                                    r"kernel)", line))}
    if proc.returncode != 0 or "dropped by kernel" not in counts:
        raise RuntimeError(f"tcpdump failed (exit {proc.returncode}): {' / '.join(lines)!r}")
    if counts["dropped by kernel"]:
        raise RuntimeError(f"tcpdump: {counts['dropped by kernel']} packets dropped by kernel; "
                           f"the capture in {path} is incomplete")


def _settle(path: Path, quiet_s: float = 0.05, limit_s: float = 2.0) -> None:
    """Wait until ``path`` has not grown for ``quiet_s`` (tcpdump has written what it has)."""
    deadline = time.monotonic() + limit_s
    size = -1
    while time.monotonic() < deadline:
        now = path.stat().st_size if path.exists() else 0
        if now == size:
            return
        size = now
        time.sleep(quiet_s)


def capture_available(interface: str = "lo") -> str | None:
    """None when a capture on ``interface`` works here, else why not.

    Tries one: a listening socket on a free loopback port, a connection to it captured, and
    the capture read back (tcpdump present, permitted, and writing frames this parser reads).
    """
    if _tcpdump() is None:
        return "tcpdump is not installed"
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as listener:
        listener.settimeout(5.0)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        path = Path(tmp) / "probe.pcap"
        try:
            with capture(port, path, interface):
                with socket.create_connection(("127.0.0.1", port), timeout=5.0) as client:
                    conn, _ = listener.accept()
                    client.sendall(b"x")
                    conn.recv(1)
                    conn.close()
            seen = sum(1 for seg in _segments(path) if port in (seg[3], seg[4]))
        except (OSError, RuntimeError, ValueError) as exc:
            return f"no capture on {interface}: {exc}"
    return None if seen else f"no capture on {interface}: tcpdump recorded no packets"


# --- pcap, link, IP and TCP --------------------------------------------------------------

def _records(f: BinaryIO, name: str) -> tuple[int, Iterator[tuple[int, bytes]]]:
    """The link type of the open pcap file ``f`` and its ``(time ns, frame)`` records."""
    head = f.read(24)
    for order in "<>":
        magic = struct.unpack(order + "I", head[:4])[0] if len(head) == 24 else 0
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        kind = "a pcapng file" if head[:4] == b"\n\r\r\n" else "no pcap file"
        raise ValueError(f"{name} is {kind} (tcpdump -w writes pcap)")
    link = struct.unpack(order + "I", head[20:24])[0] & 0xFFFF  # the rest: FCS flags
    if link not in _LINKS:
        raise ValueError(f"{name}: link type {link} is not one of {sorted(_LINKS.values())}")
    scale = 1000 if magic == _MAGIC_US else 1
    record = struct.Struct(order + "IIII")

    def records() -> Iterator[tuple[int, bytes]]:
        while len(h := f.read(16)) == 16:
            sec, frac, incl, orig = record.unpack(h)
            frame = f.read(incl)
            if len(frame) < incl:  # cut short: tcpdump stopped mid-write
                return
            if incl < orig:
                raise ValueError(f"{name}: a packet of {orig} bytes was captured as {incl} "
                                 "(the snapshot length): its stream cannot be followed")
            yield sec * 1_000_000_000 + frac * scale, frame
    return link, records()


def _ip(link: int, frame: bytes) -> bytes | None:
    """The IP packet a frame carries; None for anything else."""
    if link == _ETHERNET:
        off, kind = 14, int.from_bytes(frame[12:14], "big")
        while kind in (0x8100, 0x88A8) and len(frame) >= off + 4:  # VLAN tags
            kind, off = int.from_bytes(frame[off + 2:off + 4], "big"), off + 4
    elif link == _SLL:
        off, kind = 16, int.from_bytes(frame[14:16], "big")
    elif link == _SLL2:
        off, kind = 20, int.from_bytes(frame[0:2], "big")
    elif link in (_NULL, _LOOP):  # a 4-byte address family, in either byte order: skip it
        off, kind = 4, _IP_ETHERTYPES[0]
    else:
        off, kind = 0, _IP_ETHERTYPES[0]
    return frame[off:] if kind in _IP_ETHERTYPES else None


def _tcp(packet: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``(source address, destination address, TCP segment)`` of an IP packet; None when it
    carries no TCP or is a fragment."""
    if len(packet) < 20:
        return None
    if packet[0] >> 4 == 4:
        if packet[9] != 6 or int.from_bytes(packet[6:8], "big") & 0x3FFF:  # MF or an offset
            return None
        # the length drops any link-layer padding; 0 in a segmentation-offload super-packet
        end = int.from_bytes(packet[2:4], "big") or len(packet)
        return packet[12:16], packet[16:20], packet[(packet[0] & 15) * 4:end]
    if packet[0] >> 4 == 6 and len(packet) >= 40:
        nxt, off = packet[6], 40
        end = 40 + (int.from_bytes(packet[4:6], "big") or len(packet) - 40)
        while nxt in (0, 43, 60) and off + 8 <= end:  # hop-by-hop, routing, destination opts
            nxt, off = packet[off], off + (packet[off + 1] + 1) * 8
        return (packet[8:24], packet[24:40], packet[off:end]) if nxt == 6 else None
    return None


def _segments(path: Path) -> Iterator[tuple[int, bytes, bytes, int, int, int, int, bytes]]:
    """``(time ns, source, destination, source port, destination port, seq, flags,
    payload)`` of every TCP segment in the capture, in capture order."""
    with open(path, "rb") as f:
        link, frames = _records(f, str(path))
        for ts, frame in frames:
            packet = _ip(link, frame)
            found = _tcp(packet) if packet is not None else None
            if found is None or len(found[2]) < 20:
                continue
            src, dst, seg = found
            sport, dport, seq, _, off, flags = struct.unpack("!HHIIBB", seg[:14])
            yield ts, src, dst, sport, dport, seq, flags, seg[(off >> 4) * 4:]


class _Stream:
    """One direction of a TCP connection, put back in sequence order: duplicates and
    retransmitted bytes dropped, early (out-of-order) segments held until the gap fills."""

    def __init__(self) -> None:
        self.isn: int | None = None
        self.base: int | None = None  # sequence number of stream offset 0
        self.next = 0  # offset of the next byte due
        self.held: list[tuple[int, int, bytes, int]] = []  # (offset, arrival, data, time)
        self.arrivals = 0

    def segment(self, seq: int, syn: bool, payload: bytes, ts: int) -> list[tuple[bytes, int]]:
        """The bytes a segment makes available, in order, as ``(data, time ns of the packet
        that carried them)``; all of them are available from this packet on."""
        if syn:
            self.isn = seq
            if self.base is None:
                self.base = (seq + 1) % _SEQ
            seq = (seq + 1) % _SEQ  # a SYN's data (TCP fast open) follows its sequence number
        if not payload:
            return []
        if self.base is None:  # the capture began after the handshake
            self.base = seq
        delta = ((seq - self.base) % _SEQ - self.next % _SEQ) % _SEQ
        off = self.next + (delta - _SEQ if delta >= _SEQ // 2 else delta)
        if off > self.next:
            self.arrivals += 1
            bisect.insort(self.held, (off, self.arrivals, payload, ts))
            return []
        out = []
        for start, data, carried in [(off, payload, ts)] + self._ready(off + len(payload)):
            if start + len(data) > self.next:
                out.append((data[self.next - start:], carried))
                self.next = start + len(data)
        return out

    def _ready(self, end: int) -> list[tuple[int, bytes, int]]:
        """Held segments that start by ``end`` (the new edge, extended as they join)."""
        ready = []
        while self.held and self.held[0][0] <= end:
            start, _, data, carried = self.held.pop(0)
            ready.append((start, data, carried))
            end = max(end, start + len(data))
        return ready


# --- HTTP/1.1 --------------------------------------------------------------------------

class _Body:
    """One message body, decoded as its bytes arrive: a fixed length, chunked, or running to
    the connection's end."""

    def __init__(self, length: int | None, chunked: bool) -> None:
        self.left = length or 0
        self.mode = "chunked" if chunked else "close" if length is None else "length"
        self.state = "size"

    def take(self, buf: bytearray) -> tuple[bytes, int, bool]:
        """``(decoded data, bytes of buf consumed, whether the body ended)``."""
        if self.mode == "close":
            return bytes(buf), len(buf), False
        if self.mode == "length":
            n = min(self.left, len(buf))
            self.left -= n
            return bytes(buf[:n]), n, self.left == 0
        out, i = [], 0
        while True:
            if self.state == "data":
                n = min(self.left, len(buf) - i)
                out.append(bytes(buf[i:i + n]))
                i, self.left = i + n, self.left - n
                if self.left:
                    break
                self.state = "crlf"
            elif self.state == "crlf":
                if len(buf) - i < 2:
                    break
                if buf[i:i + 2] != b"\r\n":
                    raise ValueError("no CRLF after a chunk")
                i, self.state = i + 2, "size"
            else:  # a chunk-size line, or a trailer line (the empty one ends the body)
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if len(buf) - i > _MAX_HEAD:
                        raise ValueError("no end to a chunk-size or trailer line")
                    break
                line, i = bytes(buf[i:j]), j + 2
                if self.state == "trailer":
                    if not line:
                        return b"".join(out), i, True
                    continue
                self.left = int(line.split(b";")[0].strip(), 16)
                self.state = "data" if self.left else "trailer"
        return b"".join(out), i, False


@dataclass
class _Message:
    """A request or a (final) response found in a stream."""

    start_ns: int  # time of the packet carrying its first byte
    method: str = ""
    trace_id: str | None = None
    end_ns: int | None = None  # of the packet carrying its last byte
    token_ns: int | None = None  # responses: of the packet completing the first token event
    sse: bytearray | None = field(default=None, repr=False)  # responses: undispatched SSE
    data: list[bytes] = field(default_factory=list, repr=False)


class _Parser:
    """One direction of a connection as a sequence of HTTP/1.1 messages (requests from the
    client, responses from the server), fed its bytes in order."""

    start_line = _REQUEST_LINE

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0  # stream offset of buf[0]
        self.marks: deque[tuple[int, int]] = deque()  # (stream offset, time of its packet)
        self.messages: list[_Message] = []
        self.current: _Message | None = None
        self.body: _Body | None = None
        self.broken = False

    def feed(self, data: bytes, carried_ns: int, now_ns: int) -> None:
        """Take bytes carried by a packet at ``carried_ns``, available from ``now_ns`` on."""
        if self.broken:
            return
        self.marks.append((self.pos + len(self.buf), carried_ns))
        self.buf += data
        try:
            self._parse(now_ns)
        except ValueError:
            self.broken = True  # lost track of the messages: the rest of the stream is ignored

    def _consume(self, n: int) -> None:
        del self.buf[:n]
        self.pos += n
        while len(self.marks) > 1 and self.marks[1][0] <= self.pos:
            self.marks.popleft()

    def _carried_ns(self) -> int:
        """Time of the packet that carried the buffer's first byte."""
        while len(self.marks) > 1 and self.marks[1][0] <= self.pos:
            self.marks.popleft()
        return self.marks[0][1]

    def _parse(self, now_ns: int) -> None:
        while True:
            if self.body is None:  # a head
                end = self._head_end()
                if end < 0:
                    return
                lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
                message = _Message(self._carried_ns())
                self._consume(end + 4)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers.setdefault(name.strip().lower(), value.strip())
                self.body = self._head(message, lines[0], headers)
                if self.body is None:
                    continue  # an interim response: no body, not a message of its own
                self.current = message
            data, used, done = self.body.take(self.buf)
            self._consume(used)
            assert self.current is not None
            if data:
                self._data(self.current, data, now_ns)
            if not done:
                return
            self.current.end_ns = now_ns
            self.messages.append(self.current)
            self.body, self.current = None, None

    def _head_end(self) -> int:
        """Where the head at the buffer's start ends (its blank line), -1 while incomplete.
        Drops whatever comes before a start line: blank lines between messages, or the rest
        of a message the capture began in the middle of."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if self.start_line.match(self.buf):
                if end < 0 and len(self.buf) > _MAX_HEAD:
                    raise ValueError("a message head without an end")
                return end
            found = self.start_line.search(self.buf)
            if found is None:  # a start line begins a line: keep only what may begin one
                self._consume(max(self.buf.rfind(b"\n") + 1, len(self.buf) - _MAX_HEAD))
                return -1
            self._consume(found.start())

    def _head(self, message: _Message, line: str, headers: dict[str, str]) -> _Body | None:
        raise NotImplementedError

    def _data(self, message: _Message, data: bytes, now_ns: int) -> None:
        """Body bytes of ``message``, available from ``now_ns`` on."""

    @staticmethod
    def _length(headers: dict[str, str]) -> tuple[int | None, bool]:
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        return (int(length) if length is not None else None), chunked


class _Requests(_Parser):
    def _head(self, message: _Message, line: str, headers: dict[str, str]) -> _Body:
        message.method = line.split(" ", 1)[0]
        parts = headers.get("traceparent", "").split("-")
        if len(parts) >= 4 and re.fullmatch(r"[0-9a-fA-F]{32}", parts[1]):
            message.trace_id = parts[1].lower()
        length, chunked = self._length(headers)
        return _Body(length or 0, chunked)


class _Responses(_Parser):
    start_line = _STATUS_LINE

    def __init__(self, requests: _Requests) -> None:
        super().__init__()
        self.requests = requests

    def _head(self, message: _Message, line: str, headers: dict[str, str]) -> _Body | None:
        status = int(line.split(" ", 2)[1])
        if status == 101:
            raise ValueError("the connection switched protocols")
        if 100 <= status < 200:
            return None
        n = len(self.messages)  # its request: the n-th on the connection
        sent = self.requests.messages + [self.requests.current or _Message(0)]
        method = sent[n].method if n < len(sent) else ""
        length, chunked = self._length(headers)
        if method == "HEAD" or status in (204, 304):
            length, chunked = 0, False
        if "event-stream" in headers.get("content-type", "event-stream"):
            message.sse = bytearray()
        return _Body(length, chunked)

    def _data(self, message: _Message, data: bytes, now_ns: int) -> None:
        if message.sse is None:
            return
        message.sse += data
        while (j := message.sse.find(b"\n")) >= 0:
            line = bytes(message.sse[:j]).rstrip(b"\r")
            del message.sse[:j + 1]
            if line.startswith(b"data:"):
                message.data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line:  # the blank line that dispatches an event
                if message.data and _has_token(b"\n".join(message.data)):
                    message.token_ns, message.sse = now_ns, None  # the first is all we need
                    return
                message.data = []


def _has_token(data: bytes) -> bool:
    """Whether an SSE event's data is an OpenAI-style chunk with token text: a non-empty
    ``choices[i].text`` (completions) or ``choices[i].delta.content`` (chat). A role-only
    first chat chunk, a usage chunk and ``[DONE]`` are not."""
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    choices = obj.get("choices") if isinstance(obj, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        for text in (choice.get("text"), delta.get("content") if isinstance(delta, dict) else 0):
            if isinstance(text, str) and text:
                return True
    return False


class _Connection:
    def __init__(self, client_port: int, server_port: int) -> None:
        self.ports = (client_port, server_port)
        self.streams = (_Stream(), _Stream())  # client -> server, server -> client
        self.requests = _Requests()
        self.parsers: tuple[_Parser, _Parser] = (self.requests, _Responses(self.requests))
        self.syn_ns: int | None = None

    def segment(self, side: int, seq: int, flags: int, payload: bytes, ts: int) -> None:
        if side == 0 and flags & (_SYN | _ACK) == _SYN and self.syn_ns is None:
            self.syn_ns = ts
        for data, carried in self.streams[side].segment(seq, bool(flags & _SYN), payload, ts):
            self.parsers[side].feed(data, carried, ts)

    def found(self) -> Iterator[WireRequest]:
        requests, responses = self.requests.messages, self.parsers[1].messages
        if self.requests.current is not None:  # the capture ended in its body
            requests = requests + [self.requests.current]
        # responses to requests sent before the capture began come before the first request
        while responses and requests and responses[0].start_ns < requests[0].start_ns:
            responses = responses[1:]
        current = self.parsers[1].current
        if current is not None:  # the capture ended in its body
            responses = responses + [current]
        for i, request in enumerate(requests):
            if request.method == "POST":
                token_ns = responses[i].token_ns if i < len(responses) else None
                yield WireRequest(self.ports, request.start_ns, token_ns, request.trace_id,
                                  request.end_ns, self.syn_ns if i == 0 else None)


def read_pcap(path: Path, server_port: int) -> list[WireRequest]:
    """Every POST request to ``server_port`` in the capture ``path``, in the order sent, with
    the capture times of its first packet and of its first token (see the module docstring).

    Warns when it loses track of a connection's messages (a packet missing from the capture
    leaves a gap in its bytes; or they are not HTTP/1.1): its later requests, or their first
    tokens, cannot be found.
    """
    live: dict[tuple[bytes, int, bytes], _Connection] = {}
    done: list[_Connection] = []
    for ts, src, dst, sport, dport, seq, flags, payload in _segments(path):
        if dport == server_port:
            side, key = 0, (src, sport, dst)
        elif sport == server_port:
            side, key = 1, (dst, dport, src)
        else:
            continue
        conn = live.get(key)
        if conn is None or (side == 0 and flags & (_SYN | _ACK) == _SYN
                            and conn.streams[0].isn != seq
                            and (conn.streams[0].isn, conn.streams[0].base) != (None, None)):
            if conn is not None:  # the client reused the port for a new connection
                done.append(conn)
            conn = live[key] = _Connection(key[1], server_port)
        conn.segment(side, seq, flags, payload, ts)
    conns = done + list(live.values())
    lost = [c.ports for c in conns
            if any(s.held for s in c.streams) or any(p.broken for p in c.parsers)]
    if lost:
        warnings.warn(f"{path}: lost track of the HTTP/1.1 messages on connections {lost} "
                      "(bytes missing from the capture, or not HTTP/1.1); their later "
                      "requests or first tokens are not found", RuntimeWarning, stacklevel=2)
    return sorted((r for c in conns for r in c.found()), key=lambda r: r.post_ns)


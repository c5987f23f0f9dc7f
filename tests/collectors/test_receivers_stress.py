"""The OTLP receivers under a storm of bad bodies interleaved with valid exports.

Several concurrent senders over real loopback sockets, HTTP with keep-alive and fresh
connections, gRPC through a raw channel and the generated stub: every bad body is answered
with its error, never a 5xx, a reset or a hang; every span of the valid ones is stored exactly
once (HTTP into a real Parquet ``TraceWriter``, gRPC into a counting sink); the receiver
answers after the storm; memory stays bounded.

Memory is the process's resident set (``VmRSS``), sampled every 20 ms during the storm, not
``tracemalloc``: the bodies live in gRPC's C core, in pyarrow's memory pool and in socket
buffers, which ``tracemalloc`` does not see, and tracing every Python allocation would slow
the run several times over. RSS also counts one-off warm-up (the first Parquet part, lazy
imports, a malloc arena per busy thread: about 50 MiB on the first HTTP storm, a few MiB on
a repeat), so two bounds: the peak over the whole storm, and the growth over its second
half, once warm. The full runs send about 100 MiB of bad bodies in their second half (the
figures print with ``-s``), so a receiver that kept them would fail the second bound.
"""

from __future__ import annotations

import gzip
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from ttft.collectors import TraceWriter, otlp_receiver, read_spans
from ttft.collectors.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import TRACES_PATH, OTLPReceiver

SEED = 20_240_611
SENDERS = 8
SPANS_PER_REQUEST = 5
MAX_BODY_BYTES = 64 << 10  # small, so oversized bodies stay cheap to send
CALL_TIMEOUT_S = 10.0  # one request or call; a hang fails the test instead of stalling it
RUN_TIMEOUT_S = 240.0  # the whole storm
MEMORY_BOUND_BYTES = 150 << 20  # peak growth over the whole storm, warm-up included
WARM_BOUND_BYTES = 32 << 20  # growth over the storm's second half, once the receiver is warm
T0_NS = 1_700_000_000_000_000_000
PROTO = "application/x-protobuf"
JSON = "application/json"

SIZES = [pytest.param(1_000, 100, id="short"),
         pytest.param(10_000, 1_000, id="full", marks=pytest.mark.stress)]

HTTP_BAD = {  # kind -> the status it must get
    "random_proto": 400, "truncated_proto": 400, "invalid_json": 400, "json_not_request": 400,
    "bad_ids_json": 200, "not_gzip": 400, "truncated_gzip": 400, "bad_content_length": 400,
    "short_body": 400, "no_content_length": 411, "oversized": 413, "gzip_bomb": 413,
    "wrong_content_type": 415, "wrong_encoding": 415,
}
# bad_ids_json: one span of five has a bad trace id; it alone is rejected (partial success)
HTTP_GOOD = ["proto", "proto_gzip", "json", "json_gzip"]
GRPC_BAD = {
    "random_bytes": grpc.StatusCode.INVALID_ARGUMENT,
    "truncated": grpc.StatusCode.INVALID_ARGUMENT,
    "json_body": grpc.StatusCode.INVALID_ARGUMENT,  # OTLP/JSON sent as if it were protobuf
    "oversized": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "gzip_bomb": grpc.StatusCode.RESOURCE_EXHAUSTED,  # small on the wire, huge inflated
}
# gRPC itself takes 100-600 ms to refuse a message over its limit (it cancels the stream;
# measured with grpcio 1.85), so oversized calls come 1 in 10 to keep the short run short.
GRPC_BAD_TURNS = ["random_bytes", "truncated", "json_body", "gzip_bomb"] * 2 + [
    "random_bytes", "oversized"]
GRPC_GOOD = ["stub", "stub_gzip"]
GOOD = frozenset(HTTP_GOOD + GRPC_GOOD)
BOMB_BYTES = MAX_BODY_BYTES * 16
GZIP_BOMB = gzip.compress(b"\0" * BOMB_BYTES)


# ---------------------------------------------------------------- bodies


def span_ids(index: int) -> list[str]:
    """The span ids of valid request ``index``, unique across the run (never zero)."""
    return [f"{index * SPANS_PER_REQUEST + j + 1:016x}" for j in range(SPANS_PER_REQUEST)]


def trace_id(index: int) -> str:
    return f"{index + 1:032x}"


def valid_request(index: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    service = resource_spans.resource.attributes.add(key="service.name")
    service.value.string_value = "stress"
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "stress"
    for offset, span_id in enumerate(span_ids(index)):
        span = scope_spans.spans.add(name="step", kind=1)
        span.trace_id, span.span_id = bytes.fromhex(trace_id(index)), bytes.fromhex(span_id)
        span.start_time_unix_nano = T0_NS + index * 1_000 + offset
        span.end_time_unix_nano = span.start_time_unix_nano + 10
    return request


def valid_json(index: int) -> bytes:
    """OTLP/JSON with hex ids, as collectors and SDKs write it."""
    spans = [{"traceId": trace_id(index), "spanId": span_id, "name": "step", "kind": 1,
              "startTimeUnixNano": str(T0_NS + index * 1_000 + offset),
              "endTimeUnixNano": str(T0_NS + index * 1_000 + offset + 10)}
             for offset, span_id in enumerate(span_ids(index))]
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": "stress"}}]},
        "scopeSpans": [{"scope": {"name": "stress"}, "spans": spans}],
    }]}).encode()


def does_not_parse(data: bytes) -> bool:
    try:
        ExportTraceServiceRequest.FromString(data)
    except Exception:
        return True
    return False


def unparseable_bytes(rng: random.Random) -> bytes:
    """Random bytes that protobuf itself refuses (some random strings do parse)."""
    while True:
        data = rng.randbytes(rng.randint(1, 2_000))
        if does_not_parse(data):
            return data


def oversized_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randint(MAX_BODY_BYTES + 1, 8 * MAX_BODY_BYTES))


def truncated_proto(rng: random.Random, index: int) -> bytes:
    data = valid_request(index).SerializeToString()
    cut = data[:rng.randint(1, len(data) - 1)]  # one top-level field: every cut is broken
    assert does_not_parse(cut)
    return cut


@dataclass
class Send:
    """One HTTP request: how it goes on the wire and what it must get."""

    kind: str
    body: bytes
    headers: dict[str, str]
    expected: int
    spans: list[str] = field(default_factory=list)
    fresh: bool = False  # on a new connection, closed afterwards
    wire: str = "client"  # "client": http.client; "chunked": body without Content-Length;
    # "short": a raw socket that sends less than its Content-Length, then half-closes


def http_send(kind: str, index: int, rng: random.Random) -> Send:
    if kind in BAD_BODIES:
        return bad_body_send(kind, index, rng)
    if kind in HTTP_BAD:
        return bad_framing_send(kind, index, rng)
    assert kind in HTTP_GOOD
    body = valid_json(index) if kind.startswith("json") else (
        valid_request(index).SerializeToString())
    headers = {"Content-Type": JSON if kind.startswith("json") else PROTO}
    if kind.endswith("gzip"):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return Send(kind, body, headers, 200, span_ids(index), fresh=rng.random() < 0.2)


BAD_BODIES = frozenset(("random_proto", "truncated_proto", "invalid_json", "json_not_request",
                        "bad_ids_json", "oversized", "gzip_bomb"))
"""The bad HTTP kinds whose body is wrong; the others frame or label a good body wrongly."""


def bad_body_send(kind: str, index: int, rng: random.Random) -> Send:
    proto, js = {"Content-Type": PROTO}, {"Content-Type": JSON}
    expected = HTTP_BAD[kind]
    if kind == "random_proto":
        return Send(kind, unparseable_bytes(rng), proto, expected)
    if kind == "truncated_proto":
        return Send(kind, truncated_proto(rng, index), proto, expected)
    if kind == "invalid_json":
        text = valid_json(index)
        return Send(kind, text[:rng.randint(0, len(text) - 1)], js, expected)
    if kind == "json_not_request":
        body = rng.choice([b"[1, 2]", b'"resourceSpans"', b"null", b'{"resourceSpans": 7}',
                           b'{"resourceSpans": [{"scopeSpans": {"spans": 1}}]}'])
        return Send(kind, body, js, expected)
    if kind == "bad_ids_json":
        body = valid_json(index).replace(trace_id(index).encode(), b"zz" * 16, 1)
        return Send(kind, body, js, expected)
    if kind == "oversized":
        return Send(kind, oversized_bytes(rng), proto, expected)
    assert kind == "gzip_bomb"
    return Send(kind, GZIP_BOMB, {**proto, "Content-Encoding": "gzip"}, expected)


def bad_framing_send(kind: str, index: int, rng: random.Random) -> Send:
    proto = {"Content-Type": PROTO}
    expected = HTTP_BAD[kind]
    good = valid_request(index).SerializeToString()
    if kind == "not_gzip":
        return Send(kind, good, {**proto, "Content-Encoding": "gzip"}, expected)
    if kind == "truncated_gzip":
        packed = gzip.compress(good)
        return Send(kind, packed[:rng.randint(10, len(packed) - 1)],
                    {**proto, "Content-Encoding": "gzip"}, expected)
    if kind == "bad_content_length":  # '²' is a Latin-1 digit to str.isdigit, not to int()
        value = rng.choice(["-1", "1e3", "0x10", "²", f"{len(good)}, {len(good)}"])
        return Send(kind, good, {**proto, "Content-Length": value}, expected)
    if kind == "short_body":
        return Send(kind, good, proto, expected, wire="short")
    if kind == "no_content_length":
        return Send(kind, good, proto, expected, wire="chunked")
    if kind == "wrong_content_type":
        return Send(kind, good, {"Content-Type": "text/plain"}, expected)
    assert kind == "wrong_encoding"
    return Send(kind, gzip.compress(good), {**proto, "Content-Encoding": "br"}, expected)


def plan(n_bad: int, n_good: int, bad: list[str], good: list[str]) -> list[tuple[str, int]]:
    """``(kind, index)`` in a seeded shuffled order: bad kinds in turn, valid ones cycling."""
    items = [(bad[i % len(bad)], i) for i in range(n_bad)]
    items += [(good[i % len(good)], n_bad + i) for i in range(n_good)]
    random.Random(SEED).shuffle(items)
    return items


# ---------------------------------------------------------------- harness


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass
class Storm:
    """What a run of the senders gave: each item's outcome, and the figures."""

    outcomes: dict[int, object] = field(default_factory=dict, repr=False)
    bad_bytes: int = 0  # bad bodies sent, as they went on the wire
    duration_s: float = 0.0
    rss_before: int = 0  # resident set when the senders started
    rss_half: int = 0  # ... when half the items were answered (the receiver is warm)
    rss_peak: int = 0  # ... at most, sampled every 20 ms
    rss_after: int = 0  # ... when the senders were done

    def report(self, protocol: str, n_bad: int, n_good: int) -> None:
        """The figures worth keeping, shown with ``pytest -s``."""
        mib = 1 << 20
        print(f"\n{protocol} {n_bad} bad + {n_good} valid: {self.duration_s:.1f} s, bad bodies "
              f"{self.bad_bytes / mib:.0f} MiB; RSS {self.rss_before / mib:.0f} MiB before, "
              f"peak +{(self.rss_peak - self.rss_before) / mib:.1f} MiB, second half "
              f"+{(self.rss_after - self.rss_half) / mib:.1f} MiB")

    def check_memory(self) -> None:
        growth, warm_growth = self.rss_peak - self.rss_before, self.rss_after - self.rss_half
        assert growth < MEMORY_BOUND_BYTES, f"RSS peaked {growth >> 20} MiB above the start"
        assert warm_growth < WARM_BOUND_BYTES, f"RSS grew {warm_growth >> 20} MiB once warm"


def run_senders(items: list[tuple[str, int]],
                send_one: Callable[[int, str, int, Callable[[int], None]], object]) -> Storm:
    """Each of ``SENDERS`` threads sends every ``SENDERS``-th item, while the resident set
    is sampled.

    ``send_one(sender, kind, index, sent)`` returns the outcome or raises (an exception is
    kept as the outcome), and calls ``sent(n_bytes)`` with the size of the body it sends.
    Threads that do not finish within ``RUN_TIMEOUT_S`` fail the test.
    """
    storm = Storm()
    lock = threading.Lock()
    done = threading.Event()

    def work(sender: int) -> None:
        for kind, index in items[sender::SENDERS]:
            def sent(n_bytes: int, bad: bool = kind not in GOOD) -> None:
                with lock:
                    storm.bad_bytes += n_bytes * bad

            try:
                outcome = send_one(sender, kind, index, sent)
            except Exception as exc:  # recorded, and the assertions name it
                outcome = f"{type(exc).__name__}: {exc}"
            with lock:
                storm.outcomes[index] = outcome
                if len(storm.outcomes) == len(items) // 2:
                    storm.rss_half = rss_bytes()

    def sample() -> None:
        while not done.wait(0.02):
            storm.rss_peak = max(storm.rss_peak, rss_bytes())

    storm.rss_before = storm.rss_peak = rss_bytes()
    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    threads = [threading.Thread(target=work, args=(sender,), name=f"sender-{sender}",
                                daemon=True) for sender in range(SENDERS)]
    started_s = time.perf_counter()
    for thread in threads:
        thread.start()
    deadline_s = time.monotonic() + RUN_TIMEOUT_S
    for thread in threads:
        thread.join(max(0.0, deadline_s - time.monotonic()))
    storm.duration_s = time.perf_counter() - started_s
    done.set()
    sampler.join(CALL_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a sender hung"
    storm.rss_after = rss_bytes()
    storm.rss_peak = max(storm.rss_peak, storm.rss_after)
    return storm


def misses(items: list[tuple[str, int]], outcomes: dict[int, object],
           expected: Callable[[str], object]) -> Counter:
    """``(kind, expected, got)`` for every item that did not get its answer."""
    return Counter((kind, str(expected(kind)), str(outcomes.get(index)))
                   for kind, index in items if outcomes.get(index) != expected(kind))


# ---------------------------------------------------------------- HTTP


def status_over_client(connection: http.client.HTTPConnection, send: Send) -> int:
    """Sends on a keep-alive connection; after a failure the connection starts afresh."""
    body = iter([send.body]) if send.wire == "chunked" else send.body  # chunked: no length
    try:
        connection.request("POST", TRACES_PATH, body=body, headers=send.headers)
        response = connection.getresponse()
        response.read()
    except Exception:
        connection.close()
        raise
    return response.status


def status_over_short_body(port: int, send: Send) -> int:
    """Declares more bytes than it sends, then half-closes: the body ends early."""
    head = (f"POST {TRACES_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: {PROTO}\r\nContent-Length: {len(send.body) + 100}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_S) as sock:
        sock.sendall(head.encode() + send.body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("n_bad,n_good", SIZES)
def test_http_receiver_survives_a_storm_of_bad_bodies(tmp_path, n_bad, n_good):
    items = plan(n_bad, n_good, sorted(HTTP_BAD), HTTP_GOOD)
    path = tmp_path / "trace.parquet"
    writer = TraceWriter(path, flush_spans=2_000)
    receiver = OTLPReceiver(writer, port=0, max_body_bytes=MAX_BODY_BYTES).start()
    connections = [http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=CALL_TIMEOUT_S)
                   for _ in range(SENDERS)]

    def send_one(sender: int, kind: str, index: int, sent: Callable[[int], None]) -> int:
        send = http_send(kind, index, random.Random(SEED + index))
        sent(len(send.body))
        if send.wire == "short":
            return status_over_short_body(receiver.port, send)
        if not send.fresh:
            return status_over_client(connections[sender], send)
        fresh = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=CALL_TIMEOUT_S)
        try:
            return status_over_client(fresh, send)
        finally:
            fresh.close()

    try:
        storm = run_senders(items, send_one)
        final = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=CALL_TIMEOUT_S)
        last = http_send("proto", n_bad + n_good, random.Random(SEED))
        final_status = status_over_client(final, last)
        final.close()
    finally:
        for connection in connections:
            connection.close()
        stopped = receiver.stop()
        writer.close()

    expected = dict(HTTP_BAD) | dict.fromkeys(HTTP_GOOD, 200)
    assert misses(items, storm.outcomes, expected.get) == Counter()
    assert (final_status, stopped) == (200, True)
    valid = [index for kind, index in items if kind in HTTP_GOOD] + [n_bad + n_good]
    partial = [index for kind, index in items if kind == "bad_ids_json"]
    sent_ids = [span_id for index in valid for span_id in span_ids(index)]
    sent_ids += [span_id for index in partial for span_id in span_ids(index)[1:]]
    table = read_spans(path)
    stored = table.column("span_id").to_pylist()
    assert len(sent_ids) == (n_good + 1) * SPANS_PER_REQUEST + len(partial) * (
        SPANS_PER_REQUEST - 1)
    assert (table.num_rows, len(set(stored))) == (len(sent_ids), len(sent_ids))
    assert set(stored) == set(sent_ids)
    assert (receiver.requests, receiver.rejected) == (n_bad + n_good + 1, n_bad - len(partial))
    assert (receiver.spans_received, receiver.spans_rejected) == (len(sent_ids), len(partial))
    storm.report("HTTP", n_bad, n_good)
    storm.check_memory()


def test_a_body_that_stops_arriving_is_answered_408(monkeypatch):
    monkeypatch.setattr(otlp_receiver._Handler, "timeout", 0.5)  # the per-read socket timeout
    receiver = OTLPReceiver(lambda table: None, port=0).start()
    head = (f"POST {TRACES_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {JSON}\r\n"
            "Content-Length: 100\r\n\r\n{")
    try:
        with socket.create_connection(("127.0.0.1", receiver.port),
                                      timeout=CALL_TIMEOUT_S) as sock:
            sock.sendall(head.encode())  # one byte of a hundred, then nothing
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        stopped = receiver.stop()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {
        "code": 4, "message": "body not received within 0.5 s"}
    assert (stopped, receiver.requests, receiver.rejected) == (True, 1, 1)


# ---------------------------------------------------------------- gRPC


class CountingSink:
    """A thread-safe sink that keeps how often each span id arrived."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows = 0
        self.span_ids: Counter[str] = Counter()

    def __call__(self, table: pa.Table) -> None:
        ids = table.column("span_id").to_pylist()
        with self._lock:
            self.rows += len(ids)
            self.span_ids.update(ids)


def grpc_body(kind: str, index: int, rng: random.Random
              ) -> tuple[bytes, grpc.Compression | None]:
    """A bad message for the raw ``Export`` call, and the compression to send it with."""
    if kind == "random_bytes":
        return unparseable_bytes(rng), None
    if kind == "truncated":
        return truncated_proto(rng, index), None
    if kind == "json_body":
        body = valid_json(index)
        assert does_not_parse(body)
        return body, None
    if kind == "oversized":
        return oversized_bytes(rng), None
    assert kind == "gzip_bomb"
    return b"\0" * BOMB_BYTES, grpc.Compression.Gzip


def grpc_code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        response = call()
    except grpc.RpcError as exc:
        return exc.code()
    assert response == ExportTraceServiceResponse()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("n_bad,n_good", SIZES)
def test_grpc_receiver_survives_a_storm_of_bad_messages(n_bad, n_good):
    items = plan(n_bad, n_good, GRPC_BAD_TURNS, GRPC_GOOD)
    sink = CountingSink()
    receiver = OTLPGrpcReceiver(sink, port=0, max_message_bytes=MAX_BODY_BYTES).start()
    target = f"127.0.0.1:{receiver.port}"
    channels = [grpc.insecure_channel(target) for _ in range(SENDERS)]
    stubs = [TraceServiceStub(channel) for channel in channels]
    raw = [channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                               response_deserializer=ExportTraceServiceResponse.FromString)
           for channel in channels]

    def send_one(sender: int, kind: str, index: int, sent: Callable[[int], None]
                 ) -> grpc.StatusCode:
        if kind in GRPC_GOOD:
            compression = grpc.Compression.Gzip if kind == "stub_gzip" else None
            return grpc_code(lambda: stubs[sender].Export(
                valid_request(index), timeout=CALL_TIMEOUT_S, compression=compression))
        body, compression = grpc_body(kind, index, random.Random(SEED + index))
        sent(len(GZIP_BOMB) if compression else len(body))  # about what goes on the wire
        return grpc_code(lambda: raw[sender](body, timeout=CALL_TIMEOUT_S,
                                             compression=compression))

    try:
        storm = run_senders(items, send_one)
        with grpc.insecure_channel(target) as channel:
            final = grpc_code(lambda: TraceServiceStub(channel).Export(
                valid_request(n_bad + n_good), timeout=CALL_TIMEOUT_S))
    finally:
        for channel in channels:
            channel.close()
        stopped = receiver.stop()

    expected = dict(GRPC_BAD) | dict.fromkeys(GRPC_GOOD, grpc.StatusCode.OK)
    assert misses(items, storm.outcomes, expected.get) == Counter()
    assert (final, stopped) == (grpc.StatusCode.OK, True)
    valid = [index for kind, index in items if kind in GRPC_GOOD] + [n_bad + n_good]
    sent_ids = [span_id for index in valid for span_id in span_ids(index)]
    assert len(sent_ids) == (n_good + 1) * SPANS_PER_REQUEST
    assert sink.rows == len(sent_ids)
    assert sink.span_ids == Counter(sent_ids)  # each exactly once
    invalid = sum(1 for kind, _ in items if GRPC_BAD.get(kind) == grpc.StatusCode.INVALID_ARGUMENT)
    # gRPC answers RESOURCE_EXHAUSTED itself: those calls never reach the receiver
    assert (receiver.requests, receiver.rejected) == (n_good + 1 + invalid, invalid)
    assert (receiver.spans_received, receiver.spans_rejected) == (len(sent_ids), 0)
    storm.report("gRPC", n_bad, n_good)
    storm.check_memory()

"""``ttft trace`` stopped in the middle of its run, by Ctrl-C (SIGINT) and by SIGTERM: a real
``ttft`` process against a tiny SSE server on loopback (in this process) that answers the
first requests and holds the next one open, so the signal always comes while the load
generator waits. For the held request the server exports one span over OTLP/JSON to the
run's receiver, a child of its ``server`` span. Either the server never sends that span
(the child's parent never arrives, as a server cut off mid-request leaves it), or it sends
it half a second after the client hung up, as a server exporting in batches does when a
request ends; then a run that waits for the server's last spans holds it. The trace must
be readable, closed (no parts left behind) and hold the client spans of the requests the
server answered and of the held one, ended ``cancelled``; ``ttft trace`` says what it kept,
and ``ttft analyze`` counts the held request as a cancelled failure, not as a data-quality
defect."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.compute as pc
import pytest

from ttft.collectors import read_spans
from ttft.collectors.loadgen import CANCELLED_ERROR
from ttft.tracer.schema import OUTCOME_CANCELLED

ANSWERED = 3
"""The server answers this many completions; the next one it holds open until the end."""
REQUESTS = 8
TIMEOUT_S = 60.0
HELD_PARENT = "5e12e5e12e5e12e5"
"""The span id of the held request's ``server`` span, sent when its client hangs up."""


class SSEServer(ThreadingHTTPServer):
    """An OpenAI-style streaming server that records the trace id of each completion."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.answered: list[str] = []  # trace ids, in the order their responses ended
        self.received = 0
        self.held: str | None = None  # the trace id of the held completion
        self.receiver: str | None = None  # the run's OTLP/HTTP endpoint, once printed
        self.receiver_known = threading.Event()
        self.holding = threading.Event()  # the held completion's span went to the receiver
        self.release = threading.Event()
        self.server_span_after_s: float | None = None  # None: the server span never comes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up is no error here (``fit_to_server`` drops its other
        ``/tokenize`` calls once one got a 404; the interrupted run drops the held one)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SSEServer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def send_json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "sse", "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/completions":  # /tokenize: none here, prompts stay approximate
            self.send_json(404, {"error": {"message": "not found"}})
            return
        trace_id = self.headers["traceparent"].split("-")[1]
        with self.server.lock:
            index = self.server.received
            self.server.received += 1
        if index >= ANSWERED:
            self.server.held = trace_id
            now_ns = time.time_ns()
            export(self.server, trace_id, "a11ce0000000000a", HELD_PARENT, "queue",
                   now_ns, now_ns + 1_000_000)
            self.server.holding.set()
            self.connection.settimeout(TIMEOUT_S)
            with contextlib.suppress(OSError):
                self.rfile.read(1)  # until the client hangs up
            if self.server.server_span_after_s is not None:
                end_ns = time.time_ns()
                time.sleep(self.server.server_span_after_s)
                client_span = self.headers["traceparent"].split("-")[2]
                export(self.server, trace_id, HELD_PARENT, client_span, "server", now_ns,
                       end_ns)
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [{"id": f"cmpl-{index}", "choices": [{"index": 0, "text": text,
                                                       "finish_reason": finish}]}
                  for text, finish in (("Hello", None), (" there", "length"))]
        chunks.append({"id": f"cmpl-{index}", "choices": [],
                       "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
        for event in [*(json.dumps(c) for c in chunks), "[DONE]"]:
            data = f"data: {event}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        with self.server.lock:
            self.server.answered.append(trace_id)


def export(server: SSEServer, trace_id: str, span_id: str, parent_id: str, name: str,
           start_ns: int, end_ns: int) -> None:
    """Send the run's receiver one span over OTLP/JSON; a receiver already stopped is no
    error (the run did not wait for it)."""
    assert server.receiver_known.wait(TIMEOUT_S) and server.receiver
    span = {"traceId": trace_id, "spanId": span_id, "parentSpanId": parent_id,
            "name": name, "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end_ns)}
    body = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sse"}}]},
        "scopeSpans": [{"spans": [span]}]}]}
    request = urllib.request.Request(server.receiver, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            assert response.status == 200
    except OSError:
        assert name == "server", f"the receiver refused the {name} span"


def watch_receiver(server: SSEServer, stderr_path: Path, proc: subprocess.Popen) -> None:
    """Tell ``server`` the receiver endpoint ``ttft trace`` prints on stderr."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"receiving the server's spans on (\S+) ", stderr_path.read_text())
        if found:
            server.receiver = found.group(1)
            server.receiver_known.set()
            return
        time.sleep(0.02)


@contextmanager
def sse_server() -> Iterator[SSEServer]:
    server = SSEServer()
    thread = threading.Thread(target=server.serve_forever, name="sse-test", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT_S)


def ttft_command() -> list[str]:
    """The ``ttft`` console script beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name("ttft")
    found = str(beside) if beside.exists() else shutil.which("ttft")
    assert found, "the ttft command is not installed"
    return [found]


@pytest.mark.parametrize(("signum", "span_wait_s"), [(signal.SIGINT, 0), (signal.SIGTERM, 0),
                                                   (signal.SIGINT, 30)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-server-span-comes-late"])
def test_an_interrupted_trace_keeps_every_request_sent_and_cancels_the_one_in_flight(
        signum, span_wait_s, tmp_path):
    out = tmp_path / "run.parquet"
    stderr_path = tmp_path / "stderr.txt"
    with sse_server() as server, stderr_path.open("wb") as stderr_file:
        server.server_span_after_s = 0.5 if span_wait_s else None
        command = [*ttft_command(), "trace", server.url, "-o", str(out), "--concurrency", "1",
                   "--requests", str(REQUESTS), "--warmup", "0", "--prompt-tokens", "4",
                   "--output-tokens", "2", "--receiver-port", "0", "--span-wait", str(span_wait_s),
                   "--timeout", str(TIMEOUT_S)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr_file,
                                start_new_session=True)
        try:
            watch_receiver(server, stderr_path, proc)
            # one request in flight at a time: the held one went out after the answered
            # ones ended at the client, and its span reached the receiver
            assert server.holding.wait(TIMEOUT_S), stderr_path.read_text()[-2000:]
            proc.send_signal(signum)
            proc.wait(TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT_S)
        answered, held = list(server.answered), server.held
        assert server.received == ANSWERED + 1
    stderr = stderr_path.read_text()
    # stopped as by Ctrl-C (the CLI's exit status for it), not killed by the signal
    assert proc.returncode == 130, stderr[-2000:]
    assert out.is_file() and not Path(f"{out}.parts").exists(), stderr[-2000:]
    table = read_spans(out)
    assert stderr.splitlines()[-1] == (
        f"interrupted: {ANSWERED} requests done (0 failed), 1 in flight cancelled, "
        f"{REQUESTS - ANSWERED - 1} not sent; trace written to {out} "
        f"({table.num_rows:,} span rows)")
    clients = table.filter(pc.equal(table.column("stage"), "client"))
    outcomes = {tid: json.loads(attrs)["outcome"] for tid, attrs in zip(
        clients.column("trace_id").to_pylist(), clients.column("attributes").to_pylist(),
        strict=True)}
    assert outcomes == {**dict.fromkeys(answered, "ok"), held: OUTCOME_CANCELLED}
    first_tokens = table.filter(pc.equal(table.column("name"), "first_token"))
    assert sorted(first_tokens.column("trace_id").to_pylist()) == sorted(answered)
    assert set(first_tokens.column("parent_id").to_pylist()) <= set(
        clients.column("span_id").to_pylist())
    queue = table.filter(pc.equal(table.column("stage"), "queue"))
    assert queue.column("trace_id").to_pylist() == [held]
    assert queue.column("parent_id").to_pylist() == [HELD_PARENT]
    # the held request's server span, sent 0.5 s after the stop, is kept: the run waited
    # for the server's last spans. Else its queue span's parent is not in the trace.
    servers = table.filter(pc.equal(table.column("stage"), "server"))
    assert servers.column("span_id").to_pylist() == ([HELD_PARENT] if span_wait_s else [])
    # every row belongs to a request that was sent; none of the four not sent left any
    assert set(table.column("trace_id").to_pylist()) == {*answered, held}

    analyzed = subprocess.run([*ttft_command(), "analyze", str(out), "--json"],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    summary = json.loads(analyzed.stdout)
    assert (summary["requests"], summary["requests_ok"]) == (ANSWERED + 1, ANSWERED)
    assert summary["failures"] == {OUTCOME_CANCELLED: 1}
    assert summary["failure_examples"][OUTCOME_CANCELLED] == [
        {"trace_id": held, "status_code": None, "error": CANCELLED_ERROR}]
    # a cancelled request is an outcome: no defect at all, no_window and orphan_parent least
    assert summary["quality"] == dict.fromkeys(summary["quality"], 0)

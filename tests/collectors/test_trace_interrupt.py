"""``ttft trace`` stopped in the middle of its run, by Ctrl-C (SIGINT) and by SIGTERM: a real
``ttft`` process against a tiny SSE server on loopback (in this process) that answers the
first requests and holds the next one open, so the signal always comes while the load
generator waits. The trace it leaves must be readable, closed (no parts left behind) and
hold the client spans of exactly the requests the server answered."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.compute as pc
import pytest

from ttft.collectors import read_spans

ANSWERED = 3
"""The server answers this many completions; the next one it holds open until the end."""
TIMEOUT_S = 60.0


class SSEServer(ThreadingHTTPServer):
    """An OpenAI-style streaming server that records the trace id of each completion."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.answered: list[str] = []  # trace ids, in the order their responses ended
        self.received = 0
        self.holding = threading.Event()  # a completion arrived after the answered ones
        self.release = threading.Event()

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
            self.server.holding.set()
            self.server.release.wait(TIMEOUT_S)
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [{"id": f"cmpl-{index}", "choices": [{"index": 0, "text": text}]}
                  for text in ("Hello", " there")]
        chunks.append({"id": f"cmpl-{index}", "choices": [],
                       "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
        for event in [*(json.dumps(c) for c in chunks), "[DONE]"]:
            data = f"data: {event}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        with self.server.lock:
            self.server.answered.append(trace_id)


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_trace_keeps_every_finished_requests_client_spans(signum, tmp_path):
    out = tmp_path / "run.parquet"
    with sse_server() as server:
        command = [*ttft_command(), "trace", server.url, "-o", str(out), "--concurrency", "1",
                   "--requests", "8", "--warmup", "0", "--prompt-tokens", "4",
                   "--output-tokens", "2", "--receiver-port", "0", "--span-wait", "0",
                   "--timeout", str(TIMEOUT_S)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            # one request in flight at a time: the held one went out after the answered
            # ones ended at the client
            assert server.holding.wait(TIMEOUT_S), proc.stderr.read().decode()[-2000:]
            proc.send_signal(signum)
            _, stderr = proc.communicate(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT_S)
        answered = list(server.answered)
        assert server.received == ANSWERED + 1
    # stopped as by Ctrl-C (the CLI's exit status for it), not killed by the signal
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert out.is_file() and not Path(f"{out}.parts").exists(), stderr.decode()[-2000:]
    table = read_spans(out)
    clients = table.filter(pc.equal(table.column("stage"), "client"))
    first_tokens = table.filter(pc.equal(table.column("name"), "first_token"))
    assert sorted(clients.column("trace_id").to_pylist()) == sorted(answered)
    assert sorted(first_tokens.column("trace_id").to_pylist()) == sorted(answered)
    assert set(first_tokens.column("parent_id").to_pylist()) == set(
        clients.column("span_id").to_pylist())
    # every client row of the trace belongs to a request that ended (the held one left none)
    assert set(table.column("trace_id").to_pylist()) == set(answered)

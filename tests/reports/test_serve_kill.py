"""`ttft serve --trace-out` under SIGKILL: a kill at any moment leaves a readable trace
(empty before any span), and loses at most about the last second of spans: every request
that finished more than that before the kill is in it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pyarrow.compute as pc

from ttft.collectors import read_spans

TIMEOUT_S = 60.0
SETTLE_S = 2.0  # > the flush cadence (0.5 s at the tracer, 0.5 s at the writer) with margin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(trace, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "ttft.reports.cli", "serve", "--model", "tiny", "--port",
         str(port), "--device", "cpu", "--trace-out", str(trace)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "TTFT_SKIP_PEAKS": "1"},
    )
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, "ttft serve exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("ttft serve did not start")


def _kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(TIMEOUT_S)


def test_a_kill_before_any_request_leaves_a_readable_trace(tmp_path):
    trace = tmp_path / "server.parquet"
    _kill(_serve(trace, _free_port()))  # killed as soon as it answers
    table = read_spans(trace)  # the parts directory the killed writer left
    assert table.filter(pc.equal(table.column("stage"), "server")).num_rows == 0


def test_a_kill_loses_no_request_that_finished_a_second_before(tmp_path):
    trace = tmp_path / "server.parquet"
    port = _free_port()
    process = _serve(trace, port)
    finished = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT_S) as client:
            for i in range(6):
                answer = client.post("/v1/completions", json={
                    "model": "tiny", "prompt": f"Once upon a time {i}", "max_tokens": 4})
                assert answer.status_code == 200
                finished.append(answer.json()["id"])
        time.sleep(SETTLE_S)
    finally:
        _kill(process)
    table = read_spans(trace)
    servers = table.filter(pc.equal(table.column("stage"), "server"))
    kept = set(servers.column("request_id").to_pylist())
    assert set(finished) <= kept, sorted(set(finished) - kept)
    assert all(json.loads(a).get("http.status_code") == 200
               for a in servers.column("attributes").to_pylist())

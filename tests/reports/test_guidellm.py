"""`ttft trace` against guidellm's mock server, an OpenAI-compatible server nobody here wrote
(``guidellm mock-server --ttft-ms 80 --itl-ms 5``): the client's TTFT and inter-token gaps
come back as the server was told to make them, and no request fails.

guidellm pins its own dependencies, so it lives in a virtual environment of its own:
``.ci/run`` installs it and names its executable in ``TTFT_GUIDELLM``; else the one on
``PATH`` is used. Without one the test skips, except under CI, where that is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _live import wait_healthy
from typer.testing import CliRunner

from ttft.collectors import read_spans, run_metadata
from ttft.engine.server import free_port
from ttft.reports.cli import app

TTFT_MS = 80.0
ITL_MS = 5.0
TTFT_P50_MS = (79.0, 91.0)
"""The issue's bounds on the client's TTFT p50; measured: 84.2-87.1 ms (80 ms of sleep, then
Sanic's response start and the first chunk's write, read by the client)."""
START_TIMEOUT_S = 90.0
"""guidellm imports transformers before it listens: about 8 s on a quiet 2-core machine."""
STOP_TIMEOUT_S = 10.0
ITL_MEDIAN_MS = (4.5, 7.0)
ITL_EACH_MS = (4.5, 8.0)
"""Bounds on each request's mean gap between content chunks (the median over requests, and
every request). The server sleeps 5 ms between chunks, so nothing comes back much below 5 ms
(0.1 ms for the clock); above it, asyncio.sleep's overshoot and Sanic's write give medians
of 5.2-5.3 ms on a quiet 2-core machine, and up to 6.6 ms (single requests 7.1 ms) with its
load average at 4 from other work. Below 5 ms only by a late first chunk: with the load
average at 10, a first chunk read 3-4 ms late shortened every request's mean gap over the
15 after it to 4.77-5.18 ms (the bound 4.5 ms still fails a client that squeezed gaps)."""


def guidellm_path() -> str:
    """The guidellm executable; skips (fails under CI) when there is none."""
    path = os.environ.get("TTFT_GUIDELLM") or shutil.which("guidellm")
    if path is None:
        message = ("no guidellm (python3 -m venv V && V/bin/pip install guidellm; "
                   "TTFT_GUIDELLM=V/bin/guidellm)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextlib.contextmanager
def mock_server(executable: str, log: Path) -> Iterator[str]:
    """guidellm's mock server on a free loopback port; yields its base URL once ``/health``
    answers (at most ``START_TIMEOUT_S``) and stops it (its whole process group) after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [executable, "mock-server", "--host", "127.0.0.1", "--port", str(port),
             "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(proc, url, log, START_TIMEOUT_S)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)


def request_gaps_ms(table) -> list[float]:
    """Each request's mean gap between its content chunks (client events), in ms."""
    events = table.filter(pc.is_in(table.column("name"), pa.array(["first_token", "token"])))
    by_trace: dict[str, list[int]] = {}
    for trace_id, ns in zip(events.column("trace_id").to_pylist(),
                            events.column("start_ns").to_pylist(), strict=True):
        by_trace.setdefault(trace_id, []).append(ns)
    return [float(np.diff(sorted(ns)).mean()) / 1e6 for ns in by_trace.values() if len(ns) > 1]


def test_trace_against_guidellms_mock_server(tmp_path):
    executable = guidellm_path()
    out = tmp_path / "guidellm.parquet"
    with mock_server(executable, tmp_path / "guidellm.log") as url:
        result = CliRunner().invoke(app, [
            "trace", url, "--concurrency", "2", "--requests", "20", "--output-tokens", "16",
            "--receiver-port", "0", "--span-wait", "0", "--json", "-o", str(out),
        ])
    assert result.exit_code == 0, result.output
    assert "20 requests (0 failed)" in result.output
    summary = json.loads(result.stdout)
    table = read_spans(out)
    meta = run_metadata(table)
    assert meta["server"]["model"] == meta["server"]["models"]["data"][0]["id"]
    # its /tokenize wants {"text"}: none of the three dialects, so lengths are approximate
    assert meta["prompt_lengths"].startswith("approximate") and meta["prompt_tokenizer"] is None
    clients = [json.loads(a) for a in table.filter(
        pc.equal(table.column("stage"), "client")).column("attributes").to_pylist()]
    assert len(clients) == 20
    assert {(a["outcome"], a["status_code"]) for a in clients} == {("ok", 200)}
    assert {(a["content_chunks"], a["completion_tokens"]) for a in clients} == {(16, 16)}
    assert summary["boundary"] == "client" and summary["requests"] == 20
    assert TTFT_P50_MS[0] <= summary["ttft_ms"]["p50"] <= TTFT_P50_MS[1], summary["ttft_ms"]
    gaps_ms = request_gaps_ms(table)
    assert len(gaps_ms) == 20
    assert ITL_MEDIAN_MS[0] <= float(np.median(gaps_ms)) <= ITL_MEDIAN_MS[1], gaps_ms
    assert all(ITL_EACH_MS[0] <= g <= ITL_EACH_MS[1] for g in gaps_ms), gaps_ms

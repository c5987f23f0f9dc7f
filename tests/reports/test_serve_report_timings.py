"""`ttft serve --report-timings` (a real process on loopback, exporting no spans), traced by
`ttft trace`, then `ttft analyze`: the timings the server put in its streams' final chunks
become estimated ``queue`` and ``prefill`` spans, so the analysis names them instead of one
``untraced`` part (docs/attribution.md, "Server-reported timings")."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from _live import stop, wait_healthy
from test_serve import free_port, ttft_script
from typer.testing import CliRunner

from ttft.reports.cli import app

runner = CliRunner()
REQUESTS = 6
QUEUE_MS = 30


def test_reported_timings_name_queue_and_prefill_without_otlp(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "run.parquet"
    env = {**os.environ, "TTFT_CACHE_DIR": str(tmp_path / "cache")}
    with (tmp_path / "serve.log").open("w") as log:
        server = subprocess.Popen(
            [ttft_script(), "serve", "--model", "tiny", "--device", "cpu", "--port", str(port),
             "--report-timings", "--inject-delay", f"queue={QUEUE_MS}"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(server, url, tmp_path / "serve.log")
            traced = runner.invoke(app, [
                "trace", url, "--concurrency", "2", "--requests", str(REQUESTS),
                "--prompt-tokens", "16:48", "--output-tokens", "4", "--receiver-port", "0",
                "--span-wait", "0", "-o", str(out)])
        finally:
            stop(server, signal.SIGINT)
    assert traced.exit_code == 0, traced.output
    said = " ".join(traced.output.split())  # as wrapped to the terminal's width
    assert ("the server sent no spans to http://127.0.0.1:" in said
            and f"the analysis below is the client's view and the timings the server reported "
            f"in {REQUESTS} of its responses (estimated spans)" in said)
    analysed = runner.invoke(app, ["analyze", str(out), "--json"])
    assert analysed.exit_code == 0, analysed.output
    summary = json.loads(analysed.stdout)
    assert summary["failures"] == {} and summary["requests_ok"] == REQUESTS
    named = {stage for stage, s in summary["stages"].items() if s["mean"] > 0}
    assert {"queue", "prefill"} <= named <= {"queue", "prefill", "untraced"}
    assert summary["stages"]["queue"]["p50"] >= QUEUE_MS  # the injected wait, as reported
    assert summary["stages"]["untraced"]["share"] < 0.5
    assert summary["quality"]["estimated_span"] == 2 * REQUESTS
    printed = runner.invoke(app, ["analyze", str(out)])
    assert "estimated_span" in printed.stdout

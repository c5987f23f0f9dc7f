"""`ttft serve` end to end: a real process on loopback, the openai client, SIGINT, then the
trace it wrote analyzed by `ttft analyze`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
from _live import stop, wait_healthy

from ttft.collectors import read_spans

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ttft_script() -> str:
    beside = Path(sys.executable).parent / "ttft"
    return str(beside) if beside.exists() else "ttft"


def test_serve_trace_and_analyze(tmp_path):
    port = free_port()
    trace = tmp_path / "server.parquet"
    env = {**os.environ, "TTFT_CACHE_DIR": str(tmp_path / "cache")}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [
            ttft_script(),
            "serve",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--trace-out",
            str(trace),
            "--inject-delay",
            "queue=30",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}", tmp_path / "serve.log")
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30
        )
        for i in range(3):
            stream = client.completions.create(
                model="tiny",
                prompt=f"Once upon a time {i}",
                max_tokens=4,
                stream=True,
                extra_headers={"traceparent": PARENT} if i == 0 else None,
            )
            assert "".join(c.choices[0].text for c in stream if c.choices)
        client.close()
    finally:
        try:
            stop(server, signal.SIGINT)
        finally:
            log.close()
    # 130 = 128 + SIGINT: uvicorn re-raises the signal after a clean shutdown
    assert server.returncode in (0, 130), (tmp_path / "serve.log").read_text()
    done = subprocess.run(
        [ttft_script(), "analyze", str(trace), "--json", "--boundary", "server"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["requests"] == 3  # /health polls are not traced
    rows = read_spans(trace).to_pandas()
    assert "0af7651916cd43dd8448eb211c80319c" in set(rows[rows.name == "server"].trace_id)
    # the injected 30 ms queue delay shows up as queue time in every request
    assert out["stages"]["queue"]["p50"] >= 30.0
    assert out["quality"]["no_window"] == 0
    engine = subprocess.run(
        [ttft_script(), "analyze", str(trace), "--json", "--boundary", "engine"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(engine.stdout)["stages"]["queue"]["p50"] >= 30.0


def test_sigterm_shuts_down_and_writes_the_trace_file(tmp_path):
    """Found: uvicorn re-raises the signal it stopped on, and SIGTERM's default action then
    killed the process before the tracer flushed: only FILE.parts/ was left, never FILE."""
    port = free_port()
    trace = tmp_path / "server.parquet"
    env = {**os.environ, "TTFT_CACHE_DIR": str(tmp_path / "cache")}
    with (tmp_path / "serve.log").open("w") as log:
        server = subprocess.Popen(
            [ttft_script(), "serve", "--model", "tiny", "--device", "cpu", "--port", str(port),
             "--trace-out", str(trace)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(server, f"http://127.0.0.1:{port}", tmp_path / "serve.log")
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                               json={"model": "tiny", "prompt": "hello there", "max_tokens": 3})
            assert reply.status_code == 200
        finally:
            stop(server, signal.SIGTERM)
    assert server.returncode == 128 + signal.SIGTERM, (tmp_path / "serve.log").read_text()
    assert trace.is_file() and not Path(f"{trace}.parts").exists()
    assert read_spans(trace).num_rows > 0


def test_serve_with_recompute_preemption_preempts_and_answers_as_without(tmp_path):
    # 4 prompts of 40 tokens (3 blocks of 16 each) at once over 12 blocks: admitted
    # together, they need 5 blocks each by their 40th token, so some are preempted.
    port = free_port()
    trace = tmp_path / "server.parquet"
    env = {**os.environ, "TTFT_CACHE_DIR": str(tmp_path / "cache")}
    prompts = [[(37 * i + 11 * k) % 2000 + 10 for k in range(40)] for i in range(4)]
    with (tmp_path / "serve.log").open("w") as log:
        server = subprocess.Popen(
            [ttft_script(), "serve", "--model", "tiny", "--device", "cpu", "--port", str(port),
             "--trace-out", str(trace), "--preemption", "recompute", "--kv-blocks", "12"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(server, f"http://127.0.0.1:{port}", tmp_path / "serve.log")

            def complete(prompt: list[int]) -> str:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
                    "model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0})
                assert reply.status_code == 200, reply.text
                return reply.json()["choices"][0]["text"]

            # Three rounds at once: on a loaded machine one round's requests can arrive so
            # far apart that the first is done before the last is admitted.
            with ThreadPoolExecutor(len(prompts)) as pool:
                rounds = [list(pool.map(complete, prompts)) for _ in range(3)]
            alone = [complete(p) for p in prompts]  # one at a time: nothing to preempt
        finally:
            stop(server, signal.SIGINT)
    log_text = (tmp_path / "serve.log").read_text()
    assert "recompute preemption" in log_text, log_text
    assert rounds == [alone] * 3
    rows = read_spans(trace).to_pandas()
    preempted = rows[rows.stage == "preempted"]
    assert len(preempted) >= 1
    attrs = [json.loads(a) for a in preempted.attributes]
    assert all(a["blocks_freed"] >= 1 and a["preempted_by"] for a in attrs)


def test_serve_refuses_a_bad_preemption_mode_before_binding():
    from typer.testing import CliRunner

    from ttft.reports.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["serve", "--preemption", "swap"])
    assert bad.exit_code == 2 and "--preemption 'swap': expected off or recompute" in bad.stderr
    both = runner.invoke(app, ["serve", "--preemption", "recompute", "--disaggregate"])
    assert both.exit_code == 2
    assert "--preemption recompute is not supported with --disaggregate" in both.stderr

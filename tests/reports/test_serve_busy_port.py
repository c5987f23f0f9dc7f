"""`ttft serve` binds its port before it loads the model: a port in use is one line naming
it, and comes before a normal start would even have its model."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def ttft_script() -> str:
    beside = Path(sys.executable).parent / "ttft"
    return str(beside) if beside.exists() else "ttft"


def _serve(port: int, cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [ttft_script(), "serve", "--model", "tiny", "--device", "cpu", "--port", str(port)],
        env={**os.environ, "TTFT_CACHE_DIR": str(cache)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)


def _until_serving_s(cache: Path) -> float:
    """Seconds from launch until a normal start has loaded its model."""
    started = time.perf_counter()
    server = _serve(0, cache)
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if line.startswith("serving model"):
                return time.perf_counter() - started
        raise AssertionError(f"ttft serve exited with {server.wait()} before serving")
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=60)


def test_a_busy_port_fails_before_the_model_loads(tmp_path):
    normal_s = _until_serving_s(tmp_path / "cache")  # also fills the tokenizer cache
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.perf_counter()
        server = _serve(port, tmp_path / "cache")
        _, stderr = server.communicate(timeout=60)
        busy_s = time.perf_counter() - started
    assert server.returncode == 2
    assert stderr.strip() == f"error: cannot serve on 127.0.0.1:{port}: Address already in use"
    assert busy_s < normal_s, (busy_s, normal_s)  # the model was never loaded

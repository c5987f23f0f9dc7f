"""`ttft collect` takes its bearer token from ``TTFT_COLLECT_TOKEN``, so it stays out of argv."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx

TIMEOUT_S = 15.0
RUN_S = 30  # --duration: bounds the blocking reads of the process's stderr below


def test_the_token_comes_from_the_environment(tmp_path):
    with subprocess.Popen(
        [sys.executable, "-m", "ttft.reports.cli", "collect", "--http-port", "0", "--no-grpc",
         "-o", str(tmp_path / "spans"), "--duration", str(RUN_S)],
        env={**os.environ, "TTFT_COLLECT_TOKEN": "s3cret"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as process:
        try:
            url = next(match.group(1) for line in process.stderr
                       if (match := re.search(r"OTLP/HTTP listening on (\S+)$", line.rstrip())))
            proto = {"Content-Type": "application/x-protobuf"}
            without = httpx.post(url, content=b"", headers=proto, timeout=TIMEOUT_S)
            wrong = httpx.post(url, content=b"", timeout=TIMEOUT_S,
                               headers={**proto, "Authorization": "Bearer nope"})
            right = httpx.post(url, content=b"", timeout=TIMEOUT_S,
                               headers={**proto, "Authorization": "Bearer s3cret"})
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0
    assert [r.status_code for r in (without, wrong, right)] == [401, 401, 200]
    assert "s3cret" not in " ".join(process.args)

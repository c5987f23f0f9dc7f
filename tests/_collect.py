"""A real ``ttft collect`` process on loopback, for tests that start, signal or kill one,
and the large exports they send it.

Importable from every test module (``tests/`` is on ``sys.path`` through its conftest)."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TIMEOUT_S = 60.0  # a deadline to start and stop, not a timing: a loaded machine is slow


def one_scope_export(n_spans: int) -> ExportTraceServiceRequest:
    """An export of ``n_spans`` valid spans with random ids, one resource, one scope."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    attribute = resource_spans.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "big"
    scope_spans = resource_spans.scope_spans.add()
    for i in range(n_spans):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), "prefill"
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + 1000 * i
        span.end_time_unix_nano = span.start_time_unix_nano + 500
    return request


class CollectProcess:
    """``ttft collect -o out`` on ports the kernel picked, with the endpoints it printed
    (``http_url`` / ``grpc_url``: None for a protocol turned off by ``flags``) and its
    trace path; its stderr lines are read on a thread into ``lines``."""

    def __init__(self, out: Path, *flags: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ttft.reports.cli", "collect", "-o", str(out),
             "--http-port", "0", "--grpc-port", "0", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        deadline_s = time.monotonic() + TIMEOUT_S
        self.http_url: str | None = None
        self.grpc_url: str | None = None
        try:
            while True:
                match = self.next_line(r"(OTLP/HTTP|OTLP/gRPC) listening on (\S+)$|"
                                       r"writing spans to (\S+) \(Ctrl-C", deadline_s)
                if match[3] is not None:
                    self.trace = Path(match[3])
                    break
                if match[1] == "OTLP/HTTP":
                    self.http_url = match[2]
                else:
                    self.grpc_url = match[2]
        except BaseException:
            self.kill()
            raise

    @property
    def http_port(self) -> int:
        assert self.http_url is not None
        return int(self.http_url.rsplit(":", 1)[1].split("/", 1)[0])

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, pattern: str, deadline_s: float) -> re.Match[str]:
        """The next stderr line matching ``pattern``, before ``deadline_s``."""
        seen: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline_s - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}; got {seen}") from None
            assert line is not None, f"ttft collect ended without {pattern!r}; got {seen}"
            match = re.search(pattern, line)
            if match:
                return match
            seen.append(line)

    def kill(self) -> None:
        """SIGKILL, if still running, reap, and close its stderr once read to the end."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(TIMEOUT_S)
        self._pump_thread.join(TIMEOUT_S)
        assert self.process.stderr is not None
        self.process.stderr.close()

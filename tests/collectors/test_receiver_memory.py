"""`ttft collect`'s memory is bounded by the chunk, not the request: four concurrent large
exports (protobuf over OTLP/HTTP) peak far below what holding their rows would take, and
every span is stored. The issue's goal, four concurrent 10^6-span requests under 1 GiB,
runs under `pytest -m stress`; the default run sends 4 × 120,000 spans (about 900 MB peak
without chunking, about 370 MB with it, on the machine this was written on).

What the requests add is measured above the process's own size once it is idle: the
compiled OTLP decoder (numba and its kernels) is about 150 MiB of the process, loaded once
on a thread after start (248 → 492 MiB for the default run here, against 101 → 384 MiB
with the reference decoder alone, ``TTFT_OTLP_DECODER=reference``)."""

import http.client
import signal
import threading
import time

import pytest
from _collect import CollectProcess, one_scope_export

from ttft.collectors import read_spans


def export(n_spans: int) -> bytes:
    return one_scope_export(n_spans).SerializeToString()


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def settled_rss_bytes(pid: int, timeout_s: float = 60.0) -> int:
    """The process's peak resident size once it stops growing (the compiled decoder
    loads, or compiles on a first run, on a thread after the receiver listens)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = peak_rss_bytes(pid)
        if now - last < (1 << 20):
            return now
        last = now
    return last


def send_concurrently(port: int, bodies: list[bytes], timeout_s: float) -> list[int]:
    statuses: list[int] = []

    def send(body: bytes) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        try:
            connection.request("POST", "/v1/traces", body,
                               {"Content-Type": "application/x-protobuf"})
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    return statuses


def check(tmp_path, n_spans: int, limit_bytes: int, timeout_s: float) -> None:
    """Four exports of ``n_spans`` at once add less than ``limit_bytes`` to the idle
    process."""
    bodies = [export(n_spans) for _ in range(4)]
    collect = CollectProcess(tmp_path, "--no-grpc")
    try:
        idle = settled_rss_bytes(collect.process.pid)
        statuses = send_concurrently(collect.http_port, bodies, timeout_s)
        peak = peak_rss_bytes(collect.process.pid)
        collect.process.send_signal(signal.SIGINT)
        collect.process.wait(timeout_s)
    finally:
        collect.kill()
    assert statuses == [200] * 4
    assert peak - idle < limit_bytes, (f"peak RSS {peak / 2**20:.0f} MiB, "
                                       f"{idle / 2**20:.0f} MiB idle")
    assert read_spans(tmp_path).num_rows == 4 * n_spans


def test_four_large_exports_at_once_stay_within_bounded_memory(tmp_path):
    check(tmp_path, 120_000, 400 << 20, timeout_s=120)


@pytest.mark.stress
def test_four_million_span_exports_at_once_peak_under_a_gibibyte(tmp_path):
    check(tmp_path, 1_000_000, (1 << 30) - (100 << 20), timeout_s=600)

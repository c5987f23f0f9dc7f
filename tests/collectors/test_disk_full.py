"""A full disk under ``ttft collect``: exports are answered as retryable (HTTP 503 with
Retry-After, gRPC UNAVAILABLE with a RetryInfo), never 500; the receiver stores again by
itself once there is space; the run reads whole, every acknowledged span in it; the
condition and its end are logged once each (issue 37). On a small tmpfs, which needs root
to mount (the test skips without)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ttft.collectors import TraceWriter, read_inputs, read_spans
from ttft.collectors.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver
from ttft.collectors.otlp_receiver import OTLPReceiver

T0_NS = 1_700_000_000_000_000_000
PROTO = "application/x-protobuf"
SPANS_PER_EXPORT = 40
MAX_EXPORTS = 400  # bounded: the disk fills long before


def export(index: int) -> bytes:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for j in range(SPANS_PER_EXPORT):
        n = index * SPANS_PER_EXPORT + j + 1
        span = spans.add(name=f"step {'x' * 200}", trace_id=n.to_bytes(16, "big"),
                         span_id=n.to_bytes(8, "big"))
        span.start_time_unix_nano, span.end_time_unix_nano = T0_NS + n, T0_NS + n + 5
    return request.SerializeToString()


def span_ids(index: int) -> set[str]:
    return {format(index * SPANS_PER_EXPORT + j + 1, "016x") for j in range(SPANS_PER_EXPORT)}


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, mounted for the test (skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """A ballast file taking all but about 64 KiB of ``disk``."""
    ballast = disk / "ballast"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    ballast.write_bytes(bytes(max(0, free - (64 << 10))))
    return ballast


@pytest.mark.parametrize("flush_spans", [10**6, 3 * SPANS_PER_EXPORT],
                         ids=["one segment", "segments rotated while full"])
def test_http_answers_503_while_full_and_stores_again_with_space(small_disk, caplog,
                                                                 flush_spans):
    caplog.set_level(logging.WARNING, logger="ttft.collectors.receiver")
    ballast = fill(small_disk)
    trace = small_disk / "run.parquet"
    acknowledged: set[str] = set()
    statuses: list[int] = []
    writer = TraceWriter(trace, log=True, flush_interval_s=None, flush_spans=flush_spans)
    with OTLPReceiver(lambda table: writer.append(table, durable=True), port=0
                      ) as receiver, httpx.Client(timeout=20) as client:
        def send(index: int) -> httpx.Response:
            answer = client.post(receiver.endpoint, content=export(index),
                                 headers={"Content-Type": PROTO})
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                acknowledged.update(span_ids(index))
            return answer

        index = 0
        while index < MAX_EXPORTS and 503 not in statuses:
            send(index)
            index += 1
        assert statuses[-1] == 503, statuses
        busy = send(index)  # still full: retryable again, quietly
        assert (busy.status_code, busy.headers["Retry-After"]) == (503, "1")
        # the run reads while the disk is full, with what was acknowledged
        during = set(read_spans(trace).column("span_id").to_pylist())
        assert acknowledged <= during
        ballast.unlink()  # space again: stored again, by itself
        for later in range(index + 1, index + 4):
            assert send(later).status_code == 200
    writer.close()
    assert 500 not in statuses
    stored = set(read_spans(trace).column("span_id").to_pylist())
    assert acknowledged <= stored and len(acknowledged) >= 4 * SPANS_PER_EXPORT
    messages = [r.getMessage() for r in caplog.records if r.name == "ttft.collectors.receiver"]
    assert sum("the disk is full" in m for m in messages) == 1, messages
    assert sum("has space again" in m for m in messages) == 1, messages


def test_timed_flushes_failing_on_a_full_disk_log_once_and_do_not_spin(small_disk, caplog):
    """The writer's timer, flushing every 50 ms into a full disk, logs the failure once and
    its end once, and waits between tries (it once retried at once, in a loop)."""
    caplog.set_level(logging.WARNING, logger="ttft.collectors.writer")
    trace = small_disk / "run.parquet"
    writer = TraceWriter(trace, log=True, flush_interval_s=0.05, flush_spans=10**6)
    rows = [{"trace_id": format(i + 1, "032x"), "span_id": format(i + 1, "016x"),
             "name": "x" * 300, "stage": "other", "start_ns": i, "end_ns": i + 1,
             "clock": "c", "service": "s"} for i in range(100)]
    with writer._io_lock:  # no flush until the disk is full: the rows wait in the log
        writer.append(rows, durable=True)
        ballast = small_disk / "ballast"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        ballast.write_bytes(bytes(free))
    import time

    time.sleep(1.0)  # about 20 intervals of failing flushes
    ballast.unlink()
    time.sleep(0.5)
    writer.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "ttft.collectors.writer"]
    failed = [m for m in messages if "timed flush failed" in m]
    assert len(failed) == 1, messages
    assert sum("succeed again" in m for m in messages) == 1, messages
    assert {r["span_id"] for r in rows} <= set(read_spans(trace).column("span_id").to_pylist())


def test_a_segment_cut_by_a_full_disk_reads_as_empty(small_disk):
    """A log segment whose header a full disk cut holds nothing acknowledged: the run reads
    around it, never refused."""
    trace = small_disk / "run.parquet"
    writer = TraceWriter(trace, log=True, flush_interval_s=None, merge_on_close=False)
    writer.append([{"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "s",
                    "stage": "other", "start_ns": 1, "end_ns": 2, "clock": "c",
                    "service": "s"}], durable=True)
    parts = trace.with_name("run.parquet.parts")
    (parts / "log-00009.spans").write_bytes(b"TTFT")  # a header cut after its first bytes
    table = read_spans(trace)
    assert table.num_rows == 1
    assert read_inputs(table)[0]["torn_bytes"] == 4
    writer.close()


def test_grpc_answers_unavailable_with_a_retry_info_while_full(small_disk):
    ballast = fill(small_disk)
    writer = TraceWriter(small_disk / "run.parquet", log=True, flush_interval_s=None,
                         flush_spans=10**6)
    codes = []
    with OTLPGrpcReceiver(lambda table: writer.append(table, durable=True), port=0
                          ) as receiver, \
            grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        call = channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        for index in range(MAX_EXPORTS):
            try:
                call(export(index), timeout=20)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                trailing = dict(exc.trailing_metadata())
                break
        assert codes == [grpc.StatusCode.UNAVAILABLE]
        assert "google.rpc.retryinfo-bin" in trailing
        ballast.unlink()
        call(export(MAX_EXPORTS), timeout=20)
    writer.close()

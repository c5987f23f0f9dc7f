"""The recorder process of a traced run (``collectors._trace_process``): the load generator's
rows reach the trace through its pipe unchanged, a busy receiver port leaves no file, the
recorder outlives a Ctrl-C sent to it and a load generator killed outright, and closes the
trace with every row the pipe held."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _benchmarks import benchmark_module

from ttft.collectors import read_spans, run_metadata
from ttft.collectors._trace_process import TraceProcess
from ttft.collectors.loadgen import results_table, run
from ttft.collectors.workloads import workload
from ttft.tracer.schema import COLUMNS

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "client_accuracy.py"


@pytest.fixture(scope="module")
def sse_url():
    """benchmarks/sse_server.py in a separate process (as benchmarks/client_accuracy.py
    starts it)."""
    with benchmark_module("client_accuracy.py", "client_accuracy_for_recorder") as module, \
            module.sse_server() as url:
        yield url


def _rows(table):
    return sorted(table.select(list(COLUMNS)).to_pylist(),
                  key=lambda r: (r["trace_id"], r["start_ns"], r["name"], r["span_id"] or ""))


def test_the_rows_of_every_request_reach_the_trace_unchanged(sse_url, tmp_path):
    out = tmp_path / "run.parquet"
    recorder = TraceProcess(out, {"command": "test"})
    assert recorder.http_endpoint is None  # no receivers asked for
    os.kill(recorder._proc.pid, signal.SIGINT)  # a Ctrl-C reaches the whole group: ignored
    try:
        results = asyncio.run(run(sse_url, workload([0.0] * 12, ["Hi."], 4), concurrency=3,
                                  warmup=1, writer=recorder.rows))
    finally:
        closed = recorder.close()
    assert closed.error is None and closed.server_rows == 0
    assert [r.outcome for r in results] == ["ok"] * 12
    table = read_spans(out)
    assert run_metadata(table)["command"] == "test"
    assert _rows(table) == _rows(results_table(results))
    assert recorder.close() is closed  # idempotent


def test_a_busy_receiver_port_is_named_and_leaves_no_file(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = tmp_path / "run.parquet"
        with pytest.raises(OSError, match=f"OTLP/HTTP on 127.0.0.1:{port}"):
            TraceProcess(out, {}, receivers={"host": "127.0.0.1", "http_port": port,
                                             "grpc_port": None, "token": None})
    assert list(tmp_path.iterdir()) == []


def test_the_receivers_listen_in_the_recorder_and_count_what_they_stored(tmp_path):
    import httpx

    recorder = TraceProcess(tmp_path / "run.parquet", {}, receivers={
        "host": "127.0.0.1", "http_port": 0, "grpc_port": None, "token": None})
    trace = "5b8efff798038103d269b633813fc60c"
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {
        "stringValue": "srv"}}]}, "scopeSpans": [{"spans": [{
            "traceId": trace, "spanId": "eee19b7ec3c1b174", "name": "queue",
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000"}]}]}]}
    try:
        assert recorder.http_endpoint is not None
        response = httpx.post(recorder.http_endpoint, json=body, timeout=10.0)
        assert response.status_code == 200
        recorder.want({trace})
        assert recorder.poll() == (True, 1)
    finally:
        closed = recorder.close()
    assert closed.error is None
    assert (closed.server_rows, closed.trace_ids) == (1, frozenset({trace}))
    assert read_spans(tmp_path / "run.parquet").column("name").to_pylist() == ["queue"]


_KILLED = textwrap.dedent("""
    import asyncio, os, signal, sys
    from ttft.collectors._trace_process import TraceProcess

    async def main(recorder):
        await recorder.rows.open()
        for i in range(50):
            recorder.rows.put([{"trace_id": f"{i:032x}", "span_id": f"{i + 1:016x}",
                                "parent_id": None, "request_id": None, "name": "client",
                                "stage": "client", "start_ns": i, "end_ns": i + 5,
                                "clock": "client", "service": "t", "attributes": "{}"}])
        await asyncio.sleep(0.2)  # the loop writes what the pipe takes
        print(recorder._proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main(TraceProcess(sys.argv[1], {"command": "killed"})))
""")


def test_a_killed_load_generator_leaves_a_closed_trace_with_every_row_it_sent(tmp_path):
    out = tmp_path / "run.parquet"
    done = subprocess.run([sys.executable, "-c", _KILLED, str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    recorder_pid = int(done.stdout.split()[0])
    while time.monotonic() < deadline:  # the recorder exits once the trace is closed
        try:
            os.kill(recorder_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    table = pq.read_table(out)
    assert sorted(table.column("start_ns").to_pylist()) == list(range(50))
    assert not Path(f"{out}.parts").exists()


def _row(i: int, **changed):
    return {"trace_id": f"{i:032x}", "span_id": f"{i + 1:016x}", "parent_id": None,
            "request_id": None, "name": "client", "stage": "client", "start_ns": i,
            "end_ns": i + 5, "clock": "client", "service": "t", "attributes": "{}", **changed}


def test_one_requests_bad_row_costs_no_other_request_its_rows(tmp_path):
    out = tmp_path / "run.parquet"
    recorder = TraceProcess(out, {})

    async def load() -> Exception | None:
        await recorder.rows.open()
        for i in range(30):  # written at once: the recorder reads them in few batches
            recorder.rows.put([_row(i, start_ns="late") if i == 7 else _row(i)])
        return await recorder.rows.finish()

    assert asyncio.run(load()) is None  # the pipe took everything
    closed = recorder.close()
    assert isinstance(closed.error, ValueError)
    assert sorted(read_spans(out).column("start_ns").to_pylist()) == [
        i for i in range(30) if i != 7]

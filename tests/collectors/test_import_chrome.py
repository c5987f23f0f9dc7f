"""Chrome trace event importer: phases, nesting, async pairs, GPU kernels and their
launches, metadata counts; a real PyTorch profiler trace of one prefill chunk."""

import gzip
import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ttft.collectors import TraceFileError, guess_format
from ttft.collectors.importers import IMPORTERS
from ttft.engine.kv_cache import PagedKVCache
from ttft.engine.model import ModelConfig, Transformer, prefill_chunk
from ttft.tracer.schema import SCHEMA_VERSION

EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "engine"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 10, "args": {"name": "main"}},
    {"ph": "X", "name": "step", "pid": 1, "tid": 10, "ts": 100, "dur": 900,
     "args": {"step_id": 3}},
    {"ph": "B", "name": "prefill.chunk", "pid": 1, "tid": 10, "ts": 200,
     "args": {"chunk_tokens": 16}},
    {"ph": "B", "name": "matmul", "pid": 1, "tid": 10, "ts": 250.5},
    {"ph": "E", "pid": 1, "tid": 10, "ts": 300.25, "args": {"flops": 10}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 10,
     "ts": 310, "dur": 5, "args": {"correlation": 77}},
    {"ph": "E", "pid": 1, "tid": 10, "ts": 600},
    {"ph": "i", "name": "first_sampled", "pid": 1, "tid": 10, "ts": 650, "s": "t"},
    {"ph": "E", "pid": 1, "tid": 11, "ts": 700},  # no B on this thread
    {"ph": "b", "cat": "req", "id": "0x1", "name": "request", "pid": 1, "ts": 50},
    {"ph": "b", "cat": "req", "id": "0x1", "name": "queue", "pid": 1, "ts": 60},
    {"ph": "n", "cat": "req", "id": "0x1", "name": "admitted", "pid": 1, "ts": 90},
    {"ph": "e", "cat": "req", "id": "0x1", "name": "queue", "pid": 1, "ts": 180},
    {"ph": "e", "cat": "req", "id": "0x1", "name": "request", "pid": 1, "ts": 990,
     "args": {"status": "ok"}},
    {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 2, "tid": 7, "ts": 320,
     "dur": 200.0006, "args": {"device": 0, "stream": 7, "correlation": 77}},
    {"ph": "s", "cat": "ac2g", "id": 77, "name": "launch", "pid": 1, "tid": 10, "ts": 310},
    {"ph": "C", "name": "memory", "pid": 1, "ts": 400, "args": {"bytes": 1024}},
    {"ph": "P", "name": "sample", "pid": 1, "tid": 10, "ts": 410},
    {"ph": "I", "name": "mark", "pid": 1, "tid": 10, "ts": 400, "s": "g"},
]
THREAD = {"tid": 10, "thread_name": "main"}
HOST = {"clock": "host:engine", "service": "engine", "trace": 0}
EXPECTED = [  # parent and trace by name / first-seen order: ids are hashes
    {"name": "step", "parent": None, "stage": "step", "start_ns": 100_000,
     "end_ns": 1_000_000, **HOST, "attributes": {"step_id": 3, **THREAD}},
    {"name": "prefill.chunk", "parent": "step", "stage": "prefill.chunk", "start_ns": 200_000,
     "end_ns": 600_000, **HOST, "attributes": {"chunk_tokens": 16, **THREAD}},
    {"name": "matmul", "parent": "prefill.chunk", "stage": "other", "start_ns": 250_500,
     "end_ns": 300_250, **HOST, "attributes": {"flops": 10, **THREAD}},
    {"name": "cudaLaunchKernel", "parent": "prefill.chunk", "stage": "other",
     "start_ns": 310_000, "end_ns": 315_000, **HOST,
     "attributes": {"correlation": 77, "cat": "cuda_runtime", **THREAD}},
    {"name": "first_sampled", "parent": "step", "stage": "event", "start_ns": 650_000,
     "end_ns": 650_000, **HOST, "attributes": {"scope": "t", **THREAD}},
    {"name": "request", "parent": None, "stage": "other", "start_ns": 50_000,
     "end_ns": 990_000, **HOST, "attributes": {"cat": "req", "id": "0x1", "status": "ok"}},
    {"name": "queue", "parent": "request", "stage": "queue", "start_ns": 60_000,
     "end_ns": 180_000, **HOST, "attributes": {"cat": "req", "id": "0x1"}},
    {"name": "admitted", "parent": "queue", "stage": "event", "start_ns": 90_000,
     "end_ns": 90_000, **HOST, "attributes": {"cat": "req", "id": "0x1"}},
    {"name": "gemm_kernel", "parent": "cudaLaunchKernel", "stage": "gpu", "start_ns": 320_000,
     "end_ns": 520_001, "clock": "gpu:0", "service": "2", "trace": 0,
     "attributes": {"device": 0, "stream": 7, "correlation": 77, "cat": "kernel", "tid": 7}},
    {"name": "mark", "parent": None, "stage": "event", "start_ns": 400_000, "end_ns": 400_000,
     **HOST, "attributes": {"scope": "g", **THREAD}},
]


def readable(table):
    """Rows with ids replaced by the parent's name and the trace's first-seen number,
    after checking the ids are well-formed and unique."""
    rows = table.to_pylist()
    names = {row["span_id"]: row["name"] for row in rows}
    traces = list(dict.fromkeys(row["trace_id"] for row in rows))
    assert len(names) == len(rows)
    assert all(len(t) == 32 and int(t, 16) for t in traces)
    assert all(len(s) == 16 and int(s, 16) for s in names)
    return [
        {"name": row["name"], "parent": names.get(row["parent_id"]), "stage": row["stage"],
         "start_ns": row["start_ns"], "end_ns": row["end_ns"], "clock": row["clock"],
         "service": row["service"], "trace": traces.index(row["trace_id"]),
         "attributes": json.loads(row["attributes"])}
        for row in rows
    ]


def test_hand_written_events_read_to_exact_rows(tmp_path):
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"traceEvents": EVENTS, "displayTimeUnit": "ns"}))

    table = IMPORTERS["chrome"].read(path)

    assert readable(table) == EXPECTED
    assert table.num_rows == len(EXPECTED)
    meta = json.loads(table.schema.metadata[b"ttft"])
    assert meta == {
        "schema_version": SCHEMA_VERSION, "source_format": "chrome", "source": str(path),
        "clock_epoch": False, "unmatched": 1, "flow_events": 1, "counter_events": 1,
        "skipped_events": {"P": 1}, "display_time_unit": "ns",
    }
    assert IMPORTERS["chrome"].read(path).equals(table)  # ids are deterministic


def test_gzip_and_array_form_without_closing_bracket_read_the_same(tmp_path):
    gz = tmp_path / "events.json.gz"
    gz.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(EVENTS)[:-1] + ",\n")

    assert guess_format(gz) == "chrome"
    assert guess_format(bare) == "chrome"
    assert readable(IMPORTERS["chrome"].read(gz)) == EXPECTED
    assert readable(IMPORTERS["chrome"].read(bare)) == EXPECTED


def test_unknown_gpu_launch_and_unclosed_async_are_counted_not_fatal(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([
        {"ph": "M", "name": "process_labels", "pid": 5, "args": {"labels": "GPU 1"}},
        {"ph": "X", "name": "fused", "pid": 5, "tid": 3, "ts": 10, "dur": 2,
         "args": {"device": 1, "stream": 3, "correlation": 9}},
        {"ph": "b", "cat": "c", "id": 1, "name": "open", "pid": 5, "ts": 11},
        {"ph": "e", "cat": "c", "id": 2, "name": "other", "pid": 5, "ts": 12},
    ]))

    table = IMPORTERS["chrome"].read(path)

    assert readable(table) == [
        {"name": "fused", "parent": None, "stage": "gpu", "start_ns": 10_000, "end_ns": 12_000,
         "clock": "gpu:1", "service": "5", "trace": 0,
         "attributes": {"device": 1, "stream": 3, "correlation": 9, "tid": 3}},
    ]
    assert json.loads(table.schema.metadata[b"ttft"])["unmatched"] == 2


def test_pytorch_profiler_trace_of_a_prefill_chunk(tmp_path):
    model = Transformer.from_config(ModelConfig.preset("tiny"), seed=0)
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=8)
    seq = cache.allocate()
    path = tmp_path / "torch.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("prefill.chunk"):
            prefill_chunk(model, cache, seq, torch.arange(8).tolist())
    prof.export_chrome_trace(str(path))
    now_ns = time.time_ns()

    assert guess_format(path) == "chrome"
    table = IMPORTERS["chrome"].read(path)
    rows = table.to_pylist()
    by_id = {row["span_id"]: row for row in rows}
    (chunk,) = [row for row in rows if row["name"] == "prefill.chunk"]
    aten = [row for row in rows if row["name"].startswith("aten::")]

    def ancestors(row):
        while row["parent_id"] in by_id:
            row = by_id[row["parent_id"]]
            yield row["span_id"]

    assert chunk["stage"] == "prefill.chunk"
    assert aten and all(chunk["span_id"] in ancestors(row) for row in aten)
    assert any(row["parent_id"] == chunk["span_id"] for row in aten)
    assert all(row["end_ns"] >= row["start_ns"] for row in rows)
    if "baseTimeNanoseconds" in json.loads(path.read_text()):  # PyTorch >= 2.4 writes it
        assert json.loads(table.schema.metadata[b"ttft"])["clock_epoch"] is True
        assert abs(chunk["start_ns"] - now_ns) < 60 * 10**9
    assert chunk["start_ns"] <= min(row["start_ns"] for row in aten)


def test_guess_format_does_not_take_jaeger_for_chrome(tmp_path):
    chrome = tmp_path / "chrome.json"
    chrome.write_text(json.dumps({"traceEvents": EVENTS}))
    jaeger = tmp_path / "jaeger.json"
    jaeger.write_text(json.dumps({"data": [{"traceID": "463ac35c9f6413ad", "spans": [
        {"traceID": "463ac35c9f6413ad", "spanID": "463ac35c9f6413ad", "operationName": "x",
         "startTime": 1, "duration": 1, "processID": "p1"}],
        "processes": {"p1": {"serviceName": "s"}}}]}))

    assert guess_format(chrome) == "chrome"
    assert guess_format(jaeger) == "jaeger"
    assert IMPORTERS["chrome"].guess_can_open(jaeger) is False
    assert IMPORTERS["jaeger"].guess_can_open(chrome) is False


def test_truncated_and_bad_events_name_the_file_and_event(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"traceEvents": EVENTS})[:200])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [EVENTS[2], {"ph": "X", "name": "y", "ts": "1"}]}))

    assert guess_format(cut) == "chrome"
    with pytest.raises(TraceFileError) as info:
        IMPORTERS["chrome"].read(cut)
    assert info.value.path == str(cut)
    assert str(info.value).startswith(f"{cut}: not valid JSON")
    with pytest.raises(TraceFileError) as info:
        IMPORTERS["chrome"].read(bad)
    assert str(info.value) == (
        f"{bad}: traceEvents[1].ts: expected microseconds as a number, got '1'"
    )

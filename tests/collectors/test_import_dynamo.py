"""NVIDIA Dynamo ``request_end`` JSON Lines: records in the documented shape
(ai-dynamo/dynamo lib/llm/src/request_trace/types.rs, the file sinks' envelope) become
queue, prefill and an estimated kv_transfer, attributed to Dynamo's TTFT exactly."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest

from ttft.analysis import analyze
from ttft.collectors import TraceFileError, read_spans, run_metadata
from ttft.collectors.importers.dynamo import ESTIMATE
from ttft.collectors.reader import guess_format
from ttft.tracer.schema import ATTR_ESTIMATED

RECEIVED_MS = 1_777_312_800_000
MS = 1_000_000


def request_end(request_id: str, **fields) -> dict:
    """A record as Dynamo's RequestTraceRecord serializes it (omitted fields absent)."""
    request = {
        "request_id": request_id,
        "x_request_id": f"llm-call-{request_id}",
        "model": "my-model",
        "input_tokens": 4096,
        "output_tokens": 512,
        "cached_tokens": 3584,
        "request_received_ms": RECEIVED_MS,
        "prefill_wait_time_ms": 12.5,
        "prefill_time_ms": 70.0,
        "ttft_ms": 82.5,
        "total_time_ms": 1000.0,
        "avg_itl_ms": 1.8,
        "kv_hit_rate": 0.875,
        "kv_transfer_estimated_latency_ms": 4.25,
        "queue_depth": 3,
        "worker": {"prefill_worker_id": 7, "prefill_dp_rank": 0, "decode_worker_id": 9,
                   "decode_dp_rank": 0},
        "replay": {"trace_block_size": 32, "input_length": 4096,
                   "input_sequence_hashes": [11, 22]},
        **fields,
    }
    request = {k: v for k, v in request.items() if v is not None}
    return {"schema": "dynamo.request.trace.v1", "event_type": "request_end",
            "event_time_unix_ms": RECEIVED_MS + 1000, "event_source": "dynamo",
            "request": request}


def write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def trace(tmp_path):
    """The jsonl sink's envelope around one disaggregated request, a bare aggregated one
    (no transfer), a tool record, an uploader marker and one record that cannot be placed."""
    path = tmp_path / "dynamo-trace.jsonl"
    write(path, [
        {"timestamp": 5, "event": request_end("req-1")},
        request_end("req-2", kv_transfer_estimated_latency_ms=None, cached_tokens=0,
                    worker=None),
        {"schema": "dynamo.request.trace.v1", "event_type": "tool_end",
         "event_time_unix_ms": RECEIVED_MS, "event_source": "harness",
         "tool": {"tool_call_id": "t1", "tool_class": "search", "duration_ms": 3.0}},
        {"verification": "trace-s3-uploader"},
        request_end("req-3", request_received_ms=None),
    ])
    return path


def test_guessed_and_read_as_spans(trace):
    assert guess_format(trace) == "dynamo"
    table = read_spans(trace)
    rows = {(r["request_id"], r["name"]): r for r in table.to_pylist()}
    t0 = RECEIVED_MS * MS
    one = {name: (r["stage"], r["start_ns"] - t0, r["end_ns"] - t0)
           for (rid, name), r in rows.items() if rid == "req-1"}
    assert one == {
        "dynamo.request": ("server", 0, 1000 * MS),
        "prefill_wait": ("queue", 0, 12_500_000),
        "prefill": ("prefill", 12_500_000, 82_500_000),
        "kv_transfer_estimate": ("kv_transfer", 82_500_000 - 4_250_000, 82_500_000),
        "first_byte": ("event", 82_500_000, 82_500_000),
    }
    transfer = json.loads(rows["req-1", "kv_transfer_estimate"]["attributes"])
    assert transfer == {ATTR_ESTIMATED: ESTIMATE, "kv_transfer_estimated_latency_ms": 4.25}
    root = json.loads(rows["req-1", "dynamo.request"]["attributes"])
    assert root["cached_tokens"] == 3584 and root["prompt_tokens"] == 4096
    assert root["worker"]["decode_worker_id"] == 9 and "replay" not in root
    assert {r for r, _ in rows} == {"req-1", "req-2"}
    assert ("req-2", "kv_transfer_estimate") not in rows
    meta = run_metadata(table)
    assert meta["source_format"] == "dynamo"
    assert meta["skipped_events"] == {"tool_end": 1}
    assert meta["rejected"] == {"count": 1, "examples": [
        "line 5: request req-3: no usable request_received_ms"]}
    assert meta["estimated"]["count"] == 1


def test_attribution_takes_the_estimate_out_of_prefill(trace):
    result = analyze(read_spans(trace), policy="exclusive")
    assert result.attribution.boundary == "server"
    parts = result.attribution.attributed
    ids = list(result.attribution.requests["request_id"])
    got = {rid: {k: int(v) for k, v in parts.iloc[i].items() if v} for i, rid in enumerate(ids)}
    assert got == {
        "req-1": {"queue": 12_500_000, "prefill": 70_000_000 - 4_250_000,
                  "kv_transfer": 4_250_000},
        "req-2": {"queue": 12_500_000, "prefill": 70_000_000},
    }
    assert list(result.attribution.requests["ttft_ns"]) == [82_500_000, 82_500_000]
    conditions = dict(zip(ids, result.attribution.requests["condition"], strict=True))
    assert conditions == {"req-1": "prefix_hit", "req-2": "cold"}
    quality = result.summary.quality
    assert (quality["estimated_span"], quality["rejected_span"]) == (1, 1)


def test_a_request_without_prefill_times_is_the_servers(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, [request_end("agg", prefill_wait_time_ms=None, prefill_time_ms=None,
                             kv_transfer_estimated_latency_ms=None)])
    result = analyze(read_spans(path))
    assert result.attribution.attributed.iloc[0][lambda s: s > 0].to_dict() == {
        "server": 82_500_000}


def test_gzipped_file_and_the_agent_schema_name(tmp_path):
    path = tmp_path / "trace.000000.jsonl.gz"
    record = request_end("req-9")
    record["schema"] = "dynamo.agent.trace.v1"
    path.write_bytes(gzip.compress((json.dumps(record) + "\n").encode()))
    assert guess_format(path) == "dynamo"
    assert read_spans(path).num_rows == 5


def test_missing_durations_place_nothing(tmp_path):
    path = tmp_path / "t.jsonl"
    write(path, [request_end("a", prefill_time_ms=None, ttft_ms=None, total_time_ms=-1.0,
                             kv_transfer_estimated_latency_ms=None)])
    rows = {r["name"]: (r["start_ns"], r["end_ns"]) for r in read_spans(path).to_pylist()}
    t0 = RECEIVED_MS * MS
    # Only the wait is known: the request span reaches its end, nothing else is placed.
    assert rows == {"dynamo.request": (t0, t0 + 12_500_000), "prefill_wait": (t0, t0 + 12_500_000)}


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(request_end("a")) + "\n{not json\n")
    with pytest.raises(TraceFileError, match="line 2: not JSON"):
        read_spans(path, format="dynamo")


def test_analyze_format_dynamo_shows_the_estimate_in_data_quality(trace):
    out = subprocess.run(["ttft", "analyze", "--format", "dynamo", str(trace)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "1 estimated_span" in out and "kv_transfer" in out


def test_a_partitioned_import_counts_its_estimates_once(tmp_path):
    """The importer's counts live in the run metadata; a dataset keeps them in partition 0
    only, so the merged data quality equals one process's (it once counted them in every
    partition)."""
    from ttft.analysis.clocks import offsets_from_bounds
    from ttft.analysis.part import analyze_part, merge, survey
    from ttft.analysis.partition import partition_rows
    from ttft.collectors import write_dataset

    path = tmp_path / "many.jsonl"
    write(path, [request_end(f"req-{i}") for i in range(20)])
    table = read_spans(path)
    single = analyze(table).summary
    assert single.quality["estimated_span"] == 20
    p = partition_rows(table, 4)
    write_dataset(tmp_path / "ds", table, p.owner, p.copy_rows, p.copy_partitions, 4, p.key)
    parts = [read_spans(tmp_path / "ds", partition=k) for k in range(4)]
    surveys = [survey(t) for t in parts]
    offsets = offsets_from_bounds([s.bounds for s in surveys])
    analysed = [analyze_part(t, offsets=offsets, boundary=single.boundary, policy="exclusive")
                for t in parts]
    merged = merge(analysed, offsets=offsets, metadata=surveys[0].metadata).summary
    assert merged.quality["estimated_span"] == 20
    assert merged.quality == single.quality

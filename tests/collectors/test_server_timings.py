"""The timings servers report in their responses, each read from a fixture in its documented
shape and placed on the client's clock (docs/attribution.md, "Server-reported timings");
the load generator's request turns them into estimated child spans of its client span."""

from __future__ import annotations

import json

import pytest

from ttft.collectors._client_request import Request
from ttft.collectors.server_timings import reported_spans, server_timing_metrics
from ttft.tracer.schema import ATTR_ESTIMATED, REPORTED_SERVICE

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
START, FIRST, END = T0, T0 + 100 * MS, T0 + 400 * MS

# llama.cpp server (tools/server/README.md): the final chunk of an OpenAI-compatible stream
LLAMA_CPP_FINAL_CHUNK = {
    "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
    "created": 1735689600, "id": "chatcmpl-abc", "model": "gpt-3.5-turbo",
    "system_fingerprint": "b4600-abcdef", "object": "chat.completion.chunk",
    "timings": {"prompt_n": 12, "prompt_ms": 23.5, "prompt_per_token_ms": 1.958,
                "prompt_per_second": 510.6, "predicted_n": 16, "predicted_ms": 210.4,
                "predicted_per_token_ms": 13.15, "predicted_per_second": 76.05, "cache_n": 4},
}
# vLLM's per-request metrics (vllm serve --enable-per-request-metrics;
# docs/features/per_request_metrics.md), ms; its TTFT counts from the scheduling
VLLM_METRICS = {"metrics": {
    "time_to_first_token_ms": 30.0, "generation_time_ms": 240.5, "queue_time_ms": 12.0,
    "mean_itl_ms": 15.0, "tokens_per_second": 66.5}}
# SGLang's meta_info (native /generate), seconds
SGLANG_META_INFO = {"meta_info": {
    "id": "0a1b", "finish_reason": {"type": "length", "length": 16}, "prompt_tokens": 12,
    "completion_tokens": 16, "cached_tokens": 0, "e2e_latency": 0.25, "queue_time": 0.004,
    "prefill_launch_delay": 0.001, "prefill_launch_latency": 0.02}}
# Ollama's final object of /api/generate (its API reference), nanoseconds
OLLAMA_FINAL = {
    "model": "llama3.2", "created_at": "2023-08-04T19:22:45.499127Z", "response": "",
    "done": True, "done_reason": "stop", "total_duration": 5043500667,
    "load_duration": 5025959, "prompt_eval_count": 26, "prompt_eval_duration": 32595300,
    "eval_count": 290, "eval_duration": 4709213000}
# Dynamo: nvext.timing (RequestTracker's fields), asked for with extra_fields ["timing"]
DYNAMO_NVEXT = {"nvext": {"timing": {
    "request_received_ms": 1718000000100, "prefill_wait_time_ms": 3.2,
    "prefill_time_ms": 27.5, "ttft_ms": 30.7, "total_time_ms": 250.0, "kv_hit_rate": 0.25}}}
# TensorRT-LLM's trtllm-serve: W3C Server-Timing, dur in ms
TRTLLM_HEADERS = {"server-timing": "server_queue;dur=2.5, server_ttft;dur=31.0, "
                                   "server_e2e;dur=250.2"}
# TGI: a whole answer's timing headers, ms
TGI_HEADERS = {"x-compute-type": "gpu+optimized", "x-total-time": "250",
               "x-validation-time": "1", "x-queue-time": "2", "x-inference-time": "245",
               "x-time-per-token": "15", "x-prompt-tokens": "12", "x-generated-tokens": "16"}


def placed(headers=None, fields=None, first=FIRST):
    spans = reported_spans(headers or {}, fields or {}, start_ns=START, first_token_ns=first,
                           end_ns=END)
    return [(s.name, s.stage, s.start_ns - T0, s.end_ns - T0) for s in spans]


@pytest.mark.parametrize(("headers", "fields", "expected"), [
    ({}, LLAMA_CPP_FINAL_CHUNK, [("prefill", "prefill", 100 * MS - 23_500_000, 100 * MS)]),
    ({}, VLLM_METRICS, [("queue", "queue", 58 * MS, 70 * MS),
                        ("prefill", "prefill", 70 * MS, 100 * MS)]),
    ({}, SGLANG_META_INFO, [("queue", "queue", 75 * MS, 79 * MS),
                            ("batch_wait", "batch_wait", 79 * MS, 80 * MS),
                            ("prefill", "prefill", 80 * MS, 100 * MS)]),
    ({}, OLLAMA_FINAL, [("load", "other", 100 * MS - 32_595_300 - 5_025_959,
                         100 * MS - 32_595_300),
                        ("prefill", "prefill", 100 * MS - 32_595_300, 100 * MS)]),
    ({}, DYNAMO_NVEXT, [("queue", "queue", 69_300_000, 72_500_000),
                        ("prefill", "prefill", 72_500_000, 100 * MS)]),
    (TRTLLM_HEADERS, {}, [("queue", "queue", 69 * MS, 71_500_000),
                          ("prefill", "prefill", 71_500_000, 100 * MS)]),
    # TGI's headers come with a whole answer: they end at the response's end
    (TGI_HEADERS, {}, [("queue", "queue", 153 * MS, 155 * MS),
                       ("inference", "other", 155 * MS, 400 * MS)]),
], ids=["llama.cpp", "vllm", "sglang", "ollama", "dynamo", "trtllm", "tgi"])
def test_each_documented_shape_is_placed_back_to_back_before_its_anchor(headers, fields,
                                                                        expected):
    assert placed(headers, fields) == expected


def test_the_estimate_says_which_field_and_how_it_was_placed():
    spans = reported_spans(TRTLLM_HEADERS, {}, start_ns=START, first_token_ns=FIRST,
                           end_ns=END)
    assert [s.estimated for s in spans] == [
        "trt-llm Server-Timing server_queue (2.5 ms), placed to end at the start of the "
        "reported prefill",
        "trt-llm Server-Timing server_ttft - server_queue (28.5 ms), placed to end at the "
        "client's first token"]
    assert dict(spans[0].attributes) == {
        "source": "trt-llm Server-Timing", "server_timing.server_queue": 2.5,
        "server_timing.server_ttft": 31.0, "server_timing.server_e2e": 250.2}


def test_a_span_reaching_before_the_client_s_send_is_clipped_there():
    fields = {"timings": {"prompt_ms": 80.0, "queue_ms": 50.0}}
    spans = reported_spans({}, fields, start_ns=START, first_token_ns=T0 + 100 * MS,
                           end_ns=END)
    assert [(s.name, s.start_ns - T0, s.end_ns - T0) for s in spans] == [
        ("queue", 0, 20 * MS), ("prefill", 20 * MS, 100 * MS)]
    assert spans[0].estimated.endswith(
        "(clipped at the client's send: the reported durations exceed the time the client "
        "measured from it)")


@pytest.mark.parametrize("fields", [
    {"timings": {"queue_ms": 5.0}},  # the queue's end is unknown without the prefill's length
    {"timings": {"prompt_ms": "12"}},  # not a number
    {"timings": {"prompt_ms": -1.0}},
    {"metrics": {"queue_time_ms": 2.0}},  # vLLM's metrics without its TTFT
    {"metrics": {"scheduled_ts": 2.0, "first_token_ts": 3.0}},  # not vLLM's response shape
    {"nvext": {"worker_id": 3}},  # asked for no timing
    {"timings": {"prompt_ms": 0.0}},  # zero length: nothing to show
])
def test_what_cannot_be_placed_places_nothing(fields):
    assert placed({}, fields) == []


def test_without_a_first_token_only_sources_ending_at_the_response_end_are_placed():
    assert placed({}, LLAMA_CPP_FINAL_CHUNK, first=None) == []
    assert placed(TGI_HEADERS, {}, first=None)[-1][3] == 400 * MS


def test_one_source_per_request_the_first_in_order():
    both = {**DYNAMO_NVEXT, **LLAMA_CPP_FINAL_CHUNK}
    assert placed({}, both) == placed({}, DYNAMO_NVEXT)
    # a source present but unplaceable gives way to the next
    assert placed({}, {"nvext": {"timing": {}}, **LLAMA_CPP_FINAL_CHUNK}) == \
        placed({}, LLAMA_CPP_FINAL_CHUNK)


def test_server_timing_follows_the_w3c_syntax():
    header = ('cache;desc="Cache Read, a, b";dur=23.2, db;dur=53, app;dur=47.2, '
              'missedCache, total;dur="12", db;dur=99, bad;dur=x')
    assert server_timing_metrics(header) == {"cache": 23.2, "db": 53.0, "app": 47.2,
                                             "total": 12.0}


def test_the_request_writes_them_as_estimated_children_of_its_client_span():
    req = Request(0, T0)
    req.start_ns = START
    req.on_headers(200, {"content-type": "text/event-stream"}, T0 + 10 * MS)
    first = {"id": "r1", "choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}
    body = (f"data: {json.dumps(first)}\n\ndata: {json.dumps(LLAMA_CPP_FINAL_CHUNK)}\n\n"
            "data: [DONE]\n\n").encode()
    req.on_body(body, FIRST)
    req.on_end(FIRST + MS)
    result = req.finish(END)
    client = result.rows[0]
    reported = [r for r in result.rows if r["service"] == REPORTED_SERVICE]
    assert [(r["name"], r["stage"], r["start_ns"], r["end_ns"], r["clock"], r["parent_id"],
             r["trace_id"], r["request_id"]) for r in reported] == [
        ("prefill", "prefill", FIRST - 23_500_000, FIRST, "client", client["span_id"],
         client["trace_id"], "r1")]
    attrs = json.loads(reported[0]["attributes"])
    assert attrs[ATTR_ESTIMATED] == ("llama.cpp timings prompt_ms (23.5 ms), placed to end "
                                     "at the client's first token")
    assert attrs["llama.cpp.prompt_n"] == 12 and attrs["llama.cpp.cache_n"] == 4
    assert json.loads(client["attributes"])["finish_reason"] == "stop"
    assert result.outcome == "ok"


@pytest.mark.parametrize("header", [
    "server_queue;dur=-5, server_ttft;dur=15",  # a negative queue would inflate the prefill
    "server_queue;dur=20, server_ttft;dur=15",  # a queue longer than the TTFT holding it
])
def test_a_server_timing_pair_that_cannot_be_split_places_nothing(header):
    assert placed({"server-timing": header}, {}) == []


def test_a_request_s_reported_spans_begin_no_earlier_than_its_send():
    # prompt_ms 500 against 100 ms from the client span's start to its first token, the
    # request sent 10 ms in: the reported prefill starts at the send, not before it, and the
    # measured time before the send stays the client's
    req = Request(0, T0)
    req.start_ns = START
    req.on_sent(START + 10 * MS)
    req.on_headers(200, {"content-type": "text/event-stream"}, T0 + 20 * MS)
    final = {**LLAMA_CPP_FINAL_CHUNK, "timings": {"prompt_ms": 500.0}}
    first = {"id": "r1", "choices": [{"index": 0, "text": "Hi", "finish_reason": None}]}
    req.on_body((f"data: {json.dumps(first)}\n\ndata: {json.dumps(final)}\n\n"
                 "data: [DONE]\n\n").encode(), FIRST)
    req.on_end(FIRST + MS)
    reported = [r for r in req.finish(END).rows if r["service"] == REPORTED_SERVICE]
    assert [(r["name"], r["start_ns"] - T0, r["end_ns"] - T0) for r in reported] == [
        ("prefill", 10 * MS, 100 * MS)]
    assert "clipped at the client's send" in json.loads(reported[0]["attributes"])[ATTR_ESTIMATED]

"""TensorRT-LLM's OpenTelemetry span events (tensorrt_llm/llmapi/tracing.py, SpanEvents) become
intervals: the K/V transfer between ``kv_cache_transfer_start`` and ``kv_cache_transfer_end``,
the disaggregated server's routing up to ``ctx_server.selected`` (mappings.toml names the
sources), read through the OTLP importer and the one analysis."""

from __future__ import annotations

from _otlp_json import Span, analysed, client, parts_ms

SERVICE = "unknown_service"  # TensorRT-LLM's tracer sets no service name


def disaggregated():
    """One request (ms) at the disaggregated server (its request span, the two picks as
    events), a context worker's and a generation worker's request span (vLLM's
    ``llm_request`` shape: arrival to finish, gen_ai.latency.* in seconds); the generation
    worker's span carries the transfer's two events."""
    return [
        client(1, 180, 400),
        Span(2, "llm_request", 2, 395, parent=1, service=SERVICE, host="disagg",
             events=[("ctx_server.selected", 8, {"server": "ctx-0:8001"}),
                     ("gen_server.selected", 120, {"server": "gen-0:8002"})]),
        Span(3, "llm_request", 10, 115, parent=2, service=SERVICE, host="ctx-0",
             attributes={"gen_ai.latency.time_in_queue": 0.015,
                         "gen_ai.latency.time_to_first_token": 0.100}),
        Span(4, "llm_request", 122, 394, parent=2, service=SERVICE, host="gen-0",
             attributes={"gen_ai.latency.time_in_queue": 0.010,
                         "gen_ai.latency.time_to_first_token": 0.048,
                         "gen_ai.latency.kv_cache_transfer_time": 0.035},
             events=[("kv_cache_transfer_start", 125),
                     ("kv_cache_transfer_end", 160, {"kv_cache_size": 1 << 20})]),
    ]


def test_transfer_and_routing_events_become_stages(tmp_path):
    analysis = analysed(tmp_path / "trt.jsonl", disaggregated())
    assert analysis.attribution.boundary == "client"
    got, ttft = parts_ms(analysis)
    # [0, 2) network; [2, 8) route (the server's span start to ctx_server.selected); the
    # context worker's queue [10, 25) and the generation worker's [122, 125) queue; the
    # transfer [125, 160) kv_transfer (over the generation worker's queue to 132); the rest
    # of the spans, whose durations place nothing more (no prefill time reported), server.
    assert got == {"network": 2, "route": 6, "queue": 18, "kv_transfer": 35, "server": 119}
    assert sum(got.values()) == ttft == 180


def test_a_transfer_end_without_its_start_places_nothing(tmp_path):
    spans = disaggregated()
    spans[3].events = [("kv_cache_transfer_end", 160)]
    got, ttft = parts_ms(analysed(tmp_path / "trt.jsonl", spans))
    assert "kv_transfer" not in got
    assert got["queue"] == 25 and sum(got.values()) == ttft == 180

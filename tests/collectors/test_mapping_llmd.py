"""llm-d's gateway (EPP) and routing-sidecar spans map onto ttft's stages, the time the
gateway spends choosing an endpoint as ``route`` (collectors/importers/mappings.toml names
the llm-d sources), read through the OTLP importer and the one analysis."""

from __future__ import annotations

import pytest
from _otlp_json import Span, analysed, client, parts_ms

from ttft.collectors.importers.mapping import default_mapping
from ttft.tracer.schema import PRIORITY

EPP, SIDECAR = "llm-d-epp", "llm-d-disagg-sidecar"


def _stage_of(name: str, service: str) -> str:
    """The stage the built-in rules give a span of this name and service."""
    rules = [r for r in default_mapping().rules
             if not r.is_interval and r.stage != "event" and r.matches_pair(service, name)]
    return rules[0].stage if rules else "other"


@pytest.mark.parametrize(
    ("name", "service", "stage"),
    [
        ("gateway.request", "llm-d-router/epp", "server"),
        ("gateway.request_orchestration", EPP, "route"),
        ("gateway.director.handle_request", "gateway-api-inference-extension", "route"),
        ("gateway.scheduler.schedule", "gateway-api-inference-extension", "route"),
        ("llm_d.epp.scoring", EPP, "route"),
        ("llm_d.epp.scorer.precise-prefix-cache-scorer", EPP, "route"),
        ("llm_d.epp.profile_handler.pick", EPP, "route"),
        ("llm_d.epp.prerequest.pd_disaggregation", EPP, "route"),
        ("run_scheduler_profile", EPP, "route"),
        ("filter_endpoints", EPP, "route"),
        ("pick_endpoints", EPP, "route"),
        ("score_prefix_cache", EPP, "route"),
        ("produce_precise_prefix_cache", EPP, "route"),
        ("pick_disagg_profile", EPP, "route"),
        ("pick_pd_profile", EPP, "route"),
        ("prepare_disaggregation", EPP, "route"),
        ("llm_d.kv_cache.score_tokens", "llm-d-kv-cache", "route"),
        ("llm_d.kv_cache.index", "llm-d-kv-cache", "route"),
        ("llm_d.kv_cache_manager.get_scores", "kv-cache-manager", "route"),
        ("score_tokens", EPP, "route"),
        ("index_lookup", EPP, "route"),
        ("compute_scores", EPP, "route"),
        # KV-event processing runs these in traces of their own: not a request's routing
        ("index_add", EPP, "other"),
        ("index_evict", EPP, "other"),
        ("llm_d.kv_cache.index.add", "llm-d-kv-cache", "other"),
        # bare names of other services are not llm-d's
        ("pick_endpoints", "my-app", "other"),
        ("forward_request", "my-app", "other"),
        ("llm_d.pd_proxy.POST /v1/chat/completions", SIDECAR, "server"),
        ("llm_d.pd_proxy.request", "llm-d-pd-proxy", "server"),
        ("forward_request", SIDECAR, "server"),
        ("llm_d.pd_proxy.prefill", SIDECAR, "prefill"),
        ("llm_d.pd_proxy.decode", SIDECAR, "other"),
    ],
)
def test_llmd_span_names_map_onto_stages(name, service, stage):
    assert _stage_of(name, service) == stage


def test_route_ranks_with_the_prefill_envelope_below_the_waits():
    assert PRIORITY["queue"] > PRIORITY["route"] == PRIORITY["prefill"] > PRIORITY["other"]


def pd_request():
    """A disaggregated request through llm-d (ms): the EPP's ext-proc span around the
    request, its orchestration with the scheduler's spans below it, then the sidecar, its
    prefill leg (the prefill instance's vLLM span below it) and its decode leg (the decode
    instance's vLLM span, whose queue time holds the K/V pull)."""
    def vllm(span, parent, start, end, queue_s, prefill_s, ttft_s, host):
        return Span(span, "llm_request", start, end, parent=parent, service="vllm", host=host,
                    attributes={"gen_ai.latency.time_in_queue": queue_s,
                                "gen_ai.latency.time_in_model_prefill": prefill_s,
                                "gen_ai.latency.time_to_first_token": ttft_s})

    epp = {"service": EPP, "host": "epp"}
    side = {"service": SIDECAR, "host": "decode-pod"}
    return [
        client(1, 380, 400),
        Span(2, "gateway.request", 2, 398, parent=1, **epp),
        Span(3, "gateway.request_orchestration", 4, 30, parent=2, **epp),
        Span(4, "run_scheduler_profile", 6, 26, parent=3, **epp),
        Span(5, "filter_endpoints", 6, 8, parent=4, **epp),
        Span(6, "llm_d.epp.scoring", 8, 24, parent=4, **epp),
        Span(7, "llm_d.epp.scorer.precise-prefix-cache-scorer", 8, 20, parent=6, **epp,
             attributes={"llm_d.epp.scorer.type": "precise-prefix-cache-scorer"}),
        Span(8, "score_tokens", 10, 18, parent=7, **epp),
        Span(9, "index_lookup", 11, 17, parent=8, **epp),
        Span(10, "llm_d.epp.scorer.load-aware-scorer", 20, 24, parent=6, **epp),
        Span(11, "pick_endpoints", 24, 26, parent=4, **epp),
        Span(12, "a_plugin_we_do_not_know", 26, 28, parent=3, **epp),  # other, under route
        Span(13, "llm_d.pd_proxy.POST /v1/chat/completions", 32, 396, parent=2, **side),
        Span(14, "forward_request", 33, 395, parent=13, **side),
        Span(15, "prefill", 35, 150, parent=14, **side),
        vllm(16, 15, 40, 148, 0.010, 0.090, 0.100, "prefill-pod"),
        Span(17, "decode", 152, 394, parent=14, **side),
        vllm(18, 17, 155, 393, 0.100, 0.020, 0.125, "decode-pod"),
    ]


def test_gateway_time_is_route_and_the_parts_sum_to_ttft(tmp_path):
    analysis = analysed(tmp_path / "llmd.jsonl", pd_request())
    assert analysis.attribution.boundary == "client"
    got, ttft = parts_ms(analysis)
    # [0, 2) network; the gateway's own time server (2 + 2), the sidecar's until its prefill
    # leg (3) and between its legs (2); the orchestration [4, 30) route, its unknown plugin
    # span included; the prefill leg: its edges (5 + 8 + 2) and the prefill instance's
    # prefill (90) prefill, its queue (10) queue; the decode leg: the decode instance's
    # queue (100, the K/V pull) and prefill (20), the rest of the leg to the client's first
    # token (3 + 105) other.
    assert got == {"network": 2, "server": 9, "route": 26, "queue": 110, "prefill": 125,
                   "other": 108}
    assert sum(got.values()) == ttft == 380
    assert analysis.summary.quality["no_window"] == 0


def test_kv_event_traces_of_the_indexer_are_no_requests(tmp_path):
    background = [Span(100, "index_add", 500, 501, trace=7, service=EPP, host="epp"),
                  Span(101, "index_evict", 502, 503, trace=8, service=EPP, host="epp")]
    analysis = analysed(tmp_path / "llmd.jsonl", pd_request() + background)
    assert len(analysis.assembly.requests) == 1
    assert analysis.summary.quality["no_window"] == 0
    assert parts_ms(analysis)[0]["route"] == 26

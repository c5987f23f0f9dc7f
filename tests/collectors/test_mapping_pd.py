"""Prefill/decode-disaggregated spans of vLLM (the lifecycle spans of vllm-project/vllm#44402)
and SGLang (renamed dispatch slices) map onto ttft's stages (mappings.toml names the
sources), and a vLLM P/D request is attributed with its transfer."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from _build import row

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors.importers.mapping import default_mapping
from ttft.tracer.schema import CLIENT_CLOCK, METADATA_KEY, SPAN_SCHEMA, stage_of

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def span(span_id, name, start_ms, end_ms=None, *, parent=None, service="vllm-decode"):
    """A row of trace 1 at ``T0`` + ms (the client's on its own clock), its stage from its
    name as an importer leaves it (``other`` until the mapping, ``event`` for a point)."""
    end_ms = start_ms if end_ms is None else end_ms
    stage = stage_of(name)
    if stage == "other" and start_ms == end_ms:
        stage = "event"
    clock = CLIENT_CLOCK if service == "loadgen" else "host:vllm"
    return row(1, span_id, name, T0 + start_ms * MS, T0 + end_ms * MS, parent=parent,
               stage=stage, clock=clock, service=service)


def mapped(rows: list[dict]) -> pa.Table:
    meta = {METADATA_KEY: json.dumps({"source_format": "test"}).encode()}
    table = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA).replace_schema_metadata(meta)
    return default_mapping().apply(table)


def vllm_pd() -> list[dict]:
    """The prefill instance queues and prefills; the decode instance waits for the remote
    K/V, queues, computes the last prompt token and samples, then decodes."""
    prefill = {"service": "vllm-prefill"}
    return [
        span(1, "client", 0, 200, service="loadgen"),
        span(2, "first_token", 190, parent=1, service="loadgen"),
        span(3, "vllm_queue", 10, 20, parent=1, **prefill),
        span(4, "vllm_prefill", 20, 80, parent=1, **prefill),
        span(5, "vllm_async_kv_transfer", 85, 150, parent=1),
        span(6, "vllm_queue", 150, 155, parent=1),
        span(7, "vllm_prefill", 155, 160, parent=1),
        span(8, "vllm_decode", 160, 400, parent=1),
    ]


def test_vllm_lifecycle_spans_map_onto_stages():
    rows = mapped(vllm_pd()).select(["name", "stage"]).to_pylist()
    assert {r["name"]: r["stage"] for r in rows} == {
        "client": "client", "first_token": "event", "vllm_queue": "queue",
        "vllm_prefill": "prefill", "vllm_async_kv_transfer": "kv_transfer",
        "vllm_decode": "other",
    }


def test_vllm_pd_request_attributes_the_transfer():
    result = attribute(assemble(mapped(vllm_pd())), "client", "exclusive")
    got = {k: v // MS for k, v in result.attributed.iloc[0].items() if v}
    # No server span: the client window [0, 190) minus the server-side spans is untraced
    # ([0, 10) and the hand-off [80, 85): no server window tells network from server); the
    # decode phase from the decode instance's first token at 160 to its arrival at the
    # client is the decode span's (`other`).
    assert got == {"untraced": 10 + 5, "queue": 10 + 5, "prefill": 60 + 5, "kv_transfer": 65,
                   "other": 30}
    assert sum(got.values()) == 190


@pytest.mark.parametrize("name", ["api_server_dispatch", "dpc_dispatch"])
def test_sglang_renamed_dispatch_slices_are_stated_other(name):
    rules = [r for r in default_mapping().rules
             if not r.is_interval and r.matches_pair("sglang", name)]  # intervals map no row
    assert rules and rules[0].stage == "other" and rules[0].source == "sglang"

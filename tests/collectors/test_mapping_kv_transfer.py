"""SGLang's PD-disaggregation transfer slices map onto ``kv_transfer`` and take their time
in the client boundary (collectors/importers/mappings.toml names the sources)."""

from __future__ import annotations

import json

import pyarrow as pa

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.collectors.importers.mapping import default_mapping
from ttft.tracer.schema import CLIENT_CLOCK, METADATA_KEY, SPAN_SCHEMA, stage_of

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def row(span, name, start_ms, end_ms=None, *, parent=None, clock="host:sgl", **attributes):
    end_ms = start_ms if end_ms is None else end_ms
    stage = stage_of(name)
    if stage == "other" and start_ms == end_ms:
        stage = "event"
    return {
        "trace_id": format(1, "032x"),
        "span_id": format(span, "016x"),
        "parent_id": None if parent is None else format(parent, "016x"),
        "request_id": None,
        "name": name,
        "stage": stage,
        "start_ns": T0 + start_ms * MS,
        "end_ns": T0 + end_ms * MS,
        "clock": clock,
        "service": "loadgen" if clock == CLIENT_CLOCK else "sglang",
        "attributes": json.dumps(attributes),
    }


def test_prefill_and_decode_transfer_slices_are_kv_transfer():
    rows = [
        row(1, "client", 0, 500, clock=CLIENT_CLOCK),
        row(2, "first_token", 400, parent=1, clock=CLIENT_CLOCK),
        row(3, "prefill Req 1a2b3c4d", 10, 390, parent=1, rid="1a2b3c4d"),
        row(4, "prefill_waiting", 20, 100, parent=3),
        row(5, "prefill_forward", 100, 200, parent=3),
        row(6, "prefill_transfer_kv_cache", 200, 260, parent=3),
        row(7, "decode Req 1a2b3c4d", 15, 390, parent=1, rid="1a2b3c4d"),
        row(8, "decode_transferred", 210, 280, parent=7),
        row(9, "decode_waiting", 280, 300, parent=7),
    ]
    meta = {METADATA_KEY: json.dumps({"source_format": "test"}).encode()}
    table = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA).replace_schema_metadata(meta)
    mapped = default_mapping().apply(table)
    stages = {r["name"]: r["stage"] for r in mapped.select(["name", "stage"]).to_pylist()}
    assert stages["prefill_transfer_kv_cache"] == stages["decode_transferred"] == "kv_transfer"
    result = attribute(assemble(mapped), "client", "exclusive")
    got = {k: v / MS for k, v in result.attributed.iloc[0].items() if v}
    # The two transfer slices overlap: their union [200, 280) is kv_transfer. The server
    # window is [10, 390) (no first byte: the root's end); the rest of [0, 400) is network.
    assert got == {"network": 20, "server": 10 + 90, "queue": 80 + 20, "prefill": 100,
                   "kv_transfer": 80}

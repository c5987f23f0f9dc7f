"""``analysis.transfer``: each request's K/V transfer (blocks, bytes, duration, achieved
bandwidth, estimated or measured), its summary under ``kv_transfer`` in ``ttft analyze
--json``, and the deployment named by the run metadata."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _build import row, table, tid
from _disagg import BLOCK_BYTES, DECODE, METADATA_COLOCATED, METADATA_DISAGG, two_workers

from ttft.analysis import analyze
from ttft.analysis.transfer import COLUMNS, deployment, transfer_summary, transfers
from ttft.tracer.schema import (
    ATTR_ESTIMATED,
    ATTR_KV_BLOCKS,
    ATTR_KV_BYTES,
    ATTR_KV_FIRST_TOKEN,
)


def four_requests() -> list[dict]:
    """Request 1: 4 blocks in 45 ns; 2: 8 blocks in 45 ns; 3: its transfer estimated by the
    source (no bytes); 4: no transfer at all; 5: a transfer without its bytes."""
    rows = two_workers(1, 0, blocks=4) + two_workers(2, 1000, blocks=8)
    est = [r for r in two_workers(3, 2000) if r["name"] != "kv_transfer"]
    est.append(row(3, 308, "kv_transfer", 2030, 2070, parent=302, **DECODE,
                   **{ATTR_ESTIMATED: "dynamo upper bound"}))
    none = [r for r in two_workers(4, 3000) if r["name"] != "kv_transfer"]
    unknown = [r for r in two_workers(5, 4000) if r["name"] != "kv_transfer"]
    unknown.append(row(5, 508, "kv_transfer", 4030, 4090, parent=502, **DECODE,
                       **{ATTR_KV_BLOCKS: 2}))
    return rows + est + none + unknown


def test_each_transfer_is_measured_exactly_and_requests_without_one_are_absent():
    found = analyze(table(four_requests()))
    frame = transfers(found.assembly, found.attribution.requests["request"].to_numpy())
    assert tuple(frame.columns) == COLUMNS
    got = {r.trace_id: (r.blocks, r.bytes, r.dur_ns, r.estimated)
           for r in frame.itertuples(index=False)}
    assert got == {
        tid(1): (4, 4 * BLOCK_BYTES, 45, False),
        tid(2): (8, 8 * BLOCK_BYTES, 45, False),
        tid(3): (-1, -1, 40, True),
        tid(5): (2, -1, 60, False),
    }
    rate = dict(zip(frame["trace_id"], frame["bytes_per_s"], strict=True))
    assert rate[tid(1)] == 4 * BLOCK_BYTES * 1e9 / 45
    assert rate[tid(2)] == 8 * BLOCK_BYTES * 1e9 / 45
    assert np.isnan(rate[tid(3)]) and np.isnan(rate[tid(5)])


def test_several_slices_of_one_request_are_one_transfer():
    rows = [r for r in two_workers(1) if r["name"] != "kv_transfer"]
    rows += [
        row(1, 120, "kv_transfer", 30, 50, parent=102, **DECODE,
            **{ATTR_KV_BLOCKS: 1, ATTR_KV_BYTES: 1000}),
        row(1, 121, "kv_transfer", 55, 80, parent=102, **DECODE,
            **{ATTR_KV_BLOCKS: 2, ATTR_KV_BYTES: 3000}),
    ]
    found = analyze(table(rows))
    frame = transfers(found.assembly, found.attribution.requests["request"].to_numpy())
    assert frame[["blocks", "bytes", "dur_ns"]].to_numpy().tolist() == [[3, 4000, 50]]
    assert frame["bytes_per_s"].iloc[0] == 4000 * 1e9 / 50


def test_the_summary_counts_estimates_and_takes_bandwidth_from_measured_transfers():
    summary = analyze(table(four_requests())).summary
    kv = summary.kv_transfer
    one, two = 4 * BLOCK_BYTES * 1e9 / 45, 8 * BLOCK_BYTES * 1e9 / 45
    assert kv == {
        "requests": 4,
        "estimated": 1,
        "blocks": 4 + 8 + 2,
        "bytes": 12 * BLOCK_BYTES,
        "duration_ms": {"p50": pytest.approx(45e-6), "p90": pytest.approx(55.5e-6),
                        "max": 60e-6},
        "bytes_per_s": {"p50": pytest.approx((one + two) / 2), "p90": pytest.approx(
            one + 0.9 * (two - one)), "min": one, "max": two, "requests": 2},
        "aggregate_bytes_per_s": 12 * BLOCK_BYTES * 1e9 / 90,
        "first_token": {},
    }
    assert json.loads(summary.to_json())["kv_transfer"]["requests"] == 4


def test_a_trace_without_transfers_has_no_kv_transfer_key():
    rows = [r for r in two_workers(1) if r["name"] != "kv_transfer"]
    summary = analyze(table(rows)).summary
    assert summary.kv_transfer is None
    assert "kv_transfer" not in summary.to_dict()
    assert transfer_summary(transfers(analyze(table(rows)).assembly, np.arange(1))) is None


def test_only_estimates_give_no_bandwidth():
    rows = [r for r in two_workers(1) if r["name"] != "kv_transfer"]
    rows.append(row(1, 108, "kv_transfer", 30, 70, parent=102, **DECODE,
                    **{ATTR_ESTIMATED: "x", ATTR_KV_BLOCKS: 3, ATTR_KV_BYTES: 3000}))
    kv = analyze(table(rows)).summary.kv_transfer
    assert (kv["requests"], kv["estimated"], kv["bytes"]) == (1, 1, 3000)
    assert kv["bytes_per_s"] is None and kv["aggregate_bytes_per_s"] is None


def test_deployment_names_what_the_run_metadata_says():
    assert deployment(METADATA_DISAGG) == "disaggregated (first token: decode)"
    assert deployment(METADATA_COLOCATED) == "co-located"
    assert deployment({"engine": {"disaggregated": {}}}) == "disaggregated"
    assert deployment({"generator": "synthetic"}) is None
    assert deployment({"engine": "not a mapping"}) is None


def test_each_transfer_names_the_side_its_spans_say_sent_the_first_token():
    """``ttft.kv.first_token`` on a request's transfer spans (the first that names one), as
    counts per side in the summary; a request whose spans name none counts for no side."""
    rows = [r for r in two_workers(1) + two_workers(2, 1000) + two_workers(3, 2000)
            if r["name"] != "kv_transfer"]
    rows += [
        row(1, 120, "kv_transfer", 30, 50, parent=102, **DECODE,
            **{ATTR_KV_BLOCKS: 1, ATTR_KV_BYTES: 1000, ATTR_KV_FIRST_TOKEN: "decode"}),
        row(2, 220, "kv_transfer", 1030, 1050, parent=202, **DECODE,
            **{ATTR_KV_BLOCKS: 1, ATTR_KV_BYTES: 1000}),
        row(2, 221, "kv_transfer", 1055, 1060, parent=202, **DECODE,
            **{ATTR_KV_BLOCKS: 1, ATTR_KV_BYTES: 1000, ATTR_KV_FIRST_TOKEN: "prefill"}),
        row(3, 320, "kv_transfer", 2030, 2050, parent=302, **DECODE,
            **{ATTR_KV_BLOCKS: 1, ATTR_KV_BYTES: 1000, ATTR_KV_FIRST_TOKEN: "elsewhere"}),
    ]
    found = analyze(table(rows))
    frame = transfers(found.assembly, found.attribution.requests["request"].to_numpy())
    assert dict(zip(frame["trace_id"], frame["first_token"], strict=True)) == {
        tid(1): "decode", tid(2): "prefill", tid(3): None}
    assert found.summary.kv_transfer["first_token"] == {"decode": 1, "prefill": 1}

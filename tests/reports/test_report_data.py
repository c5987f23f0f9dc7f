"""What the report draws: chosen requests and waterfall lanes."""

from __future__ import annotations

import numpy as np
import pytest

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.pipeline import analyze
from ttft.collectors.synthetic import generate
from ttft.reports import report_data
from ttft.tracer.schema import BOUNDARY_EVENTS


@pytest.fixture(scope="module")
def data():
    synthetic = generate(200, seed=11)
    return report_data.build_report(analyze(synthetic.table, trace="synth"))


def test_chosen_requests_are_the_median_p99_and_slowest(data):
    ttft = np.sort(data.attribution.requests["ttft_ns"].to_numpy())
    got = {w.label: w.ttft_ms for w in data.waterfalls}
    assert got == {
        "median": ttft[99] / 1e6,
        "p99": ttft[197] / 1e6,
        "slowest": ttft[199] / 1e6,
    }


def test_a_request_chosen_twice_is_drawn_once():
    attr = attribute(assemble(generate(2, seed=1).table))
    assert [label for label, _ in report_data.chosen_requests(attr)] == ["median", "p99"]


def test_waterfall_lanes_never_overlap_and_hold_the_window(data):
    for w in data.waterfalls:
        spans = w.spans
        assert len(spans) > 0
        for _, lane in spans.groupby("lane"):
            lane = lane.sort_values("start_ms")
            assert (lane["start_ms"].to_numpy()[1:] >= lane["end_ms"].to_numpy()[:-1]).all()
        # Every lane label names one clock; steps sit in lanes of their own.
        for label, stage in zip(spans["lane"], spans["stage"], strict=True):
            clock = label.rpartition(" · ")[0]
            assert clock.endswith(" steps") == (stage == "step")
        # The window starts at 0 and the boundary event ends it.
        assert w.window_ms == (0.0, w.ttft_ms)
        first_token = [t for name, _, t in w.events if name == "first_token"]
        assert first_token == [pytest.approx(w.ttft_ms)]
        assert {name for name, _, _ in w.events} >= set(BOUNDARY_EVENTS)
        assert sum(w.parts_ms.values()) == pytest.approx(w.ttft_ms)
        # GPU spans of the request's own chunk steps come along, on the gpu clock.
        assert (spans[spans["stage"] == "gpu"]["clock"] == "gpu:0").all()
        assert (spans["stage"] == "gpu").any()


def test_lane_order_puts_client_then_host_then_gpu():
    lanes = ["gpu:0 · 1", "host:a steps · 1", "host:a · 2", "client · 1", "host:a · 1"]
    assert report_data.lane_order(lanes) == [
        "client · 1",
        "host:a · 1",
        "host:a · 2",
        "host:a steps · 1",
        "gpu:0 · 1",
    ]


def test_blame_and_the_prefill_fit_are_over_the_requests_the_ttft_figures_are_over():
    """Found: the report's wait blame and prefill fit counted failed requests and those
    without a window, so its queue row said 20 requests beside a headline of 15."""
    import json

    import pyarrow as pa

    from ttft.analysis.blame import blame, blame_summary

    table = generate(40, seed=4).table
    stages = table.column("stage").cast(pa.string()).to_pylist()
    traces = table.column("trace_id").to_pylist()
    failed = {t for t, s in zip(traces, stages, strict=True) if s == "client"}
    failed = set(sorted(failed)[:6])
    attrs = [json.dumps({"outcome": "timeout", "error": "timed out"})
             if s == "client" and t in failed else a
             for s, a, t in zip(stages, table.column("attributes").to_pylist(), traces,
                                strict=True)]
    table = table.set_column(table.schema.get_field_index("attributes"), "attributes",
                             pa.array(attrs, pa.string()))
    analysis = analyze(table, trace="synth")
    data = report_data.build_report(analysis)
    ok = set(data.attribution.requests["trace_id"])
    assert len(ok) == 34 and not ok & failed
    every = blame(analysis.assembly)
    assert set(every["trace_id"]) & failed  # blame itself covers every request
    queue = data.blame[(data.blame["condition"] == "all") & (data.blame["wait"] == "queue")]
    want = blame_summary(every[every["trace_id"].isin(ok)])
    want = want[(want["condition"] == "all") & (want["wait"] == "queue")]
    assert int(queue["requests"].iloc[0]) == int(want["requests"].iloc[0]) <= 34
    assert queue.reset_index(drop=True).equals(want.reset_index(drop=True))
    assert set(data.prefill_points["trace_id"]) <= ok

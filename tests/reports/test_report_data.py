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


def test_a_waterfall_draws_the_gpu_spans_attribution_joined():
    """Two engine traces count steps from 0 (a restart): each request's waterfall draws the
    gpu span of its own engine trace, the one attribution joined, not both with its
    ``(service, step_id)``; and one request's chunks on two steps draw those two only."""
    from _build import event, row, table

    def run(trace: int, engine: int, t0: int, gpu_ns: int, steps=(7,)) -> list[dict]:
        out = [row(trace, 1, "server", t0, t0 + 100),
               row(trace, 2, "queue", t0, t0 + 10, parent=1),
               row(trace, 4, "sample", t0 + 60, t0 + 70, parent=1),
               event(trace, 5, "first_byte", t0 + 80, parent=1),
               row(engine, 1, "step", t0 + 5, t0 + 65)]
        for i, step in enumerate(steps):
            out.append(row(trace, 10 + i, "prefill.chunk", t0 + 10 + 20 * i, t0 + 30 + 20 * i,
                           parent=1, step_id=step))
            out.append(row(engine, 20 + i, "gpu", t0 + 15 + 20 * i, t0 + 15 + 20 * i + gpu_ns,
                           parent=1, step_id=step))
        return out

    asm = assemble(table(run(1, 2, 0, 4) + run(3, 4, 10_000, 3, steps=(7, 8))
                         + run(5, 6, 20_000, 2, steps=(8,))))
    assert asm.quality.counts["reused_step_id"] > 0
    for request, expected in enumerate(([(15, 19)], [(10_015, 10_018), (10_035, 10_038)],
                                        [(20_015, 20_017)])):
        frame = report_data.request_spans(asm, request, 0, 30_000)
        gpu = frame[frame["stage"] == "gpu"]
        assert sorted(zip(gpu["start_ns"], gpu["end_ns"], strict=True)) == expected, request


def test_each_drawn_request_is_named_by_what_tells_it_apart(data):
    tags = [w.tag for w in data.waterfalls]
    assert len(set(tags)) == len(tags)
    for w in data.waterfalls:
        assert w.request_id and w.tag == w.request_id


def test_without_a_request_id_a_request_is_named_by_its_trace_id_s_random_end():
    shared = "36f1de77d7df0123456789ab"  # ids of one run used to share 28 leading digits
    w = report_data.Waterfall("median", shared + "0000000a", None, 1.0, (0.0, 1.0),
                              None, [], {}, [])
    other = report_data.Waterfall("p99", shared + "0000000b", None, 1.0, (0.0, 1.0),
                                  None, [], {}, [])
    assert w.tag != other.tag and w.tag.endswith("0000000a")

"""Client/server clock offsets: the midpoint rule recovers a known shift, attribution of a
shifted trace equals the unshifted one, and one-host traces are left alone."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _build import event, row, table
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.clock_offset import MIN_REQUESTS, ClockOffset
from ttft.analysis.clocks import apply_offsets, estimate_offsets
from ttft.analysis.request_values import request_values
from ttft.analysis.summary import Summary, summarize
from ttft.collectors.synthetic import HOST_CLOCK, generate
from ttft.reports.terminal import render_analysis
from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES

CLIENT = {"clock": "client", "service": "loadgen"}
MS = 1_000_000
N = 120


@pytest.fixture(scope="module")
def synth() -> pa.Table:
    return generate(N, seed=3).table


def shifted(tab: pa.Table, delta_ns: int) -> pa.Table:
    """``tab`` with every row not on the client clock moved by ``delta_ns``: the server's
    clock (and its gpu clock) reads ``delta_ns`` more than the client's."""
    moved = pc.not_equal(tab.column("clock").cast(pa.string()), "client")
    for name in ("start_ns", "end_ns"):
        column = tab.column(name)
        new = pc.if_else(moved, pc.add(column, delta_ns), column)
        tab = tab.set_column(tab.schema.get_field_index(name), tab.schema.field(name), new)
    return tab


def parts(tab: pa.Table, boundary: str, policy: str) -> tuple[list[str], np.ndarray]:
    result = attribute(assemble(tab), boundary, policy)
    return result.requests["trace_id"].tolist(), result.attributed.to_numpy()


def assert_same_attribution(
    a: pa.Table, b: pa.Table, tolerance_ns: int = 1_000, boundaries=BOUNDARY_NAMES
) -> None:
    for boundary in boundaries:
        for policy in POLICIES:
            ids_a, att_a = parts(a, boundary, policy)
            ids_b, att_b = parts(b, boundary, policy)
            assert ids_a == ids_b
            assert np.abs(att_a - att_b).max(initial=0) <= tolerance_ns, (boundary, policy)


def test_one_host_trace_gets_offset_zero_and_unchanged_attribution(synth):
    assert estimate_offsets(synth) == [ClockOffset("client", HOST_CLOCK, 0, 0, 0, N, 0, 0)]
    assert apply_offsets(synth, estimate_offsets(synth)) is synth
    asm = assemble(synth)
    assert [c.offset_ns for c in asm.quality.clocks] == [0]
    summary = summarize(attribute(asm), request_values(asm, attribute(asm))).to_dict()
    assert "clocks" not in summary  # nothing to report: the clocks agree


@pytest.mark.parametrize("delta_ns", [3_700 * MS, -250 * MS, 12 * MS])
def test_known_shift_is_recovered_and_undone(synth, delta_ns):
    moved = shifted(synth, delta_ns)
    (offset,) = estimate_offsets(moved)
    # The synthetic network delay is the same both ways: the midpoint rule is exact.
    assert offset == ClockOffset("client", HOST_CLOCK, -delta_ns, -delta_ns, 0, N, N, 0)
    back = apply_offsets(moved, [offset])
    for name in ("start_ns", "end_ns"):  # gpu:0 spans move with their host clock too
        assert back.column(name).equals(synth.column(name))


@pytest.mark.parametrize("delta_ns", [3_700 * MS, -250 * MS])
def test_attribution_of_a_shifted_trace_equals_the_unshifted_one(synth, delta_ns):
    moved = shifted(synth, delta_ns)
    assert_same_attribution(synth, moved, tolerance_ns=0)
    asm = assemble(moved)
    assert asm.quality.counts["clock_shift"] == 0
    assert [c.offset_ns for c in asm.quality.clocks] == [-delta_ns]


def test_a_shifted_trace_in_several_chunks_moves_its_own_copy_of_the_times(synth):
    # Several chunks: the decoded times are numpy's own copy, shifted in place; the table
    # itself (Arrow's buffers) must not move, and the answer is the one-chunk table's.
    moved = shifted(synth, -250 * MS)
    chunked = pa.Table.from_batches(moved.to_batches(max_chunksize=7))
    assert chunked.column("start_ns").num_chunks > 1
    before = chunked.column("start_ns").to_pylist()
    assert_same_attribution(moved, chunked, tolerance_ns=0)
    assert chunked.column("start_ns").to_pylist() == before
    one, many = assemble(moved).rows, assemble(chunked).rows
    assert np.array_equal(one.start_ns, many.start_ns)
    assert np.array_equal(one.end_ns, many.end_ns)


def test_summary_and_terminal_report_the_offset(synth):
    moved = shifted(synth, -250 * MS)
    asm = assemble(moved)
    summary = summarize(attribute(asm), request_values(asm, attribute(asm))).to_dict()
    assert list(summary)[-3:] == ["quality", "clocks", "load"]
    assert summary["clocks"] == [
        {
            "client_clock": "client",
            "server_clock": HOST_CLOCK,
            "applied": True,
            "offset_ms": 250.0,
            "estimate_ms": 250.0,
            "spread_ms": 0.0,
            "requests": N,
            "violations_before": N,
            "violations_after": 0,
            "bounded": True,
        }
    ]
    assert f"clocks: {HOST_CLOCK} → client offset +250.000 ms" in rendered(summary)


def rendered(summary: dict) -> str:
    out = io.StringIO()
    render_analysis(Summary(**summary), Console(file=out, width=250, color_system=None))
    return out.getvalue()


def drop_events(tab: pa.Table, names: tuple[str, ...], traces: list[str]) -> pa.Table:
    gone = pc.and_(
        pc.is_in(tab.column("name"), pa.array(names)),
        pc.is_in(tab.column("trace_id"), pa.array(traces)),
    )
    return tab.filter(pc.invert(gone))


def test_requests_without_events_fall_back_to_spans(synth):
    traces = sorted(
        set(synth.filter(pc.equal(synth.column("name"), "client"))["trace_id"].to_pylist())
    )
    # A third loses `sent` (the client span's start is used: biased by connect time), a
    # third loses `first_byte` (client end against server end: exact here); the median is
    # still exact.
    base = drop_events(synth, ("sent",), traces[: N // 3])
    base = drop_events(base, ("first_byte",), traces[N // 3 : 2 * N // 3])
    moved = shifted(base, 3_700 * MS)
    (offset,) = estimate_offsets(moved)
    assert (offset.offset_ns, offset.requests, offset.violations_after) == (-3_700 * MS, N, 0)
    assert offset.spread_ns > 0
    assert_same_attribution(base, moved, tolerance_ns=0)


def test_requests_missing_a_side_are_left_out(synth):
    client_only = [
        row(900, 1, "client", 0, 10 * MS, **CLIENT),
        event(900, 2, "sent", 1 * MS, **CLIENT),
        event(900, 3, "first_token", 5 * MS, **CLIENT),
    ]
    moved = pa.concat_tables([shifted(synth, 3_700 * MS), table(client_only)])
    (offset,) = estimate_offsets(moved)
    assert (offset.offset_ns, offset.requests) == (-3_700 * MS, N)


def requests_with(delays: list[tuple[int, int]], delta_ns: int, clock: str = "host:b") -> list:
    """One request per ``(forward, back)`` network delay; server clock = client + delta."""
    rows = []
    for i, (fwd, back) in enumerate(delays):
        t, base = i + 1, (i + 1) * 1_000 * MS
        server0 = base + 100_000 + fwd  # sent at base + 100 us
        first_byte = server0 + 7 * MS
        srv = {"clock": clock, "request_id": f"r{t}"}
        rows += [
            row(t, 10 * t, "client", base, first_byte + back + 20 * MS, **CLIENT),
            event(t, 10 * t + 1, "sent", base + 100_000, parent=10 * t, **CLIENT),
            event(t, 10 * t + 2, "first_token", first_byte + back, parent=10 * t, **CLIENT),
            row(
                t,
                10 * t + 3,
                "server",
                server0 + delta_ns,
                first_byte + 15 * MS + delta_ns,
                parent=10 * t,
                **srv,
            ),
            row(
                t,
                10 * t + 4,
                "queue",
                server0 + delta_ns + 10_000,
                first_byte + delta_ns,
                parent=10 * t + 3,
                **srv,
            ),
            event(t, 10 * t + 5, "first_byte", first_byte + delta_ns, parent=10 * t + 3, **srv),
        ]
    return rows


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(st.integers(-6 * MS, 6 * MS), st.integers(-(10**10), 10**10)),
    st.lists(st.integers(1_000, 5 * MS), min_size=MIN_REQUESTS, max_size=30),
)
def test_symmetric_delays_recover_the_offset(delta_ns, delays):
    tab = table(requests_with([(d, d) for d in delays], delta_ns))
    (offset,) = estimate_offsets(tab)
    outside = sum(d < abs(delta_ns) for d in delays)
    assert offset.violations_before == outside
    if 2 * outside > len(delays):
        assert (offset.offset_ns, offset.violations_after) == (-delta_ns, 0)
    else:  # most requests fit as they are: no adjustment
        assert (offset.offset_ns, offset.violations_after) == (0, outside)
    assert offset.estimate_ns == -delta_ns and offset.spread_ns == 0
    if offset.violations_after == 0:
        unshifted = table(requests_with([(d, d) for d in delays], 0))
        assert_same_attribution(unshifted, tab, boundaries=["client"])


@settings(max_examples=40, deadline=None)
@given(
    st.integers(10 * MS, 10**10),
    st.sampled_from([1, -1]),
    st.lists(
        st.tuples(st.integers(1_000, 5 * MS), st.integers(1_000, 5 * MS)),
        min_size=MIN_REQUESTS,
        max_size=30,
    ),
)
def test_asymmetric_delays_bound_the_error(size_ns, sign, delays):
    delta_ns = sign * size_ns
    (offset,) = estimate_offsets(table(requests_with(delays, delta_ns)))
    worst = max(abs(back - fwd) for fwd, back in delays) / 2
    assert offset.applied and abs(offset.offset_ns + delta_ns) <= worst + 1


def test_too_few_requests_are_reported_not_applied():
    few = MIN_REQUESTS - 1
    (offset,) = estimate_offsets(table(requests_with([(MS, MS)] * few, 3_700 * MS)))
    assert (offset.offset_ns, offset.estimate_ns) == (0, -3_700 * MS)
    assert offset.violations_before == offset.violations_after == few


def test_a_minority_outside_on_one_host_changes_nothing():
    """A client that records ``sent`` late makes some requests look shifted; most fit."""
    delays = [(MS, MS)] * 12 + [(-2 * MS, MS)] * 5  # server "starts" before sent
    tab = table(requests_with(delays, 0))
    (offset,) = estimate_offsets(tab)
    assert (offset.offset_ns, offset.violations_before, offset.violations_after) == (0, 5, 5)
    asm = assemble(tab)
    summary = summarize(attribute(asm), request_values(asm, attribute(asm))).to_dict()
    assert summary["clocks"][0]["violations_after"] == 5  # reported: something is off
    assert "clocks: host:b → client not adjusted" in rendered(summary)


def test_two_server_clocks_get_one_offset_each():
    delays = [(MS, MS)] * MIN_REQUESTS
    rows = requests_with(delays, 2_000 * MS, clock="host:a")
    other = requests_with(delays, -40 * MS, clock="host:b")
    for r in other:
        r["trace_id"] = "f" + r["trace_id"][1:]
        if r["request_id"]:
            r["request_id"] = "b-" + r["request_id"]
    offsets = estimate_offsets(table(rows + other))
    assert [(o.server_clock, o.offset_ns) for o in offsets] == [
        ("host:a", -2_000 * MS),
        ("host:b", 40 * MS),
    ]


def test_gpu_clocks_move_with_their_host():
    rows = [
        row(1, 1, "step", 100, 200, clock="host:a", step_id=1),
        row(1, 2, "gpu", 110, 190, parent=1, clock="gpu:0", step_id=1),
        row(2, 3, "step", 100, 200, clock="host:b", service="other", step_id=1),
        row(2, 4, "gpu", 110, 190, parent=3, clock="gpu:0", service="other", step_id=1),
        row(3, 5, "gpu", 300, 310, clock="gpu:1"),  # no host in its trace: the service's
        row(4, 6, "client", 0, 10, **CLIENT),
    ]
    offset = ClockOffset("client", "host:a", -50, -50, 0, 10, 10, 0)
    out = apply_offsets(table(rows), [offset])
    assert out.column("start_ns").to_pylist() == [50, 60, 100, 110, 250, 0]
    with pytest.raises(ValueError, match="two clock offsets"):
        apply_offsets(table(rows), [offset, offset])
    assert apply_offsets(table(rows), []).equals(table(rows))

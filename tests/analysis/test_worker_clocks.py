"""Worker clocks (``analysis._worker_clocks``): a disaggregated prefill worker's clock moves
with its server's, and by an offset of its own when it is on a host of its own; on one host
nothing moves; partitions estimate it as the whole does."""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _disagg import disaggregate
from test_part import in_partitions, one_process, split

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.clocks import apply_offsets, estimate_offsets, offsets_from_bounds
from ttft.analysis.order_stats import Spilled, load_keyed, save_keyed
from ttft.analysis.part import survey
from ttft.collectors.synthetic import generate
from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES

MS = 1_000_000
SERVER, WORKER, GPU = "host:synth", "host:synth/prefill", "gpu:0"


@cache
def disagg(requests: int = 200, seed: int = 3) -> pa.Table:
    return disaggregate(generate(requests, seed=seed).table)


def moved(tab: pa.Table, delta_ns: int, clocks: tuple[str, ...]) -> pa.Table:
    """``tab`` with the rows on ``clocks`` reading ``delta_ns`` later."""
    hit = pc.is_in(tab.column("clock"), pa.array(clocks))
    for name in ("start_ns", "end_ns"):
        i, column = tab.schema.get_field_index(name), tab.column(name)
        tab = tab.set_column(i, tab.schema.field(name),
                             pc.if_else(hit, pc.add(column, delta_ns), column))
    return tab


def parts(tab: pa.Table, boundary: str, policy: str) -> tuple[list[str], np.ndarray]:
    result = attribute(assemble(tab), boundary, policy)
    return result.requests["trace_id"].tolist(), result.attributed.to_numpy()


def worst_difference_ns(a: pa.Table, b: pa.Table, policies=POLICIES) -> int:
    worst = 0
    for boundary in BOUNDARY_NAMES:
        for policy in policies:
            ids_a, att_a = parts(a, boundary, policy)
            ids_b, att_b = parts(b, boundary, policy)
            assert ids_a == ids_b
            worst = max(worst, int(np.abs(att_a - att_b).max(initial=0)))
    return worst


def pair(offsets, clock: str):
    return next(o for o in offsets if o.server_clock == clock)


def test_one_host_moves_nothing():
    offsets = estimate_offsets(disagg())
    worker = pair(offsets, WORKER)
    assert worker.client_clock == SERVER and worker.violations_before == 0
    assert not any(o.applied for o in offsets)
    assert apply_offsets(disagg(), offsets) is disagg()


def test_the_worker_moves_with_a_server_on_another_host_than_the_client():
    """The client 250 ms behind the server's host, where the prefill worker (a clock name of
    its own, as ``ttft serve --disaggregate`` writes) runs too: every part is unchanged.
    Before, the worker's rows stayed put and the gpu stage lost 109 of its 124 ms."""
    skewed = moved(disagg(), 250 * MS, (SERVER, WORKER, GPU))
    offsets = estimate_offsets(skewed)
    assert pair(offsets, SERVER).applied and not pair(offsets, WORKER).applied
    assert worst_difference_ns(disagg(), skewed) <= 1_000
    assert assemble(skewed).quality.counts["outside_window"] == 0


@pytest.mark.parametrize("delta_ms", [-20, -3, 2, 20])
def test_a_worker_on_a_host_of_its_own_is_moved_back(delta_ms):
    skewed = moved(disagg(), delta_ms * MS, (WORKER, GPU))
    worker = pair(estimate_offsets(skewed), WORKER)
    assert worker.applied and worker.violations_after == 0
    # the range every request fits narrows the estimate to a fraction of a ms
    assert abs(worker.offset_ns + delta_ms * MS) < 0.3 * MS
    assert 0 < worker.spread_ns < 1 * MS
    # the critical path may take another chain for a 0.1 ms move: the other two are smooth
    assert worst_difference_ns(disagg(), skewed, ("exclusive", "shared")) < 0.3 * MS
    assert assemble(skewed).quality.counts["outside_window"] == 0


def test_a_skew_inside_the_slack_is_left_alone():
    """0.02 ms: every request still fits; nothing says the clocks disagree."""
    skewed = moved(disagg(), 20_000, (WORKER, GPU))
    worker = pair(estimate_offsets(skewed), WORKER)
    assert worker.violations_before == 0 and not worker.applied


def test_too_few_requests_are_reported_not_applied():
    skewed = moved(disagg(6), 20 * MS, (WORKER, GPU))
    worker = pair(estimate_offsets(skewed), WORKER)
    assert worker.requests == 6 and worker.violations_before == 6 and not worker.applied


@pytest.mark.parametrize("partitions", [2, 7])
def test_partitions_estimate_the_worker_as_the_whole_does(partitions):
    skewed = moved(moved(disagg(), 40 * MS, (SERVER, WORKER, GPU)), 6 * MS, (WORKER, GPU))
    dataset = split(skewed, partitions)
    for boundary, policy in (("client", "exclusive"), ("server", "critical-path")):
        merged = in_partitions(dataset, boundary, policy).summary
        single = one_process(skewed, boundary, policy).summary.to_dict()
        assert merged.to_dict() == single
        applied = {c["server_clock"]: c for c in single["clocks"] if c["applied"]}
        assert set(applied) == {SERVER, WORKER}
        assert abs(applied[WORKER]["offset_ms"] + 6) < 0.3


@pytest.mark.parametrize(("partitions", "limit"), [(3, 1), (7, 4)])
def test_spilled_bounds_refined_give_the_offsets_of_the_whole(partitions, limit):
    """A Dask driver's estimate (each partition's bounds on disk, read back a part at a
    time, at most ``limit`` values fetched around a rank) is the whole trace's, field for
    field: the server pair's median and quartiles, the worker pair's order statistics and
    every misfit count."""
    skewed = moved(moved(disagg(), 40 * MS, (SERVER, WORKER, GPU)), 6 * MS, (WORKER, GPU))
    whole = estimate_offsets(skewed)
    in_memory = [survey(t).bounds for t in split(skewed, partitions)]
    with Spilled(save=save_keyed, load=load_keyed, keep_bytes=0) as spilled:
        for k in reversed(range(partitions)):  # put in any order, read in part order
            spilled.put(k, in_memory[k])
        spilled.fetch_limit = limit
        reads = []
        spilled_map = spilled.map
        spilled.map = lambda fn: reads.append(1) or spilled_map(fn)
        found = offsets_from_bounds(spilled)
    assert found == whole == offsets_from_bounds(in_memory)
    assert {o.server_clock for o in found if o.applied} == {SERVER, WORKER}
    assert len(reads) > 6  # refined pass by pass, not fetched at once


def test_keyed_arrays_come_back_as_they_went():
    bounds = {SERVER: (np.array([1, -2], np.int64), np.array([3, 4], np.int64)),
              (SERVER, WORKER): (np.array([], np.int64), np.array([], np.int64))}
    with Spilled(save=save_keyed, load=load_keyed) as spilled:
        spilled.add(bounds)
        (back,) = spilled.map(lambda b: b)
    assert list(back) == list(bounds)
    for key, arrays in bounds.items():
        assert [a.tolist() for a in back[key]] == [a.tolist() for a in arrays]
        assert all(a.dtype == np.int64 for a in back[key])


def cancelled(tab: pa.Table, requests: int, early_ns: int) -> pa.Table:
    """``tab`` with its first ``requests`` requests cancelled mid-prefill: no boundary
    event, the server span ending ``early_ns`` before the worker's last chunk does."""
    frame = tab.to_pandas()
    for name in ("stage", "name", "clock"):
        frame[name] = frame[name].astype(object)
    chunks = frame[frame["stage"] == "prefill.chunk"].groupby("trace_id")["end_ns"].max()
    picked = sorted(chunks.index)[:requests]
    for trace_id in picked:
        server = (frame["trace_id"] == trace_id) & (frame["stage"] == "server")
        frame.loc[server, "end_ns"] = chunks[trace_id] - early_ns
    lost = frame["trace_id"].isin(picked) & frame["name"].isin(
        ["first_byte", "first_token", "first_sampled"])
    return pa.Table.from_pandas(frame[~lost], schema=tab.schema, preserve_index=False)


@pytest.mark.parametrize(("requests", "cancel"), [(200, 5), (50, 1)])
def test_cancelled_requests_on_one_host_move_nothing(requests, cancel):
    """A cancelled request's server span may end before its prefill: only ``first_byte``
    bounds the end (before: 1 such request of 50 moved the worker by 0.16 ms)."""
    tab = cancelled(disagg(requests), cancel, 50_000)
    worker = pair(estimate_offsets(tab), WORKER)
    assert worker.violations_before == 0 and not worker.applied


def test_a_worker_clock_some_requests_serve_on_is_judged_on_all_requests():
    """Three requests (no client) have the worker's clock as their server clock: the whole
    file and its partitions alike align the worker by its 200 requests (before: the whole
    file left the 6 ms alone, partitions without the three moved it)."""
    base = moved(disagg(), 6 * MS, (WORKER, GPU))
    frame = base.to_pandas()
    for name in ("stage", "clock", "trace_id", "span_id", "parent_id", "request_id"):
        frame[name] = frame[name].astype(object)
    picked = sorted(frame.loc[frame["stage"] == "server", "trace_id"])[:3]
    extra = frame[frame["trace_id"].isin(picked) & (frame["clock"] != "client")].copy()
    extra["clock"] = WORKER
    extra = extra[extra["stage"] != "client"]
    for name in ("trace_id", "request_id"):
        extra[name] = ["e" + str(v)[1:] for v in extra[name]]
    tab = pa.Table.from_pandas(pd.concat([frame, extra]), schema=base.schema,
                               preserve_index=False)
    single = one_process(tab, "client", "exclusive").summary.to_dict()
    applied = {c["server_clock"]: c for c in single["clocks"] if c["applied"]}
    assert abs(applied[WORKER]["offset_ms"] + 6) < 0.3 and applied[WORKER]["requests"] == 200
    for partitions in (2, 5):
        merged = in_partitions(split(tab, partitions), "client", "exclusive").summary
        assert merged.to_dict() == single


def test_the_terminal_says_how_far_a_worker_moves_in_all():
    from test_clocks import rendered

    from ttft.analysis.request_values import request_values
    from ttft.analysis.summary import summarize

    skewed = moved(moved(disagg(), 40 * MS, (SERVER, WORKER, GPU)), 6 * MS, (WORKER, GPU))
    asm = assemble(skewed)
    text = rendered(summarize(attribute(asm), request_values(asm, attribute(asm))).to_dict())
    assert f"clocks: {SERVER} → client offset -40.000 ms" in text
    own = pair(asm.quality.clocks, WORKER).offset_ns / MS
    assert f"clocks: {WORKER} → {SERVER} offset {own:+,.3f} ms" in text
    assert f"with {SERVER}'s, its rows move {own - 40:+,.3f} ms" in text


def _clock_line(tab: pa.Table) -> tuple[dict, str]:
    """The worker pair of ``tab``'s summary, and its terminal ``clocks:`` line (the HTML
    report says the spread by the same words, ``reports._text.spread_words``)."""
    from rich.console import Console

    from ttft.reports.terminal import render_quality

    summary = one_process(tab, "client", "exclusive").summary
    (c,) = [c for c in summary.clocks if c["server_clock"] == WORKER]
    console = Console(record=True, width=400)
    render_quality(summary, console)
    (line,) = [x for x in console.export_text().splitlines() if WORKER in x]
    return c, line


def test_a_worker_pair_says_what_its_spread_is():
    """A worker pair's ``spread_ms`` is the width of the offsets all its requests fit: the
    terminal line says "range … wide", and where no offset fits them all (half the workers
    20 ms ahead, half 20 ms behind) that the bounds cross, never a negative spread."""
    ahead = moved(disagg(), 20 * MS, (WORKER,))
    c, line = _clock_line(ahead)
    assert c["applied"] and c["spread_ms"] > 0
    assert f"range {c['spread_ms']:,.3f} ms wide" in line and "spread" not in line

    tab = disagg()
    traces = pc.unique(tab.column("trace_id")).to_pylist()
    half = pc.is_in(tab.column("trace_id"), pa.array(traces[::2]))
    on_worker = pc.equal(tab.column("clock"), WORKER)
    for name in ("start_ns", "end_ns"):
        i, column = tab.schema.get_field_index(name), tab.column(name)
        shift = pc.if_else(half, 20 * MS, -20 * MS)
        tab = tab.set_column(i, tab.schema.field(name),
                             pc.if_else(on_worker, pc.add(column, shift), column))
    c, line = _clock_line(tab)
    assert c["spread_ms"] < 0
    assert f"no offset fits every request (bounds cross by {-c['spread_ms']:,.3f} ms)" in line
    assert "spread -" not in line
    assert c["bounded"]

    # No first byte anywhere: nothing bounds the range above, and its spread of 0 is said
    # as an open range, not as an exact one (before: "range 0.000 ms wide").
    behind = moved(disagg(), -20 * MS, (WORKER,))
    behind = behind.filter(pc.invert(pc.equal(behind.column("name"), "first_byte")))
    c, line = _clock_line(behind)
    assert c["applied"] and not c["bounded"] and c["spread_ms"] == 0
    assert "range open above (no request's first byte bounds it)" in line
    assert "0.000 ms wide" not in line

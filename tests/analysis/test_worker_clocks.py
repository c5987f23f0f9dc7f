"""Worker clocks (``analysis._worker_clocks``): a disaggregated prefill worker's clock moves
with its server's, and by an offset of its own when it is on a host of its own; on one host
nothing moves; partitions estimate it as the whole does."""

from __future__ import annotations

from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _disagg import disaggregate
from test_partial import in_partitions, one_process, split

from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.clocks import apply_offsets, estimate_offsets
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
        _, merged = in_partitions(dataset, boundary, policy)
        single = one_process(skewed, boundary, policy).summary.to_dict()
        assert merged.to_dict() == single
        applied = {c["server_clock"]: c for c in single["clocks"] if c["applied"]}
        assert set(applied) == {SERVER, WORKER}
        assert abs(applied[WORKER]["offset_ms"] + 6) < 0.3

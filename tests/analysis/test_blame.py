"""Blame: waits split by the engine's steps into prefill, decode, unknown and idle."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from _build import row, table, tid
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis.assemble import assemble
from ttft.analysis.blame import COLUMNS, KINDS, SUMMARY_COLUMNS, WAITS, blame, blame_summary
from ttft.collectors.synthetic import generate

ENGINE = 99  # the engine's own trace


def step(span: int, start_ns: int, end_ns: int, **attrs) -> dict:
    return row(ENGINE, span, "step", start_ns, end_ns, **attrs)


def records(df: pd.DataFrame) -> list[dict]:
    return df.to_dict("records")


def expect(trace: int, wait: str, prefill=0, decode=0, unknown=0, idle=0, **kw) -> dict:
    wait_ns = prefill + decode + unknown + idle
    return {
        "trace_id": tid(trace),
        "request_id": kw.get("request_id"),
        "condition": kw.get("condition"),
        "wait": wait,
        "wait_ns": wait_ns,
        "prefill_ns": prefill,
        "decode_ns": decode,
        "unknown_ns": unknown,
        "idle_ns": idle,
    }


def test_queue_split_by_batch_composition():
    rows = [
        row(1, 1, "queue", 0, 100, request_id="r1"),
        step(1, 10, 40, step_id=1, prefill_tokens=64, decode_tokens=0),
        step(2, 50, 90, step_id=2, prefill_tokens=0, decode_tokens=3),
        step(3, 95, 130, step_id=3, prefill_tokens=30, decode_tokens=10),
    ]
    # [10,40) prefill 30; [50,90) decode 40; [95,100): floor(5*30/40) = 3 prefill, 2 decode;
    # uncovered [0,10) + [40,50) + [90,95) = 25 idle.
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "queue", prefill=33, decode=42, idle=25, request_id="r1")
    ]


def test_gap_between_chunks_subtracts_own_tokens():
    rows = [
        row(1, 1, "prefill", 100, 350, cached_tokens=0),
        row(1, 2, "prefill.chunk", 100, 150, parent=1, step_id=5, chunk_tokens=64),
        row(1, 3, "prefill.chunk", 300, 350, parent=1, step_id=7, chunk_tokens=32),
        # Own tokens only and no decode: unknown. Own tokens and decode: all decode.
        step(5, 90, 180, step_id=5, prefill_tokens=64, decode_tokens=0),
        step(6, 190, 250, step_id=6, prefill_tokens=0, decode_tokens=2),
        step(7, 280, 360, step_id=7, prefill_tokens=32, decode_tokens=4),
    ]
    # Gap [150, 300): [150,180) unknown 30, [190,250) decode 60, [280,300) decode 20,
    # [180,190) + [250,280) idle 40.
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "between_chunks", decode=80, unknown=30, idle=40, condition="cold")
    ]


def test_own_tokens_subtracted_in_interior_steps():
    # Inconsistent data: the request's chunk names a step that runs inside its queue span;
    # the own tokens still come off that step, not only off the edge steps.
    rows = [
        row(1, 1, "queue", 0, 100),
        row(1, 2, "prefill.chunk", 120, 130, step_id=2, chunk_tokens=16),
        step(1, 10, 30, step_id=1, prefill_tokens=0, decode_tokens=1),
        step(2, 40, 60, step_id=2, prefill_tokens=48, decode_tokens=16),
        step(3, 70, 90, step_id=3, prefill_tokens=0, decode_tokens=1),
    ]
    # step 2: other prefill 32 vs decode 16 over 20 ns → floor(20*32/48) = 13 prefill.
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "queue", prefill=13, decode=40 + 7, idle=40)
    ]


def test_several_gaps_and_queues_are_summed_per_wait():
    rows = [
        row(1, 1, "server", 0, 1000, cached_tokens=32, request_id="r1"),
        row(1, 2, "queue", 0, 10),
        row(1, 3, "queue", 20, 30),  # a second queue span (re-queued): summed
        row(1, 4, "prefill.chunk", 40, 50, step_id=1, chunk_tokens=8),
        row(1, 5, "prefill.chunk", 60, 70, step_id=2, chunk_tokens=8),
        row(1, 6, "prefill.chunk", 70, 80, step_id=3, chunk_tokens=8),  # no gap
        row(1, 7, "prefill.chunk", 95, 99, step_id=4, chunk_tokens=8),
        step(1, 50, 60, step_id=9, prefill_tokens=0, decode_tokens=2),
        row(2, 1, "queue", 0, 5),  # no request_id, no condition: None in both
    ]
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "queue", idle=20, request_id="r1", condition="prefix_hit"),
        expect(1, "between_chunks", decode=10, idle=15, request_id="r1", condition="prefix_hit"),
        expect(2, "queue", idle=5),
    ]


def test_traces_sharing_a_request_id_are_one_request():
    # Trace context was lost between the queue (trace 1) and the chunks (trace 2): one
    # request, as attribution counts it. Per trace, the queue would be a request of
    # unknown condition and step 1 (trace 2's chunk) other requests' prefill.
    rows = [
        row(1, 1, "queue", 0, 100, request_id="r1"),
        row(2, 1, "prefill.chunk", 100, 110, request_id="r1", step_id=1, chunk_tokens=8,
            cached_tokens=0),
        row(2, 2, "prefill.chunk", 200, 210, request_id="r1", step_id=3, chunk_tokens=8),
        step(1, 95, 110, step_id=1, prefill_tokens=8, decode_tokens=0),  # own tokens only
        step(2, 120, 180, step_id=2, prefill_tokens=0, decode_tokens=2),
        step(3, 195, 210, step_id=3, prefill_tokens=8, decode_tokens=2),
    ]  # fmt: skip
    # Queue [0,100): [95,100) unknown 5, idle 95. Gap [110,200): [120,180) decode 60,
    # [195,200) decode 5 (own prefill off step 3), idle 25.
    asm = assemble(table(rows))
    assert records(blame(asm)) == [
        expect(1, "queue", unknown=5, idle=95, request_id="r1", condition="cold"),
        expect(1, "between_chunks", decode=65, idle=25, request_id="r1", condition="cold"),
    ]
    assert asm.requests[["trace_id", "request_id", "condition"]].values.tolist() == [
        [tid(1), "r1", "cold"]
    ]


def test_steps_of_another_service_or_clock_are_ignored():
    rows = [
        row(1, 1, "queue", 0, 100),
        step(1, 0, 50, step_id=1, prefill_tokens=10, decode_tokens=0, service="other"),
        step(2, 50, 100, step_id=2, prefill_tokens=10, decode_tokens=0, clock="host:b"),
    ]
    assert records(blame(assemble(table(rows)))) == [expect(1, "queue", idle=100)]


def test_missing_or_malformed_attributes_are_unknown():
    rows = [
        row(1, 1, "queue", 0, 100),
        step(1, 0, 10),  # no counts
        step(2, 10, 20, prefill_tokens=5),  # decode count missing
        step(3, 20, 30, prefill_tokens="5", decode_tokens=1),  # not an integer
        step(4, 30, 40, prefill_tokens=-3, decode_tokens=1),  # negative
        step(5, 40, 50, prefill_tokens=0, decode_tokens=0),  # nothing to split by
        step(6, 50, 60),
        step(7, 60, 70),
    ]
    rows[-2]["attributes"] = "not json {"
    rows[-1]["attributes"] = None
    assert records(blame(assemble(table(rows)))) == [expect(1, "queue", unknown=70, idle=30)]


def test_own_chunk_without_chunk_tokens_makes_its_step_unknown():
    rows = [
        row(1, 1, "prefill.chunk", 0, 10, step_id=1),
        row(1, 2, "prefill.chunk", 30, 40, step_id=2, chunk_tokens=4),
        step(1, 0, 20, step_id=1, prefill_tokens=8, decode_tokens=8),
        step(2, 25, 40, step_id=2, prefill_tokens=4, decode_tokens=1),
    ]
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "between_chunks", decode=5, unknown=10, idle=5)
    ]


def test_overlapping_steps_never_count_twice():
    rows = [
        row(1, 1, "queue", 0, 100),
        step(1, 0, 80, prefill_tokens=0, decode_tokens=1),  # clipped to [0, 20)
        step(2, 20, 60, prefill_tokens=4, decode_tokens=0),
        step(3, 70, 75, prefill_tokens=4, decode_tokens=0),  # same start as the next
        step(4, 70, 90, prefill_tokens=0, decode_tokens=1),
    ]
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "queue", prefill=40, decode=20 + 20, idle=20)
    ]


def test_no_waits_or_no_rows_give_the_columns():
    for rows in ([], [row(1, 1, "queue", 5, 5), row(1, 2, "prefill.chunk", 5, 9)]):
        df = blame(assemble(table(rows)))
        assert list(df.columns) == list(COLUMNS) and len(df) == 0


def reference(steps: list[tuple], a: int, b: int, own: dict[int, int]) -> list[int]:
    """One wait against steps ``(start, end, step_id, prefill, decode)`` (-1: missing), one
    step at a time: sort (ties by the other fields), clip each end to the next start, split
    each overlap with ``own[step_id]`` tokens (-1: of unknown size) taken off prefill."""
    steps = sorted(steps)
    parts = [0, 0, 0]
    for i, (s0, s1, sid, p, d) in enumerate(steps):
        s1 = max(s0, min(s1, steps[i + 1][0]) if i + 1 < len(steps) else s1)
        ov = max(0, min(b, s1) - max(a, s0))
        mine = own.get(sid, 0)
        p_other = max(p - mine, 0)
        if p < 0 or d < 0 or mine < 0 or p_other + d == 0:
            parts[2] += ov
        else:
            parts[0] += ov * p_other // (p_other + d)
            parts[1] += ov - ov * p_other // (p_other + d)
    return [*parts, b - a - sum(parts)]


counts = st.integers(-1, 50)
steps_st = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 300), counts, counts), max_size=25
)
# A wait: (start, length, the step its request's one chunk claims (0: none), chunk tokens,
# the wait's stage).
waits_st = st.lists(
    st.tuples(
        st.integers(0, 1000), st.integers(1, 400), st.integers(0, 25), counts,
        st.sampled_from(["queue", "batch_wait"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(steps_st, waits_st, st.randoms(use_true_random=False))
def test_parts_sum_to_the_wait_and_match_a_step_by_step_split(steps, waits, rnd):
    rows = []
    for i, (s0, dur, p, d) in enumerate(steps):
        attrs = {k: v for k, v in (("prefill_tokens", p), ("decode_tokens", d)) if v >= 0}
        rows.append(step(i + 1, s0, s0 + dur, step_id=i + 1, **attrs))
    for t, (a, dur, claim, tokens, wait) in enumerate(waits):
        rows.append(row(t + 1, 1, wait, a, a + dur))
        if claim:  # one chunk after everything: no gap, but its step's own tokens count
            attrs = {"chunk_tokens": tokens} if tokens >= 0 else {}
            rows.append(row(t + 1, 2, "prefill.chunk", 5000, 5001, step_id=claim, **attrs))
    rnd.shuffle(rows)
    df = blame(assemble(table(rows)))
    assert len(df) == len(waits)
    parts = df[[f"{k}_ns" for k in KINDS]].to_numpy()
    assert (parts >= 0).all()
    assert (parts.sum(axis=1) == df["wait_ns"].to_numpy()).all()
    spans = [(s0, s0 + dur, i + 1, p, d) for i, (s0, dur, p, d) in enumerate(steps)]
    got = {r["trace_id"]: [r["wait"], *(r[f"{k}_ns"] for k in KINDS)] for r in records(df)}
    for t, (a, dur, claim, tokens, wait) in enumerate(waits):
        own = {claim: tokens} if claim else {}
        assert got[tid(t + 1)] == [wait, *reference(spans, a, a + dur, own)]


def test_synthetic_trace_gaps_hold_a_neighbours_decode():
    spans = generate(300, seed=1).table.to_pandas()
    chunks = spans[spans["stage"] == "prefill.chunk"]
    multi = chunks.groupby("trace_id").size()
    multi = set(multi[multi > 1].index)
    # The first cohort (its first chunk is step 0) has no earlier cohort decoding in its gaps.
    first = {
        t
        for t, a in zip(chunks["trace_id"], chunks["attributes"], strict=True)
        if json.loads(a)["step_id"] == 0
    }
    df = blame(assemble(generate(300, seed=1).table))
    parts = df[[f"{k}_ns" for k in KINDS]].to_numpy()
    assert (parts >= 0).all() and (parts.sum(axis=1) == df["wait_ns"].to_numpy()).all()
    assert set(df["wait"]) <= set(WAITS)
    gaps = df[df["wait"] == "between_chunks"]
    assert set(gaps["trace_id"]) == multi
    assert first and first <= set(spans["trace_id"])
    later = gaps[~gaps["trace_id"].isin(first)]
    assert len(later) > 0 and (later["decode_ns"] > 0).all()
    assert (gaps["unknown_ns"] == 0).all()
    assert set(df.loc[df["wait"] == "queue", "trace_id"]) == set(
        spans.loc[spans["stage"] == "queue", "trace_id"]
    )
    assert set(df["condition"]) == {"cold", "prefix_hit"}


MS = 1_000_000


def test_summary_means_and_shares_per_condition():
    def r(condition, wait, pre, dec, unk, idle):
        parts = dict(prefill_ns=pre * MS, decode_ns=dec * MS, unknown_ns=unk * MS)
        wait_ns = (pre + dec + unk + idle) * MS
        return dict(condition=condition, wait=wait, wait_ns=wait_ns, **parts, idle_ns=idle * MS)

    per_request = pd.DataFrame(
        [
            r("cold", "queue", 30, 20, 0, 50),
            r("prefix_hit", "queue", 100, 100, 50, 50),
            r("cold", "between_chunks", 0, 50, 0, 0),
            r(None, "queue", 0, 0, 0, 200),  # unknown condition: only in "all"
        ]
    )
    expected = pd.DataFrame(
        [
            ("all", "queue", 3, 200.0, 130 / 3, 40.0, 50 / 3, 100.0, 130 / 600, 0.2, 50 / 600, 0.5),
            ("all", "between_chunks", 1, 50.0, 0.0, 50.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0),
            ("cold", "queue", 1, 100.0, 30.0, 20.0, 0.0, 50.0, 0.3, 0.2, 0.0, 0.5),
            ("cold", "between_chunks", 1, 50.0, 0.0, 50.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0),
            ("prefix_hit", "queue", 1, 300.0, 100.0, 100.0, 50.0, 50.0, 1 / 3, 1 / 3, 1 / 6, 1 / 6),
        ],
        columns=list(SUMMARY_COLUMNS),
    )
    pd.testing.assert_frame_equal(blame_summary(per_request), expected)


def test_summary_of_nothing_has_the_columns():
    out = blame_summary(blame(assemble(table([]))))
    assert list(out.columns) == list(SUMMARY_COLUMNS) and len(out) == 0


def test_summary_of_blame_keeps_the_sums():
    out = blame_summary(blame(assemble(generate(200, seed=3).table)))
    assert list(out["condition"].unique()) == ["all", "cold", "prefix_hit"]
    shares = out[[f"share_{k}" for k in KINDS]].sum(axis=1).to_numpy()
    means = out[[f"{k}_ms_mean" for k in KINDS]].sum(axis=1).to_numpy()
    np.testing.assert_allclose(shares, 1.0)
    np.testing.assert_allclose(means, out["wait_ms_mean"].to_numpy())


def test_batch_wait_split_like_the_queue_with_own_chunk_tokens_off():
    # Admitted at 100 (end of schedule); its first chunk runs at 150 in step 2, after
    # another request's 48-token chunk: [100,120) idle (admission, no step), [120,130)
    # step 1 decode, [140,150) step 2 with 48 other + 16 own prefill tokens and 16 decode.
    rows = [
        row(1, 1, "queue", 0, 90),
        row(1, 2, "schedule", 90, 100),
        row(1, 3, "batch_wait", 100, 150, step_id=2),
        row(1, 4, "prefill", 150, 160),
        row(1, 5, "prefill.chunk", 150, 160, parent=4, step_id=2, chunk_tokens=16),
        step(1, 120, 130, step_id=1, prefill_tokens=0, decode_tokens=3),
        step(2, 140, 170, step_id=2, prefill_tokens=64, decode_tokens=16),
    ]
    # step 2 over [140,150): other prefill 48 vs decode 16 → floor(10*48/64) = 7 prefill.
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "queue", idle=90),
        expect(1, "batch_wait", prefill=7, decode=10 + 3, idle=20 + 10),
    ]
    assert WAITS == ("queue", "batch_wait", "preempted", "kv_transfer", "between_chunks")



def test_preempted_time_is_split_by_the_steps_that_ran_and_ends_a_run_of_chunks():
    # Preempted after one chunk, admitted again at 140: its recompute's chunks are a run of
    # their own, so the 140 ns from its first chunk to its next are no between_chunks gap.
    rows = [
        row(1, 1, "prefill.chunk", 0, 10, request_id="b", step_id=1, chunk_tokens=8),
        row(1, 2, "preempted", 20, 120, request_id="b", preempted_by=["a"]),
        row(1, 3, "prefill.chunk", 150, 160, request_id="b", step_id=9, chunk_tokens=16),
        row(1, 4, "prefill.chunk", 170, 180, request_id="b", step_id=10, chunk_tokens=16),
        step(1, 0, 10, step_id=1, prefill_tokens=8, decode_tokens=0),
        step(2, 30, 70, step_id=2, prefill_tokens=0, decode_tokens=4),  # a's decode
        step(3, 80, 100, step_id=3, prefill_tokens=30, decode_tokens=10),
        step(4, 150, 160, step_id=9, prefill_tokens=16, decode_tokens=0),
        step(5, 170, 180, step_id=10, prefill_tokens=16, decode_tokens=0),
    ]
    # [30,70) decode 40; [80,100): floor(20*30/40) = 15 prefill, 5 decode; 40 idle.
    assert records(blame(assemble(table(rows)))) == [
        expect(1, "preempted", prefill=15, decode=45, idle=40, request_id="b"),
        expect(1, "between_chunks", idle=10, request_id="b"),
    ]


def test_without_the_preempted_span_the_same_chunks_leave_one_gap_per_pair():
    rows = [
        row(1, 1, "prefill.chunk", 0, 10, request_id="b", step_id=1, chunk_tokens=8),
        row(1, 3, "prefill.chunk", 150, 160, request_id="b", step_id=9, chunk_tokens=16),
        row(2, 1, "preempted", 20, 120, request_id="c"),  # another request's: no cut
        row(2, 2, "prefill.chunk", 130, 140, request_id="c", step_id=8, chunk_tokens=8),
    ]
    found = {r["request_id"]: r for r in records(blame(assemble(table(rows))))
             if r["wait"] == "between_chunks"}
    assert found == {"b": expect(1, "between_chunks", idle=140, request_id="b")}

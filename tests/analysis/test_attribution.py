"""The vectorized attribution against hand-computed cases and the per-request sweep."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd
import pytest
from _build import event, row, table
from hypothesis import given, settings
from hypothesis import strategies as st

from ttft.analysis import _column_arrays
from ttft.analysis.assemble import assemble
from ttft.analysis.attribution import attribute
from ttft.analysis.reference import ReferenceSpan, attribute_request, covered_and_raw
from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES, ROOT_ONLY_STAGE, STAGE_NAMES

CLIENT = {"clock": "client", "service": "loadgen"}


def one_request() -> list[dict]:
    """A client around a server, two chunks with a neighbour's step between them, and a
    GPU span (in the engine's trace, joined by step id) outlasting its chunk into sample."""
    return [
        row(1, 1, "client", 0, 100, **CLIENT),
        row(1, 2, "connect", 0, 5, parent=1, **CLIENT),
        row(1, 3, "server", 10, 95, parent=1, request_id="r1", cached_tokens=0),
        row(1, 4, "tokenize", 12, 20, parent=3),
        row(1, 5, "queue", 25, 40, parent=3),
        row(1, 6, "prefill", 40, 70, parent=3),
        row(1, 7, "prefill.chunk", 40, 50, parent=6, step_id=1),
        row(1, 8, "prefill.chunk", 60, 70, parent=6, step_id=2),
        row(1, 9, "sample", 70, 75, parent=3),
        event(1, 10, "first_sampled", 75, parent=3),
        row(1, 11, "stream", 76, 80, parent=3),
        event(1, 12, "first_byte", 80, parent=3),
        event(1, 13, "first_token", 90, parent=1, **CLIENT),
        row(2, 20, "step", 60, 70, step_id=2),
        row(2, 21, "gpu", 62, 73, parent=20, clock="gpu:0", step_id=2),
    ]


def parts(boundary: str, policy: str, rows: list[dict] | None = None) -> dict[str, int]:
    result = attribute(assemble(table(rows or one_request())), boundary, policy)
    got = result.attributed.iloc[0]
    return {k: int(v) for k, v in got[got > 0].items()}


COMMON = {"tokenize": 8, "queue": 15, "prefill": 10, "prefill.chunk": 12}


@pytest.mark.parametrize(
    ("boundary", "policy", "expected"),
    [
        # gpu wins its overlap with the chunk and with sample; [5,10) and [80,90) are
        # the client's alone (network); server-only gaps are "server".
        (
            "client",
            "exclusive",
            {
                "connect": 5,
                "network": 15,
                "server": 8,
                "gpu": 11,
                "sample": 2,
                "stream": 4,
                **COMMON,
            },
        ),
        # gpu and sample share [70,73): 3 ns split 1/1 with the spare 1 ns to gpu.
        (
            "client",
            "shared",
            {
                "connect": 5,
                "network": 15,
                "server": 8,
                "gpu": 10,
                "sample": 3,
                "stream": 4,
                **COMMON,
            },
        ),
        # the walk clips gpu to its chunk, so sample keeps all of [70,75).
        (
            "client",
            "critical-path",
            {
                "connect": 5,
                "network": 15,
                "server": 8,
                "gpu": 8,
                "sample": 5,
                "stream": 4,
                **COMMON,
            },
        ),
        ("server", "exclusive", {"server": 8, "gpu": 11, "sample": 2, "stream": 4, **COMMON}),
        # [20,25) between tokenize and queue is covered by no engine span.
        ("engine", "exclusive", {"unattributed": 5, "gpu": 11, "sample": 2, **COMMON}),
        ("engine", "critical-path", {"unattributed": 5, "gpu": 8, "sample": 5, **COMMON}),
    ],
)
def test_hand_computed_request(boundary, policy, expected):
    assert parts(boundary, policy) == expected


def test_step_id_join_and_windows():
    asm = assemble(table(one_request()))
    req = asm.requests.iloc[0]
    assert (req.client_a, req.client_b, req.server_a, req.server_b) == (0, 90, 10, 80)
    assert (req.engine_a, req.engine_b, req.condition, req.request_id) == (12, 75, "cold", "r1")
    gpu = asm.spans.stage == STAGE_NAMES.index("gpu")
    assert asm.spans.start_ns[gpu].tolist() == [62]
    assert asm.spans.depth[gpu].tolist() == [4]  # client > server > prefill > chunk > gpu
    assert asm.default_boundary() == "client"


def test_covered_raw_and_overlap():
    result = attribute(assemble(table(one_request())), "client", "exclusive")
    raw, cov = result.raw.iloc[0], result.covered.iloc[0]
    assert raw["client"] == 90 and result.attributed.iloc[0]["client"] == 0
    assert (raw["prefill"], cov["prefill"]) == (30, 30)
    assert (raw["prefill.chunk"], cov["prefill.chunk"]) == (20, 20)
    assert (raw["gpu"], raw["sample"]) == (11, 5)


def test_request_id_joins_traces_that_lost_context():
    rows = one_request()
    for r in rows:  # the server dropped the traceparent: its spans are in trace 9
        if r["clock"] not in ("client",) and r["stage"] != "step" and r["name"] != "gpu":
            r["trace_id"] = format(9, "032x")
    rows[0]["request_id"] = "r1"
    asm = assemble(table(rows))
    assert len(asm.requests) == 1
    assert parts("client", "exclusive", rows)["network"] == 15


def test_engine_window_falls_back_to_queue_and_sample_end():
    rows = [r for r in one_request() if r["name"] not in ("tokenize", "first_sampled")]
    assert parts("engine", "exclusive", rows) == {
        "queue": 15,
        "prefill": 10,
        "prefill.chunk": 12,
        "gpu": 11,
        "sample": 2,
    }


def test_requests_without_window_are_counted():
    rows = one_request() + [row(5, 50, "server", 0, 10, request_id="r5")]
    result = attribute(assemble(table(rows)), "server", "exclusive")
    assert len(result.requests) == 1
    assert result.quality.counts["no_window"] == 1


# --- the vectorized implementation against the plain sweep, on random requests ----------

STAGES = [
    "tokenize",
    "queue",
    "schedule",
    "prefill",
    "prefill.chunk",
    "sample",
    "detokenize",
    "stream",
    "forward",
    "gpu",
    "other",
]


def random_requests(seed: int, n_requests: int, children: int = 7):
    """Random requests as table rows plus the sweep's view of each, built independently;
    each with up to ``children`` server-side spans beside its client and server spans."""
    rnd = random.Random(seed)
    rows: list[dict] = []
    truth = []
    ids = iter(range(1, 10**6))
    for t in range(1, n_requests + 1):
        spans = []  # (id, stage, start, end, parent id, client side, depth)
        c_end = rnd.randint(30, 80)
        cid = next(ids)
        spans.append((cid, "client", 0, c_end, None, True, 0))
        if rnd.random() < 0.5:
            spans.append((next(ids), "connect", 0, rnd.randint(0, 10), cid, True, 1))
        s0 = rnd.randint(0, 20)
        sid_ = next(ids)
        spans.append((sid_, "server", s0, rnd.randint(s0 + 1, c_end + 10), cid, False, 1))
        server_side = [(sid_, 1)]
        joined = []
        for _ in range(rnd.randint(0, children)):
            stage = rnd.choice(STAGES)
            start = rnd.randint(0, 70)
            parent, pdepth = rnd.choice(server_side)
            span = (next(ids), stage, start, start + rnd.randint(0, 30), parent, False, pdepth + 1)
            spans.append(span)
            server_side.append((span[0], pdepth + 1))
            if stage == "prefill.chunk" and rnd.random() < 0.6:
                g0 = rnd.randint(start, start + 20)
                joined.append(
                    (next(ids), "gpu", g0, g0 + rnd.randint(1, 20), span[0], False, pdepth + 2)
                )
        events = {"first_token": rnd.randint(1, c_end + 5), "first_byte": rnd.randint(s0, s0 + 60)}
        if rnd.random() < 0.7:
            events["first_sampled"] = rnd.randint(s0, s0 + 60)
        for sp in spans:
            side = CLIENT if sp[5] else {}
            attrs = {"step_id": 1000 * t + sp[0]} if sp[1] == "prefill.chunk" else {}
            rows.append(row(t, sp[0], sp[1], sp[2], sp[3], parent=sp[4], **side, **attrs))
        for sp in joined:
            rows.append(
                row(
                    10_000 + sp[0],
                    sp[0],
                    "gpu",
                    sp[2],
                    sp[3],
                    clock="gpu:0",
                    step_id=1000 * t + sp[4],
                )
            )
        for name, when in events.items():
            side = CLIENT if name == "first_token" else {}
            rows.append(event(t, next(ids), name, when, **side))
        truth.append((spans + joined, events))
    rnd.shuffle(rows)
    return rows, truth


def sweep_view(spans, events, boundary):
    """Window, root and ReferenceSpans of one request for a boundary, from the generator."""
    by_id = {sp[0]: sp for sp in spans}
    server = next(sp for sp in spans if sp[1] == "server")
    client = next(sp for sp in spans if sp[1] == "client")
    fb = events.get("first_byte")
    if boundary == "client":
        a, b = client[2], events["first_token"]
        take = spans
    elif boundary == "server":
        a, b = server[2], fb
        take = [sp for sp in spans if not sp[5]]
    else:
        starts = {
            st: min((sp[2] for sp in spans if sp[1] == st), default=None)
            for st in ("tokenize", "queue")
        }
        a = starts["tokenize"] if starts["tokenize"] is not None else starts["queue"]
        samples = [sp for sp in spans if sp[1] == "sample"]
        # the earliest sample span; of two starting together, the longer (docs/attribution.md)
        first_sample = min(samples, key=lambda sp: (sp[2], -sp[3])) if samples else None
        b = events.get("first_sampled", first_sample[3] if first_sample else None)
        take = [sp for sp in spans if not sp[5] and sp[1] != "server"]
    if a is None or b is None or b < a:
        return None
    index = {sp[0]: i for i, sp in enumerate(take)}
    root = index.get(client[0] if boundary == "client" else server[0])
    if boundary == "engine":
        root = None
    out = []
    for sp in take:
        p = sp[4]
        while p is not None and p not in index:
            p = by_id[p][4]
        cut = (server[2], fb) if boundary == "client" and not sp[5] else None
        parent = -1 if p is None or index[p] == root else index[p]
        out.append(ReferenceSpan(sp[2], sp[3], sp[1], sp[6], format(sp[0], "016x"), parent, cut))
    return a, b, root, out


def other_id(n: int) -> str:
    """A span id that is not 16-character hex, ordered unlike ``n`` (an importer's ids)."""
    return f"span-{n * 7919 % 100_003}"


def with_other_ids(rows: list[dict]) -> list[dict]:
    def rename(value):
        return None if value is None else other_id(int(value, 16))

    return [{**r, "span_id": rename(r["span_id"]), "parent_id": rename(r["parent_id"])}
            for r in rows]


@pytest.mark.parametrize("compiled", [False, True], ids=["blocks", "compiled"])
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 12), st.booleans())
def test_vectorized_equals_sweep(compiled, seed, n_requests, hex_ids):
    """Every request against the plain sweep, by the vectorized blocks and (``compiled``)
    by the compiled kernels that take over from them on large tables."""
    with pytest.MonkeyPatch.context() as patch:
        if compiled:
            patch.setattr(_column_arrays, "KERNEL_ROWS", 1)
        else:  # the blocks, numba loaded or not
            patch.setattr(_column_arrays, "LOADED_KERNEL_ROWS", 2**62)
        _vectorized_equals_sweep(seed, n_requests, hex_ids)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 3), st.integers(60, 200))
def test_wide_requests_equal_the_sweep(seed, n_requests, children):
    """Requests wider than a block's bits (over `MAX_BITS` spans: the painted owners, the
    sorted unions and the shared sweep, linear in spans) against the plain sweep."""
    _vectorized_equals_sweep(seed, n_requests, True, children, POLICIES)


def _vectorized_equals_sweep(seed, n_requests, hex_ids, children=7, policies=POLICIES):
    rows, truth = random_requests(seed, n_requests, children)
    span_id = (lambda n: format(n, "016x")) if hex_ids else other_id
    # One clock for both sides (the generator's): from 10 requests on, the estimator would
    # find an offset in the random server windows.
    asm = assemble(table(rows if hex_ids else with_other_ids(rows)), offsets=[])
    assert len(asm.requests) == n_requests
    order = np.argsort([int(t, 16) for t in asm.requests.trace_id])
    for boundary in BOUNDARY_NAMES:
        for policy in policies:
            result = attribute(asm, boundary, policy)
            got = {tr: i for i, tr in enumerate(result.requests.trace_id)}
            for k, (spans, events) in enumerate(truth):
                view = sweep_view(spans, events, boundary)
                trace = asm.requests.trace_id.iloc[order[k]]
                if view is None:
                    assert trace not in got
                    continue
                a, b, root, sweep_spans = view
                sweep_spans = [dataclasses.replace(sp, span_id=span_id(int(sp.span_id, 16)))
                               for sp in sweep_spans]
                want = attribute_request(
                    sweep_spans,
                    a,
                    b,
                    root=root,
                    root_stage=ROOT_ONLY_STAGE[boundary],
                    policy=policy,
                )
                line = result.attributed.iloc[got[trace]]
                assert {s: int(v) for s, v in line[line > 0].items()} == want, (boundary, policy)
                assert int(line.sum()) == b - a
                if policy == "exclusive":
                    covered, raw = covered_and_raw(sweep_spans, a, b, root)
                    cov = result.covered.iloc[got[trace]].drop(["network", "unattributed"])
                    rw = result.raw.iloc[got[trace]].drop(["network", "unattributed"])
                    assert {s: int(v) for s, v in cov[cov > 0].items()} == covered
                    assert {s: int(v) for s, v in rw[rw > 0].items()} == raw


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**9), st.sampled_from(POLICIES), st.sampled_from(BOUNDARY_NAMES))
def test_row_order_changes_nothing(seed, policy, boundary):
    rows, _ = random_requests(seed, 4)
    first = attribute(assemble(table(rows)), boundary, policy)
    random.Random(seed).shuffle(rows)
    second = attribute(assemble(table(rows)), boundary, policy)
    key = first.requests.trace_id.argsort()
    key2 = second.requests.trace_id.argsort()
    assert np.array_equal(first.attributed.to_numpy()[key], second.attributed.to_numpy()[key2])


# --- docs/design.md's invariants, directly on the vectorized path ------------------------------


def parts_by_trace(rows: list[dict], boundary: str, policy: str) -> dict[str, dict[str, int]]:
    result = attribute(assemble(table(rows)), boundary, policy)
    att = result.attributed
    return {
        tr: {s: int(v) for s, v in att.iloc[i][att.iloc[i] > 0].items()}
        for i, tr in enumerate(result.requests.trace_id)
    }


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.sampled_from(BOUNDARY_NAMES))
def test_exclusive_part_never_exceeds_covered_time(seed, boundary):
    rows, _ = random_requests(seed, 4)
    result = attribute(assemble(table(rows)), boundary, "exclusive")
    att = result.attributed.drop(columns=["network", "unattributed"]).to_numpy()
    cov = result.covered.drop(columns=["network", "unattributed"]).to_numpy()
    root = ROOT_ONLY_STAGE[boundary]
    if root in result.attributed.columns and root not in ("network", "unattributed"):
        # root-only time is the root's stage and the root covers the whole window
        assert (result.attributed[root] <= result.covered[root]).all()
    assert (att <= cov).all()


# not sample: the end of the earliest sample can be the engine window's end, which a
# split would move (the invariant is about attribution inside a fixed window)
SPLITTABLE = {"queue", "schedule", "stream", "forward", "other", "tokenize", "gpu"}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.sampled_from(BOUNDARY_NAMES), st.data())
def test_exclusive_splitting_a_span_changes_nothing(seed, boundary, data):
    rows, _ = random_requests(seed, 3)
    parents = {r["parent_id"] for r in rows}
    candidates = [
        i
        for i, r in enumerate(rows)
        if r["stage"] in SPLITTABLE
        and r["span_id"] not in parents
        and r["end_ns"] - r["start_ns"] >= 2
    ]
    if not candidates:
        return
    i = data.draw(st.sampled_from(candidates))
    victim = rows[i]
    mid = data.draw(st.integers(victim["start_ns"] + 1, victim["end_ns"] - 1))
    # detokenize shares tokenize's priority: keep ties out of the comparison
    if victim["stage"] == "tokenize" and any(r["stage"] == "detokenize" for r in rows):
        return
    left = {**victim, "end_ns": mid}
    right = {**victim, "start_ns": mid, "span_id": format(10**9 + i, "016x")}
    split = rows[:i] + [left, right] + rows[i + 1 :]
    assert parts_by_trace(split, boundary, "exclusive") == parts_by_trace(
        rows, boundary, "exclusive"
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.sampled_from(BOUNDARY_NAMES), st.data())
def test_exclusive_adding_a_span_inside_a_higher_one_changes_nothing(seed, boundary, data):
    from ttft.tracer.schema import PRIORITY

    rows, _ = random_requests(seed, 3)
    hosts = [
        r
        for r in rows
        if r["stage"] in PRIORITY
        and r["stage"] not in ("client", "connect", "server")
        and r["end_ns"] > r["start_ns"]
        and int(r["trace_id"], 16) < 10_000  # not the engine's traces
    ]
    if not hosts:
        return
    host = data.draw(st.sampled_from(hosts))
    # window-defining stages (client, server, tokenize, queue, sample) would move a window
    moves_window = ("client", "server", "tokenize", "queue", "sample")
    lower = [
        s for s, p in PRIORITY.items() if p < PRIORITY[host["stage"]] and s not in moves_window
    ]
    if not lower:
        return
    stage = data.draw(st.sampled_from(lower))
    lo = data.draw(st.integers(host["start_ns"], host["end_ns"] - 1))
    hi = data.draw(st.integers(lo + 1, host["end_ns"]))
    extra = row(
        int(host["trace_id"], 16),
        10**9,
        stage,
        lo,
        hi,
        parent=int(host["span_id"], 16),
        clock=host["clock"],
    )
    assert parts_by_trace(rows + [extra], boundary, "exclusive") == parts_by_trace(
        rows, boundary, "exclusive"
    )


@pytest.mark.parametrize("step", [2, 2**50])
def test_step_join_copies_every_gpu_span_of_the_step(step):
    rows = one_request()
    for r in rows:
        if r["attributes"] and '"step_id": 2' in r["attributes"]:
            r["attributes"] = r["attributes"].replace('"step_id": 2', f'"step_id": {step}')
    rows.append(row(2, 22, "gpu", 64, 74, parent=20, clock="gpu:1", step_id=step))
    rows.append(row(3, 23, "gpu", 30, 35, clock="gpu:0", step_id=step, service="other"))
    asm = assemble(table(rows))
    gpu = asm.spans.stage == STAGE_NAMES.index("gpu")
    assert sorted(asm.spans.start_ns[gpu].tolist()) == [62, 64]  # not the other service's
    assert parts("client", "exclusive", rows)["gpu"] == 12  # [62, 74)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_requests_without_a_window_change_no_other_request(seed):
    """Whether blocks run over every request (few lack the window: those get an empty one
    and are dropped) or over the windowed ones only (many lack it), the parts of the others
    are the same as without the windowless requests at all."""
    rows, _ = random_requests(seed, 16)

    def trace_of(r):
        return int(r["trace_id"], 16)

    def without_first_token(traces):
        return [r for r in rows if not (r["name"] == "first_token" and trace_of(r) in traces)]

    def parts(table_rows, drop=()):
        result = attribute(assemble(table(table_rows), offsets=[]), "client", "exclusive")
        frames = {name: getattr(result, name).set_index(result.requests.trace_id)
                  for name in ("attributed", "covered", "raw")}
        assert not set(frames["attributed"].index) & {format(t, "032x") for t in drop}
        return frames

    alone = parts([r for r in rows if trace_of(r) > 4 or trace_of(r) >= 10_000])
    for drop in ({1}, {1, 2, 3, 4}):  # 1 of 16 lacks the window: every request; 4: windowed
        got = parts(without_first_token(drop), drop)
        for name, frame in got.items():
            pd.testing.assert_frame_equal(frame.loc[alone[name].index], alone[name])


def test_a_request_of_twenty_thousand_spans_is_attributed_exactly():
    """More elementary segments than an int16 counts (each span adds two): 20,000 queue
    spans of 3 ns, 5 ns apart, under one server span; each is its own exclusive time, and
    the server span keeps the gaps."""
    n = 20_000
    rows = [row(1, 1, "client", 0, 10 * n, **CLIENT),
            row(1, 2, "server", 1, 10 * n - 1, parent=1),
            event(1, 3, "first_byte", 10 * n - 2, parent=2),
            event(1, 4, "first_token", 10 * n - 1, parent=1, **CLIENT)]
    rows += [row(1, 10 + i, "queue", 2 + 5 * i, 5 + 5 * i, parent=2) for i in range(n)]
    result = attribute(assemble(table(rows)), "client", "exclusive")
    got = {k: int(v) for k, v in result.attributed.iloc[0].items() if v}
    assert got == {"queue": 3 * n, "server": 10 * n - 2 - 1 - 3 * n, "network": 2}
    assert int(result.covered.iloc[0]["queue"]) == int(result.raw.iloc[0]["queue"]) == 3 * n


def test_covered_is_raw_itself_only_where_every_value_is_equal():
    """Where no stage's spans overlap each other, ``covered`` and ``raw`` are one frame (a
    part a third smaller to send and hold); two overlapping queue spans make them differ,
    and then they are two frames with the union and the sum."""
    same = attribute(assemble(table(one_request())), "client", "exclusive")
    assert same.covered is same.raw
    rows = one_request() + [row(1, 14, "queue", 30, 45, parent=3)]
    apart = attribute(assemble(table(rows)), "client", "exclusive")
    assert apart.covered is not apart.raw
    assert (int(apart.raw.iloc[0]["queue"]), int(apart.covered.iloc[0]["queue"])) == (30, 20)


def test_a_merged_attribution_keeps_covered_as_raw_where_every_part_does():
    """``merge`` stacks ``raw`` once and gives it as ``covered`` too where every part's
    two are one frame; a part whose two differ makes the stacked ones two frames, each
    its parts' own values."""
    from ttft.analysis.part import analyze_part, merge

    alone = analyze_part(table(one_request()))
    both = merge([alone, alone]).attribution
    assert both.covered is both.raw and len(both.raw) == 2
    rows = one_request() + [row(1, 14, "queue", 30, 45, parent=3)]
    mixed = merge([alone, analyze_part(table(rows))]).attribution
    assert mixed.covered is not mixed.raw
    assert mixed.raw["queue"].tolist() == [15, 30]
    assert mixed.covered["queue"].tolist() == [15, 20]

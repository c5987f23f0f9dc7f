"""The plain per-request sweep against hand-computed attributions and docs/design.md's
invariants."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ttft.analysis.reference import ReferenceSpan as RefSpan
from ttft.analysis.reference import attribute_request, covered_and_raw
from ttft.tracer.schema import POLICIES, PRIORITY, ROOT_ONLY_STAGE


def sid(n: int) -> str:
    return f"{n:016x}"


def attribute_all(spans, a_ns, b_ns, *, root, root_stage):
    return {
        policy: attribute_request(
            spans, a_ns, b_ns, root=root, root_stage=root_stage, policy=policy
        )
        for policy in POLICIES
    }


# --- hand-computed cases ---------------------------------------------------------------------


def test_nested_spans():
    # server [0,20) > prefill [2,18) > prefill.chunk [4,10), [12,16)
    spans = [
        RefSpan(0, 20, "server", 0, sid(1)),
        RefSpan(2, 18, "prefill", 1, sid(2), parent=0),
        RefSpan(4, 10, "prefill.chunk", 2, sid(3), parent=1),
        RefSpan(12, 16, "prefill.chunk", 2, sid(4), parent=1),
    ]
    expected = {"server": 4, "prefill": 6, "prefill.chunk": 10}
    assert attribute_all(spans, 0, 20, root=0, root_stage="server") == {
        "exclusive": expected,
        "shared": expected,
        "critical-path": expected,
    }


def _gpu_outlasting_chunk() -> list[RefSpan]:
    """Server window [0,32): the gpu span [10,24) outlasts its chunk [8,20) into sample."""
    return [
        RefSpan(0, 40, "server", 0, sid(1)),
        RefSpan(0, 4, "tokenize", 1, sid(2)),
        RefSpan(4, 8, "queue", 1, sid(3)),
        RefSpan(8, 20, "prefill", 1, sid(4)),
        RefSpan(8, 20, "prefill.chunk", 2, sid(5), parent=3),
        RefSpan(10, 24, "gpu", 3, sid(6), parent=4),
        RefSpan(20, 26, "sample", 1, sid(7)),
        RefSpan(26, 28, "detokenize", 1, sid(8)),
        RefSpan(28, 30, "stream", 1, sid(9)),
    ]


def test_gpu_outlasting_its_chunk_overlaps_sample():
    common = {"tokenize": 4, "queue": 4, "prefill.chunk": 2, "detokenize": 2, "stream": 2}
    assert attribute_all(_gpu_outlasting_chunk(), 0, 32, root=0, root_stage="server") == {
        # [20,24): gpu outranks sample
        "exclusive": {**common, "gpu": 14, "sample": 2, "server": 2},
        # [20,24): gpu and sample are both leaves, 2 ns each
        "shared": {**common, "gpu": 12, "sample": 4, "server": 2},
        # gpu is clipped to its chunk [8,20), so sample keeps [20,26)
        "critical-path": {**common, "gpu": 10, "sample": 6, "server": 2},
    }


def test_gpu_outlasting_its_chunk_covered_and_raw():
    covered, raw = covered_and_raw(_gpu_outlasting_chunk(), 0, 32)
    assert covered == {
        "server": 32,
        "tokenize": 4,
        "queue": 4,
        "prefill": 12,
        "prefill.chunk": 12,
        "gpu": 14,
        "sample": 6,
        "detokenize": 2,
        "stream": 2,
    }
    assert raw == covered


def test_covered_and_raw_overlapping_spans_of_one_stage():
    spans = [
        RefSpan(0, 10, "gpu", 1, sid(1)),
        RefSpan(5, 15, "gpu", 1, sid(2)),
        RefSpan(20, 30, "gpu", 1, sid(3)),
        RefSpan(30, 31, "queue", 1, sid(4)),  # zero length once clipped
    ]
    assert covered_and_raw(spans, 0, 25) == ({"gpu": 20}, {"gpu": 10 + 10 + 5})


def test_uncovered_gap_is_unattributed_under_the_virtual_root():
    spans = [
        RefSpan(0, 4, "tokenize", 1, sid(1)),
        RefSpan(6, 10, "queue", 1, sid(2)),
    ]
    expected = {"tokenize": 4, "unattributed": 2, "queue": 4}
    assert attribute_all(spans, 0, 10, root=None, root_stage="unattributed") == {
        "exclusive": expected,
        "shared": expected,
        "critical-path": expected,
    }


def test_root_only_time_goes_to_the_root_stage():
    spans = [
        RefSpan(0, 10, "server", 0, sid(1)),
        RefSpan(2, 5, "tokenize", 1, sid(2), parent=0),
    ]
    expected = {"server": 7, "tokenize": 3}
    assert attribute_all(spans, 0, 10, root=0, root_stage="server") == {
        "exclusive": expected,
        "shared": expected,
        "critical-path": expected,
    }


def test_root_not_covering_the_window_end():
    # The root ends at 8 inside [0,10): the root defines the window, so every policy
    # treats it as covering all of [0, 10).
    spans = [RefSpan(0, 8, "server", 0, sid(1)), RefSpan(2, 5, "queue", 1, sid(2))]
    assert attribute_all(spans, 0, 10, root=0, root_stage="server") == {
        "exclusive": {"server": 7, "queue": 3},
        "shared": {"server": 7, "queue": 3},
        "critical-path": {"server": 7, "queue": 3},
    }
    assert covered_and_raw(spans, 0, 10, root=0) == ({"server": 10, "queue": 3},) * 2


def test_client_window_around_the_server_window_is_network():
    # Client window [0,90); the server span is already clipped to its own window [15,80).
    spans = [
        RefSpan(0, 100, "client", 0, sid(1)),
        RefSpan(0, 10, "connect", 1, sid(2)),
        RefSpan(15, 80, "server", 1, sid(3)),
        RefSpan(15, 20, "tokenize", 2, sid(4), parent=2),
        RefSpan(20, 30, "queue", 2, sid(5), parent=2),
        RefSpan(30, 70, "prefill.chunk", 2, sid(6), parent=2),
        RefSpan(70, 78, "stream", 2, sid(7), parent=2),
    ]
    expected = {
        "connect": 10,
        "network": 5 + 10,
        "tokenize": 5,
        "queue": 10,
        "prefill.chunk": 40,
        "stream": 8,
        "server": 2,
    }
    assert attribute_all(spans, 0, 90, root=0, root_stage=ROOT_ONLY_STAGE["client"]) == {
        "exclusive": expected,
        "shared": expected,
        "critical-path": expected,
    }


def test_shared_remainder_goes_to_the_highest_keys_first():
    # One segment of 10 ns, three leaves: 10 = 4 + 3 + 3, the 4 to gpu (highest priority).
    spans = [
        RefSpan(0, 10, "stream", 1, sid(1)),
        RefSpan(0, 10, "gpu", 1, sid(2)),
        RefSpan(0, 10, "sample", 1, sid(3)),
    ]
    assert attribute_request(
        spans, 0, 10, root=None, root_stage="unattributed", policy="shared"
    ) == {"gpu": 4, "sample": 3, "stream": 3}


def test_shared_remainder_follows_depth_start_and_span_id():
    # 11 ns over five leaves: 3 + 2 + 2 + 2 + 2. Priority ties broken by depth.
    deeper = [RefSpan(0, 11, "tokenize", 1, sid(9)), RefSpan(0, 11, "detokenize", 2, sid(1))]
    deeper += [
        RefSpan(0, 11, s, 1, sid(20 + k)) for k, s in enumerate(("queue", "other", "stream"))
    ]
    assert attribute_request(
        deeper, 0, 11, root=None, root_stage="unattributed", policy="shared"
    ) == {"detokenize": 3, "tokenize": 2, "queue": 2, "other": 2, "stream": 2}
    # 5 ns over two leaves with equal priority and depth: the later start gets the 3.
    later = [RefSpan(-1, 5, "detokenize", 1, sid(9)), RefSpan(0, 5, "tokenize", 1, sid(1))]
    assert attribute_request(
        later, 0, 5, root=None, root_stage="unattributed", policy="shared"
    ) == {"tokenize": 3, "detokenize": 2}
    # Equal priority, depth and start: the larger span_id gets the 3.
    by_id = [
        RefSpan(0, 5, "tokenize", 1, "00000000000000ff"),
        RefSpan(0, 5, "detokenize", 1, "0000000000000a00"),
    ]
    assert attribute_request(
        by_id, 0, 5, root=None, root_stage="unattributed", policy="shared"
    ) == {"detokenize": 3, "tokenize": 2}


def test_shared_does_not_give_ancestors_a_share():
    spans = [
        RefSpan(0, 10, "prefill", 1, sid(1)),
        RefSpan(0, 10, "prefill.chunk", 2, sid(2), parent=0),
        RefSpan(0, 10, "queue", 1, sid(3)),
    ]
    assert attribute_request(
        spans, 0, 10, root=None, root_stage="unattributed", policy="shared"
    ) == {"prefill.chunk": 5, "queue": 5}


def test_exclusive_ties_broken_by_depth_then_start_then_span_id():
    def winner(spans: list[RefSpan]) -> dict[str, int]:
        return attribute_request(
            spans, 0, 10, root=None, root_stage="unattributed", policy="exclusive"
        )

    same = {"start_ns": 0, "end_ns": 10, "depth": 1}
    assert winner(
        [
            RefSpan(stage="tokenize", span_id=sid(2), **same),
            RefSpan(stage="detokenize", span_id=sid(1), **same),
        ]
    ) == {"tokenize": 10}
    assert winner(
        [
            RefSpan(stage="tokenize", span_id=sid(1), **same),
            RefSpan(stage="detokenize", span_id=sid(2), **same),
        ]
    ) == {"detokenize": 10}
    # String comparison of span ids: "f0..." > "0f...".
    assert winner(
        [
            RefSpan(stage="tokenize", span_id="f000000000000000", **same),
            RefSpan(stage="detokenize", span_id="0fffffffffffffff", **same),
        ]
    ) == {"tokenize": 10}
    # Later unclipped start beats span_id, even where both are clipped to the same start.
    assert winner(
        [RefSpan(-5, 10, "tokenize", 1, sid(2)), RefSpan(-1, 10, "detokenize", 1, sid(1))]
    ) == {"detokenize": 10}
    # Depth beats start.
    assert winner(
        [RefSpan(0, 10, "tokenize", 2, sid(1)), RefSpan(3, 10, "detokenize", 1, sid(2))]
    ) == {"tokenize": 10}
    # Priority beats depth.
    assert winner(
        [RefSpan(0, 10, "queue", 5, sid(1)), RefSpan(0, 10, "stream", 1, sid(2))]
    ) == {"stream": 10}


def test_critical_path_sibling_overlap():
    spans = [
        RefSpan(0, 20, "server", 0, sid(1)),
        RefSpan(0, 10, "tokenize", 1, sid(2), parent=0),
        RefSpan(5, 15, "queue", 1, sid(3), parent=0),
    ]
    assert attribute_request(spans, 0, 20, root=0, root_stage="server", policy="critical-path") == {
        "queue": 10,
        "server": 10,
    }


def test_critical_path_ties_later_start_then_span_id():
    # Both children end at 10: the later start is taken first, the other one cannot fit.
    later = [RefSpan(0, 10, "queue", 1, sid(1)), RefSpan(4, 10, "stream", 1, sid(2))]
    assert attribute_request(
        later, 0, 12, root=None, root_stage="unattributed", policy="critical-path"
    ) == {"stream": 6, "unattributed": 6}
    # Same end and start: the larger span_id.
    same = [RefSpan(2, 10, "queue", 1, sid(9)), RefSpan(2, 10, "stream", 1, sid(3))]
    assert attribute_request(
        same, 0, 12, root=None, root_stage="unattributed", policy="critical-path"
    ) == {"queue": 8, "unattributed": 4}


def test_critical_path_drops_children_outside_their_parent_with_their_subtree():
    spans = [
        RefSpan(0, 5, "prefill", 1, sid(1)),
        RefSpan(6, 10, "prefill.chunk", 2, sid(2), parent=0),  # outside its parent
        RefSpan(7, 9, "gpu", 3, sid(3), parent=1),
    ]
    assert attribute_all(spans, 0, 20, root=None, root_stage="unattributed") == {
        "exclusive": {"prefill": 5, "unattributed": 11, "prefill.chunk": 2, "gpu": 2},
        "shared": {"prefill": 5, "unattributed": 11, "prefill.chunk": 2, "gpu": 2},
        "critical-path": {"prefill": 5, "unattributed": 15},
    }


def test_a_span_whose_parent_is_clipped_away_hangs_from_the_next_ancestor():
    # Window [10,20): prefill [0,10) takes no part, its chunk [5,15) is the root's child.
    spans = [
        RefSpan(0, 10, "prefill", 1, sid(1)),
        RefSpan(5, 15, "prefill.chunk", 2, sid(2), parent=0),
    ]
    expected = {"prefill.chunk": 5, "unattributed": 5}
    assert attribute_all(spans, 10, 20, root=None, root_stage="unattributed") == {
        "exclusive": expected,
        "shared": expected,
        "critical-path": expected,
    }


def test_empty_window_and_errors():
    spans = [RefSpan(0, 10, "queue", 1, sid(1))]
    assert (
        attribute_request(spans, 5, 5, root=None, root_stage="unattributed", policy="shared") == {}
    )
    with pytest.raises(ValueError, match="unknown policy 'fair'"):
        attribute_request(spans, 0, 10, root=None, root_stage="unattributed", policy="fair")
    with pytest.raises(ValueError, match="before its start"):
        attribute_request(spans, 10, 0, root=None, root_stage="unattributed", policy="exclusive")
    with pytest.raises(ValueError, match="parent index 3 out of range"):
        attribute_request(
            [RefSpan(0, 10, "queue", 1, sid(1), parent=3)],
            0,
            10,
            root=None,
            root_stage="unattributed",
            policy="exclusive",
        )
    cycle = [
        RefSpan(0, 10, "queue", 1, sid(1), parent=1),
        RefSpan(0, 10, "stream", 1, sid(2), parent=0),
    ]
    with pytest.raises(ValueError, match="cycle"):
        attribute_request(cycle, 0, 10, root=None, root_stage="unattributed", policy="shared")
    with pytest.raises(ValueError, match="'step' takes no time"):
        attribute_request(
            [RefSpan(0, 10, "step", 1, sid(1))],
            0,
            10,
            root=None,
            root_stage="unattributed",
            policy="exclusive",
        )


# --- properties ------------------------------------------------------------------------------

ALL_STAGES = sorted(PRIORITY)
# tokenize and detokenize, queue and preempted, prefill and route share a priority (the
# exclusive tie then goes to the later start, so splitting a span may move it); without the
# second of each, priority alone orders stages
DISTINCT_PRIORITY_STAGES = [s for s in ALL_STAGES
                            if s not in {"detokenize", "preempted", "route"}]


def test_the_distinct_priority_stages_have_distinct_priorities():
    """A stage added with a priority another has must be left out above too."""
    assert len({PRIORITY[s] for s in DISTINCT_PRIORITY_STAGES}) == len(DISTINCT_PRIORITY_STAGES)


@st.composite
def requests(draw, stages=ALL_STAGES):
    """A request: spans (parents before children), a window, the root and its stage."""
    n = draw(st.integers(0, 7))
    ids = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n + 1, max_size=n + 1, unique=True))
    a_ns = draw(st.integers(0, 10))
    b_ns = draw(st.integers(a_ns, 40))
    root_kind = draw(st.sampled_from(["client", "server", "engine"]))
    spans: list[RefSpan] = []
    root = None
    if root_kind != "engine":
        root = 0
        root_start_ns = draw(st.integers(-5, a_ns))
        root_end_ns = draw(st.integers(a_ns, 45))
        spans.append(RefSpan(root_start_ns, root_end_ns, root_kind, 0, sid(ids[n])))
    for k in range(n):
        parent = draw(st.sampled_from([-1, *range(len(spans))]))
        depth = 1 if parent in (-1, root) else spans[parent].depth + 1
        start_ns = draw(st.integers(0, 40))
        end_ns = draw(st.integers(start_ns, start_ns + 20))
        stage = draw(st.sampled_from(stages))
        spans.append(RefSpan(start_ns, end_ns, stage, depth, sid(ids[k]), parent))
    return spans, a_ns, b_ns, root, ROOT_ONLY_STAGE[root_kind]


def run(request, policy: str) -> dict[str, int]:
    spans, a_ns, b_ns, root, root_stage = request
    return attribute_request(spans, a_ns, b_ns, root=root, root_stage=root_stage, policy=policy)


@given(requests())
def test_every_policy_sums_to_the_window(request):
    spans, a_ns, b_ns, root, root_stage = request
    for policy in POLICIES:
        parts = run(request, policy)
        assert sum(parts.values()) == b_ns - a_ns
        assert all(ns > 0 for ns in parts.values())
        # The root's own stage name (client) never takes time unless another span has it.
        others = {s.stage for i, s in enumerate(spans) if i != root}
        assert set(parts) <= others | {root_stage, "unattributed"}


@given(requests(), st.randoms(use_true_random=False))
def test_row_order_changes_nothing(request, rng):
    spans, a_ns, b_ns, root, root_stage = request
    order = list(range(len(spans)))
    rng.shuffle(order)  # new position -> old index
    new_index = {old: new for new, old in enumerate(order)}
    shuffled = [spans[old] for old in order]
    shuffled = [
        RefSpan(s.start_ns, s.end_ns, s.stage, s.depth, s.span_id, new_index.get(s.parent, -1))
        for s in shuffled
    ]
    moved = (shuffled, a_ns, b_ns, None if root is None else new_index[root], root_stage)
    for policy in POLICIES:
        assert run(moved, policy) == run(request, policy)


@given(requests())
def test_exclusive_part_never_exceeds_covered(request):
    spans, a_ns, b_ns, root, _ = request
    covered, _ = covered_and_raw(spans, a_ns, b_ns, root)
    for stage, ns in run(request, "exclusive").items():
        if stage not in ("network", "unattributed"):
            assert ns <= covered[stage]


@given(requests(stages=DISTINCT_PRIORITY_STAGES), st.data())
def test_exclusive_splitting_a_span_changes_nothing(request, data):
    spans, a_ns, b_ns, root, root_stage = request
    parents = {s.parent for s in spans}
    splittable = [
        i
        for i, s in enumerate(spans)
        if i != root and i not in parents and s.end_ns - s.start_ns >= 2
    ]
    assume(splittable)
    i = data.draw(st.sampled_from(splittable))
    s = spans[i]
    mid_ns = data.draw(st.integers(s.start_ns + 1, s.end_ns - 1))
    unused_id = sid(max(int(x.span_id, 16) for x in spans) + 1)
    split = list(spans)
    split[i] = RefSpan(s.start_ns, mid_ns, s.stage, s.depth, s.span_id, s.parent)
    split.append(RefSpan(mid_ns, s.end_ns, s.stage, s.depth, unused_id, s.parent))
    assert run((split, a_ns, b_ns, root, root_stage), "exclusive") == run(request, "exclusive")


@given(requests(stages=DISTINCT_PRIORITY_STAGES), st.data())
def test_exclusive_adding_a_span_inside_a_higher_priority_one_changes_nothing(request, data):
    spans, a_ns, b_ns, root, root_stage = request
    hosts = [
        i
        for i, s in enumerate(spans)
        if i != root and s.end_ns > s.start_ns and PRIORITY[s.stage] > min(PRIORITY.values())
    ]
    assume(hosts)
    h = data.draw(st.sampled_from(hosts))
    host = spans[h]
    start_ns = data.draw(st.integers(host.start_ns, host.end_ns - 1))
    end_ns = data.draw(st.integers(start_ns + 1, host.end_ns))
    lower = [s for s in DISTINCT_PRIORITY_STAGES if PRIORITY[s] < PRIORITY[host.stage]]
    stage = data.draw(st.sampled_from(lower))
    unused_id = sid(max(int(x.span_id, 16) for x in spans) + 1)
    added = [*spans, RefSpan(start_ns, end_ns, stage, host.depth + 1, unused_id, h)]
    assert run((added, a_ns, b_ns, root, root_stage), "exclusive") == run(request, "exclusive")


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), max_size=6), st.data())
def test_policies_agree_when_nothing_overlaps(gaps_and_lengths, data):
    spans = []
    cursor_ns = 0
    for k, (gap_ns, length_ns) in enumerate(gaps_and_lengths):
        stage = data.draw(st.sampled_from(ALL_STAGES))
        spans.append(
            RefSpan(cursor_ns + gap_ns, cursor_ns + gap_ns + length_ns, stage, 1, sid(k))
        )
        cursor_ns += gap_ns + length_ns
    b_ns = data.draw(st.integers(0, cursor_ns + 3))
    parts = attribute_all(spans, 0, b_ns, root=None, root_stage="unattributed")
    assert parts["shared"] == parts["exclusive"]
    assert parts["critical-path"] == parts["exclusive"]

"""Plain per-request attribution: the readable reference the vectorized code is checked against.

One request, one window ``[a, b)``, one policy; a straightforward loop over elementary
segments (``exclusive``, ``shared``) or over the span tree (``critical-path``), exactly as
docs/attribution.md ("Policies") states the rules. Clarity over speed: the cost is
O(segments x spans) per request, which is what "a plain per-request Python sweep" means in
the benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ttft.tracer.schema import POLICIES, PRIORITY

_ROOT = -1
"""Parent value meaning "the window root" (a real root span or the virtual one)."""

_UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class ReferenceSpan:
    """One span of a request, as the reference sees it.

    Attributes:
        start_ns: start before any clipping; the exclusive key uses this value.
        end_ns: end before any clipping.
        stage: canonical stage name (a key of ``PRIORITY`` unless the span is the root).
        depth: depth in the request's full tree, root 0.
        span_id: the span id (16 lowercase hex characters in every ttft trace; any
            string from other sources); ties compare as strings.
        parent: index into the request's span list of the nearest ancestor that takes part,
            ``-1`` for a child of the window root.
        cut: an interval ``(lo_ns, hi_ns)`` the span is clipped to before the window (the
            server window, for server-side spans in the client boundary), or None.
    """

    start_ns: int
    end_ns: int
    stage: str
    depth: int
    span_id: str
    parent: int = -1
    cut: tuple[int, int] | None = None

    def clipped(self, a_ns: int, b_ns: int) -> tuple[int, int]:
        """The span clipped to its ``cut`` and to ``[a_ns, b_ns)`` (may be empty)."""
        lo_ns, hi_ns = max(self.start_ns, a_ns), min(self.end_ns, b_ns)
        if self.cut is not None:
            lo_ns, hi_ns = max(lo_ns, self.cut[0]), min(hi_ns, self.cut[1])
        return lo_ns, hi_ns


def attribute_request(
    spans: Sequence[ReferenceSpan],
    a_ns: int,
    b_ns: int,
    *,
    root: int | None,
    root_stage: str,
    policy: str,
) -> dict[str, int]:
    """Attributed ns per stage for one request's window ``[a_ns, b_ns)``.

    Args:
        spans: the request's spans; ``parent`` indexes into this sequence.
        a_ns: window start.
        b_ns: window end, ``>= a_ns``.
        root: index of the root span in ``spans`` (the ``client`` or ``server`` span), or
            ``None`` for the engine boundary's virtual root, which covers nothing.
        root_stage: the stage that receives the root's own time (``network``, ``server``
            or ``unattributed``); the root span's own stage name never receives time.
        policy: ``exclusive``, ``shared`` or ``critical-path``.

    Returns:
        ``{stage: ns}`` for every stage with non-zero time; the values sum to exactly
        ``b_ns - a_ns``. Time that no span covers is ``unattributed``.

    Raises:
        ValueError: on an unknown policy, ``b_ns < a_ns``, a bad ``root`` or ``parent``
            index, a parent cycle, or a non-root span whose stage has no priority.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    if b_ns < a_ns:
        raise ValueError(f"window end {b_ns} is before its start {a_ns}")
    _check(spans, root)

    intervals, root_interval = _clip_to_window(spans, a_ns, b_ns, root)
    parents = {i: _nearest_taking_part(spans, i, intervals, root) for i in intervals}

    parts: dict[str, int] = {}
    if policy == "exclusive":
        _exclusive(spans, intervals, root_interval, a_ns, b_ns, root_stage, parts)
    elif policy == "shared":
        _shared(spans, intervals, parents, root_interval, a_ns, b_ns, root_stage, parts)
    else:
        _critical_path(spans, intervals, parents, a_ns, b_ns, root_stage, parts)
    return {stage: ns for stage, ns in parts.items() if ns != 0}


def covered_and_raw(
    spans: Sequence[ReferenceSpan], a_ns: int, b_ns: int, root: int | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """Per stage: the union length and the summed length of the spans clipped to the window.

    Every span counts, the root (which covers the whole window) included; spans with zero
    clipped length take no part, so only stages with non-zero time appear.

    Returns:
        ``(covered, raw)``, each ``{stage: ns}``.
    """
    by_stage: dict[str, list[tuple[int, int]]] = {}
    for i, span in enumerate(spans):
        start_ns, end_ns = span.clipped(a_ns, b_ns)
        if i == root:
            start_ns, end_ns = a_ns, b_ns
        if end_ns > start_ns:
            by_stage.setdefault(span.stage, []).append((start_ns, end_ns))

    covered: dict[str, int] = {}
    raw: dict[str, int] = {}
    for stage, pieces in by_stage.items():
        raw[stage] = sum(end_ns - start_ns for start_ns, end_ns in pieces)
        union_ns = 0
        reach_ns = None  # end of the union so far, walking the pieces in start order
        for start_ns, end_ns in sorted(pieces):
            if reach_ns is None or start_ns >= reach_ns:
                union_ns += end_ns - start_ns
                reach_ns = end_ns
            elif end_ns > reach_ns:
                union_ns += end_ns - reach_ns
                reach_ns = end_ns
        covered[stage] = union_ns
    return covered, raw


# --- taking part -------------------------------------------------------------------------


def _check(spans: Sequence[ReferenceSpan], root: int | None) -> None:
    """Reject indices and stages the sweep cannot interpret."""
    n = len(spans)
    if root is not None and not 0 <= root < n:
        raise ValueError(f"root index {root} is outside the {n} spans")
    for i, span in enumerate(spans):
        if i == root:
            continue
        if span.stage not in PRIORITY:
            raise ValueError(f"span {i} ({span.span_id}): stage {span.stage!r} takes no time")
        # Walk up the chain: every index valid, and no cycle (at most n steps to the root).
        p, steps = span.parent, 0
        while p != _ROOT and p != root:
            if not 0 <= p < n:
                raise ValueError(f"span {i} ({span.span_id}): parent index {p} out of range")
            steps += 1
            if steps > n:
                raise ValueError(f"span {i} ({span.span_id}): parent indices form a cycle")
            p = spans[p].parent


def _clip_to_window(
    spans: Sequence[ReferenceSpan], a_ns: int, b_ns: int, root: int | None
) -> tuple[dict[int, tuple[int, int]], tuple[int, int] | None]:
    """Clip to ``[a, b)``: non-root spans that keep a positive length, and the root's interval."""
    intervals: dict[int, tuple[int, int]] = {}
    root_interval = None
    for i, span in enumerate(spans):
        if i == root:
            # The root defines the window: it covers all of it (docs/attribution.md).
            root_interval = (a_ns, b_ns) if b_ns > a_ns else None
            continue
        start_ns, end_ns = span.clipped(a_ns, b_ns)
        if end_ns > start_ns:
            intervals[i] = (start_ns, end_ns)
    return intervals, root_interval


def _nearest_taking_part(
    spans: Sequence[ReferenceSpan], i: int, intervals: dict[int, tuple[int, int]], root: int | None
) -> int:
    """The nearest ancestor of span ``i`` that takes part, or ``_ROOT``."""
    p = spans[i].parent
    while p != _ROOT and p != root and p not in intervals:
        p = spans[p].parent  # that ancestor was clipped away: skip to its own parent
    return _ROOT if p == root else p


def _key(span: ReferenceSpan) -> tuple[int, int, int, str, str]:
    """The exclusive order, larger wins: priority, depth, unclipped start, span_id.

    The stage name is a last resort so that duplicate span ids (a data-quality defect)
    still give an answer that does not depend on row order.
    """
    return (PRIORITY[span.stage], span.depth, span.start_ns, span.span_id, span.stage)


def _segments(
    intervals: dict[int, tuple[int, int]],
    root_interval: tuple[int, int] | None,
    a_ns: int,
    b_ns: int,
) -> list[tuple[int, int]]:
    """The window cut at every clipped span endpoint."""
    cuts = {a_ns, b_ns}
    for start_ns, end_ns in intervals.values():
        cuts.update((start_ns, end_ns))
    if root_interval is not None:
        cuts.update(root_interval)
    ordered = sorted(cuts)
    return list(zip(ordered[:-1], ordered[1:], strict=True))


def _covers(interval: tuple[int, int] | None, t0_ns: int, t1_ns: int) -> bool:
    return interval is not None and interval[0] <= t0_ns and t1_ns <= interval[1]


def _add(parts: dict[str, int], stage: str, ns: int) -> None:
    parts[stage] = parts.get(stage, 0) + ns


# --- policies ------------------------------------------------------------------------------


def _exclusive(
    spans: Sequence[ReferenceSpan],
    intervals: dict[int, tuple[int, int]],
    root_interval: tuple[int, int] | None,
    a_ns: int,
    b_ns: int,
    root_stage: str,
    parts: dict[str, int],
) -> None:
    for t0_ns, t1_ns in _segments(intervals, root_interval, a_ns, b_ns):
        active = [i for i, interval in intervals.items() if _covers(interval, t0_ns, t1_ns)]
        if active:
            winner = max(active, key=lambda i: _key(spans[i]))
            _add(parts, spans[winner].stage, t1_ns - t0_ns)
        elif _covers(root_interval, t0_ns, t1_ns):
            _add(parts, root_stage, t1_ns - t0_ns)
        else:
            _add(parts, _UNATTRIBUTED, t1_ns - t0_ns)


def _shared(
    spans: Sequence[ReferenceSpan],
    intervals: dict[int, tuple[int, int]],
    parents: dict[int, int],
    root_interval: tuple[int, int] | None,
    a_ns: int,
    b_ns: int,
    root_stage: str,
    parts: dict[str, int],
) -> None:
    for t0_ns, t1_ns in _segments(intervals, root_interval, a_ns, b_ns):
        length_ns = t1_ns - t0_ns
        active = [i for i, interval in intervals.items() if _covers(interval, t0_ns, t1_ns)]
        if not active:
            # The root is an ancestor of every other span: it shares only when alone.
            stage = root_stage if _covers(root_interval, t0_ns, t1_ns) else _UNATTRIBUTED
            _add(parts, stage, length_ns)
            continue
        ancestors_of_active: set[int] = set()
        for i in active:
            p = parents[i]
            while p != _ROOT:
                ancestors_of_active.add(p)
                p = parents[p]
        leaves = [i for i in active if i not in ancestors_of_active]
        leaves.sort(key=lambda i: _key(spans[i]), reverse=True)
        share_ns, remainder_ns = divmod(length_ns, len(leaves))
        for rank, i in enumerate(leaves):
            _add(parts, spans[i].stage, share_ns + (1 if rank < remainder_ns else 0))


def _critical_path(
    spans: Sequence[ReferenceSpan],
    intervals: dict[int, tuple[int, int]],
    parents: dict[int, int],
    a_ns: int,
    b_ns: int,
    root_stage: str,
    parts: dict[str, int],
) -> None:
    children: dict[int, list[int]] = {_ROOT: []}
    for i in intervals:
        children.setdefault(i, [])
    for i in intervals:
        children[parents[i]].append(i)

    def stage_of(node: int) -> str:
        return root_stage if node == _ROOT else spans[node].stage

    def walk(node: int, ps_ns: int, pe_ns: int) -> None:
        # Children clipped to this node's interval; empty ones drop out with their subtree
        # (they are never walked).
        kids: list[tuple[int, int, str, int]] = []  # (start, end, span_id, index)
        for k in children[node]:
            start_ns, end_ns = max(intervals[k][0], ps_ns), min(intervals[k][1], pe_ns)
            if end_ns > start_ns:
                kids.append((start_ns, end_ns, spans[k].span_id, k))
        cursor_ns = pe_ns
        while True:
            ready = [kid for kid in kids if kid[1] <= cursor_ns]
            if not ready:
                break
            # Ends last; ties: later (clipped) start, then larger span_id.
            start_ns, end_ns, _, k = max(
                ready, key=lambda kid: (kid[1], kid[0], kid[2], spans[kid[3]].stage)
            )
            _add(parts, stage_of(node), cursor_ns - end_ns)
            walk(k, start_ns, end_ns)
            cursor_ns = start_ns
        _add(parts, stage_of(node), cursor_ns - ps_ns)

    walk(_ROOT, a_ns, b_ns)

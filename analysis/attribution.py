"""Split each request's TTFT window into stage parts that sum exactly to the window.

Pure functions over an :class:`~ttft.analysis.assemble.Assembly` (no I/O). The three
policies of docs/design.md, with the details fixed in docs/attribution.md:

* ``exclusive``: every elementary segment goes to the active span with the largest key
  ``(priority, depth, start, span_id)``;
* ``shared``: every segment is split equally among the active spans that are not
  ancestors of another active span, remainder 1 ns at a time in exclusive order;
* ``critical-path``: Jaeger's walk from the window's root, stopped at the first-token
  milestone.

All three run on dense ``(requests, spans)`` blocks (see ``_request_blocks``): loops go over
span columns or tree depth, never over requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from ttft.analysis import _column_arrays as col
from ttft.analysis import _request_blocks
from ttft.analysis._critical import critical_path
from ttft.analysis._request_blocks import (
    MAX_BITS,
    active_bits,
    iter_blocks,
    nearest_ancestor,
    take_rows,
)
from ttft.analysis._trees import CODE, N_STAGES, value_rank
from ttft.analysis.assemble import Assembly
from ttft.analysis.quality import Quality
from ttft.tracer.schema import BOUNDARY_NAMES, POLICIES, PRIORITY, ROOT_ONLY_STAGE, STAGE_NAMES

_PRIO = np.zeros(N_STAGES, np.int64)
for _name, _p in PRIORITY.items():
    _PRIO[CODE[_name]] = _p
_DERIVED = np.array([CODE["network"], CODE["untraced"], CODE["unattributed"]])

ELIGIBLE: dict[str, np.ndarray] = {}
"""Per boundary: which stage codes may take window time (client side decided apart)."""
for _b in BOUNDARY_NAMES:
    _ok = np.zeros(N_STAGES, bool)
    _ok[[CODE[s] for s in PRIORITY]] = True
    if _b == "engine":
        _ok[CODE["server"]] = False
    ELIGIBLE[_b] = _ok


FRAMES = ("requests", "attributed", "covered", "raw", "failed")
"""The per-request frames of an `Attribution`."""

FAILED_COLUMNS = (
    "trace_id", "request_id", "condition", "outcome", "status_code", "error", "ttft_ns",
    "request",
)
"""The columns of `Attribution.failed`, one row per failed request."""


@dataclass
class Attribution:
    """Per-request parts of one boundary and policy.

    ``requests`` holds the requests that have a window (``trace_id``, ``request_id``,
    ``condition``, ``a_ns``, ``ttft_ns``, and ``request``: the request's row in
    ``Assembly.requests``, the index ``Assembly.rows.req`` uses); ``attributed``, ``covered``
    and ``raw`` are int64 ns, one row per request of ``requests`` and one column per stage
    name (``covered`` is ``raw`` itself, one frame, where every value of the two is equal:
    no stage's spans overlap each other; frames are read, never written). ``attributed``
    rows sum exactly to ``ttft_ns``. Only requests that did not fail
    are attributed; ``failed`` holds the others (`FAILED_COLUMNS`: ``ttft_ns`` is their
    window at this boundary when they saw a first token, else -1).
    """

    boundary: str
    policy: str
    requests: pd.DataFrame
    attributed: pd.DataFrame
    covered: pd.DataFrame
    raw: pd.DataFrame
    quality: Quality
    failed: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=list(FAILED_COLUMNS))
    )

    def per_request(self) -> pd.DataFrame:
        """Long form: one row per request and stage with any time (``trace_id``,
        ``request_id``, ``condition``, ``stage``, ``attributed_ns``, ``covered_ns``,
        ``raw_ns``, ``ttft_ns``)."""
        att = self.attributed.to_numpy()
        cov = self.covered.to_numpy()
        raw = self.raw.to_numpy()
        row, stage = np.nonzero((att > 0) | (cov > 0) | (raw > 0))
        req = self.requests.iloc[row]
        return pd.DataFrame(
            {
                "trace_id": req["trace_id"].to_numpy(),
                "request_id": req["request_id"].to_numpy(),
                "condition": req["condition"].to_numpy(),
                "stage": np.asarray(self.attributed.columns)[stage],
                "attributed_ns": att[row, stage],
                "covered_ns": cov[row, stage],
                "raw_ns": raw[row, stage],
                "ttft_ns": req["ttft_ns"].to_numpy(),
            }
        )

    def per_request_parts(self, write: Callable[[pd.DataFrame], None]) -> None:
        """`per_request` in pieces, in order: ``write`` of each (of each part's, one part
        read at a time, for an attribution stacked from parts)."""
        write(self.per_request())


def attribute(asm: Assembly, boundary: str | None = None, policy: str = "exclusive") -> Attribution:
    """Attribute every request's TTFT at ``boundary`` (default: the outermost supported)
    under ``policy``; requests without that window are counted as ``no_window``."""
    boundary = boundary or asm.default_boundary()
    if boundary not in BOUNDARY_NAMES:
        raise ValueError(f"unknown boundary {boundary!r}; choose from {BOUNDARY_NAMES}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {POLICIES}")
    reqs = asm.requests
    ok = asm.ok()
    windowed = asm.has_window(boundary)
    has = windowed & ok  # TTFT is over ok requests; failures are reported apart
    quality = Quality().merged(asm.quality)
    missing = np.flatnonzero(ok & ~windowed)
    quality.add("no_window", len(missing), reqs["trace_id"].iloc[missing])

    n_req = len(reqs)
    a = reqs[f"{boundary}_a"].to_numpy()
    b = reqs[f"{boundary}_b"].to_numpy()
    root = (
        reqs[f"{boundary}_root"].to_numpy()
        if boundary != "engine"
        else np.full(n_req, -1, np.int64)
    )
    cut_lo = reqs["server_a"].to_numpy()
    cut_hi = reqs["server_window_end"].to_numpy()
    has_cut = (boundary == "client") & (reqs["server_root"].to_numpy() >= 0)
    out = {key: np.zeros((n_req, N_STAGES), np.int64) for key in ("att", "cov", "raw")}
    sp = asm.spans
    # A request without spans still has a window (events only): it is all root time.
    lone = np.flatnonzero(has & (sp.counts == 0))
    out["att"][lone, CODE[ROOT_ONLY_STAGE[boundary]]] = b[lone] - a[lone]
    # When few requests lack the window, blocks run over all requests, so each is one run of
    # the span arrays (read as views); the others get an empty window and their rows are
    # dropped below. Otherwise only the windowed requests are gathered.
    every = 8 * int((~has).sum()) <= n_req
    counts = sp.counts if every else np.where(has, sp.counts, 0)
    a_in, b_in = (np.where(has, a, 0), np.where(has, b, 0)) if every else (a, b)
    if col.compiled(len(sp.req)):
        # Compiled, one request at a time; the blocks take only the requests it leaves.
        slow = _swept(sp, has, a, b, root, boundary, cut_lo, cut_hi, has_cut, out, policy)
        counts, a_in, b_in = np.where(slow, sp.counts, 0), a, b
    for ids, pos in iter_blocks(counts, sp.offsets):
        block = _Block(sp, ids, pos, a_in, b_in, root, boundary, cut_lo, cut_hi, has_cut)
        run = {"exclusive": block.exclusive, "shared": block.shared}
        out["att"][ids] = run.get(policy, block.critical_path)()
        out["raw"][ids] = block.raw()
        out["cov"][ids] = block.covered(out["raw"][ids])
    if boundary == "client":  # without a server window, root-only time is not the network's
        blind = np.flatnonzero(has & ~has_cut)  # alone (`tracer.schema.root_only_stage`)
        out["att"][blind, CODE["untraced"]] += out["att"][blind, CODE["network"]]
        out["att"][blind, CODE["network"]] = 0
    keep = np.flatnonzero(has)
    for key in ("cov", "raw"):
        out[key][:, _DERIVED] = out["att"][:, _DERIVED]
    whole = len(keep) == n_req  # the usual case: the arrays become the frames, uncopied
    if np.array_equal(out["cov"], out["raw"]):  # no stage's spans overlap each other: one
        del out["cov"]  # frame for both, so a part is a third smaller to send and to hold
    frames = {
        key: pd.DataFrame(value if whole else value[keep], columns=list(STAGE_NAMES),
                          copy=False)
        for key, value in out.items()
    }
    frames.setdefault("cov", frames["raw"])
    requests = reqs.iloc[keep][["trace_id", "request_id", "condition"]].reset_index(drop=True)
    requests["a_ns"] = a[keep]
    requests["ttft_ns"] = b[keep] - a[keep]
    requests["request"] = keep
    bad = np.flatnonzero(~ok)
    failed = reqs.iloc[bad][list(FAILED_COLUMNS[:6])].reset_index(drop=True)
    failed["ttft_ns"] = np.where(windowed[bad], b[bad] - a[bad], -1)
    failed["request"] = bad
    return Attribution(
        boundary, policy, requests, frames["att"], frames["cov"], frames["raw"], quality,
        failed,
    )


def _union_ns(lo: np.ndarray, hi: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per row, the length of the union of the intervals ``[lo, hi)`` where ``mine``."""
    lo = np.where(mine, lo, np.iinfo(np.int64).max)
    order = np.argsort(lo, axis=1, kind="stable")
    lo = np.take_along_axis(lo, order, axis=1)
    hi = np.take_along_axis(np.where(mine, hi, np.iinfo(np.int64).min), order, axis=1)
    reach = np.maximum.accumulate(hi, axis=1)  # the furthest end so far
    before = np.concatenate([np.full((len(lo), 1), np.iinfo(np.int64).min), reach[:, :-1]],
                            axis=1)
    gain = np.where(hi > np.maximum(lo, before), hi - np.maximum(lo, before), 0)
    return np.where(lo != np.iinfo(np.int64).max, gain, 0).sum(axis=1)


_NAME_RANK = np.argsort(np.argsort(np.asarray(STAGE_NAMES)))
"""Each stage code's rank by stage name."""


def _swept(sp, has, a, b, root, boundary, cut_lo, cut_hi, has_cut, out, policy) -> np.ndarray:
    """``policy``'s parts of the requests with ``has`` by `_kernels.exclusive_sweep` or
    `_policy_kernels.policy_sweep`, into ``out``; returns the requests it left to the
    blocks (many spans, or an order only stage names or trace ids decide)."""
    from ttft.analysis._kernels import exclusive_sweep  # numba: only large tables need it
    from ttft.analysis._policy_kernels import CRITICAL_PATH, SHARED, policy_sweep

    tables = np.stack([ELIGIBLE[boundary].astype(np.int64), _PRIO, _NAME_RANK.astype(np.int64)])
    codes = np.array([CODE[ROOT_ONLY_STAGE[boundary]], CODE["unattributed"],
                      int(boundary == "client")], np.int64)
    slow = np.zeros(len(has), bool)
    # One layout and dtype per argument, so the kernel is compiled for one signature.
    per_request = [np.ascontiguousarray(v, dtype) for v, dtype in (
        (sp.counts, np.int64), (sp.offsets, np.int64), (has, bool), (a, np.int64),
        (b, np.int64), (root, np.int64), (np.broadcast_to(has_cut, has.shape), bool),
        (cut_lo, np.int64), (cut_hi, np.int64))]
    spans = (sp.stage, sp.client, sp.start_ns, sp.end_ns, sp.keep, sp.depth)
    frames = (tables, codes, out["att"], out["cov"], out["raw"], slow)
    if policy == "exclusive":
        exclusive_sweep(*per_request, *spans, sp.sid_hi, sp.sid_lo, *frames)
    else:
        code = SHARED if policy == "shared" else CRITICAL_PATH
        policy_sweep(code, *per_request, *spans, np.ascontiguousarray(sp.parent),
                     sp.sid_hi, sp.sid_lo, *frames)
    return slow


class _Block:
    """One block of requests with the same span count, clipped to their windows."""

    def __init__(self, sp, ids, pos, a, b, root, boundary, cut_lo, cut_hi, has_cut):
        n, k = pos.shape
        self.n, self.k = n, k
        self.a = a[ids][:, None]
        self.b = b[ids][:, None]
        stage = pos.take(sp.stage).astype(np.int64)
        client = pos.take(sp.client)
        start, end = pos.take(sp.start_ns), pos.take(sp.end_ns)
        inc = pos.take(sp.keep) & ELIGIBLE[boundary][stage]
        if boundary != "client":
            inc &= ~client
        lo = np.maximum(start, self.a)
        hi = np.minimum(end, self.b)
        cut = has_cut[ids][:, None] & ~client
        lo = np.where(cut, np.maximum(lo, cut_lo[ids][:, None]), lo)
        hi = np.where(cut, np.minimum(hi, cut_hi[ids][:, None]), hi)
        rootcol = root[ids][:, None]
        is_root = np.arange(k)[None] == rootcol
        inc = (inc & (hi > lo)) | is_root
        lo = np.where(is_root, self.a, lo)
        hi = np.where(is_root, self.b, hi)
        self.inc = inc
        self.lo = np.where(inc, lo, self.a)
        self.hi = np.where(inc, hi, self.a)
        self.stage = stage
        # The stage that receives the span's own time: the root's goes to the root stage.
        root_stage = CODE[ROOT_ONLY_STAGE[boundary]]
        self.out_stage = np.where(is_root, root_stage, stage)
        self.is_root = is_root
        self.rootcol = rootcol
        self._sp, self._pos = sp, pos  # for what only some policies read (below)
        self.depth = pos.take(sp.depth).astype(np.int64)
        self.start = start
        prio = np.where(is_root, 0, _PRIO[stage])
        self.prio = np.where(inc, prio, -1)

    @cached_property
    def sid(self) -> tuple[np.ndarray, np.ndarray]:
        """The span ids' two words (`Spans.sid_hi`, ``sid_lo``), read where ties need them."""
        return self._pos.take(self._sp.sid_hi), self._pos.take(self._sp.sid_lo)

    def ties(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The last keys of every order, for ``rows`` of the block: the stage's name (as
        ``reference`` compares it), then the
        trace id's rank (one span id in two traces of a request), so equal keys before
        them never leave the order to the columns'."""
        return _NAME_RANK[self.stage[rows]], value_rank(self._pos.take(self._sp.trace)[rows],
                                                        self._sp.trace_values)

    # -- exclusive order and elementary segments -------------------------------------
    @cached_property
    def parent(self) -> np.ndarray:
        """Nearest included ancestor's column; else the root's (the virtual root: -1)."""
        par = nearest_ancestor(self._pos.take(self._sp.parent), self.inc)
        par = np.where(~self.is_root & (par < 0), self.rootcol, par)
        return np.where(self.is_root, -1, par)

    @cached_property
    def _order(self) -> np.ndarray:
        """Columns sorted by ascending exclusive key (priority, depth, start, span_id)."""
        rel = self.start - self.start.min(axis=1, keepdims=True)
        # A difference that wrapped (spans on two clocks 2^63 ns apart) is as late as any.
        rel = np.where(rel < 0, (1 << 53) - 1, np.minimum(rel, (1 << 53) - 1))
        key = ((self.prio + 1) << 58) | (np.minimum(self.depth, 31) << 53) | rel
        order = np.argsort(key, axis=-1)
        ranked = np.take_along_axis(key, order, axis=1)
        tied = np.flatnonzero((ranked[:, 1:] == ranked[:, :-1]).any(axis=1))
        if len(tied):  # the span id decides ties (rare: same priority, depth and start)
            hi, lo = self.sid
            stage, trace = self.ties(tied)
            order[tied] = np.lexsort((trace, stage, lo[tied], hi[tied], key[tied]), axis=-1)
        return order

    @cached_property
    def _segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Elementary segments: ``length`` (N, S) in ns, and for every column the segment
        positions ``[first, stop)`` it covers (N, K), as small integers.

        Positions come from sorting all endpoints of a row; segments between equal
        endpoints have zero length, so how ties are ordered never matters.
        """
        pts = np.concatenate([self.a, self.lo, self.hi, self.b], axis=1)
        order = np.argsort(pts, axis=1, kind="stable")
        small = np.int16 if pts.shape[1] <= np.iinfo(np.int16).max else np.int32
        pos = np.empty(order.shape, small)
        np.put_along_axis(pos, order, np.arange(pts.shape[1], dtype=small)[None], axis=1)
        pts = np.take_along_axis(pts, order, axis=1)
        k = self.k
        return pts[:, 1:] - pts[:, :-1], pos[:, 1 : k + 1], pos[:, k + 1 : 2 * k + 1]

    @cached_property
    def _bits(self) -> np.ndarray:
        """`active_bits` of the block (``K <= MAX_BITS``), computed once for the exclusive
        owners and the covered unions: bit ``j`` is the ``j``-th column in exclusive order
        (`_order`)."""
        length, first, stop = self._segments
        order = self._order
        first = np.take_along_axis(first, order, axis=1)
        stop = np.take_along_axis(stop, order, axis=1)
        return active_bits(first, stop, length.shape[1])

    def sum_by_stage(self, stage: np.ndarray, ns: np.ndarray) -> np.ndarray:
        flat = (np.arange(self.n)[:, None] * N_STAGES + stage).ravel()
        return _request_blocks.row_sums(flat, ns, self.n * N_STAGES).reshape(self.n, N_STAGES)

    def exclusive(self) -> np.ndarray:
        """Each segment to the active column with the largest exclusive key."""
        length, first, stop = self._segments
        order = self._order
        if self.k <= MAX_BITS:  # the highest active column is the top bit set
            owner = np.frexp(self._bits.astype(np.float64))[1] - 1
        else:  # more columns than bits: painted, each segment once (linear in spans)
            from ttft.analysis._wide_kernels import paint_owners  # numba: only wide requests

            first = np.take_along_axis(first, order, axis=1)
            stop = np.take_along_axis(stop, order, axis=1)
            owner = paint_owners(first, stop, length.shape[1])
        out_stage = np.take_along_axis(self.out_stage, order, axis=1)
        stage = np.where(owner >= 0, take_rows(out_stage, owner), CODE["unattributed"])
        return self.sum_by_stage(stage, length)

    def raw(self) -> np.ndarray:
        """Summed length of each stage's clipped spans."""
        return self.sum_by_stage(self.stage, np.where(self.inc, self.hi - self.lo, 0))

    def covered(self, raw: np.ndarray) -> np.ndarray:
        """Union length of each stage's clipped spans: ``raw`` wherever a row has at most
        one span of the stage, a union over segments where it has several."""
        cov = raw.copy()
        length, first, stop = self._segments
        spans = self.sum_by_stage(self.stage, self.inc.astype(np.int64))
        several = np.flatnonzero((spans >= 2).any(axis=0))
        bits = self._bits if self.k <= MAX_BITS and len(several) else None
        for code in several:
            rows = spans[:, code] >= 2
            mine = (self.stage[rows] == code) & self.inc[rows]
            if bits is not None:
                mine = np.take_along_axis(mine, self._order[rows], axis=1)  # as the bits
                words = (mine * np.ldexp(1.0, np.arange(self.k))).sum(axis=1).astype(np.uint64)
                hit = (bits[rows] & words[:, None]) != 0
            else:  # the union of the stage's clipped intervals, by sorting (linear-log)
                cov[rows, code] = _union_ns(self.lo[rows], self.hi[rows], mine)
                continue
            cov[rows, code] = np.where(hit, length[rows], 0).sum(axis=1)
        return cov

    def shared(self) -> np.ndarray:
        """Each segment split equally among its active leaves (no active descendant)."""
        order = self._order
        inv = np.argsort(order, axis=1)
        out_stage = np.take_along_axis(self.out_stage, order, axis=1)
        parent = take_rows(inv, np.take_along_axis(self.parent, order, axis=1), fill=-1)
        length, first, stop = self._segments
        first = np.take_along_axis(first, order, axis=1)
        stop = np.take_along_axis(stop, order, axis=1)
        if self.k > MAX_BITS:  # wide: a sweep, not (K, K) ancestors and (S, K) masks
            from ttft.analysis._wide_kernels import shared_wide  # numba: only wide requests

            per_col, uncovered = shared_wide(first.astype(np.int64), stop.astype(np.int64),
                                             parent.astype(np.int64), length)
            att = self.sum_by_stage(out_stage, per_col)
            att[:, CODE["unattributed"]] += uncovered
            return att
        seg = np.arange(2 * self.k + 1, dtype=np.int16)[None, :, None]
        active = (first[:, None, :] <= seg) & (seg < stop[:, None, :])
        # anc[n, i, j]: column i is an ancestor of column j (sorted order).
        anc = np.zeros((self.n, self.k, self.k), np.float32)
        rows = np.repeat(np.arange(self.n), self.k)
        cols = np.tile(np.arange(self.k), self.n)
        cur = parent.copy()
        for _ in range(self.k):
            ok = (cur >= 0).ravel()
            if not ok.any():
                break
            anc[rows[ok], cur.ravel()[ok], cols[ok]] = 1.0
            cur = take_rows(parent, cur, fill=-1)
        ancestor_of_active = np.matmul(active.astype(np.float32), anc.transpose(0, 2, 1)) > 0
        leaf = active & ~ancestor_of_active
        m = leaf.sum(axis=2)
        div = np.maximum(m, 1)
        base, rem = length // div, length % div
        from_top = np.cumsum(leaf[:, :, ::-1], axis=2)[:, :, ::-1]
        extra = leaf & (from_top <= rem[:, :, None])
        per_col = (leaf * base[:, :, None] + extra).sum(axis=1)
        uncovered = np.where(m == 0, length, 0).sum(axis=1)
        att = self.sum_by_stage(out_stage, per_col)
        att[:, CODE["unattributed"]] += uncovered
        return att

    def critical_path(self) -> np.ndarray:
        """Jaeger's walk from the window's end, children clipped to their parents."""
        return critical_path(self)

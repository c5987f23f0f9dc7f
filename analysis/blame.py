"""Blame: what the engine was executing while a request waited (docs/design.md, "Attribution").

A request is a request of the assembly (``analysis.assemble``: traces sharing a
``request_id`` are one request). Its waits are its ``queue`` spans (waiting for admission),
its ``batch_wait`` spans (admitted, waiting for its first chunk: other requests' admission
and the chunks that run before its own in the step that carries it), its ``preempted``
spans (its K/V blocks taken by another request, until it is admitted again:
``analysis.preemption`` names the requests), its ``kv_transfer`` spans from the end of its
last prefill chunk on (disaggregated serving: the part of the transfer its prefill did not
hide) and the gaps between its consecutive ``prefill.chunk`` spans (a ``preempted`` span
between two chunks ends one run of chunks: the recompute's chunks are another, and the
time between the runs is the preemption's and the re-admission's, not a gap). Each wait
is split by the engine's ``step`` spans on the same ``(service, clock)``
(for a transfer, the worker that recorded it): the part of a step that overlaps the wait
goes to ``prefill`` and ``decode`` in proportion to the step's ``prefill_tokens`` (less this
request's own ``chunk_tokens`` in that step, matched by ``step_id``) and ``decode_tokens``;
a step whose split is not known goes to ``unknown``; wait time under no step is ``idle``
(the engine had nothing to run, or was between steps: planning and admitting requests).

Vectorized over waits: steps are sorted per ``(service, clock)`` and each step's end is
clipped to the next step's start (overlapping steps never count twice), so a wait's steps
are one contiguous run found by binary search; interior steps are summed from cumulative
sums and only the two edge steps are clipped. Steps that carry the request's own tokens are
corrected afterwards, one ``(wait, step)`` pair at a time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import _column_arrays as col
from ttft.analysis._reported import without_reported
from ttft.analysis._request_columns import request_columns
from ttft.analysis.assemble import Assembly, Rows
from ttft.tracer.schema import (
    ATTR_CHUNK_TOKENS,
    ATTR_DECODE_TOKENS,
    ATTR_PREFILL_TOKENS,
    ATTR_STEP_ID,
)

SPAN_WAITS = ("queue", "batch_wait", "preempted", "kv_transfer")
"""The waits that are spans of their own stage."""
WAITS = (*SPAN_WAITS, "between_chunks")
"""The waits blame splits: ``queue``, ``batch_wait``, ``preempted`` and ``kv_transfer``
spans (a transfer from the end of the request's last prefill chunk on: the part overlapped
with its own prefill is not waiting), and gaps between a request's prefill chunks."""
KINDS = ("prefill", "decode", "unknown", "idle")
"""What the engine was doing during a wait; the frame of `blame` has a ``<kind>_ns`` each."""
COLUMNS = ("trace_id", "request_id", "condition", "wait", "wait_ns", *(f"{k}_ns" for k in KINDS))
SUMMARY_COLUMNS = (
    "condition",
    "wait",
    "requests",
    "wait_ms_mean",
    *(f"{k}_ms_mean" for k in KINDS),
    *(f"share_{k}" for k in KINDS),
)


def blame(asm: Assembly, step_spans: pa.Table | None = None) -> pd.DataFrame:
    """Split every request's waiting time by what the engine executed meanwhile.

    Args:
        asm: the assembled trace (`ttft.analysis.assemble.assemble`). Its clock-aligned
            times and valid rows are used (rows it counts as defects, such as a missing
            field or an end before the start, are not); the ``step`` spans are those of
            any trace. Missing or malformed attributes count as absent and never raise.
        step_spans: the ``step`` spans to split by instead of the assembly's own: valid
            rows with ``service``, ``clock``, ``start_ns``, ``end_ns`` (already on the
            assembly's clock) and ``attributes`` as ``SPAN_SCHEMA`` has them (one partition
            of a dataset blamed against every step of the dataset,
            ``analysis.part.global_steps``); a step whose service or clock the
            assembly lacks overlaps none of its waits.

    Returns:
        One row per (request, wait) with wait time > 0, in the order of ``asm.requests``
        and then `WAITS`: ``trace_id``, ``request_id`` and ``condition`` (``cold``,
        ``prefix_hit`` or None) of the request as ``asm.requests`` has them, ``wait`` (one
        of `WAITS`), ``wait_ns`` and ``prefill_ns``, ``decode_ns``, ``unknown_ns``,
        ``idle_ns`` (int64, summing to ``wait_ns`` exactly). Several waits of one kind
        (several queue spans, several gaps, in any of the request's traces) are summed into
        one row. Prefill time is other requests' prefill: the request's own chunk tokens
        are subtracted from a step's ``prefill_tokens``. A step lacking ``prefill_tokens``
        or ``decode_tokens``, with none left after the subtraction, or carrying an own
        chunk without ``chunk_tokens``, is ``unknown``.
    """
    rows = asm.rows
    start, end = rows.start_ns, rows.end_ns
    group = (rows.service.astype(np.int64) + 1) * (len(rows.clock_values) + 1) + rows.clock + 1
    attrs = rows.table.column("attributes")
    if step_spans is None:
        steps = _Steps(attrs, rows.of("step"), start, end, group, rows.service)
    else:
        steps = _Steps(*_outside_steps(rows, step_spans))
    chunk_rows = rows.of("prefill.chunk", requests_only=True)
    span_rows = [without_reported(rows.of(w, requests_only=True), rows.service,
                                  rows.service_values) for w in SPAN_WAITS]
    iv_req, iv_wait, iv_a, iv_b, iv_group = _intervals(
        span_rows, chunk_rows, rows.req, start, end, group, len(asm.requests)
    )
    if len(iv_req) == 0:
        return _empty(COLUMNS)
    parts = steps.split(iv_a, iv_b, iv_group)
    steps.correct_own(parts, iv_req, iv_a, iv_b, chunk_rows, rows.req, rows.service, attrs)

    # One row per (request, wait): sum the intervals.
    key = iv_req * len(WAITS) + iv_wait
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    wait_ns = np.add.reduceat((iv_b - iv_a)[order], first)
    sums = [np.add.reduceat(p[order], first) for p in parts]
    out: dict[str, object] = {
        **request_columns(asm, key[first] // len(WAITS), "trace_id", "request_id", "condition")
    }
    out["wait"] = pd.Series(np.asarray(WAITS, dtype=object)[key[first] % len(WAITS)], dtype=object)
    out["wait_ns"] = wait_ns
    for kind, value in zip(KINDS[:3], sums, strict=True):
        out[f"{kind}_ns"] = value
    out["idle_ns"] = wait_ns - sums[0] - sums[1] - sums[2]
    return pd.DataFrame(out)


def blame_summary(per_request: pd.DataFrame) -> pd.DataFrame:
    """Aggregate `blame` rows per condition and wait.

    Returns:
        One row per (condition, wait) that has rows, condition ``all`` first (it mixes
        both conditions and includes requests of unknown condition), then ``cold`` and
        ``prefix_hit``; waits in `WAITS` order. Columns: ``requests`` (rows = requests with
        that wait), ``wait_ms_mean`` and ``<kind>_ms_mean`` (means over those requests) and
        ``share_<kind>`` (the kind's summed time over the summed wait time, a fraction).
        Empty input gives an empty frame with these columns.
    """
    if per_request.empty:
        return _empty(SUMMARY_COLUMNS)
    conditions = per_request["condition"].to_numpy(dtype=object)
    waits = per_request["wait"].to_numpy(dtype=object)
    ns = {c: per_request[f"{c}_ns"].to_numpy(np.int64) for c in ("wait", *KINDS)}
    rows = []
    for condition in ("all", "cold", "prefix_hit"):
        in_condition = (
            np.ones(len(conditions), bool) if condition == "all" else (conditions == condition)
        )
        for wait in WAITS:
            mask = in_condition & (waits == wait)
            count = int(mask.sum())
            if count == 0:
                continue
            sums = [int(ns[c][mask].sum()) for c in ("wait", *KINDS)]
            means = [v / count / 1e6 for v in sums]
            rows.append((condition, wait, count, *means, *(v / sums[0] for v in sums[1:])))
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


class _Steps:
    """The ``step`` spans sorted by (group, start), ends clipped to the next start."""

    def __init__(self, attrs, rows, start, end, group, service) -> None:
        step_id = col.int_attribute(attrs, rows, ATTR_STEP_ID)
        prefill = col.int_attribute(attrs, rows, ATTR_PREFILL_TOKENS)
        decode = col.int_attribute(attrs, rows, ATTR_DECODE_TOKENS)
        # Ties broken by every field, so row order never matters: of steps starting
        # together, the one sorted last (the longest) keeps its time.
        order = np.lexsort((decode, prefill, step_id, end[rows], start[rows], group[rows]))
        rows = rows[order]
        self.step_id, self.prefill, self.decode = step_id[order], prefill[order], decode[order]
        self.group = group[rows]
        self.service = service[rows]
        self.start = start[rows]
        stop = np.maximum(end[rows], self.start)
        same = self.group[1:] == self.group[:-1]
        stop[:-1] = np.where(same, np.minimum(stop[:-1], self.start[1:]), stop[:-1])
        self.stop = stop
        whole = _split(self.stop - self.start, self.prefill, self.decode, 0)
        self.cum = [np.concatenate([[0], np.cumsum(p)]) for p in whole]

    def overlap(self, idx: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        lo = np.maximum(self.start[idx], a)
        hi = np.minimum(self.stop[idx], b)
        return np.maximum(hi - lo, 0)

    def split(self, a: np.ndarray, b: np.ndarray, group: np.ndarray) -> list[np.ndarray]:
        """Prefill, decode and unknown ns of each interval ``[a, b)`` in ``group``, without
        own-token corrections; sets ``self.lo`` / ``self.hi``, the run of steps each
        interval overlaps."""
        n = len(a)
        parts = [np.zeros(n, np.int64) for _ in range(3)]
        self.lo = np.zeros(n, np.int64)
        self.hi = np.zeros(n, np.int64)
        if len(self.start) == 0:
            return parts
        bounds = np.flatnonzero(np.r_[True, self.group[1:] != self.group[:-1], True])
        groups = self.group[bounds[:-1]]
        for g in np.unique(group):
            at = np.searchsorted(groups, g)
            if at == len(groups) or groups[at] != g:
                continue
            gs, ge = bounds[at], bounds[at + 1]
            m = np.flatnonzero(group == g)
            self.lo[m] = gs + np.searchsorted(self.stop[gs:ge], a[m], "right")
            self.hi[m] = gs + np.searchsorted(self.start[gs:ge], b[m], "left")
        lo, hi = self.lo, self.hi
        inner = hi - 1 > lo + 1
        k0, k1 = np.where(inner, lo + 1, 0), np.where(inner, hi - 1, 0)
        for part, cum in zip(parts, self.cum, strict=True):
            part += cum[k1] - cum[k0]
        for edge, use in ((lo, hi > lo), (hi - 1, hi - 1 > lo)):
            m = np.flatnonzero(use)
            idx = edge[m]
            ov = self.overlap(idx, a[m], b[m])
            for part, value in zip(
                parts, _split(ov, self.prefill[idx], self.decode[idx], 0), strict=True
            ):
                part[m] += value
        return parts

    def correct_own(self, parts, iv_req, a, b, chunk_rows, req, service, attrs) -> None:
        """Re-split the steps that carry the interval's own request's chunks (``req`` is
        each row's request, ``iv_req`` each interval's)."""
        if len(chunk_rows) == 0 or len(self.start) == 0:
            return
        chunks = pd.DataFrame(
            {
                "req": req[chunk_rows],
                "service": service[chunk_rows],
                "step_id": col.int_attribute(attrs, chunk_rows, ATTR_STEP_ID),
                "tokens": col.int_attribute(attrs, chunk_rows, ATTR_CHUNK_TOKENS),
            }
        )
        chunks = chunks[chunks["step_id"] >= 0]
        own = chunks.groupby(["req", "service", "step_id"], sort=False)["tokens"].agg(
            ["sum", "min"]
        )
        own["own"] = np.where(own["min"] < 0, -1, own["sum"])  # -1: an own chunk of unknown size
        known = self.step_id >= 0
        steps = pd.DataFrame(
            {
                "service": self.service[known],
                "step_id": self.step_id[known],
                "idx": np.flatnonzero(known),
            }
        )
        pairs = own["own"].reset_index().merge(steps, on=["service", "step_id"])
        ivs = pd.DataFrame({"req": iv_req, "iv": np.arange(len(iv_req))})
        pairs = pairs[["req", "idx", "own"]].merge(ivs, on="req")
        iv = pairs["iv"].to_numpy()
        idx = pairs["idx"].to_numpy()
        m = (idx >= self.lo[iv]) & (idx < self.hi[iv])
        iv, idx, own_tokens = iv[m], idx[m], pairs["own"].to_numpy()[m]
        ov = self.overlap(idx, a[iv], b[iv])
        p, d = self.prefill[idx], self.decode[idx]
        fixed = _split(ov, p, d, own_tokens)
        plain = _split(ov, p, d, 0)
        for part, new, old in zip(parts, fixed, plain, strict=True):
            np.add.at(part, iv, new - old)


def _outside_steps(rows: Rows, spans: pa.Table) -> tuple:
    """`_Steps`'s arguments for step ``spans`` of another table: their services and
    clocks coded as ``rows`` codes them (-2 and group -1 where ``rows`` lacks the name)."""
    service = _codes_in(spans.column("service"), rows.service_values)
    clock = _codes_in(spans.column("clock"), rows.clock_values)
    known = (service > -2) & (clock > -2)
    group = np.where(known, (service + 1) * (len(rows.clock_values) + 1) + clock + 1, -1)
    start, end = col.int64(spans.column("start_ns")), col.int64(spans.column("end_ns"))
    return spans.column("attributes"), np.arange(spans.num_rows), start, end, group, service


def _codes_in(column: pa.ChunkedArray, values: list[str]) -> np.ndarray:
    """The code of each value of ``column`` in ``values``: -1 for null, -2 when absent."""
    codes, names = col.codes(column)
    index = {value: i for i, value in enumerate(values)}
    return np.array([index.get(name, -2) for name in names] + [-1], np.int64)[codes]


def _split(ov_ns, prefill, decode, own) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ov_ns`` of steps into (prefill, decode, unknown) ns: prefill gets
    ``floor(ov * p / (p + d))`` with ``p`` the prefill tokens less ``own`` (-1: unknown)."""
    own = np.asarray(own)
    other = np.maximum(prefill - own, 0)
    total = other + decode
    known = (prefill >= 0) & (decode >= 0) & (own >= 0) & (total > 0)
    safe = np.where(known, total, 1)
    tokens = np.where(known, other, 0)
    q, r = np.divmod(ov_ns, safe)
    pre = q * tokens + (r * tokens) // safe  # exact floor without overflowing ov * p
    return pre, np.where(known, ov_ns - pre, 0), np.where(known, 0, ov_ns)


def _intervals(span_rows, chunk_rows, req, start, end, group, n_req):
    """Waits as arrays (request, wait index, a, b, group), each with ``b > a``.

    ``span_rows`` holds the rows of each of `SPAN_WAITS`, in order; a ``kv_transfer`` starts
    no earlier than the latest end of its request's chunks (any worker, clocks aligned).
    Gaps are taken between consecutive chunks of one request on one (service, clock) and in
    one run (no ``preempted`` span of the request starting between them), sorted by start,
    from the latest chunk end so far (overlapping chunks leave no gap).
    """
    prefill_end = np.full(n_req, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(prefill_end, req[chunk_rows], end[chunk_rows])
    transfer = SPAN_WAITS.index("kv_transfer")
    out = []
    for wait, rows in enumerate(span_rows):
        a, b = start[rows], end[rows]
        if wait == transfer:
            a = np.maximum(a, prefill_end[req[rows]])
        keep = b > a
        out.append((req[rows][keep], wait, a[keep], b[keep], group[rows][keep]))
    if len(chunk_rows) > 1:
        key = req[chunk_rows].astype(np.int64) * (int(group.max()) + 1) + group[chunk_rows]
        epoch = _runs(span_rows[SPAN_WAITS.index("preempted")], chunk_rows, req, start)
        order = np.lexsort((start[chunk_rows], epoch, key))
        rows, key, epoch = chunk_rows[order], key[order], epoch[order]
        run = np.r_[0, np.cumsum((key[1:] != key[:-1]) | (epoch[1:] != epoch[:-1]))]
        reach = pd.Series(end[rows]).groupby(run).cummax().to_numpy()
        a, b = reach[:-1], start[rows[1:]]
        keep = (run[1:] == run[:-1]) & (b > a)
        gap = len(SPAN_WAITS)
        out.append((req[rows[:-1]][keep], gap, a[keep], b[keep], group[rows[:-1]][keep]))
    cat = [np.concatenate([np.broadcast_to(o[j], len(o[0])) for o in out]) for j in range(5)]
    return tuple(c.astype(np.int64) for c in cat)


def _runs(preempted_rows, chunk_rows, req, start) -> np.ndarray:
    """Per chunk row, a number that differs between chunks of one request exactly when a
    ``preempted`` span of the request starts between them (at or before the later one):
    the preempted spans counted in (request, start) order up to the chunk."""
    n_pre = len(preempted_rows)
    if n_pre == 0:
        return np.zeros(len(chunk_rows), np.int64)
    rows = np.concatenate([preempted_rows, chunk_rows])
    is_chunk = np.r_[np.zeros(n_pre, bool), np.ones(len(chunk_rows), bool)]
    order = np.lexsort((is_chunk, start[rows], req[rows]))  # a span before a chunk it meets
    counted = np.empty(len(rows), np.int64)
    counted[order] = np.cumsum(~is_chunk[order])
    return counted[n_pre:]


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    def dtype(c: str) -> str:
        if c.endswith("_ns") or c == "requests":
            return "int64"
        return "float64" if c.endswith("_mean") or c.startswith("share_") else "object"

    return pd.DataFrame({c: pd.Series(dtype=dtype(c)) for c in columns})

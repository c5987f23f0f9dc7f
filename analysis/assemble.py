"""Assemble a span table into requests: grouping, the step-id join, trees and windows.

Pure function over an Arrow table (no I/O). The rules are in docs/attribution.md
("Requests", "Windows", "The tree"): traces become requests (traces sharing a
``request_id`` are one request), engine ``gpu`` spans are copied into the requests whose
``prefill.chunk`` spans carry the same ``(service, step_id)``, parents are resolved
inside each request, and the TTFT windows of all three boundaries are computed. Before any
window is built, server clocks are moved onto the client clock by the offsets of
``analysis.clocks`` (0 for one host), reported in ``quality.clocks``.
Everything is vectorized over requests (see ``_request_blocks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis import _column_arrays as col
from ttft.analysis import clocks
from ttft.analysis._binary_ids import id_texts
from ttft.analysis._clock_kinds import clock_kinds
from ttft.analysis._conditions import conditions, max_cached
from ttft.analysis._grouping import Decoded, Grouping, decode, group
from ttft.analysis._id_words import id_words
from ttft.analysis._outcomes import request_outcomes
from ttft.analysis._reported import attributed_rows
from ttft.analysis._step_join import join_gpu
from ttft.analysis._trees import CODE, MAX_NS, N_STAGES, NONE_NS, Spans, resolve_trees
from ttft.analysis.quality import Quality, estimated_spans, rejected_spans
from ttft.tracer.schema import (
    BOUNDARY_NAMES,
    EV_FIRST_BYTE,
    EV_FIRST_SAMPLED,
    EV_FIRST_TOKEN,
    OUTCOME_CANCELLED,
    OUTCOME_OK,
    STAGE_NAMES,
)

_STAGE_NAMES = np.asarray(STAGE_NAMES, dtype=object)


@dataclass
class Rows:
    """Every row of the assembled table, decoded once, for the analyses beyond attribution
    (blame, prefill scaling, regime, waterfalls), so none decodes the table again and all
    mean the same by "request".

    ``req`` is the row's request (an index into ``Assembly.requests``; -1 for rows of no
    request, such as engine ``step`` and ``gpu`` spans); ``stage`` the canonical stage code
    (``analysis._trees.CODE``); ``start_ns``/``end_ns`` after clock alignment (server clocks
    moved onto the client's); ``valid`` false for rows the analysis ignores (a missing
    field, end before start); ``service``/``clock`` codes into ``service_values`` /
    ``clock_values`` (-1 for null). ``table`` is the span table itself (names, attributes).
    ``gpu_chunk``/``gpu_row`` are the step join's pairs: each request ``prefill.chunk`` row
    and an engine ``gpu`` row joined to it (what attribution's gpu copies are made of), and
    ``gpu_move`` the ns the pair's copy moves beyond its gpu row's own times (a gpu row
    without a host clock in its trace moves with the chunk: ``Spans`` holds the copy there).
    """

    table: pa.Table
    req: np.ndarray
    stage: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    valid: np.ndarray
    service: np.ndarray
    service_values: list[str]
    clock: np.ndarray
    clock_values: list[str]
    gpu_chunk: np.ndarray
    gpu_row: np.ndarray
    gpu_move: np.ndarray

    def of(self, *stages: str, requests_only: bool = False) -> np.ndarray:
        """Indices of the valid rows whose stage is one of ``stages`` (only rows of a
        request with ``requests_only``), in table order."""
        keep = self.valid & col.among(self.stage, [CODE[s] for s in stages], N_STAGES)
        if requests_only:
            keep &= self.req >= 0
        return np.flatnonzero(keep)

    def has_stage(self, rows: np.ndarray, *stages: str) -> np.ndarray:
        """Boolean mask over ``rows``: the row's stage is one of ``stages``."""
        return col.among(self.stage[rows], [CODE[s] for s in stages], N_STAGES)

    def stage_names(self, rows: np.ndarray) -> np.ndarray:
        """The canonical stage name of each of ``rows`` (object array)."""
        return _STAGE_NAMES[self.stage[rows]]

    def clock_names(self, rows: np.ndarray) -> np.ndarray:
        """The clock of each of ``rows`` (object array, ``""`` for null)."""
        return np.asarray([*self.clock_values, ""], dtype=object)[self.clock[rows]]

    def int_attribute(self, rows: np.ndarray, key: str) -> np.ndarray:
        """The integer attribute ``key`` of each of ``rows``; -1 where absent or not a
        non-negative integer (malformed attributes never raise)."""
        return col.int_attribute(self.table.column("attributes"), rows, key)


@dataclass
class Assembly:
    """Everything attribution and summaries need, with the defects found on the way.

    ``requests`` has one row per request: ``trace_id``, ``request_id``, ``condition``
    (``cold``, ``prefix_hit`` or None), ``outcome`` (one of ``OUTCOMES`` from its client
    span; None without one), ``status_code`` and ``error`` (of a failed request, else
    None) and, per boundary ``X``, ``X_a`` / ``X_b`` window
    ends (``NONE_NS`` where missing) plus ``client_root`` / ``server_root`` (column of
    the root span in its request's block, -1) and ``server_window_end`` (where server-side
    spans are cut in the client boundary).
    """

    requests: pd.DataFrame
    spans: Spans
    token_req: np.ndarray
    token_ns: np.ndarray
    quality: Quality
    rows: Rows

    def ok(self) -> np.ndarray:
        """Boolean per request: not failed (``ok``, or no client span to say otherwise)."""
        outcome = self.requests["outcome"].to_numpy(dtype=object)
        return (outcome == OUTCOME_OK) | pd.isna(outcome)

    def has_window(self, boundary: str) -> np.ndarray:
        """Boolean per request: both ends of its window at ``boundary`` exist, in order."""
        a = self.requests[f"{boundary}_a"].to_numpy()
        b = self.requests[f"{boundary}_b"].to_numpy()
        return (a != NONE_NS) & (b != NONE_NS) & (b >= a)

    def default_boundary(self) -> str:
        """The outermost boundary that at least one request supports (else ``engine``)."""
        for name in BOUNDARY_NAMES:
            if self.has_window(name).any():
                return name
        return BOUNDARY_NAMES[-1]


def _examples(values: list[str], codes: np.ndarray) -> list[str]:
    return [values[int(c)] for c in codes if c >= 0]


def _row_names(table: pa.Table, rows: np.ndarray) -> list[str]:
    """What names a row that lacks a field: its span id, else its trace id, else its
    position (``row N``), so the examples do not depend on row order where avoidable."""
    if len(rows) == 0:
        return []
    span, trace = (id_texts(col.take(table.column(name), rows))
                   for name in ("span_id", "trace_id"))
    return [f"span {s}" if s else f"trace {t}" if t else f"row {i}"
            for s, t, i in zip(span, trace, rows.tolist(), strict=True)]


@dataclass
class _Assembling:
    """What each step of `assemble` hands the next: the table decoded (every row once) and
    grouped into requests, its times moved onto the client clock (``shift`` per row, None
    when nothing moved; ``untraced``: gpu rows without a host clock in their trace), the
    services coded, and the defects found so far."""

    table: pa.Table
    quality: Quality
    d: Decoded
    g: Grouping
    start: np.ndarray
    end: np.ndarray
    service: np.ndarray
    service_values: list[str]
    shift: np.ndarray | None
    untraced: np.ndarray | None


def assemble(table: pa.Table, *, offsets: Sequence[clocks.ClockOffset] | None = None,
             borrowed: np.ndarray | None = None) -> Assembly:
    """Group a span table (``tracer.schema.SPAN_SCHEMA``) into requests, in named steps:
    decode and group (`_grouped`), server clocks onto the client's (`_aligned`), the gpu
    step join (`_joined`), per-request trees (`_trees`), then the windows and what names
    each request (`_requests`).

    Args:
        table: the spans.
        offsets: the clock offsets to apply, estimated over more requests than this table
            holds (one partition of a dataset: ``clocks.offsets_from_bounds``); None to
            estimate them here.
        borrowed: per row, whether it is a copy whose original another partition holds
            (its row defects are counted there, not here); None for none.
    """
    col.release_arrow_pool()  # what reading and mapping the table left in the pool
    step = _aligned(table, *_grouped(table, borrowed), offsets)
    span_rows, chunk_rows, gpu_rows = _joined(step)
    spans, windows, fix = _trees(step, span_rows, chunk_rows, gpu_rows)
    requests, token_req, token_ns = _requests(step, windows)
    d = step.d
    rows = Rows(table, step.g.row_req, d.stage, step.start, step.end, d.valid,
                col.narrow(step.service, len(step.service_values)), step.service_values,
                col.narrow(d.clock_raw, len(d.clock_values)), d.clock_values, chunk_rows,
                gpu_rows, fix)
    return Assembly(requests, spans, token_req, token_ns, step.quality, rows)


def _grouped(table: pa.Table, borrowed: np.ndarray | None
             ) -> tuple[Quality, Decoded, Grouping]:
    """Decode every row once, count the row defects (not of ``borrowed`` copies) and the
    importer's, and group the traces into requests."""
    quality = Quality()
    quality.add("rejected_span", *rejected_spans(table))
    quality.add("estimated_span", *estimated_spans(table))
    d = decode(table)
    counted = np.ones(table.num_rows, bool) if borrowed is None else ~borrowed
    missing = counted & ~d.present
    quality.add("missing_field", int(missing.sum()), _row_names(table, np.flatnonzero(missing)))
    backwards = counted & d.backwards
    quality.add("end_before_start", int(backwards.sum()),
                _examples(d.trace_values, d.trace[backwards]))
    grouping = group(table, d)
    col.release_arrow_pool()  # decode's hashing is done: numpy's arrays come next
    return quality, d, grouping


def _aligned(table: pa.Table, quality: Quality, d: Decoded, g: Grouping,
             offsets: Sequence[clocks.ClockOffset] | None) -> _Assembling:
    """Server clocks moved onto the client clock, before any time is compared across
    them: by ``offsets``, else by those estimated from this table's requests."""
    quality.clocks = list(offsets) if offsets is not None else clocks.offsets_from_bounds([
        clocks.bounds(g.row_req, g.n_req, clock_kinds(d), d.start, d.end, d.clock_raw,
                      d.clock_values)
    ])
    service, service_values = col.codes(table.column("service"))
    shifted = clocks.row_shift_parts(
        d.clock_raw, d.clock_values, quality.clocks, lambda: d.trace, lambda: service
    )
    shift, untraced = (None, None) if shifted is None else shifted
    start, end = (d.start, d.end) if shift is None else (_moved(d.start, shift),
                                                        _moved(d.end, shift))
    return _Assembling(table, quality, d, g, start, end, service, service_values, shift,
                       untraced)


def _moved(ns: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``ns + shift``, in place where ``ns`` is numpy's own copy (a table of several chunks:
    ``_column_arrays.int64``), as nothing reads a row's unshifted time after `_aligned`:
    16 B a row less held to the end; a view of Arrow's read-only buffer is copied."""
    if ns.flags.writeable and ns.flags.owndata:
        ns += shift
        return ns
    return ns + shift


def _joined(step: _Assembling) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(span_rows, chunk_rows, gpu_rows)``: the spans that can take window time (request
    traces, no events, no steps; a server's reported timings only where it exported no
    spans of the request: measured wins) and the step join's pairs (``chunk_rows[i]``
    launched ``gpu_rows[i]``)."""
    d, g = step.d, step.g
    is_event = d.valid & (d.stage == CODE["event"])
    span_rows = np.flatnonzero((g.row_req >= 0) & ~is_event & (d.stage != CODE["step"]))
    span_rows = attributed_rows(span_rows, g.row_req, g.n_req, d.is_client, step.service,
                                step.service_values)
    chunk_rows, gpu_rows, reused = join_gpu(step.table, d.stage, g.row_req, d.valid, span_rows,
                                             step.start, step.end, d.trace, d.trace_values,
                                             d.clock_raw, step.shift, step.untraced)
    step.quality.add("reused_step_id", len(reused), _examples(d.trace_values, d.trace[reused]))
    return span_rows, chunk_rows, gpu_rows


def _trees(step: _Assembling, span_rows: np.ndarray, chunk_rows: np.ndarray,
           gpu_rows: np.ndarray) -> tuple[Spans, dict[str, np.ndarray], np.ndarray]:
    """The attributed rows laid out in per-request blocks (`Spans`), their trees resolved;
    also the ns each gpu copy moves beyond its gpu row (``Rows.gpu_move``)."""
    d, n_req, table = step.d, step.g.n_req, step.table
    row_req, trace, start, end, shift = step.g.row_req, d.trace, step.start, step.end, step.shift
    rows = np.concatenate([span_rows, gpu_rows])
    req = np.concatenate([row_req[span_rows], row_req[chunk_rows]])
    # Requests laid out in order, each request's spans in row order, then its gpu copies:
    # rows of a table that holds its traces together (every writer's) are then read about
    # in order, and the compiled kernels walk memory once; the blocks of equal counts
    # (_request_blocks) gather their requests' spans (docs/architecture.md, "Memory is
    # time").
    counts = np.bincount(req, minlength=n_req)
    order = col.group_order(req, n_req)
    rows, req = rows[order], req[order]
    n_plain = len(span_rows)
    # A gpu row whose engine trace shows no host clock moves, in its copies, with the chunk
    # that launched it: its service's one host clock in the table (`row_shift`) is not
    # what one partition of a dataset shows.
    move, fix = None, np.zeros(len(gpu_rows), np.int64)
    if step.untraced is not None and step.untraced[gpu_rows].any():
        fix = np.where(step.untraced[gpu_rows], shift[chunk_rows] - shift[gpu_rows], 0)
        move = np.concatenate([np.zeros(n_plain, np.int64), fix])[order]
    is_copy = order >= n_plain
    # Ids are read at these rows only (events and the engine's own spans never need
    # theirs), in row order; a gpu copy's parent is its chunk.
    span_col = table.column("span_id")
    (s_hi, s_lo, s_has), (p_hi, p_lo, p_has), (g_hi, g_lo, g_has) = id_words(
        (span_col, span_rows), (table.column("parent_id"), span_rows), (span_col, gpu_rows)
    )
    chunk_at = np.searchsorted(span_rows, chunk_rows)  # chunks are span rows
    sid_hi, sid_lo = np.concatenate([s_hi, g_hi])[order], np.concatenate([s_lo, g_lo])[order]
    has_sid = np.concatenate([s_has, g_has])[order]
    p_hi = np.concatenate([p_hi, s_hi[chunk_at]])[order]
    p_lo = np.concatenate([p_lo, s_lo[chunk_at]])[order]
    has_parent = np.concatenate([p_has, np.ones(len(chunk_at), bool)])[order]
    del s_hi, s_lo, s_has, p_has, g_hi, g_lo, g_has, chunk_at  # held to the end otherwise
    offsets = np.zeros(n_req, np.int64)
    offsets[1:] = np.cumsum(counts)[:-1]
    spans = Spans(
        req=req,
        start_ns=start[rows] if move is None else start[rows] + move,
        end_ns=end[rows] if move is None else end[rows] + move,
        stage=np.where(is_copy, CODE["gpu"], d.stage[rows]).astype(np.int8),
        client=d.is_client[rows],
        sid_hi=sid_hi,
        sid_lo=sid_lo,
        parent=np.full(len(rows), -1, np.int32),
        depth=np.zeros(len(rows), np.int16),
        keep=np.ones(len(rows), bool),
        counts=counts,
        offsets=offsets,
        trace=trace[rows],
        trace_values=d.trace_values,
    )
    # Span ids are unique per trace: a span is its (trace, id), and a gpu copy, which keeps
    # its engine trace, finds its parent (its chunk) in the chunk's trace.
    span_trace = spans.trace
    parent_trace = span_trace.copy()  # a span's own trace, but a gpu copy's is its chunk's
    copies = np.flatnonzero(is_copy)
    parent_trace[copies] = trace[chunk_rows[order[copies] - n_plain]]
    # What resolve_trees does not read is let go first: its own arrays then reuse that
    # memory, where every fresh page is time (docs/architecture.md, "Memory is time").
    del rows, order, is_copy, copies, move
    windows = resolve_trees(spans, has_sid, (p_hi, p_lo, parent_trace), has_parent, n_req,
                            span_trace, d.trace_values)
    return spans, windows, fix


def _requests(step: _Assembling, windows: dict[str, np.ndarray]
              ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """One row per request: its window ends (from the trees and the boundary events), what
    names it, its condition and outcome, with the tree and clock defects counted; and the
    client's token times (request, ns)."""
    d, g, table, quality = step.d, step.g, step.table, step.quality
    row_req, n_req, start = g.row_req, g.n_req, step.start
    ev_req = row_req[d.ev_rows]
    ev_t = start[d.ev_rows]
    firsts = {}
    for i, name in enumerate((EV_FIRST_TOKEN, EV_FIRST_BYTE, EV_FIRST_SAMPLED)):
        m = (d.kind == i) & (ev_req >= 0)
        out = np.full(n_req, MAX_NS, np.int64)
        np.minimum.at(out, ev_req[m], ev_t[m])
        firsts[name] = np.where(out == MAX_NS, NONE_NS, out)
    tok = ((d.kind == 0) | (d.kind == 3)) & (ev_req >= 0) & d.is_client[d.ev_rows]

    requests = _windows(windows, firsts, n_req)
    requests.insert(0, "trace_id", np.asarray(d.trace_values, dtype=object)[g.first_trace])
    requests.insert(1, "request_id", _request_ids(g.uniq, g.rid_values))
    requests.insert(2, "condition", _conditions(table, row_req, d.stage, n_req))
    client_rows = np.flatnonzero(d.valid & (row_req >= 0) & (d.stage == CODE["client"]))
    outcome, status, error = request_outcomes(
        table.column("attributes"), client_rows, row_req, n_req, start
    )
    requests.insert(3, "outcome", outcome)
    requests.insert(4, "status_code", status)
    requests.insert(5, "error", error)
    _add_tree_examples(quality, windows, d.trace_values, g.first_trace,
                       cut=outcome == OUTCOME_CANCELLED)
    clock_shift = (
        (requests["client_root"].to_numpy() >= 0)
        & (requests["server_root"].to_numpy() >= 0)
        # the server cannot receive a request before the client sent it. Ends are not
        # compared: the server's span may end after the client stopped reading at [DONE],
        # and a client can read the first token before the server's send() returned.
        & (windows["server_start"] < windows["client_start"])
    )
    quality.add("clock_shift", int(clock_shift.sum()), requests["trace_id"][clock_shift])
    return requests, ev_req[tok], ev_t[tok]


def _add_tree_examples(
    quality: Quality, found: dict[str, np.ndarray], trace_values: list[str], first: np.ndarray,
    cut: np.ndarray,
) -> None:
    """The tree defects; a request ``cut`` short by the run's stop (outcome ``cancelled``)
    leaves spans whose parent (its ``server`` span) never ended, so was never exported:
    an outcome, not orphans."""
    for defect, key, skip in (
        ("orphan_parent", "orphans", cut),
        ("duplicate_span_id", "duplicates", False),
        ("outside_window", "outside", False),
    ):
        per = np.where(skip, 0, found[key])
        hit = np.flatnonzero(per)
        quality.add(defect, int(per.sum()), [trace_values[first[i]] for i in hit])


def _windows(
    found: dict[str, np.ndarray], firsts: dict[str, np.ndarray], n_req: int
) -> pd.DataFrame:
    tok, queue = found["tokenize_start"], found["queue_start"]
    sampled, sample_end = firsts[EV_FIRST_SAMPLED], found["sample_end"]
    first_byte = firsts[EV_FIRST_BYTE]
    return pd.DataFrame(
        {
            "client_a": found["client_start"],
            "client_b": np.where(found["client_root"] >= 0, firsts[EV_FIRST_TOKEN], NONE_NS),
            "server_a": found["server_start"],
            "server_b": np.where(found["server_root"] >= 0, first_byte, NONE_NS),
            "engine_a": np.where(tok != NONE_NS, tok, queue),
            "engine_b": np.where(sampled != NONE_NS, sampled, sample_end),
            "client_root": found["client_root"],
            "server_root": found["server_root"],
            # The server's own window inside the client boundary ends at first_byte, or
            # at the server span's end when there is no first_byte.
            "server_window_end": np.where(first_byte != NONE_NS, first_byte, found["server_end"]),
        },
        index=pd.RangeIndex(n_req),
    )


def _request_ids(uniq: np.ndarray, rid_values: list[str]) -> np.ndarray:
    values = np.asarray([*rid_values, None], dtype=object)
    return values[np.minimum(uniq, len(rid_values))]


def _conditions(table: pa.Table, row_req: np.ndarray, stage: np.ndarray, n_req: int) -> np.ndarray:
    """``prefix_hit`` / ``cold`` / None per request (the rule of ``analysis._conditions``)."""
    attrs = table.column("attributes")
    server = max_cached(attrs, np.flatnonzero((row_req >= 0) & (stage == CODE["server"])),
                        row_req, n_req)
    # Prefill spans decide only where the server span did not say: read only those.
    unsaid = np.zeros(n_req + 1, bool)  # the last entry: rows of no request
    unsaid[:n_req] = server < 0
    prefill = col.among(stage, [CODE["prefill"], CODE["prefill.chunk"]], N_STAGES) & unsaid[row_req]
    return conditions(server, max_cached(attrs, np.flatnonzero(prefill), row_req, n_req))

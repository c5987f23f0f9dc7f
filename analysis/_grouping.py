"""Which rows are valid and which traces are one request: the first step of ``assemble``,
shared with ``analysis.partition`` so that a dataset's partitions keep exactly the
requests the analysis will form (docs/attribution.md, "Requests")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis._trees import CODE, N_STAGES, value_rank
from ttft.analysis.clock_offset import in_range
from ttft.tracer.schema import (
    ATTR_STEP_ID,
    BOUNDARY_EVENTS,
    CLIENT_CLOCK,
    EV_FIRST_BYTE,
    EV_FIRST_SAMPLED,
    EV_FIRST_TOKEN,
    EV_TOKEN,
    REQUEST_STAGES,
)

_EVENTS = (EV_FIRST_TOKEN, EV_FIRST_BYTE, EV_FIRST_SAMPLED, EV_TOKEN)


def _nulls(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if column.null_count == 0:
        return np.zeros(table.num_rows, bool)
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass
class Decoded:
    """The columns every later step reads, decoded once: codes into ``*_values``, times,
    canonical stage codes (``_trees.CODE``), and which rows are usable.

    ``present``: has a trace id and both times in range; ``backwards``: present but ending
    before it starts; ``valid``: present and not backwards. ``ev_rows`` are the valid event
    rows, ``kind`` each one's index into (first_token, first_byte, first_sampled, token),
    -1 for another event."""

    trace: np.ndarray
    trace_values: list[str]
    start: np.ndarray
    end: np.ndarray
    stage: np.ndarray
    clock_raw: np.ndarray
    clock_values: list[str]
    is_client: np.ndarray
    present: np.ndarray
    backwards: np.ndarray
    valid: np.ndarray
    ev_rows: np.ndarray
    ev_name: np.ndarray
    ev_values: list[str]
    kind: np.ndarray


def decode(table: pa.Table) -> Decoded:
    """Decode a span table (``tracer.schema.SPAN_SCHEMA``)."""
    trace, trace_values = col.trace_codes(table.column("trace_id"))
    start = col.int64(table.column("start_ns"))
    end = col.int64(table.column("end_ns"))
    stage_raw, stage_values = col.codes(table.column("stage"))
    lut = np.array([CODE.get(v, CODE["other"]) for v in stage_values] + [CODE["other"]], np.int8)
    stage = lut[stage_raw]
    clock_raw, clock_values = col.codes(table.column("clock"))
    is_client = col.among(clock_raw, [i for i, v in enumerate(clock_values) if v == CLIENT_CLOCK],
                          len(clock_values))
    present = (trace >= 0) & ~_nulls(table, "start_ns") & ~_nulls(table, "end_ns")
    present &= in_range(start) & in_range(end)
    backwards = present & (end < start)
    valid = present & ~backwards
    ev_rows = np.flatnonzero(valid & (stage == CODE["event"]))
    ev_name, ev_values = col.codes(col.take(table.column("name"), ev_rows))
    ev_kind = np.full(len(ev_values) + 1, -1, np.int8)
    for i, v in enumerate(ev_values):
        if v in _EVENTS:
            ev_kind[i] = _EVENTS.index(v)
    kind = ev_kind[ev_name]  # -1 → last entry, also -1
    return Decoded(trace, trace_values, start, end, stage, clock_raw, clock_values, is_client,
                   present, backwards, valid, ev_rows, ev_name, ev_values, kind)


@dataclass
class Grouping:
    """Requests of a table: ``row_req`` (request of each row, -1 for none or invalid),
    ``n_req``; ``uniq`` each request's key (a code into ``rid_values`` when it has a
    request id, else ``len(rid_values)`` + its trace's code); ``first_trace`` the code of
    the request's smallest trace id; ``req_of_trace`` per trace code (-1: not a request)."""

    row_req: np.ndarray
    n_req: int
    uniq: np.ndarray
    rid_values: list[str]
    first_trace: np.ndarray
    req_of_trace: np.ndarray

    def names(self, trace_values: list[str]) -> np.ndarray:
        """Each request's name: its request id, else its smallest trace id (object array)."""
        traces = np.asarray(trace_values, dtype=object)[self.first_trace]
        rids = np.asarray([*self.rid_values, None], dtype=object)
        rid = rids[np.minimum(self.uniq, len(self.rid_values))]
        return np.where(self.uniq < len(self.rid_values), rid, traces)


def group(table: pa.Table, d: Decoded) -> Grouping:
    """Which traces are requests (they hold a request-stage span or a boundary event), and
    which are one request (they share a ``request_id``)."""
    n = table.num_rows
    n_traces = len(d.trace_values)
    request_stage = col.among(d.stage, [CODE[s] for s in REQUEST_STAGES], N_STAGES)
    marks = d.valid & request_stage
    boundary_event = np.zeros(n, bool)
    boundary_event[d.ev_rows] = (d.kind >= 0) & (d.kind < len(BOUNDARY_EVENTS))
    trace_is_req = np.zeros(n_traces, bool)
    trace_is_req[d.trace[marks | boundary_event]] = True
    rid, rid_values = col.blank_as_null(col.codes(table.column("request_id")))
    with_rid = d.valid & (rid >= 0) & trace_is_req[np.maximum(d.trace, 0)]
    # A trace holding several request ids joins by the smallest; a request of several
    # traces is named by the smallest trace id: never by row order.
    rid_of_trace = col.smallest_by_value(d.trace[with_rid], rid[with_rid], rid_values, n_traces)
    req_traces = np.flatnonzero(trace_is_req)
    key = np.where(rid_of_trace >= 0, rid_of_trace, len(rid_values) + np.arange(n_traces))
    uniq, inv = np.unique(key[req_traces], return_inverse=True)
    n_req = len(uniq)
    req_of_trace = np.full(n_traces, -1, np.int64)
    req_of_trace[req_traces] = inv
    first_trace = col.smallest_by_value(inv, req_traces, d.trace_values, n_req)
    row_req = np.where(d.valid, req_of_trace[np.maximum(d.trace, 0)], -1)
    return Grouping(row_req, n_req, uniq, rid_values, first_trace, req_of_trace)


@dataclass
class StepKeys:
    """The rows the ``(service, step_id)`` join pairs: request ``prefill.chunk`` rows and
    engine-trace (no request) ``gpu`` rows, each with its service code and step id; rows
    without a step id are left out."""

    chunks: np.ndarray
    chunk_service: np.ndarray
    chunk_step: np.ndarray
    gpus: np.ndarray
    gpu_service: np.ndarray
    gpu_step: np.ndarray


def step_keys(table: pa.Table, stage: np.ndarray, row_req: np.ndarray, valid: np.ndarray,
              span_rows: np.ndarray) -> StepKeys | None:
    """The `StepKeys` of a table (``span_rows``: the request rows that may hold chunks);
    None when either side has no row."""
    chunks = span_rows[stage[span_rows] == CODE["prefill.chunk"]]
    gpus = np.flatnonzero(valid & (row_req < 0) & (stage == CODE["gpu"]))
    if len(chunks) == 0 or len(gpus) == 0:
        return None
    service, _ = col.codes(table.column("service"))
    attrs = table.column("attributes")
    c_step = col.int_attribute(attrs, chunks, ATTR_STEP_ID)
    g_step = col.int_attribute(attrs, gpus, ATTR_STEP_ID)
    chunks, c_step = chunks[c_step >= 0], c_step[c_step >= 0]
    gpus, g_step = gpus[g_step >= 0], g_step[g_step >= 0]
    return StepKeys(chunks, service[chunks], c_step, gpus, service[gpus], g_step)


def join_gpu(
    table: pa.Table,
    stage: np.ndarray,
    row_req: np.ndarray,
    valid: np.ndarray,
    span_rows: np.ndarray,
    start: np.ndarray,
    trace: np.ndarray,
    trace_values: list[str],
    shift: np.ndarray | None = None,
    untraced: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``(chunk row, gpu row)`` of request chunks and engine-trace gpu spans that
    share ``(service, step_id)``, and the chunk rows whose key names steps of more than one
    engine trace (an engine restarted, or replicas that share a service name, count steps
    from 0 again): such a chunk joins the gpu spans of the one trace whose gpu span
    starts nearest its own start, ties to the smallest trace id. (``start`` is shifted by
    ``shift``; a gpu row ``untraced`` counts as moved with the chunk, as its copy is)."""
    empty = np.empty(0, np.int64)
    keys = step_keys(table, stage, row_req, valid, span_rows)
    if keys is None:
        return empty, empty, empty
    chunks, gpus = keys.chunks, keys.gpus
    # Sort the gpu keys once; each chunk finds its run of equal keys by binary search.
    c_key = np.stack([keys.chunk_service.astype(np.int64), keys.chunk_step], axis=1)
    g_key = np.stack([keys.gpu_service.astype(np.int64), keys.gpu_step], axis=1)
    order = np.lexsort((g_key[:, 1], g_key[:, 0]))
    g_sorted = g_key[order]
    lo = _search(g_sorted, c_key, "left")
    hi = _search(g_sorted, c_key, "right")
    many = hi - lo
    left = np.repeat(chunks, many).astype(np.int64)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(many)[:-1]]), many)
    right = gpus[order[starts + np.arange(len(left))]].astype(np.int64)
    # Each chunk's pairs are one run; a run holding two engine traces is a reused step id.
    pair_trace = trace[right]
    group = np.repeat(np.arange(len(chunks)), many)
    run_start = np.concatenate([[0], np.cumsum(many)[:-1]])
    mixed = np.zeros(len(chunks), bool)
    mixed[group[pair_trace != pair_trace[run_start[group]]]] = True
    if not mixed.any():
        return left, right, empty
    pick = np.flatnonzero(mixed[group])
    g_start = start[right[pick]]
    if untraced is not None and shift is not None:
        moved = untraced[right[pick]]
        g_start = np.where(moved, g_start - shift[right[pick]] + shift[left[pick]], g_start)
    distance = np.abs(g_start - start[left[pick]])
    best = pick[np.lexsort((value_rank(pair_trace[pick], trace_values), distance, group[pick]))]
    firsts = np.flatnonzero(np.r_[True, group[best][1:] != group[best][:-1]])
    chosen = np.full(len(chunks), -1, np.int64)
    chosen[group[best[firsts]]] = pair_trace[best[firsts]]
    keep = ~mixed[group] | (pair_trace == chosen[group])
    return left[keep], right[keep], chunks[mixed].astype(np.int64)


def _search(sorted_keys: np.ndarray, keys: np.ndarray, side: str) -> np.ndarray:
    """``searchsorted`` on ``(service, step)`` pairs sorted lexicographically."""
    big = np.int64(1) << 40
    if sorted_keys[:, 1].max(initial=0) < big and keys[:, 1].max(initial=0) < big:
        flat = sorted_keys[:, 0] * big + sorted_keys[:, 1]
        return np.searchsorted(flat, keys[:, 0] * big + keys[:, 1], side=side)
    records = np.rec.fromarrays([sorted_keys[:, 0], sorted_keys[:, 1]])
    wanted = np.rec.fromarrays([keys[:, 0], keys[:, 1]])
    return np.searchsorted(records, wanted, side=side)

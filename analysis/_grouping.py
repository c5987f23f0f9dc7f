"""Which rows are valid and which traces are one request: the first step of ``assemble``,
shared with ``analysis.partition`` so that a dataset's partitions keep exactly the
requests the analysis will form (docs/attribution.md, "Requests")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis._trees import CODE, N_STAGES
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


def request_traces(d: Decoded) -> np.ndarray:
    """Per trace code, whether the trace is a request: it holds a valid request-stage span
    or a boundary event. Each trace's answer depends on its own rows alone."""
    request_stage = col.among(d.stage, [CODE[s] for s in REQUEST_STAGES], N_STAGES)
    marks = d.valid & request_stage
    boundary_event = np.zeros(len(d.trace), bool)
    boundary_event[d.ev_rows] = (d.kind >= 0) & (d.kind < len(BOUNDARY_EVENTS))
    trace_is_req = np.zeros(len(d.trace_values), bool)
    trace_is_req[d.trace[marks | boundary_event]] = True
    return trace_is_req


def trace_request_ids(table: pa.Table, d: Decoded, among: np.ndarray | None = None
                      ) -> tuple[np.ndarray, list[str]]:
    """Per trace code, the code of the smallest request id of its valid rows (-1: none),
    and the request ids' values; with ``among`` (per trace code), only those traces'.
    A trace holding several request ids joins by the smallest; a request of several
    traces is named by the smallest trace id: never by row order."""
    rid, rid_values = col.blank_as_null(col.codes(table.column("request_id"), runs=True))
    with_rid = d.valid & (rid >= 0)
    if among is not None:
        with_rid &= among[np.maximum(d.trace, 0)]
    return (col.smallest_by_value(d.trace[with_rid], rid[with_rid], rid_values,
                                  len(d.trace_values)), rid_values)


def group(table: pa.Table, d: Decoded) -> Grouping:
    """Which traces are requests (they hold a request-stage span or a boundary event), and
    which are one request (they share a ``request_id``)."""
    n = table.num_rows
    n_traces = len(d.trace_values)
    trace_is_req = request_traces(d)
    rid_of_trace, rid_values = trace_request_ids(table, d, trace_is_req)
    req_traces = np.flatnonzero(trace_is_req)
    key = np.where(rid_of_trace >= 0, rid_of_trace, len(rid_values) + np.arange(n_traces))
    uniq, inv = np.unique(key[req_traces], return_inverse=True)
    n_req = len(uniq)
    # int32 codes while they fit: ``row_req`` is held to the end (``Rows.req``), 4 B a row.
    req_of_trace = np.full(n_traces, -1, np.int32 if n_req < 2**31 else np.int64)
    req_of_trace[req_traces] = inv
    first_trace = col.smallest_by_value(inv, req_traces, d.trace_values, n_req)
    # One gather, then the rows not valid (a row without a trace, -1, is one) set to -1:
    # no clipped copy of the codes and no third array (0.8 s of fresh memory at 23.8M rows).
    row_req = req_of_trace[d.trace] if n_traces else np.full(n, -1, req_of_trace.dtype)
    row_req[~d.valid] = -1
    return Grouping(row_req, n_req, uniq, rid_values, first_trace, req_of_trace)


@dataclass
class StepKeys:
    """The rows the ``(service, step_id)`` join pairs: request ``prefill.chunk`` rows and
    engine-trace (no request) ``gpu`` rows, each with its service code and step id, and the
    engine-trace ``step`` rows that carry a step id (they tell a reused id's steps apart);
    rows without a step id are left out."""

    chunks: np.ndarray
    chunk_service: np.ndarray
    chunk_step: np.ndarray
    gpus: np.ndarray
    gpu_service: np.ndarray
    gpu_step: np.ndarray
    steps: np.ndarray
    step_service: np.ndarray
    step_step: np.ndarray


def step_keys(table: pa.Table, stage: np.ndarray, row_req: np.ndarray, valid: np.ndarray,
              span_rows: np.ndarray) -> StepKeys | None:
    """The `StepKeys` of a table (``span_rows``: the request rows that may hold chunks);
    None when either side has no row with a step id."""
    chunks = span_rows[stage[span_rows] == CODE["prefill.chunk"]]
    gpus = np.flatnonzero(valid & (row_req < 0) & (stage == CODE["gpu"]))
    if len(chunks) == 0 or len(gpus) == 0:
        return None
    steps = np.flatnonzero(valid & (row_req < 0) & (stage == CODE["step"]))
    service, _ = col.codes(table.column("service"))
    attrs = table.column("attributes")
    found = []
    for rows in (chunks, gpus, steps):
        ids = col.int_attribute(attrs, rows, ATTR_STEP_ID)
        found += [rows[ids >= 0], service[rows[ids >= 0]], ids[ids >= 0]]
    keys = StepKeys(*found)
    return keys if len(keys.chunks) and len(keys.gpus) else None

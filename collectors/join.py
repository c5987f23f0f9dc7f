"""Join a client trace with span files written elsewhere (``ttft join``).

A server's spans may have been received by another process: an OpenTelemetry Collector's
file exporter (OTLP/JSON Lines or protobuf), another ``ttft collect``, a server's own
``--trace-out``, another tracer's file (Jaeger, Chrome trace). They join the client's
requests by trace id; a server that dropped the trace context still joins through the
request id the client stored from the response (``request_id``), and then its whole trace
takes the client's trace id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.collectors.loadgen import SERVICE as CLIENT_SERVICE
from ttft.collectors.reader import read_spans, run_metadata
from ttft.collectors.writer import write_trace
from ttft.tracer.schema import SPAN_SCHEMA

__all__ = ["JoinReport", "join_traces"]


@dataclass(frozen=True)
class JoinReport:
    """Row counts of a join: the client's, and the others' by how they joined."""

    client_rows: int
    by_trace_id: int
    by_request_id: int
    unmatched: int


def join_traces(client: str | os.PathLike[str], others: list[str | os.PathLike[str]],
                out: str | os.PathLike[str]) -> JoinReport:
    """Write ``out``: the client trace plus every span of ``others``, joined.

    Spans of another file whose trace is one of the client's join as they are. A trace of
    another file with no such trace id but a ``request_id`` the client saw in a response
    is moved to that request's trace (only when that id names exactly one client trace).
    Everything else is kept unchanged and counted as unmatched: nothing is dropped.

    Every file is read by :func:`ttft.collectors.read_spans` (any format, stages mapped).

    Raises:
        TraceFileError: a file that cannot be read. OSError: ``out`` cannot be written.
    """
    base = read_spans(client)  # names a missing client trace before reading the others
    metadata = run_metadata(base)
    other = pa.concat_tables([read_spans(p).cast(SPAN_SCHEMA) for p in others]) if others \
        else SPAN_SCHEMA.empty_table()
    client_rows = base.filter(pc.equal(base.column("service"), CLIENT_SERVICE))
    client_traces = set(pc.unique(base.column("trace_id")).to_pylist())
    by_request: dict[str, set[str]] = {}
    for rid, tid in zip(client_rows.column("request_id").to_pylist(),
                        client_rows.column("trace_id").to_pylist(), strict=True):
        if rid:
            by_request.setdefault(rid, set()).add(tid)
    moves: dict[str, str] = {}
    for rid, tid in zip(other.column("request_id").to_pylist(),
                        other.column("trace_id").to_pylist(), strict=True):
        if rid and tid not in client_traces and len(by_request.get(rid, ())) == 1:
            moves.setdefault(tid, next(iter(by_request[rid])))
    trace_ids = np.asarray(other.column("trace_id").to_pylist(), dtype=object)
    joined = np.isin(trace_ids, list(client_traces)) if len(trace_ids) else np.zeros(0, bool)
    moved = np.asarray([t in moves for t in trace_ids], dtype=bool)
    if moves:
        new_ids = pa.array([moves.get(t, t) for t in trace_ids], pa.string())
        other = other.set_column(other.schema.get_field_index("trace_id"), "trace_id",
                                 new_ids).cast(SPAN_SCHEMA)
    metadata = {**metadata, "joined": {
        "client": str(client), "others": [str(p) for p in others],
        "by_trace_id": int(joined.sum()), "by_request_id": int(moved.sum()),
        "unmatched": int(len(trace_ids) - joined.sum() - moved.sum())}}
    metadata.pop("schema_version", None)
    write_trace(out, pa.concat_tables([base.cast(SPAN_SCHEMA), other]), metadata)
    return JoinReport(base.num_rows, int(joined.sum()), int(moved.sum()),
                      int(len(trace_ids) - joined.sum() - moved.sum()))

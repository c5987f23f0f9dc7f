"""Which partition of a dataset each span belongs to, so that every partition holds whole
requests and everything the analysis joins to them (docs/attribution.md, "Requests").

The key is the request, as ``assemble`` forms it: its ``request_id`` when it has one, else
its smallest trace id, hashed (``pandas.util.hash_array``, the same in every process) modulo
the partition count; every trace of a request (client and server traces sharing a request
id) goes with it. A trace that is not a request (an engine's step trace, with the ``gpu``
spans that ``assemble`` joins to a request's ``prefill.chunk`` spans by ``(service,
step_id)``) is owned by the partition of its own trace id's hash, and copied whole into
every other partition holding a request whose chunks ran in that step. Partitioning by
trace id alone would split those joins; a copy is read by the partition's analysis but
never counted twice (``assemble(..., borrowed=...)``) and never read by ``read_spans``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis._grouping import Decoded, Grouping, decode, group, step_keys
from ttft.analysis._trees import CODE

__all__ = ["KEY_RULE", "Partitioning", "partition_rows"]

KEY_RULE = ("request (request_id, else its smallest trace_id), hashed; engine step traces "
            "copied into every partition whose requests' prefill chunks ran in them")


@dataclass
class Partitioning:
    """Where each row of a table goes.

    Attributes:
        owner: int32 per row, the partition that holds it (exactly one).
        copy_rows: int64, rows also copied into another partition...
        copy_partitions: int32, ...namely this one (same length as ``copy_rows``).
        requests: requests in the table.
        key: the rule, in words (`KEY_RULE`).
    """

    owner: np.ndarray
    copy_rows: np.ndarray
    copy_partitions: np.ndarray
    requests: int
    key: str = KEY_RULE


def _hash_mod(values: np.ndarray, partitions: int) -> np.ndarray:
    if len(values) == 0:
        return np.empty(0, np.int32)
    hashed = pd.util.hash_array(values.astype(object), categorize=False)
    return (hashed % np.uint64(partitions)).astype(np.int32)


def partition_rows(table: pa.Table, partitions: int) -> Partitioning:
    """Partition a span table (``tracer.schema.SPAN_SCHEMA``) into ``partitions`` parts.

    Raises:
        ValueError: ``partitions`` below 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    d = decode(table)
    g = group(table, d)
    trace_part = _hash_mod(np.asarray(d.trace_values, dtype=object), partitions)
    request_part = _hash_mod(g.names(d.trace_values), partitions)
    is_request = g.req_of_trace >= 0
    trace_part[is_request] = request_part[g.req_of_trace[is_request]]
    owner = np.where(d.trace >= 0, trace_part[np.maximum(d.trace, 0)], 0).astype(np.int32)
    copy_traces, copy_parts = _step_copies(table, d, g, trace_part, request_part)
    copy_rows, copy_partitions = _rows_of(d.trace, copy_traces, copy_parts)
    return Partitioning(owner, copy_rows, copy_partitions.astype(np.int32), g.n_req)


def _step_copies(table: pa.Table, d: Decoded, g: Grouping, trace_part: np.ndarray,
                 request_part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(trace code, partition)`` pairs: a step trace another partition's chunks join."""
    span = np.flatnonzero((g.row_req >= 0) & (d.stage != CODE["event"])
                          & (d.stage != CODE["step"]))
    keys = step_keys(table, d.stage, g.row_req, d.valid, span)
    if keys is None:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    need = pd.DataFrame({"service": keys.chunk_service, "step": keys.chunk_step,
                         "partition": request_part[g.row_req[keys.chunks]]})
    have = pd.DataFrame({"service": keys.gpu_service, "step": keys.gpu_step,
                         "trace": d.trace[keys.gpus]})
    pairs = have.merge(need, on=["service", "step"])[["trace", "partition"]].drop_duplicates()
    pairs = pairs[pairs["partition"].to_numpy() != trace_part[pairs["trace"].to_numpy()]]
    pairs = pairs.sort_values(["trace", "partition"])
    return pairs["trace"].to_numpy(np.int64), pairs["partition"].to_numpy(np.int64)


def _rows_of(trace: np.ndarray, traces: np.ndarray, parts: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Every row of each listed trace, with the pair's partition."""
    if len(traces) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(trace, kind="stable")
    sorted_trace = trace[order]
    lo = np.searchsorted(sorted_trace, traces, "left")
    hi = np.searchsorted(sorted_trace, traces, "right")
    many = hi - lo
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(many)[:-1]]), many)
    rows = order[first + np.arange(int(many.sum()))]
    return rows.astype(np.int64), np.repeat(parts, many)

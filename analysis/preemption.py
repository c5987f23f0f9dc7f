"""Preemptions: who took a preempted request's K/V blocks, and what the engine ran while it
waited to be admitted again.

A ``preempted`` span (docs/attribution.md, "Blame") runs from a request's preemption to
its admission again. Its attributes, as the reference engine records them
(``ttft.engine.spans``): ``preempted_by``, the ids of the requests whose blocks it made
room for (its own id when it was preempted for its own next block); ``step_id``, the step
that needed them; ``blocks_freed``; ``generated_tokens``, the tokens it had generated (0:
preempted before its first token, so the wait lies inside its TTFT). ``blame`` splits the
span's time into other requests' prefill and decode; this names the requests: those the
engine's ``step`` spans served while it overlapped them (their ``request_ids``, on the
request's own ``(service, clock)``).
"""

from __future__ import annotations

import json

import pandas as pd

from ttft.analysis._request_columns import request_columns
from ttft.analysis.assemble import Assembly
from ttft.tracer.schema import ATTR_REQUEST_IDS, ATTR_STEP_ID

COLUMNS = (
    "trace_id",
    "request_id",
    "condition",
    "start_ns",
    "preempted_ns",
    "preempted_by",
    "ran",
    "step_id",
    "blocks_freed",
    "generated_tokens",
)
ATTR_PREEMPTED_BY = "preempted_by"
ATTR_BLOCKS_FREED = "blocks_freed"
ATTR_GENERATED_TOKENS = "generated_tokens"


def preemptions(asm: Assembly) -> pd.DataFrame:
    """One row per valid ``preempted`` span of a request, in table order.

    Returns:
        ``trace_id``, ``request_id``, ``condition`` of its request as ``asm.requests``
        names it; ``start_ns`` and ``preempted_ns`` (its start, clock-aligned, and length);
        ``preempted_by`` (tuple of request ids: the span's attribute, empty when absent or
        not a list of strings); ``ran`` (tuple of the request ids, sorted, that the
        ``step`` spans overlapping it on its ``(service, clock)`` served, itself left out);
        ``step_id``, ``blocks_freed``, ``generated_tokens`` (-1 where absent or not a
        non-negative integer).
    """
    rows = asm.rows
    spans = rows.of("preempted", requests_only=True)
    if len(spans) == 0:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    attrs = rows.table.column("attributes")
    steps = rows.of("step")
    own = request_columns(asm, rows.req[spans], "trace_id", "request_id", "condition")
    start, end = rows.start_ns[spans], rows.end_ns[spans]
    ran = []
    for i, row in enumerate(spans):
        mine = steps[(rows.service[steps] == rows.service[row])
                     & (rows.clock[steps] == rows.clock[row])
                     & (rows.start_ns[steps] < end[i]) & (rows.end_ns[steps] > start[i])]
        served = {rid for step in mine for rid in _strings(attrs[int(step)], ATTR_REQUEST_IDS)}
        served.discard(own["request_id"][i])
        ran.append(tuple(sorted(served)))
    return pd.DataFrame({
        **own,
        "start_ns": start,
        "preempted_ns": end - start,
        "preempted_by": pd.Series([_strings(attrs[int(r)], ATTR_PREEMPTED_BY) for r in spans],
                                  dtype=object),
        "ran": pd.Series(ran, dtype=object),
        "step_id": rows.int_attribute(spans, ATTR_STEP_ID),
        "blocks_freed": rows.int_attribute(spans, ATTR_BLOCKS_FREED),
        "generated_tokens": rows.int_attribute(spans, ATTR_GENERATED_TOKENS),
    })


def _strings(cell, key: str) -> tuple[str, ...]:
    """The list of strings under the top-level ``key`` of one JSON attributes cell; empty
    when the cell, the key or the list is missing or malformed."""
    text = cell.as_py()
    try:
        value = json.loads(text).get(key) if text else None
    except (ValueError, AttributeError):
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return ()
    return tuple(value)


def _dtype(column: str) -> str:
    if column.endswith("_ns") or column in ("step_id", "blocks_freed", "generated_tokens"):
        return "int64"
    return "object"

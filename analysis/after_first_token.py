"""What follows the first token, per request, as load-testing tools define it (guidellm,
AIPerf), from the client's token events: pure functions (no I/O).

Per request with at least two content chunks: ITL is the mean gap between its consecutive
chunks, ``(last - first) / (chunks - 1)``; TPOT is ``(last - first) / (tokens - 1)`` with
the completion tokens the server's ``usage`` reported (the client span's
``completion_tokens``), else the chunks (a chunk may carry several tokens, so chunks
overstate TPOT). Percentiles are over requests. The pooled distribution of every gap
between consecutive chunks stays, named for what it is (``chunk_gap_ms``). Time to second
token is the second content chunk after the client span's start; time to first reasoning
token is the first ``first_reasoning`` event (a chunk with ``reasoning_content``) after it.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc

from ttft.analysis._trees import NONE_NS
from ttft.analysis.assemble import Assembly
from ttft.tracer.schema import EV_FIRST_REASONING

_NS_PER_MS = 1e6
PERCENTILES = (50, 90, 99)
KEYS = ("itl_ms", "tpot_ms", "chunk_gap_ms", "ttst_ms", "ttfrt_ms")
"""The keys `summarize_values` returns, in order."""
COMPLETION_TOKENS = "completion_tokens"


def _ms(ns: np.ndarray) -> dict[str, float] | None:
    """p50/p90/p99/mean in ms and the count, None for no values."""
    if len(ns) == 0:
        return None
    ms = np.asarray(ns, dtype=np.float64) / _NS_PER_MS
    out = {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(ms, PERCENTILES),
                                              strict=True)}
    out["mean"] = math.fsum(ms) / len(ms)  # exactly rounded: the same in any order
    out["requests"] = int(len(ms))
    return out


def summarize_values(values: dict[str, np.ndarray]) -> dict[str, dict | None]:
    """ITL, TPOT, pooled chunk gaps, time to second and to first reasoning token, in ms,
    each ``{p50, p90, p99, mean, requests}`` (``requests``: how many requests, or gaps for
    ``chunk_gap_ms``, the figure is over) or None where no request has what it needs,
    from `after_first_token_values` (of one assembly, or
    concatenated over the partitions of a dataset: every figure is the same in any order of
    the values)."""
    return {key: _ms(values[key]) for key in KEYS}


def after_first_token_values(asm: Assembly, requests: np.ndarray) -> dict[str, np.ndarray]:
    """The values `after_first_token_latency` summarizes, in ns: per request (ITL, TPOT, time to
    second and to first reasoning token) or per gap (``chunk_gap_ms``), keyed by `KEYS`."""
    n_req = len(asm.requests)
    chosen = np.zeros(n_req, bool)
    chosen[np.asarray(requests, dtype=np.int64)] = True
    keep = chosen[asm.token_req]
    req, t = asm.token_req[keep], asm.token_ns[keep]
    order = np.lexsort((t, req))
    req, t = req[order], t[order]
    counts = np.bincount(req, minlength=n_req)
    first = np.full(n_req, NONE_NS, np.int64)
    last = np.full(n_req, NONE_NS, np.int64)
    starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]]) if len(req) else np.empty(0, int)
    if len(starts):
        first[req[starts]] = t[starts]
        ends = np.r_[starts[1:], len(req)] - 1
        last[req[ends]] = t[ends]
    same = req[1:] == req[:-1]
    gaps = (t[1:] - t[:-1])[same]
    many = np.flatnonzero(counts >= 2)
    span = last[many] - first[many]
    tokens = _completion_tokens(asm, many)
    tokens = np.where(tokens >= 2, tokens, counts[many])
    second = np.full(n_req, NONE_NS, np.int64)
    if len(starts):
        two = starts[counts[req[starts]] >= 2]
        second[req[two]] = t[two + 1]
    a = asm.requests["client_a"].to_numpy()
    has_second = np.flatnonzero(chosen & (second != NONE_NS) & (a != NONE_NS))
    reasoning = _first_reasoning(asm, chosen)
    has_reasoning = np.flatnonzero((reasoning != NONE_NS) & (a != NONE_NS))
    return {
        "itl_ms": span / (counts[many] - 1),
        "tpot_ms": span / (tokens - 1),
        "chunk_gap_ms": gaps,
        "ttst_ms": second[has_second] - a[has_second],
        "ttfrt_ms": reasoning[has_reasoning] - a[has_reasoning],
    }


def _completion_tokens(asm: Assembly, requests: np.ndarray) -> np.ndarray:
    """The largest ``completion_tokens`` of each request's client spans (-1 if none)."""
    rows = asm.rows
    client = rows.of("client", requests_only=True)
    best = np.full(len(asm.requests), -1, np.int64)
    if len(client):
        np.maximum.at(best, rows.req[client], rows.int_attribute(client, COMPLETION_TOKENS))
    return best[requests]


def _first_reasoning(asm: Assembly, chosen: np.ndarray) -> np.ndarray:
    """Per request, the earliest client ``first_reasoning`` event (NONE_NS if none)."""
    rows = asm.rows
    out = np.full(len(asm.requests), np.iinfo(np.int64).max, np.int64)
    # The rows so named first, by one comparison over the whole column (taking every
    # event's name to compare took 1.9 s at 23.8M spans; most traces name none), then
    # those of them that are valid request events on the client's clock.
    named = np.flatnonzero(np.asarray(pc.fill_null(pc.equal(
        rows.table.column("name"), EV_FIRST_REASONING), False).to_numpy(zero_copy_only=False),
        dtype=bool))
    events = named[rows.valid[named] & rows.has_stage(named, "event") & (rows.req[named] >= 0)]
    if len(events):
        events = events[rows.clock_names(events) == "client"]
        events = events[chosen[rows.req[events]]]
        np.minimum.at(out, rows.req[events], rows.start_ns[events])
    return np.where(out == np.iinfo(np.int64).max, NONE_NS, out)

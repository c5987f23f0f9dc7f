"""Load metrics as load-testing tools report them (guidellm, AIPerf, vLLM's benchmark):
request and output-token throughput, end-to-end latency and goodput against SLOs. Pure
functions (no I/O).

Definitions, all from the client's view (the ``client`` span of each request):

- the run's **duration** is from the earliest start of any request's client span to the
  latest end of any (failed requests included: they took part in the run);
- a **completed** request is one whose client span has outcome ``ok``; **request
  throughput** is completed requests / duration; **output tokens/s** is the sum of their
  completion tokens (the client span's ``completion_tokens``, the server's ``usage``, as
  ``analysis.after_first_token`` reads it; a request without it counts its content chunks)
  / duration;
- **content filter**: of the completed requests, those whose client span's
  ``finish_reason`` is ``content_filter`` (ok, but the server's filter ended the answer;
  docs/attribution.md, "Outcomes from the stream's end");
- **end-to-end latency** of a completed request is its client span's end - start (the
  earliest start and latest end of its client spans; the load generator writes one);
- **goodput** is over the requests the TTFT figures are over (ok, with a window at the
  boundary) plus every failed request: a request meets the SLOs when it did not fail and
  each of its metrics named in the SLO is at or under the limit. TTFT is the window at the
  analysis boundary (``Attribution.requests["ttft_ns"]``); TPOT and ITL are per request as
  ``analysis.after_first_token`` defines them. A metric a request cannot have (TPOT or ITL
  with fewer than two content chunks, end-to-end latency without a client span) does not count
  against it, as guidellm counts requests lacking a metric as not violating it. A failed
  request never meets an SLO: the goodput **share** is meeting requests / (those ok
  requests + the failed ones); the **rate** is meeting requests / the run's duration.

An engine-only trace has no client span, hence no run duration from the client's view: its
load figures and goodput rate are None (its goodput share is still defined).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import _column_arrays as col
from ttft.analysis._trees import NONE_NS
from ttft.analysis.after_first_token import (
    COMPLETION_TOKENS,
    _completion_tokens,
    after_first_token_values,
)
from ttft.analysis.assemble import Assembly
from ttft.analysis.attribution import Attribution
from ttft.tracer.schema import (
    ATTR_FINISH_REASON,
    ATTR_PROMPT_TOKENS,
    ATTR_STATUS_CODE,
    FINISH_CONTENT_FILTER,
    OUTCOME_OK,
)

__all__ = ["SLO_METRICS", "Load", "goodput", "load", "load_values", "request_table"]

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
"""The metrics an SLO may name, in the order goodput reports them."""
VALUE_KEYS = ("start_ns", "end_ns", "completed", "output_tokens", "content_filter", "ttft_ns",
              "e2e_ns", "tpot_ns", "itl_ns")
"""The keys of `load_values`: the first five per request with a client span, the others
per request of ``Attribution.requests`` (in its order)."""
_NS_PER_MS = 1e6
_NS_PER_S = 1e9


@dataclass(frozen=True)
class Load:
    """A trace's load figures (see the module docstring): ``duration_ns`` of the run,
    ``requests`` completed, their ``output_tokens`` and ``e2e_ns`` (one per completed
    request, int64), and ``content_filter``: of them, those the content filter ended."""

    duration_ns: int
    requests: int
    output_tokens: int
    e2e_ns: np.ndarray
    content_filter: int = 0

    def per_s(self, count: int) -> float | None:
        """``count`` over the run's duration, per second; None for a zero duration."""
        return per_s(count, self.duration_ns)


def per_s(count: int, duration_ns: int | None) -> float | None:
    """``count`` over a run of ``duration_ns``, per second; None for none or zero."""
    return (count / (duration_ns / _NS_PER_S)
            if duration_ns is not None and duration_ns > 0 else None)


def load_values(asm: Assembly, attr: Attribution,
                decode: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The per-request values `load` and `goodput` need, keyed by `VALUE_KEYS`.

    Per request with a client span: ``start_ns``, ``end_ns``, ``completed`` (outcome ok),
    ``output_tokens`` and ``content_filter`` (a client span's finish reason is
    ``content_filter``). Per request of ``attr.requests``: ``ttft_ns``, ``e2e_ns``
    (``NONE_NS`` without a client span), ``tpot_ns`` and ``itl_ns`` (float, NaN with fewer
    than two content chunks). Concatenating the values of a dataset's partitions, in the
    order their attributions are stacked, gives the whole dataset's.

    Args:
        asm: the assembly ``attr`` was attributed from.
        attr: the attribution.
        decode: `after_first_token_values` of ``attr``'s requests when already taken.
    """
    n_req = len(asm.requests)
    start, end = _client_spans(asm)
    has = np.flatnonzero(end != NONE_NS)
    chunks = np.bincount(asm.token_req, minlength=n_req)
    tokens = _completion_tokens(asm, has)
    outcome = asm.requests["outcome"].to_numpy(dtype=object)[has]

    ok = attr.requests["request"].to_numpy(np.int64)
    if decode is None:
        decode = after_first_token_values(asm, ok)
    # after_first_token_values gives TPOT and ITL for the requests with two or more content chunks,
    # in ascending request order, which is the order of ``attr.requests``.
    many = np.flatnonzero(chunks[ok] >= 2)
    if len(many) != len(decode["tpot_ms"]):
        raise ValueError("decode values are not of this attribution's requests")
    tpot = np.full(len(ok), np.nan)
    itl = np.full(len(ok), np.nan)
    tpot[many], itl[many] = decode["tpot_ms"], decode["itl_ms"]
    client_ok = end[ok] != NONE_NS
    return {
        "start_ns": start[has],
        "end_ns": end[has],
        "completed": outcome == OUTCOME_OK,
        "output_tokens": np.where(tokens >= 0, tokens, chunks[has]).astype(np.int64),
        "content_filter": _content_filtered(asm)[has],
        "ttft_ns": attr.requests["ttft_ns"].to_numpy(np.int64),
        "e2e_ns": np.where(client_ok, end[ok] - start[ok], NONE_NS),
        "tpot_ns": tpot,
        "itl_ns": itl,
    }


def _content_filtered(asm: Assembly) -> np.ndarray:
    """Per request of ``asm``: a client span of it says ``finish_reason`` ``content_filter``
    (read by pattern: the load generator writes the key once, at the top level)."""
    client = asm.rows.of("client", requests_only=True)
    out = np.zeros(len(asm.requests), bool)
    if len(client):
        texts = col.take(asm.rows.table.column("attributes"), client)
        if pa.types.is_dictionary(texts.type):
            texts = texts.cast(pa.string())
        said = pc.match_substring_regex(
            texts, rf'"{ATTR_FINISH_REASON}"\s*:\s*"{FINISH_CONTENT_FILTER}"')
        found = np.asarray(pc.fill_null(said, False).to_numpy(zero_copy_only=False), bool)
        out[asm.rows.req[client[found]]] = True
    return out


def _client_spans(asm: Assembly) -> tuple[np.ndarray, np.ndarray]:
    """Per request of ``asm``, the earliest start and latest end of its client spans
    (``NONE_NS`` for both without one)."""
    n_req = len(asm.requests)
    rows = asm.rows
    client = rows.of("client", requests_only=True)
    start = np.full(n_req, np.iinfo(np.int64).max, np.int64)
    end = np.full(n_req, NONE_NS, np.int64)
    np.minimum.at(start, rows.req[client], rows.start_ns[client])
    np.maximum.at(end, rows.req[client], rows.end_ns[client])
    return np.where(end != NONE_NS, start, NONE_NS), end


def request_table(asm: Assembly, attr: Attribution) -> pd.DataFrame:
    """One row per request of ``asm``, in its order.

    Columns: ``trace_id``, ``request_id``, ``condition``, ``outcome``, ``status_code`` (the
    client span's); ``start_ns``, when the request started (Unix-epoch ns: its client span's
    start, or without a client span its window's start at ``attr``'s boundary; NA without
    either), ``start_time`` (the same as ISO 8601 UTC, to the microsecond) and
    ``start_offset_ms`` (from the earliest ``start_ns`` of the table); ``ttft_ms``, the
    window at ``attr``'s boundary (of a failed request too when it saw a first token; None
    without a window); one ``<stage>_ms`` per stage with attributed time in any request
    (None for a request not attributed: failed or without a window); ``tpot_ms`` and
    ``itl_ms`` (ok requests with two or more content chunks, as in ``analysis.after_first_token``);
    ``e2e_ms`` (its client span's end - start, failed requests too);
    ``prompt_tokens`` and ``completion_tokens`` (the client span's, as the server's
    ``usage`` gave them). None (NA) where not known.
    """
    reqs = asm.requests
    n_req = len(reqs)
    out = reqs[["trace_id", "request_id", "condition", "outcome"]].astype(object)
    client = asm.rows.of("client", requests_only=True)
    out["status_code"] = _largest(asm, client, ATTR_STATUS_CODE)
    ok = attr.requests["request"].to_numpy(np.int64)
    start, end = _client_spans(asm)
    began = start.copy()
    no_client = began[ok] == NONE_NS
    began[ok[no_client]] = attr.requests["a_ns"].to_numpy(np.int64)[no_client]
    known = began != NONE_NS
    out["start_ns"] = pd.arrays.IntegerArray(np.where(known, began, 0), ~known)
    iso = np.datetime_as_string(began[known].astype("datetime64[ns]"), unit="us",
                                timezone="UTC")
    text = np.full(n_req, None, dtype=object)
    text[known] = iso
    out["start_time"] = pd.array(text, dtype="string")
    offset_ms = np.full(n_req, np.nan)
    if known.any():
        offset_ms[known] = (began[known] - began[known].min()) / _NS_PER_MS
    out["start_offset_ms"] = offset_ms
    bad = attr.failed["request"].to_numpy(np.int64)
    ttft = np.full(n_req, np.nan)
    ttft[ok] = attr.requests["ttft_ns"].to_numpy(np.int64) / _NS_PER_MS
    seen = attr.failed["ttft_ns"].to_numpy(np.int64)
    ttft[bad[seen >= 0]] = seen[seen >= 0] / _NS_PER_MS
    out["ttft_ms"] = ttft
    att = attr.attributed
    for stage in att.columns[(att.to_numpy() > 0).any(axis=0)]:
        column = np.full(n_req, np.nan)
        column[ok] = att[stage].to_numpy(np.int64) / _NS_PER_MS
        out[f"{stage}_ms"] = column
    values = load_values(asm, attr)
    for key in ("tpot", "itl"):
        column = np.full(n_req, np.nan)
        column[ok] = values[f"{key}_ns"] / _NS_PER_MS
        out[f"{key}_ms"] = column
    out["e2e_ms"] = np.where(end != NONE_NS, (end - start) / _NS_PER_MS, np.nan)
    for key in (ATTR_PROMPT_TOKENS, COMPLETION_TOKENS):
        out[key] = _largest(asm, client, key)
    return out.reset_index(drop=True)


def _largest(asm: Assembly, client: np.ndarray, key: str) -> pd.arrays.IntegerArray:
    """Per request, the largest integer attribute ``key`` of its ``client`` rows (NA if
    none has it)."""
    best = np.full(len(asm.requests), -1, np.int64)
    np.maximum.at(best, asm.rows.req[client], asm.rows.int_attribute(client, key))
    return pd.arrays.IntegerArray(best, best < 0)


def load(values: Mapping[str, np.ndarray]) -> Load | None:
    """The load figures of `load_values` (of one trace, or concatenated over a dataset's
    partitions: the same in any order); None when no request has a client span."""
    if len(values["start_ns"]) == 0:
        return None
    completed = values["completed"]
    return Load(
        duration_ns=int(values["end_ns"].max() - values["start_ns"].min()),
        requests=int(completed.sum()),
        output_tokens=int(values["output_tokens"][completed].sum()),
        e2e_ns=(values["end_ns"] - values["start_ns"])[completed],
        content_filter=int((completed & values["content_filter"]).sum()),
    )


def goodput(values: Mapping[str, np.ndarray], failed: int,
            slo_ms: Mapping[str, float]) -> dict[str, object]:
    """The requests meeting every SLO of ``slo_ms`` (see the module docstring).

    Args:
        values: `load_values`.
        failed: the number of failed requests (``len(Attribution.failed)``).
        slo_ms: a limit in ms per metric of `SLO_METRICS`.

    Returns:
        ``slo`` (the limits, as ``ttft_ms``..., in `SLO_METRICS` order), ``requests``
        meeting them, ``share`` of the ok and failed requests (0.0 when there are none)
        and ``per_s`` (None without a run duration).

    Raises:
        ValueError: an unknown metric, or a limit that is not a positive number.
    """
    check_slo(slo_ms)
    found = load(values)
    return goodput_figures(slo_ms, meeting_slo(values, slo_ms), len(values["ttft_ns"]) + failed,
                           None if found is None else found.duration_ns)


def goodput_figures(slo_ms: Mapping[str, float], meeting: int, total: int,
                    duration_ns: int | None) -> dict[str, object]:
    """`goodput`'s figures from ``meeting`` requests of ``total`` (ok and failed) over a
    run of ``duration_ns`` (None: no client span)."""
    return {
        "slo": {f"{n}_ms": float(slo_ms[n]) for n in SLO_METRICS if n in slo_ms},
        "requests": meeting,
        "share": meeting / total if total else 0.0,
        "per_s": per_s(meeting, duration_ns),
    }


def check_slo(slo_ms: Mapping[str, float]) -> None:
    """Raises ValueError for an unknown metric or a limit that is not a positive number."""
    for name, limit in slo_ms.items():
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {name!r}; choose from {SLO_METRICS}")
        if not limit > 0:
            raise ValueError(f"the {name} SLO must be a positive number of ms, not {limit!r}")


def meeting_slo(values: Mapping[str, np.ndarray], slo_ms: Mapping[str, float]) -> int:
    """How many requests of `load_values` meet every SLO (the module docstring)."""
    meets = np.ones(len(values["ttft_ns"]), bool)
    for name in (n for n in SLO_METRICS if n in slo_ms):
        measured = values[f"{name}_ns"]
        lacking = np.isnan(measured) if measured.dtype.kind == "f" else measured == NONE_NS
        meets &= lacking | (measured <= slo_ms[name] * _NS_PER_MS)
    return int(meets.sum())

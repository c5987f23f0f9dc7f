"""Summaries of an attribution: per stage, per condition, inter-token latency, the tail.

Pure functions (no I/O, no printing). Definitions from docs/design.md: percentiles are numpy's
linear ones over all requests of the trace, zeros included; ``share`` is a stage's
attributed time summed over requests divided by TTFT summed over requests;
``overlap = raw - attributed``. Times are reported in milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis.after_first_token import summarize_values
from ttft.analysis.attribution import Attribution
from ttft.analysis.load import load
from ttft.analysis.quality import EXAMPLES_KEPT
from ttft.analysis.request_values import RequestValues
from ttft.analysis.slo import goodput_summary
from ttft.analysis.transfer import transfer_summary
from ttft.tracer.schema import CONDITIONS, OUTCOMES, SCHEMA_VERSION

_NS_PER_MS = 1e6
PERCENTILES = (50, 90, 99)


def _mean_ms(ns: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The mean in ms of int64 ns from their exact integer sum: the same whatever the order
    of the values (a float sum is not), so a dataset analysed in partitions gives the very
    figures of one process."""
    return np.asarray(ns, dtype=np.int64).sum(axis=axis) / len(ns) / _NS_PER_MS


def _ms(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p99/mean in ms of a non-empty array of ns."""
    ms = np.asarray(values, dtype=np.float64) / _NS_PER_MS
    out = {
        f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(ms, PERCENTILES), strict=True)
    }
    out["mean"] = float(_mean_ms(values))
    return out


def stage_table(attr: Attribution, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Per stage with any time: attributed p50/p90/p99/mean, share, raw and overlap means.

    Args:
        attr: an attribution.
        rows: boolean mask over ``attr.requests`` (default: all requests).

    Returns:
        One row per stage (index: stage name), columns ``p50, p90, p99, mean, share,
        raw_mean, overlap_mean`` (ms, ``share`` a fraction), in canonical stage order.
    """
    att = attr.attributed.to_numpy()
    raw = attr.raw.to_numpy()
    ttft = attr.requests["ttft_ns"].to_numpy()
    if rows is not None:
        att, raw, ttft = att[rows], raw[rows], ttft[rows]
    columns = ["p50", "p90", "p99", "mean", "share", "raw_mean", "overlap_mean"]
    if len(ttft) == 0:
        return pd.DataFrame(columns=columns, dtype=float)
    used = (att > 0).any(axis=0) | (raw > 0).any(axis=0)
    names = np.asarray(attr.attributed.columns)[used]
    att, raw = att[:, used], raw[:, used]
    total = float(ttft.sum())
    ms = att / _NS_PER_MS
    table = pd.DataFrame(
        np.percentile(ms, PERCENTILES, axis=0).T if len(ms) else np.zeros((len(names), 3)),
        index=names,
        columns=["p50", "p90", "p99"],
    )
    table["mean"] = _mean_ms(att, axis=0)
    table["share"] = att.sum(axis=0) / total if total > 0 else 0.0
    table["raw_mean"] = _mean_ms(raw, axis=0)
    # From integer sums, so a stage without overlap shows exactly 0.
    table["overlap_mean"] = (raw.sum(axis=0) - att.sum(axis=0)) / len(ttft) / _NS_PER_MS
    table.index.name = "stage"
    return table[columns]


def tail_mix(attr: Attribution) -> pd.DataFrame:
    """Mean attributed ms per stage for the tail (TTFT at or above its p99) against the
    middle (TTFT between its p40 and p60; when no request lies there, as with a few
    requests, the ones nearest the median): columns ``tail_mean``, ``median_mean``."""
    ttft = attr.requests["ttft_ns"].to_numpy()
    if len(ttft) == 0:
        return pd.DataFrame(columns=["tail_mean", "median_mean"], dtype=float)
    p40, p50, p60, p99 = np.percentile(ttft, [40, 50, 60, 99])
    att = attr.attributed.to_numpy()
    used = (att > 0).any(axis=0)
    tail = _mean_ms(att[ttft >= p99][:, used], axis=0)
    band = (ttft >= p40) & (ttft <= p60)
    if not band.any():
        distance = np.abs(ttft - p50)
        band = distance == distance.min()
    middle = _mean_ms(att[band][:, used], axis=0)
    names = np.asarray(attr.attributed.columns)[used]
    return pd.DataFrame({"tail_mean": tail, "median_mean": middle}, index=names)


def _stages_dict(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    return {str(stage): {k: float(v) for k, v in row.items()} for stage, row in table.iterrows()}


@dataclass
class Summary:
    """What ``ttft analyze --json`` prints (times in ms, ``share`` a fraction): the
    contract every command's printed analysis comes from.

    ``requests`` counts the requests that did not fail and have a window at the boundary
    (``requests_ok``, the ones every TTFT figure is over) and the failed ones (``failures``:
    count by outcome, in ``OUTCOMES`` order; ``failure_examples``: up to three per outcome,
    with trace id, status code and error; ``failed_first_token``: the failed requests that
    did see a first token, with their TTFT, else None). ``ttft_ms`` (p50, p90, p99, mean
    over the ``requests_ok``) is None when there is none: no figure is made up.
    ``stages`` maps a stage to ``p50, p90, p99, mean, share, raw_mean, overlap_mean``;
    ``conditions`` maps ``cold`` / ``prefix_hit`` to ``requests, ttft_ms, stages,
    failures``;
    ``itl_ms`` (each request's mean gap between content chunks), ``tpot_ms`` ((last -
    first token) / (completion tokens - 1)), ``chunk_gap_ms`` (every gap, pooled),
    ``ttst_ms`` (time to the second token) and ``ttfrt_ms`` (to the first reasoning token)
    are over the ok requests (see ``analysis.after_first_token``), each None where none has what it
    needs; ``tail`` maps a stage to
    ``tail_mean, median_mean``; ``quality`` counts each defect; ``clocks`` (see
    `clock_list`) is None unless a clock pair disagrees; ``inputs`` (what was read, see
    ``ttft.collectors.read_inputs``) is None unless the trace was a directory of runs or an
    unfinished run.
    ``load`` (see ``analysis.load``: ``duration_s`` of the run from the client's view,
    ``requests`` completed, ``requests_per_s``, ``output_tokens``, ``output_tokens_per_s``,
    the rates None for a zero duration, ``e2e_ms``: ``p50, p90, p99, mean, requests``
    of the completed requests' client spans, None without one, and ``content_filter``: the
    completed requests the server's content filter ended) is None when the trace has
    no client span; ``goodput`` (``slo``, ``requests`` meeting every SLO, their ``share``
    of the ok and failed requests, ``per_s``; with a TTFT SLO, ``ttft_stages``: each
    stage's rescue share of the requests missing it and the smallest set of stages to cut,
    see ``analysis.slo``) is None unless SLOs were given; ``kv_transfer`` (disaggregated
    serving's K/V transfer of the ok requests, ``analysis.transfer.transfer_summary``) is
    None unless one has a ``kv_transfer`` span. These come last and, when None, are left
    out of `to_dict`.
    """

    trace: str
    schema_version: int
    boundary: str
    policy: str
    requests: int
    requests_ok: int
    failures: dict[str, int]
    failure_examples: dict[str, list[dict[str, Any]]]
    failed_first_token: dict[str, Any] | None
    ttft_ms: dict[str, float] | None
    stages: dict[str, dict[str, float]]
    conditions: dict[str, dict[str, Any]]
    itl_ms: dict[str, float] | None
    tpot_ms: dict[str, float] | None
    chunk_gap_ms: dict[str, float] | None
    ttst_ms: dict[str, float] | None
    ttfrt_ms: dict[str, float] | None
    tail: dict[str, dict[str, float]]
    quality: dict[str, int]
    clocks: list[dict[str, Any]] | None = None
    inputs: list[dict[str, Any]] | None = None
    load: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None
    kv_transfer: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values, keys in their documented order; ``clocks``,
        ``inputs``, ``load``, ``goodput`` and ``kv_transfer`` only when present."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for optional in ("clocks", "inputs", "load", "goodput", "kv_transfer"):
            if out[optional] is None:
                del out[optional]
        return out

    def group(self, name: str) -> dict[str, Any]:
        """``requests`` (ok ones), ``ttft_ms``, ``stages`` and ``failures`` of ``all``
        requests or of a condition.

        Raises:
            KeyError: no request has that condition.
        """
        if name == "all":
            return {"requests": self.requests_ok, "ttft_ms": self.ttft_ms,
                    "stages": self.stages, "failures": self.failures}
        return self.conditions[name]

    def to_json(self) -> str:
        """``ttft analyze --json``'s output (without the trailing newline)."""
        return json.dumps(self.to_dict(), indent=2)


def summarize(
    attr: Attribution,
    values: RequestValues,
    *,
    trace: str = "",
    schema_version: int = SCHEMA_VERSION,
    slo: Mapping[str, float] | None = None,
) -> Summary:
    """Summarize an attribution and its requests' values (see `Summary`): built from
    per-request values alone, so one table and a dataset's merged partitions give one
    summary.

    Args:
        attr: the attribution to summarize.
        values: its requests' `RequestValues` (``request_values`` of one assembly, or
            ``stacked`` over parts).
        trace: the trace's path, echoed back.
        schema_version: the trace file's schema version.
        slo: a limit in ms per metric (``ttft``, ``tpot``, ``itl``, ``e2e``) for goodput;
            None for no goodput.

    Raises:
        ValueError: an unknown SLO metric or a limit that is not positive.
    """
    loads = values.load
    ttft = attr.requests["ttft_ns"].to_numpy()
    conditions = attr.requests["condition"].to_numpy()
    failed = attr.failed
    by_condition = {}
    for cond in CONDITIONS:
        mask = conditions == cond
        if mask.any():
            by_condition[cond] = {
                "requests": int(mask.sum()),
                "ttft_ms": _ms(ttft[mask]),
                "stages": _stages_dict(stage_table(attr, mask)),
                "failures": _failure_counts(failed[failed["condition"] == cond]),
            }
    clocks = clock_list(attr)
    disagree = any(c["applied"] or c["violations_after"] for c in clocks)
    return Summary(
        trace=trace,
        schema_version=schema_version,
        boundary=attr.boundary,
        policy=attr.policy,
        requests=int(len(ttft) + len(failed)),
        requests_ok=int(len(ttft)),
        failures=_failure_counts(failed),
        failure_examples=_failure_examples(failed),
        failed_first_token=_failed_first_token(failed),
        ttft_ms=_ms(ttft) if len(ttft) else None,  # no made-up 0 ms: no ok request had one
        stages=_stages_dict(stage_table(attr)),
        conditions=by_condition,
        **summarize_values(values.after_first_token),
        tail=_stages_dict(tail_mix(attr)),
        quality=dict(attr.quality.counts),
        clocks=clocks if disagree else None,
        load=load_summary(loads),
        goodput=goodput_summary(attr, loads, slo),
        kv_transfer=transfer_summary(values.transfers),
    )


def load_summary(values: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """`Summary.load` from ``analysis.load.load_values`` (None without a client span)."""
    found = load(values)
    if found is None:
        return None
    e2e = found.e2e_ns
    return {
        "duration_s": found.duration_ns / 1e9,
        "requests": found.requests,
        "requests_per_s": found.per_s(found.requests),
        "output_tokens": found.output_tokens,
        "output_tokens_per_s": found.per_s(found.output_tokens),
        "e2e_ms": {**_ms(e2e), "requests": int(len(e2e))} if len(e2e) else None,
        "content_filter": found.content_filter,
    }


def _failure_counts(failed: pd.DataFrame) -> dict[str, int]:
    counts = failed["outcome"].value_counts()
    return {kind: int(counts[kind]) for kind in OUTCOMES if kind in counts.index}


def _failure_examples(failed: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in _failure_counts(failed):  # the smallest trace ids: never by row order
        rows = failed[failed["outcome"] == kind].sort_values("trace_id").head(EXAMPLES_KEPT)
        out[kind] = [
            {
                "trace_id": str(r.trace_id),
                "status_code": None if pd.isna(r.status_code) else int(r.status_code),
                "error": None if not isinstance(r.error, str) else r.error,
            }
            for r in rows.itertuples(index=False)
        ]
    return out


def _failed_first_token(failed: pd.DataFrame) -> dict[str, Any] | None:
    ttft = failed["ttft_ns"].to_numpy(dtype=np.int64)
    seen = ttft[ttft >= 0]
    return {"requests": int(len(seen)), "ttft_ms": _ms(seen)} if len(seen) else None


def clock_list(attr: Attribution) -> list[dict[str, Any]]:
    """The clock offsets of the trace (``analysis.clocks``), one dict per client/server
    clock pair, then per server/worker pair (``client_clock`` is then the server's):
    ``offset_ms`` was applied to the server clock, ``estimate_ms`` is the
    median per-request estimate whether applied or not, ``violations_*`` count requests
    whose server interval lies outside the client's at offset 0 and at the offset.

    `Summary` holds this list (key ``clocks``, after ``quality``) only when a pair's
    clocks disagree: an offset was applied or requests still lie outside."""
    return [
        {
            "client_clock": c.client_clock,
            "server_clock": c.server_clock,
            "applied": c.applied,
            "offset_ms": c.offset_ns / _NS_PER_MS,
            "estimate_ms": c.estimate_ns / _NS_PER_MS,
            "spread_ms": c.spread_ns / _NS_PER_MS,
            "requests": c.requests,
            "violations_before": c.violations_before,
            "violations_after": c.violations_after,
            "bounded": c.bounded,
        }
        for c in attr.quality.clocks
    ]


BANDS: dict[str, tuple[float, float]] = {
    "p50": (47.5, 52.5),
    "p90": (87.5, 92.5),
    "p99": (98.5, 99.5),
    "tail ≥ p99": (99.0, 100.0),
}
"""The TTFT percentile ranges whose requests `percentile_bands` averages."""


def percentile_bands(attr: Attribution, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Mean attributed ms per stage of the requests near TTFT's p50, p90 and p99, and of
    the tail (TTFT at or above p99): stacks that sum to their band's mean TTFT, unlike
    per-stage percentiles, which never add up.

    A band holds the requests whose TTFT lies between the two percentiles of `BANDS`; when
    none does (few requests), the requests nearest the band's centre percentile.

    Args:
        attr: an attribution.
        rows: boolean mask over ``attr.requests`` (default: all requests).

    Returns:
        One row per band in `BANDS` order (index ``band``): ``requests``, ``ttft_ms`` (the
        band's mean TTFT) and one column per stage with any attributed time (mean ms);
        empty when there are no requests.
    """
    att = attr.attributed.to_numpy()
    ttft = attr.requests["ttft_ns"].to_numpy()
    if rows is not None:
        att, ttft = att[rows], ttft[rows]
    used = (att > 0).any(axis=0)
    names = list(np.asarray(attr.attributed.columns)[used])
    if len(ttft) == 0:
        return pd.DataFrame(columns=["requests", "ttft_ms", *names], dtype=float)
    att = att[:, used]
    out = []
    for lo_pct, hi_pct in BANDS.values():
        lo, hi = np.percentile(ttft, [lo_pct, hi_pct])
        band = (ttft >= lo) & (ttft <= hi)
        if not band.any():
            distance = np.abs(ttft - np.percentile(ttft, (lo_pct + hi_pct) / 2))
            band = distance == distance.min()
        out.append(
            [
                int(band.sum()),
                ttft[band].mean() / _NS_PER_MS,
                *(att[band].mean(axis=0) / _NS_PER_MS),
            ]
        )
    table = pd.DataFrame(out, index=list(BANDS), columns=["requests", "ttft_ms", *names])
    table.index.name = "band"
    return table

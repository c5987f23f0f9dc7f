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

from ttft.analysis.attribution import Attribution
from ttft.analysis.load import check_slo, per_s
from ttft.analysis.order_stats import PartSet, remembered
from ttft.analysis.part_figures import (
    PERCENTILES,
    PartRows,
    after_first_token,
    failed_first_token,
    failure_counts,
    failure_examples,
    kv_transfer,
    load_figures,
    ms_figures,
    one_part,
    stage_rows,
    stages_with_time,
    summary_asks,
    tail_rows,
)
from ttft.analysis.quality import Quality
from ttft.analysis.request_values import RequestValues
from ttft.analysis.slo import goodput_summary
from ttft.tracer.schema import CONDITIONS, SCHEMA_VERSION

_NS_PER_MS = 1e6
__all__ = ["BANDS", "PERCENTILES", "Summary", "clock_list", "percentile_bands",
           "stage_table", "summarize", "summary_of", "tail_mix"]


def stage_table(attr: Attribution, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Per stage with any time: attributed p50/p90/p99/mean, share, raw and overlap means.

    Args:
        attr: an attribution.
        rows: boolean mask over ``attr.requests`` (default: all requests).

    Returns:
        One row per stage (index: stage name), columns ``p50, p90, p99, mean, share,
        raw_mean, overlap_mean`` (ms, ``share`` a fraction), in canonical stage order.
    """
    return stage_rows(one_part(attr), None if rows is None else (lambda _: rows))


def tail_mix(attr: Attribution) -> pd.DataFrame:
    """Mean attributed ms per stage for the tail (TTFT at or above its p99) against the
    middle (TTFT between its p40 and p60; when no request lies there, as with a few
    requests, the ones nearest the median): columns ``tail_mean``, ``median_mean``."""
    return tail_rows(one_part(attr))


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
    """Summarize an attribution and its requests' values (see `Summary`): `summary_of`
    them as one part.

    Args:
        attr: the attribution to summarize.
        values: its requests' `RequestValues` (``request_values`` of its assembly).
        trace: the trace's path, echoed back.
        schema_version: the trace file's schema version.
        slo: a limit in ms per metric (``ttft``, ``tpot``, ``itl``, ``e2e``) for goodput;
            None for no goodput.

    Raises:
        ValueError: an unknown SLO metric or a limit that is not positive.
    """
    return summary_of(one_part(attr, values), attr.boundary, attr.policy, attr.quality,
                      trace=trace, schema_version=schema_version, slo=slo)


def summary_of(parts: PartSet, boundary: str, policy: str, quality: Quality, *,
               trace: str = "", schema_version: int = SCHEMA_VERSION,
               slo: Mapping[str, float] | None = None) -> Summary:
    """The `Summary` of a trace's parts (a `PartSet` of ``PartRows``, one per table, all
    attributed at ``boundary`` and ``policy``; ``quality`` their merged defects and clock
    offsets): built from reductions over the parts alone (``analysis.part_figures``), so
    one table and a dataset's partitions give one summary, and merging partitions holds
    none of their requests.

    Raises:
        ValueError: an unknown SLO metric or a limit that is not positive.
    """
    if slo:
        check_slo(slo)
    # parts read back pass by pass: their percentiles in one set of passes, planned in
    # this first one (held parts take one pass a percentile call: cheaper than planning)
    planned = parts.fetch_limit is not None
    counts = parts.map(lambda p: (len(p.ttft), len(p.attribution.failed),
                                  {c: int(p.of_condition(c).sum()) for c in CONDITIONS},
                                  stages_with_time(p, CONDITIONS) if planned else None))
    present = [cond for cond in CONDITIONS if sum(c[2][cond] for c in counts)]
    asks = summary_asks(present, [c[3] for c in counts]) if planned else []
    with remembered(parts, asks):
        return _summary(parts, counts, present, boundary, policy, quality, trace,
                        schema_version, slo)


def _summary(parts: PartSet, counts: list[Any], present: list[str], boundary: str,
             policy: str, quality: Quality, trace: str, schema_version: int,
             slo: Mapping[str, float] | None) -> Summary:
    """`summary_of`'s figures, its percentiles of plain columns found already."""
    n_ok = sum(c[0] for c in counts)
    by_condition = {}
    for cond in present:
        n = sum(c[2][cond] for c in counts)

        def mine(p: PartRows, cond: str = cond) -> np.ndarray:
            return p.of_condition(cond)

        by_condition[cond] = {
            "requests": n,
            "ttft_ms": ms_figures(parts, lambda p, mine=mine: p.ttft[mine(p)], ("ttft", cond)),
            "stages": _stages_dict(stage_rows(parts, mine, (cond,))),
            "failures": failure_counts(parts, cond),
        }
    clocks = clock_list(quality)
    disagree = any(c["applied"] or c["violations_after"] for c in clocks)
    failures = failure_counts(parts)
    loads = load_figures(parts)
    return Summary(
        trace=trace,
        schema_version=schema_version,
        boundary=boundary,
        policy=policy,
        requests=int(n_ok + sum(c[1] for c in counts)),
        requests_ok=int(n_ok),
        failures=failures,
        failure_examples=failure_examples(parts, failures),
        failed_first_token=failed_first_token(parts),
        # no made-up 0 ms: no ok request had one
        ttft_ms=ms_figures(parts, lambda p: p.ttft, ("ttft",)) if n_ok else None,
        stages=_stages_dict(stage_rows(parts, None, ("all",))),
        conditions=by_condition,
        **after_first_token(parts),
        tail=_stages_dict(tail_rows(parts)),
        quality=dict(quality.counts),
        clocks=clocks if disagree else None,
        load=_load_dict(loads),
        goodput=goodput_summary(parts, slo, None if loads is None else loads["duration_ns"]),
        kv_transfer=kv_transfer(parts),
    )


def _load_dict(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """`Summary.load` from ``part_figures.load_figures`` (None without a client span)."""
    if found is None:
        return None
    duration = found["duration_ns"]

    e2e = found["e2e"]
    return {
        "duration_s": duration / 1e9,
        "requests": found["requests"],
        "requests_per_s": per_s(found["requests"], duration),
        "output_tokens": found["output_tokens"],
        "output_tokens_per_s": per_s(found["output_tokens"], duration),
        "e2e_ms": None if e2e is None else {**e2e, "requests": found["requests"]},
        "content_filter": found["content_filter"],
    }


def clock_list(quality: Quality) -> list[dict[str, Any]]:
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
        for c in quality.clocks
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

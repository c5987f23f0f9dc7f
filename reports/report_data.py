"""Everything a latency report shows, computed once for the HTML and the terminal version.

`build_report` takes one analysis (attribution done, the report's per-request rows merged
from its parts), adds percentile bands, blame, prefill scaling and the regime, and the
waterfalls of the chosen requests; the renderers only lay the results out. One process and
a dataset's partitions (``ttft.reports.runs.analyses``) reach it with the same analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ttft.analysis.assemble import Assembly, Rows
from ttft.analysis.attribution import Attribution
from ttft.analysis.blame import blame_summary
from ttft.analysis.part import with_report
from ttft.analysis.prefill import QuadraticFit, prefill_fits
from ttft.analysis.regime import RegimeResult
from ttft.analysis.result import Analysis
from ttft.analysis.summary import Summary, percentile_bands
from ttft.analysis.transfer import deployment_note
from ttft.reports.waterfall_lanes import clock_kind as clock_kind
from ttft.reports.waterfall_lanes import event_lanes, lanes, workers
from ttft.reports.waterfall_lanes import lane_order as lane_order
from ttft.tracer.schema import BOUNDARY_EVENTS, CONDITIONS

_NS_PER_MS = 1e6
MAX_WATERFALL_SPANS = 400
"""Spans drawn per waterfall at most (the request's own first, then engine steps)."""
CHOSEN = ("median", "p99", "slowest")
FIT_MIN_R2 = 0.9
"""A prefill fit is drawn only when it explains at least this share of the variance."""


@dataclass
class Waterfall:
    """One request's spans on lanes, in ms from its window start.

    ``spans`` columns: ``name``, ``stage``, ``clock``, ``start_ms``, ``end_ms``, ``lane``
    (lane labels such as ``client · 1``, per worker: ``ttft.reports.waterfall_lanes``;
    overlapping spans of one worker get separate lanes, its steps and its ``kv_transfer``
    lanes of their own); ``events``: ``(name, clock, t_ms)`` of the point events, each
    drawn on its lane in ``event_lanes``.
    """

    label: str
    trace_id: str
    condition: str | None
    ttft_ms: float
    window_ms: tuple[float, float]
    spans: pd.DataFrame
    events: list[tuple[str, str, float]]
    parts_ms: dict[str, float]
    event_lanes: list[str]
    request_id: str | None = None

    @property
    def tag(self) -> str:
        """What tells this request apart from the others: its request id, else the right-most
        hex digits of its trace id (the random part under W3C trace context; a trace's
        left-most digits may be shared by every request of a run)."""
        return self.request_id or f"trace …{self.trace_id[-12:]}"


@dataclass
class ReportData:
    """The analyses of one trace at one boundary and policy (times in ms)."""

    trace: str
    metadata: dict[str, Any]
    summary: Summary
    attribution: Attribution
    groups: dict[str, np.ndarray]
    """``all`` and each condition present: boolean masks over the attributed requests."""
    bands: dict[str, pd.DataFrame]
    cdf_ms: dict[str, np.ndarray]
    waterfalls: list[Waterfall]
    blame: pd.DataFrame
    prefill_points: pd.DataFrame
    prefill_fits: dict[str, QuadraticFit]
    regime: RegimeResult | None = None
    notes: list[str] = field(default_factory=list)
    """Lines the report shows under its title: how the run was deployed, from its metadata
    or else its ``kv_transfer`` spans (``ttft.analysis.transfer.deployment_note``)."""

    @property
    def group_label(self) -> dict[str, str]:
        """Display names of the groups: ``all`` says which conditions it mixes."""
        conds = [g for g in self.groups if g != "all"]
        label = "all requests" + (f" (mixes {' and '.join(conds)})" if len(conds) > 1 else "")
        return {g: label if g == "all" else g for g in self.groups}

    @property
    def explaining_fits(self) -> dict[str, QuadraticFit]:
        """The prefill fits worth drawing: those with ``r2 >= FIT_MIN_R2``."""
        return {c: f for c, f in self.prefill_fits.items() if f.r2 >= FIT_MIN_R2}


def build_report(analysis: Analysis, *, waterfalls: list[Waterfall] | None = None
                 ) -> ReportData:
    """Everything the report shows, from one analysis: made for a report (the driver's,
    ``ttft.reports.runs.analyses``, or ``analyze(..., regime=...)``), or analysed whole in
    this process, whose report rows are then taken from its assembly (``with_report``).

    Whatever order the requests and chunks came in (one table, or a dataset's partitions
    merged), the prefill points, their fits and the regime come out the same (sorted by
    request, fitted and summed in that order), and the blame and bands are sums over
    requests. Blame and the prefill fit are over the requests every TTFT figure is over
    (those that did not fail and have a window at the boundary), so their counts agree with
    the headline's; the regime describes the device, from every chunk it ran.

    Args:
        analysis: the trace analysed at the report's boundary and policy.
        waterfalls: the `waterfall` of each of `chosen_requests` (None: drawn from the
            analysis's assembly).
    """
    if analysis.report is None or analysis.report.blame is None:
        analysis = with_report(analysis)
    attr, summary, rows = analysis.attribution, analysis.summary, analysis.report
    assert rows is not None and rows.blame is not None and rows.prefill_points is not None
    assert analysis.regime is not None
    if waterfalls is None:
        waterfalls = own_waterfalls(analysis)
    shown = set(attr.requests["trace_id"])  # a request's smallest trace id names it
    blame_rows = rows.blame[rows.blame["trace_id"].isin(shown)]
    points = rows.prefill_points[rows.prefill_points["trace_id"].isin(shown)]
    conditions = attr.requests["condition"].to_numpy()
    groups = {"all": np.ones(len(conditions), bool)}
    for cond in CONDITIONS:
        mask = conditions == cond
        if mask.any():
            groups[cond] = mask
    ttft_ms = attr.requests["ttft_ns"].to_numpy() / _NS_PER_MS
    points = points.sort_values("trace_id", kind="stable").reset_index(drop=True)
    return ReportData(
        trace=summary.trace,
        metadata=analysis.metadata,
        summary=summary,
        attribution=attr,
        groups=groups,
        bands={g: percentile_bands(attr, mask) for g, mask in groups.items()},
        cdf_ms={g: np.sort(ttft_ms[mask]) for g, mask in groups.items()},
        waterfalls=waterfalls,
        blame=blame_summary(blame_rows),
        prefill_points=points,
        prefill_fits=prefill_fits(points),
        regime=analysis.regime.result(rows.regime),
        notes=[note] if (note := deployment_note(analysis.metadata, summary.kv_transfer)) else [],
    )


def own_waterfalls(analysis: Analysis) -> list[Waterfall]:
    """The waterfalls of `chosen_requests`, drawn from the analysis's own assembly."""
    asm, attr = analysis.assembly, analysis.attribution
    if asm is None:
        raise ValueError("an analysis merged from partitions has its waterfalls drawn by its "
                         "driver (ttft.reports.runs.analyses)")
    waterfalls = []
    for label, row in chosen_requests(attr):
        req = attr.requests.iloc[row]
        a_ns = int(req["a_ns"])
        frame = request_spans(asm, int(req["request"]), a_ns, a_ns + int(req["ttft_ns"]))
        waterfalls.append(waterfall(label, req, attr.attributed.iloc[row], frame))
    return waterfalls


def chosen_requests(attr: Attribution) -> list[tuple[str, int]]:
    """``(label, row)`` of the median, the p99 and the slowest request by TTFT, ties broken
    by trace id, so the choice never depends on the requests' order (a request chosen twice
    is drawn once, under its first label)."""
    ttft = attr.requests["ttft_ns"].to_numpy()
    if len(ttft) == 0:
        return []
    keys = pd.DataFrame({"ttft": ttft, "trace": attr.requests["trace_id"].to_numpy(object)})
    order = keys.sort_values(["ttft", "trace"]).index.to_numpy()
    picks = {
        "median": order[(len(order) - 1) // 2],
        "p99": order[min(len(order) - 1, int(np.ceil(0.99 * len(order))) - 1)],
        "slowest": order[-1],
    }
    seen: set[int] = set()
    out = []
    for label in CHOSEN:
        row = int(picks[label])
        if row not in seen:
            seen.add(row)
            out.append((label, row))
    return out


def request_spans(asm: Assembly, request: int, a_ns: int, b_ns: int,
                  steps: pa.Table | None = None) -> pd.DataFrame:
    """What a request's waterfall draws: its own rows, the gpu spans of its chunks' steps
    and the engine steps overlapping its window ``[a_ns, b_ns)`` (what ran while it
    waited) on the services its chunks ran on, as ``name, stage, clock, service,
    start_ns, end_ns`` on the assembly's (aligned) clock.

    Args:
        asm: the trace, or the partition holding the request, assembled.
        request: the request's index into ``asm.requests``.
        a_ns, b_ns: its window.
        steps: every ``step`` span of the trace on that clock, with ``name``,
            ``service``, ``clock``, ``start_ns`` and ``end_ns`` (``analysis.part.
            global_steps``), when ``asm`` holds only some; None for those of ``asm``.
    """
    rows = asm.rows
    own = np.flatnonzero(rows.valid & (rows.req == request))
    chunks = own[rows.has_stage(own, "prefill.chunk")]
    if len(chunks) == 0:
        return _frame(rows, own)
    services = np.unique(rows.service[chunks])
    # The gpu spans attribution joined to its chunks (a reused step id names one engine
    # trace's, not every trace's with that (service, step_id)), where their copies are.
    pairs = np.flatnonzero(np.isin(rows.gpu_chunk, chunks))
    gpu, first = np.unique(rows.gpu_row[pairs], return_index=True)
    drawn = pd.concat([_frame(rows, own), _frame(rows, gpu, rows.gpu_move[pairs[first]])],
                      ignore_index=True)
    if steps is None:
        step = rows.of("step")
        step = step[np.isin(rows.service[step], services)]
        near = (rows.end_ns[step] > a_ns) & (rows.start_ns[step] < b_ns)
        return pd.concat([drawn, _frame(rows, step[near])], ignore_index=True)
    names = [rows.service_values[s] if s >= 0 else None for s in services]
    start, end = steps.column("start_ns").to_numpy(), steps.column("end_ns").to_numpy()
    on = pd.Series(steps.column("service").to_pylist(), dtype=object).isin(names).to_numpy()
    near = on & (end > a_ns) & (start < b_ns)
    near_steps = steps.filter(pa.array(near))
    clock = near_steps.column("clock").to_pylist()
    outside = pd.DataFrame({
        "name": near_steps.column("name").to_pylist(), "stage": "step",
        "clock": ["" if c is None else c for c in clock],
        "service": ["" if name is None else name for name in near_steps.column(
            "service").to_pylist()],
        "start_ns": start[near], "end_ns": end[near],
    })
    return pd.concat([drawn, outside], ignore_index=True)


def _frame(rows: Rows, take: np.ndarray, moved: np.ndarray | int = 0) -> pd.DataFrame:
    """``name, stage, clock, service, start_ns, end_ns`` of the rows ``take``, on the
    assembly's (aligned) clock and ``moved`` further (a missing clock or service as ``""``)."""
    table = rows.table
    return pd.DataFrame(
        {
            "name": table.column("name").take(take).to_numpy(zero_copy_only=False),
            "stage": rows.stage_names(take),
            "clock": rows.clock_names(take),
            "service": np.asarray([*rows.service_values, ""], dtype=object)[rows.service[take]],
            "start_ns": rows.start_ns[take] + moved,
            "end_ns": rows.end_ns[take] + moved,
        }
    )


def waterfall(label: str, req: pd.Series, parts: pd.Series, frame: pd.DataFrame) -> Waterfall:
    """The `Waterfall` of one request: ``req`` its row of ``Attribution.requests``,
    ``parts`` its row of ``attributed``, ``frame`` its `request_spans`. Spans are laid out
    by start, longest first, then stage, clock and name, and events by time, so the
    drawing never depends on the order the rows came in."""
    a_ns = int(req["a_ns"])
    frame = frame.astype({"stage": str, "clock": str, "service": str})
    frame = frame.assign(worker=workers(frame))
    is_event = frame["stage"] == "event"
    spans = _in_drawing_order(frame[~is_event])
    if len(spans) > MAX_WATERFALL_SPANS:
        own = spans[spans["stage"] != "step"]
        spans = pd.concat([own, spans[spans["stage"] == "step"]]).iloc[:MAX_WATERFALL_SPANS]
        spans = _in_drawing_order(spans)
    labels = lanes(spans, spans["worker"].to_numpy(object))
    drawn = pd.DataFrame(
        {
            "name": spans["name"].to_numpy(),
            "stage": spans["stage"].to_numpy(),
            "clock": spans["clock"].to_numpy(),
            "start_ms": (spans["start_ns"].to_numpy() - a_ns) / _NS_PER_MS,
            "end_ms": (spans["end_ns"].to_numpy() - a_ns) / _NS_PER_MS,
            "lane": labels,
        }
    )
    placed = sorted(
        ((str(r.name), str(r.clock), (int(r.start_ns) - a_ns) / _NS_PER_MS, str(r.worker))
         for r in frame[is_event].itertuples()
         if r.name in BOUNDARY_EVENTS or r.name == "sent"),
        key=lambda e: (e[2], e[0], e[1], e[3]),
    )
    events = [e[:3] for e in placed]
    ttft_ms = int(req["ttft_ns"]) / _NS_PER_MS
    condition = req["condition"] if isinstance(req["condition"], str) else None
    parts_ms = {k: v / _NS_PER_MS for k, v in parts.items() if v}
    return Waterfall(
        label, str(req["trace_id"]), condition, ttft_ms, (0.0, ttft_ms), drawn, events, parts_ms,
        event_lanes(np.asarray([e[3] for e in placed], dtype=object), labels),
        req["request_id"] if isinstance(req.get("request_id"), str) else None,
    )


def _in_drawing_order(spans: pd.DataFrame) -> pd.DataFrame:
    return spans.sort_values(["start_ns", "end_ns", "stage", "clock", "name"],
                             ascending=[True, False, True, True, True], kind="stable")

"""Everything a latency report shows, computed once for the HTML and the terminal version.

`build_report` takes one analysis (attribution done), adds percentile bands, blame, prefill
scaling and the regime, and picks the requests whose waterfalls are drawn; the renderers
only lay the results out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis.assemble import Assembly, Rows
from ttft.analysis.attribution import Attribution
from ttft.analysis.blame import blame, blame_summary
from ttft.analysis.pipeline import Analysis
from ttft.analysis.prefill import QuadraticFit, prefill_fits, prefill_points
from ttft.analysis.summary import Summary, percentile_bands
from ttft.reports.regime_view import RegimeResult, compute_regime
from ttft.tracer.schema import ATTR_STEP_ID, BOUNDARY_EVENTS, CONDITIONS

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
    (lane labels such as ``client 1``; overlapping spans of one clock get separate lanes);
    ``events``: ``(name, clock, t_ms)`` of the point events.
    """

    label: str
    trace_id: str
    condition: str | None
    ttft_ms: float
    window_ms: tuple[float, float]
    spans: pd.DataFrame
    events: list[tuple[str, str, float]]
    parts_ms: dict[str, float]


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


def metadata_rows(metadata: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Run metadata as ``(key, value)`` text rows, sorted by key.

    Nested mappings are flattened into dotted keys (``model_config.hidden_size``), as are
    lists of mappings (``inputs.0.path``); strings stay as they are, other lists are joined
    with ``, `` and every other value (an empty mapping too) is its JSON text.
    """
    rows: list[tuple[str, str]] = []
    for key in sorted(metadata, key=str):
        value, name = metadata[key], f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows.extend(metadata_rows(value, f"{name}."))
        elif (
            isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value)
        ):
            for i, item in enumerate(value):
                rows.extend(metadata_rows(item, f"{name}.{i}."))
        elif isinstance(value, list | tuple):
            rows.append((name, ", ".join(_text(v) for v in value)))
        else:
            rows.append((name, _text(value)))
    return rows


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def build_report(analysis: Analysis, *, regime: RegimeResult | None = None) -> ReportData:
    """Everything the report shows, from one analysis.

    Args:
        analysis: the trace analysed at the report's boundary and policy.
        regime: the prefill regime (default: from what the trace says of its model and
            device, `ttft.reports.regime_view.compute_regime`).
    """
    asm, attr = analysis.assembly, analysis.attribution
    conditions = attr.requests["condition"].to_numpy()
    groups = {"all": np.ones(len(conditions), bool)}
    for cond in CONDITIONS:
        mask = conditions == cond
        if mask.any():
            groups[cond] = mask
    ttft_ms = attr.requests["ttft_ns"].to_numpy() / _NS_PER_MS
    points = prefill_points(asm)
    return ReportData(
        trace=analysis.summary.trace,
        metadata=analysis.metadata,
        summary=analysis.summary,
        attribution=attr,
        groups=groups,
        bands={g: percentile_bands(attr, mask) for g, mask in groups.items()},
        cdf_ms={g: np.sort(ttft_ms[mask]) for g, mask in groups.items()},
        waterfalls=_waterfalls(asm, attr),
        blame=blame_summary(blame(asm)),
        prefill_points=points,
        prefill_fits=prefill_fits(points),
        regime=regime if regime is not None else compute_regime(asm, analysis.metadata),
    )


def chosen_requests(attr: Attribution) -> list[tuple[str, int]]:
    """``(label, row)`` of the median, the p99 and the slowest request by TTFT (a request
    chosen twice is drawn once, under its first label)."""
    ttft = attr.requests["ttft_ns"].to_numpy()
    if len(ttft) == 0:
        return []
    order = np.argsort(ttft, kind="stable")
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


def _waterfalls(asm: Assembly, attr: Attribution) -> list[Waterfall]:
    chosen = chosen_requests(attr)
    if not chosen:
        return []
    rows = asm.rows
    out = []
    for label, row in chosen:
        req = attr.requests.iloc[row]
        own = np.flatnonzero(rows.valid & (rows.req == int(req["request"])))
        a_ns = int(req["a_ns"])
        engine = _engine_rows(rows, own, a_ns, a_ns + int(req["ttft_ns"]))
        parts = attr.attributed.iloc[row]
        out.append(
            _waterfall(
                label,
                req,
                _frame(rows, np.concatenate([own, engine])),
                a_ns,
                {k: v / _NS_PER_MS for k, v in parts.items() if v},
            )
        )
    return out


def _engine_rows(rows: Rows, own: np.ndarray, a_ns: int, b_ns: int) -> np.ndarray:
    """The gpu spans of the request's chunk steps and the engine steps overlapping its
    window (what ran while it waited), of the services its chunks ran on."""
    chunks = own[rows.has_stage(own, "prefill.chunk")]
    if len(chunks) == 0:
        return chunks
    steps = np.unique(rows.int_attribute(chunks, ATTR_STEP_ID))
    steps = steps[steps >= 0]
    engine = rows.of("gpu", "step")
    engine = engine[np.isin(rows.service[engine], np.unique(rows.service[chunks]))]
    is_gpu = rows.has_stage(engine, "gpu")
    near = (rows.end_ns[engine] > a_ns) & (rows.start_ns[engine] < b_ns)
    ours = np.zeros(len(engine), bool)
    if is_gpu.any():
        ours[is_gpu] = np.isin(rows.int_attribute(engine[is_gpu], ATTR_STEP_ID), steps)
    return engine[(is_gpu & ours) | (~is_gpu & near)]


def _frame(rows: Rows, take: np.ndarray) -> pd.DataFrame:
    """``name, stage, clock, start_ns, end_ns`` of the rows ``take``, on the assembly's
    (aligned) clock."""
    table = rows.table
    return pd.DataFrame(
        {
            "name": table.column("name").take(take).to_numpy(zero_copy_only=False),
            "stage": rows.stage_names(take),
            "clock": rows.clock_names(take),
            "start_ns": rows.start_ns[take],
            "end_ns": rows.end_ns[take],
        }
    )


def _waterfall(
    label: str, req: pd.Series, frame: pd.DataFrame, a_ns: int, parts_ms: dict[str, float]
) -> Waterfall:
    frame = frame.astype({"stage": str, "clock": str})
    is_event = frame["stage"] == "event"
    spans = frame[~is_event].sort_values(["start_ns", "end_ns"], ascending=[True, False])
    if len(spans) > MAX_WATERFALL_SPANS:
        own = spans[spans["stage"] != "step"]
        spans = pd.concat([own, spans[spans["stage"] == "step"]]).iloc[:MAX_WATERFALL_SPANS]
        spans = spans.sort_values(["start_ns", "end_ns"], ascending=[True, False])
    lanes = _lanes(spans)
    drawn = pd.DataFrame(
        {
            "name": spans["name"].to_numpy(),
            "stage": spans["stage"].to_numpy(),
            "clock": spans["clock"].to_numpy(),
            "start_ms": (spans["start_ns"].to_numpy() - a_ns) / _NS_PER_MS,
            "end_ms": (spans["end_ns"].to_numpy() - a_ns) / _NS_PER_MS,
            "lane": lanes,
        }
    )
    events = [
        (str(r.name), str(r.clock), (int(r.start_ns) - a_ns) / _NS_PER_MS)
        for r in frame[is_event].itertuples()
        if r.name in BOUNDARY_EVENTS or r.name == "sent"
    ]
    ttft_ms = int(req["ttft_ns"]) / _NS_PER_MS
    condition = req["condition"] if isinstance(req["condition"], str) else None
    return Waterfall(
        label, str(req["trace_id"]), condition, ttft_ms, (0.0, ttft_ms), drawn, events, parts_ms
    )


def clock_kind(clock: str) -> str:
    """``client``, ``gpu`` (a ``gpu:`` clock) or ``host`` (any other server clock)."""
    if clock == "client":
        return "client"
    return "gpu" if clock.startswith("gpu:") else "host"


_KIND_ORDER = {"client": 0, "host": 1, "gpu": 2}


def _lanes(spans: pd.DataFrame) -> list[str]:
    """Greedy interval lanes per clock (engine steps in a group of their own): a span goes
    on the first lane of its group whose last span ended at or before it starts, so no two
    bars of a lane overlap."""
    ends: dict[str, list[int]] = {}
    out = []
    rows = zip(spans["clock"], spans["stage"], spans["start_ns"], spans["end_ns"], strict=True)
    for clock, stage, start, end in rows:
        group = f"{clock} steps" if stage == "step" else clock
        lane_ends = ends.setdefault(group, [])
        for i, lane_end in enumerate(lane_ends):
            if lane_end <= start:
                lane_ends[i] = end
                break
        else:
            lane_ends.append(end)
            i = len(lane_ends) - 1
        out.append(f"{group} · {i + 1}")
    return out


def lane_order(lanes: pd.Series) -> list[str]:
    """Lane labels top to bottom: client lanes, then host, then gpu, each by number."""

    def key(label: str) -> tuple[int, str, int]:
        clock, _, n = label.rpartition(" · ")
        return (_KIND_ORDER[clock_kind(clock)], clock, int(n))

    return sorted(set(lanes), key=key)

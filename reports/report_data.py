"""Everything a latency report shows, computed once for the HTML and the terminal version.

`build` runs the analyses (attribution, percentile bands, blame, prefill scaling) and picks
the requests whose waterfalls are drawn; the renderers only lay the results out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis import blame as blame_mod
from ttft.analysis import clocks
from ttft.analysis import prefill as prefill_mod
from ttft.analysis.assemble import Assembly, assemble
from ttft.analysis.attribution import Attribution, attribute
from ttft.analysis.summary import percentile_bands, summarize
from ttft.reports.regime_view import RegimeResult, compute_regime
from ttft.tracer.schema import ATTR_STEP_ID, BOUNDARY_EVENTS, CONDITIONS, SCHEMA_VERSION

_NS_PER_MS = 1e6
MAX_WATERFALL_SPANS = 400
"""Spans drawn per waterfall at most (the request's own first, then engine steps)."""
CHOSEN = ("median", "p99", "slowest")


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
    summary: dict[str, Any]
    attribution: Attribution
    groups: dict[str, np.ndarray]
    """``all`` and each condition present: boolean masks over the attributed requests."""
    bands: dict[str, pd.DataFrame]
    cdf_ms: dict[str, np.ndarray]
    waterfalls: list[Waterfall]
    blame: pd.DataFrame
    prefill_points: pd.DataFrame
    prefill_fits: dict[str, prefill_mod.QuadraticFit]
    regime: RegimeResult | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def group_label(self) -> dict[str, str]:
        """Display names of the groups: ``all`` says which conditions it mixes."""
        conds = [g for g in self.groups if g != "all"]
        label = "all requests" + (f" (mixes {' and '.join(conds)})" if len(conds) > 1 else "")
        return {g: label if g == "all" else g for g in self.groups}


def build(
    table: pa.Table,
    metadata: dict[str, Any],
    *,
    trace: str,
    boundary: str | None = None,
    policy: str = "exclusive",
    regime_flags: dict[str, Any] | None = None,
) -> ReportData:
    """Run every analysis the report shows on ``table`` (a span table).

    Args:
        regime_flags: keyword arguments of `ttft.reports.regime_view.compute_regime`
            (``model_config``, ``peak_tflops``, ``peak_bandwidth_gbs``).
    """
    asm = assemble(table)
    attr = attribute(asm, boundary, policy)
    summary = summarize(
        attr,
        asm,
        trace=trace,
        schema_version=int(metadata.get("schema_version", SCHEMA_VERSION)),
    )
    conditions = attr.requests["condition"].to_numpy()
    groups = {"all": np.ones(len(conditions), bool)}
    for cond in CONDITIONS:
        mask = conditions == cond
        if mask.any():
            groups[cond] = mask
    ttft_ms = attr.requests["ttft_ns"].to_numpy() / _NS_PER_MS
    points = prefill_mod.prefill_points(table)
    return ReportData(
        trace=trace,
        metadata=metadata,
        summary=summary,
        attribution=attr,
        groups=groups,
        bands={g: percentile_bands(attr, mask) for g, mask in groups.items()},
        cdf_ms={g: np.sort(ttft_ms[mask]) for g, mask in groups.items()},
        waterfalls=_waterfalls(table, asm, attr),
        blame=blame_mod.blame_summary(blame_mod.blame(table)),
        prefill_points=points,
        prefill_fits=prefill_mod.prefill_fits(points),
        regime=compute_regime(table, metadata, **(regime_flags or {})),
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


def _waterfalls(table: pa.Table, asm: Assembly, attr: Attribution) -> list[Waterfall]:
    chosen = chosen_requests(attr)
    if not chosen:
        return []
    aligned = clocks.apply_offsets(table, asm.quality.clocks)
    trace_col = aligned.column("trace_id")
    rid_col = aligned.column("request_id")
    out = []
    for label, row in chosen:
        req = attr.requests.iloc[row]
        mine = pc.equal(trace_col, req["trace_id"])
        if isinstance(req["request_id"], str):
            mine = pc.or_kleene(mine, pc.fill_null(pc.equal(rid_col, req["request_id"]), False))
        own = aligned.filter(mine).to_pandas()
        a_ns = int(req["a_ns"])
        engine = _engine_rows(aligned, own, a_ns, a_ns + int(req["ttft_ns"]))
        frame = pd.concat([own, engine], ignore_index=True) if len(engine) else own
        parts = attr.attributed.iloc[row]
        out.append(
            _waterfall(label, req, frame, a_ns, {k: v / _NS_PER_MS for k, v in parts.items() if v})
        )
    return out


def _engine_rows(aligned: pa.Table, own: pd.DataFrame, a_ns: int, b_ns: int) -> pd.DataFrame:
    """The gpu spans of the request's chunk steps and the engine steps overlapping its
    window (what ran while it waited), of the services its chunks ran on."""
    chunks = own[own["stage"] == "prefill.chunk"]
    if chunks.empty:
        return own.iloc[:0]
    services = set(chunks["service"])
    steps = {_int_attr(a, ATTR_STEP_ID) for a in chunks["attributes"]} - {None}
    stage = aligned.column("stage")
    engine = aligned.filter(
        pc.and_(
            pc.is_in(aligned.column("service"), pa.array(sorted(services))),
            pc.is_in(pc.cast(stage, pa.string()), pa.array(["gpu", "step"])),
        )
    ).to_pandas()
    if engine.empty:
        return engine
    step_ids = np.array([_int_attr(a, ATTR_STEP_ID) for a in engine["attributes"]], dtype=object)
    is_gpu = (engine["stage"] == "gpu").to_numpy()
    near = (engine["end_ns"] > a_ns) & (engine["start_ns"] < b_ns)
    keep = (is_gpu & np.isin(step_ids, list(steps))) | (~is_gpu & near.to_numpy())
    return engine[keep]


def _int_attr(raw: Any, key: str) -> int | None:
    try:
        value = json.loads(raw).get(key) if isinstance(raw, str) else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


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


def _clock_kind(clock: str) -> str:
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
        return (_KIND_ORDER[_clock_kind(clock)], clock, int(n))

    return sorted(set(lanes), key=key)

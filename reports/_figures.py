"""The plotly figures of the HTML report, one function per figure, from `ReportData`.

Every title says what is shown and every axis its unit. Stages keep one colour across all
figures; clocks are told apart by the bars' fill pattern (client solid, host hatched, GPU
crossed) and by the lane labels.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ttft.reports._colours import colour
from ttft.reports.report_data import ReportData, Waterfall, lane_order
from ttft.tracer.schema import BOUNDARY_EVENTS, STAGE_BY_NAME, STAGE_NAMES

_PATTERN = {"client": "", "host": "/", "gpu": "x"}
_CONDITION_DASH = {"all": "dot", "cold": "solid", "prefix_hit": "dash"}
_LAYOUT = dict(
    template="plotly_white",
    font=dict(family="system-ui, -apple-system, Segoe UI, sans-serif", size=13),
    margin=dict(l=70, r=30, t=70, b=60),
    legend=dict(traceorder="normal"),
)


def _stage_order(stages) -> list[str]:
    rank = {s: i for i, s in enumerate(STAGE_NAMES)}
    return sorted(stages, key=lambda s: rank.get(s, len(rank)))


def _meaning(stage: str) -> str:
    s = STAGE_BY_NAME.get(stage)
    return s.meaning if s else stage


def stage_bars(data: ReportData) -> go.Figure:
    """Stacked bars: mean attributed ms per stage of the requests near p50, p90, p99 and
    of the tail, per condition; each stack sums to its band's mean TTFT."""
    fig = go.Figure()
    x_group, x_band, totals = [], [], []
    stages: set[str] = set()
    for group, bands in data.bands.items():
        stages.update(c for c in bands.columns if c not in ("requests", "ttft_ms"))
        for band, row in bands.iterrows():
            x_group.append(data.group_label[group])
            x_band.append(f"{band}<br>n={int(row['requests'])}")
            totals.append(row["ttft_ms"])
    for stage in _stage_order(stages):
        y = [
            float(bands.loc[band, stage]) if stage in bands.columns else 0.0
            for bands in data.bands.values()
            for band in bands.index
        ]
        fig.add_bar(
            x=[x_group, x_band],
            y=y,
            name=stage,
            marker_color=colour(stage),
            hovertemplate=f"<b>{stage}</b> %{{y:,.2f}} ms<br>{_meaning(stage)}<extra></extra>",
        )
    fig.add_scatter(
        x=[x_group, x_band],
        y=totals,
        mode="markers+text",
        text=[f"{t:,.1f}" for t in totals],
        textposition="top center",
        marker=dict(symbol="line-ew", size=18, color="#111", line=dict(width=2)),
        name="mean TTFT",
        hovertemplate="mean TTFT %{y:,.2f} ms<extra></extra>",
    )
    fig.update_layout(
        _LAYOUT,
        barmode="stack",
        title=f"Where TTFT goes at the {data.attribution.boundary} boundary: mean attributed "
        "ms per stage of the requests near each percentile",
        yaxis_title="attributed time (ms)",
        xaxis_title="requests near TTFT percentile (n = requests in the band)",
        height=520,
    )
    return fig


def ttft_cdf(data: ReportData) -> go.Figure:
    """TTFT CDF, one curve per condition (and all requests, dotted)."""
    fig = go.Figure()
    for group, values in data.cdf_ms.items():
        if group == "all" and len(data.cdf_ms) == 2:
            continue  # one condition only: its curve is the whole trace
        n = len(values)
        fig.add_scatter(
            x=values,
            y=np.arange(1, n + 1) / n,
            mode="lines",
            line=dict(shape="hv", dash=_CONDITION_DASH.get(group, "solid"), width=2),
            name=f"{data.group_label[group]} (n={n:,})",
            hovertemplate="TTFT %{x:,.2f} ms<br>fraction ≤: %{y:.3f}<extra></extra>",
        )
    fig.update_layout(
        _LAYOUT,
        title=f"TTFT distribution at the {data.attribution.boundary} boundary (CDF)",
        xaxis_title="TTFT (ms)",
        yaxis_title="fraction of requests with TTFT ≤ x",
        yaxis_range=[0, 1.02],
        height=420,
    )
    return fig


def waterfall(w: Waterfall, boundary: str) -> go.Figure:
    """One request's spans on lanes (overlaps on separate lanes), the TTFT window shaded,
    boundary events as vertical lines."""
    fig = go.Figure()
    spans = w.spans
    for stage in _stage_order(set(spans["stage"])):
        part = spans[spans["stage"] == stage]
        kinds = [_kind(c) for c in part["clock"]]
        fig.add_bar(
            y=part["lane"],
            x=(part["end_ms"] - part["start_ms"]).clip(lower=1e-3),
            base=part["start_ms"],
            orientation="h",
            name=stage,
            marker=dict(color=colour(stage), pattern_shape=[_PATTERN[k] for k in kinds]),
            customdata=np.stack(
                [part["name"], part["clock"], part["end_ms"] - part["start_ms"]], axis=1
            ),
            hovertemplate="<b>%{customdata[0]}</b> (" + stage + ")<br>clock %{customdata[1]}"
            "<br>%{base:,.3f} → %{x:,.3f} ms<br>duration %{customdata[2]:,.3f} ms"
            "<extra></extra>",
        )
    lo, hi = w.window_ms
    fig.add_vrect(x0=lo, x1=hi, fillcolor="#ffd166", opacity=0.15, line_width=0, layer="below")
    order = lane_order(spans["lane"])
    if w.events:
        first_lane = {}
        for lane in order:
            first_lane.setdefault(lane.rpartition(" · ")[0], lane)
        ys = [first_lane.get(clock) or f"{clock} · 1" for _, clock, _ in w.events]
        order += [y for y in dict.fromkeys(ys) if y not in order]
        boundary_event = [name in BOUNDARY_EVENTS for name, _, _ in w.events]
        fig.add_scatter(
            x=[t for _, _, t in w.events],
            y=ys,
            mode="markers+text",
            text=[name for name, _, _ in w.events],
            # Events of one lane alternate above and below, so near ones stay legible.
            textposition=[
                ("top left", "bottom left")[ys[:i].count(y) % 2] for i, y in enumerate(ys)
            ],
            textfont=dict(size=10),
            marker=dict(
                symbol="diamond",
                size=10,
                color=["#d00000" if b else "#555" for b in boundary_event],
                line=dict(color="#fff", width=1),
            ),
            name="events",
            customdata=[clock for _, clock, _ in w.events],
            hovertemplate="<b>%{text}</b> at %{x:,.3f} ms (clock %{customdata})<extra></extra>",
        )
    fig.add_vline(x=hi, line=dict(color="#d00000", width=1.5, dash="dot"))
    cond = w.condition or "condition unknown"
    fig.update_layout(
        _LAYOUT,
        title=f"The {w.label} request: TTFT {w.ttft_ms:,.2f} ms ({cond}), trace {w.trace_id[:12]}…",
        xaxis_title=f"ms from the start of the {boundary} window (shaded)",
        yaxis=dict(categoryorder="array", categoryarray=order[::-1], title="clock · lane"),
        # Focus on the window; spans running on past it (to the last byte) are cut off.
        xaxis_range=[
            min(lo, float(spans["start_ms"].min()) if len(spans) else lo) - 0.02 * hi,
            1.12 * hi,
        ],
        barmode="overlay",
        height=max(360, 190 + 24 * len(order)),
        legend=dict(orientation="h", y=-0.18, x=0),
        margin=dict(l=170, r=30, t=60, b=60),
    )
    return fig


def _kind(clock: str) -> str:
    if clock == "client":
        return "client"
    return "gpu" if clock.startswith("gpu:") else "host"


def blame(data: ReportData) -> go.Figure | None:
    """Horizontal stacked bars: what the engine ran while requests waited (queue, between
    chunks), mean ms per waiting request, per condition."""
    frame = data.blame
    if frame.empty:
        return None
    labels = [f"{r.condition} · {r.wait} (n={int(r.requests)})" for r in frame.itertuples()]
    fig = go.Figure()
    names = {
        "prefill": ("other requests' prefill", "#76b041"),
        "decode": ("other requests' decode", "#4a90d9"),
        "unknown": ("steps of unknown make-up", "#b8b08d"),
        "idle": ("idle: no engine step", "#cbd2d9"),
    }
    for kind, (name, fill) in names.items():
        values = frame[f"{kind}_ms_mean"]
        if not (values > 0).any():
            continue
        fig.add_bar(
            y=labels,
            x=values,
            orientation="h",
            name=name,
            marker_color=fill,
            hovertemplate="%{y}<br>" + name + ": %{x:,.2f} ms<extra></extra>",
        )
    fig.update_layout(
        _LAYOUT,
        barmode="stack",
        title="Wait blame: what the engine executed while requests waited (mean ms per request)",
        xaxis_title="mean wait per request (ms)",
        yaxis=dict(autorange="reversed"),
        height=max(300, 110 + 40 * len(labels)),
        margin=dict(l=230, r=30, t=70, b=60),
    )
    return fig


def prefill_scaling(data: ReportData) -> go.Figure | None:
    """Own prefill compute ms against prompt tokens computed, with the quadratic fit per
    condition."""
    points = data.prefill_points
    if points.empty:
        return None
    fig = go.Figure()
    for cond in sorted(set(points["condition"].dropna())):
        part = points[points["condition"] == cond]
        fig.add_scatter(
            x=part["computed_tokens"],
            y=part["compute_ns"] / 1e6,
            mode="markers",
            name=f"{cond} (n={len(part):,})",
            marker=dict(size=6, opacity=0.6),
            hovertemplate="%{x:,} tokens computed<br>%{y:,.2f} ms<extra></extra>",
        )
        fit = data.prefill_fits.get(cond)
        if fit is None:
            continue
        n = np.linspace(part["computed_tokens"].min(), part["computed_tokens"].max(), 100)
        fig.add_scatter(
            x=n,
            y=fit.predict_ns(n) / 1e6,
            mode="lines",
            name=f"{cond} fit: {fit.a_ns / 1e6:.3g} ms + {fit.b_ns_per_token / 1e3:.3g} µs·n "
            f"+ {fit.c_ns_per_token2:.3g} ns·n², R²={fit.r2:.3f}",
            line=dict(width=2),
            hoverinfo="skip",
        )
    fig.update_layout(
        _LAYOUT,
        title="Prefill compute time (the request's own chunks) vs prompt tokens computed",
        xaxis_title="prompt tokens computed (prompt − cached)",
        yaxis_title="prefill compute (ms)",
        legend=dict(orientation="h", y=-0.25),
        height=480,
    )
    return fig


def roofline(data: ReportData) -> go.Figure | None:
    """Each prefill chunk at its arithmetic intensity and achieved FLOP/s, per condition,
    under the traced device's roofline min(peak FLOP/s, intensity × bandwidth)."""
    found = data.regime
    if found is None or found.frame is None or found.frame.empty:
        return None
    frame = found.frame
    fig = go.Figure()
    for cond in sorted(set(frame["condition"].dropna())) or [None]:
        part = frame if cond is None else frame[frame["condition"] == cond]
        fig.add_scatter(
            x=part["intensity"],
            y=part["achieved_flops_per_s"] / 1e12,
            mode="markers",
            name=f"{cond or 'chunks'} (n={len(part):,})",
            marker=dict(size=7, opacity=0.7),
            customdata=np.stack([part["chunk_tokens"], part["context_before"]], axis=1),
            hovertemplate="%{customdata[0]:,} tokens after %{customdata[1]:,} in context"
            "<br>%{x:,.1f} FLOP/B<br>%{y:,.4f} TFLOP/s<extra></extra>",
        )
    peaks = found.peaks
    if peaks is not None:
        lo = float(frame["intensity"].min()) / 2
        hi = max(float(frame["intensity"].max()) * 2, peaks.ridge * 2)
        x = np.geomspace(max(lo, 1e-3), hi, 200)
        fig.add_scatter(
            x=x,
            y=np.minimum(peaks.flops_per_s, x * peaks.bytes_per_s) / 1e12,
            mode="lines",
            line=dict(color="#111", width=2),
            name=f"roofline: {peaks.flops_per_s / 1e12:,.3g} TFLOP/s, "
            f"{peaks.bytes_per_s / 1e9:,.3g} GB/s ({peaks.source})",
            hoverinfo="skip",
        )
        # A trace, not add_vline: plotly places shape annotations on log axes at 10**x.
        top = max(peaks.flops_per_s, float(frame["achieved_flops_per_s"].max())) / 1e12
        fig.add_scatter(
            x=[peaks.ridge, peaks.ridge],
            y=[top / 1e3, top],
            mode="lines",
            line=dict(color="#888", dash="dot", width=1),
            name=f"ridge {peaks.ridge:,.3g} FLOP/B (compute-bound to its right)",
            hoverinfo="skip",
        )
    device = peaks.device if peaks is not None else found.device_name or "unknown device"
    fig.update_layout(
        _LAYOUT,
        title=f"Prefill chunks on the roofline of {device}",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte moved)"),
        yaxis=dict(type="log", title="achieved TFLOP/s"),
        legend=dict(orientation="h", y=-0.22),
        height=480,
    )
    return fig

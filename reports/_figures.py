"""The plotly figures of the HTML report, one function per figure, from `ReportData`.

Every title says what is shown and every axis its unit. Stages keep one colour across all
figures; clocks are told apart by the bars' fill pattern (client solid, host hatched, GPU
crossed) and by the lane labels.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from ttft.reports._colours import colour
from ttft.reports.report_data import FIT_MIN_R2, ReportData, Waterfall
from ttft.reports.waterfall_lanes import clock_kind, lane_order
from ttft.tracer.schema import BOUNDARY_EVENTS, STAGE_BY_NAME, STAGE_NAMES

_PATTERN = {"client": "", "host": "/", "gpu": "x"}
_CONDITION_DASH = {"all": "dot", "cold": "solid", "prefix_hit": "dash"}
_LAYOUT = dict(
    template="plotly_white",
    font=dict(family="system-ui, -apple-system, Segoe UI, sans-serif", size=13),
    margin=dict(l=70, r=30, t=80, b=60),
    legend=dict(traceorder="normal"),
    # Axes grow their margins to fit tick labels and titles instead of cutting them.
    xaxis=dict(automargin=True),
    yaxis=dict(automargin=True),
)
# A horizontal legend at the bottom of the figure, below the axis title (not over it).
_BELOW = dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom")
# Waterfall event labels are laid out for the narrowest plot area (on a 900 px page), at
# one 10 px character's width, tried at these vertical offsets in turn, on lanes this high.
_PLOT_PX, _LABEL_PX, _SHIFTS_PX, _LANE_PX = 600, 6.5, (0, 16, -16), 48


def _plain(values):
    """Text from the trace as plotly shows it literally: plotly reads a subset of HTML in
    every label, hover and title (``<a href>``, ``<span style>``), so ``&``, ``<`` and ``>``
    go in as entities, which it shows as the characters. A string, or each of a sequence."""
    if isinstance(values, str):
        return html.escape(values, quote=False)
    return [html.escape(str(v), quote=False) for v in values]


def _title(what: str, detail: str = "") -> dict:
    """A title that fits a 900 px page: the headline, and its detail as a smaller subtitle."""
    title = dict(text=what, x=0.01, xanchor="left")
    if detail:
        title["subtitle"] = dict(text=detail, font=dict(size=12))
    return title


def _stage_order(stages) -> list[str]:
    rank = {s: i for i, s in enumerate(STAGE_NAMES)}
    return sorted(stages, key=lambda s: rank.get(s, len(rank)))


def _meaning(stage: str) -> str:
    s = STAGE_BY_NAME.get(stage)
    return s.meaning if s else stage


def stage_bars(data: ReportData) -> go.Figure:
    """Stacked bars: mean attributed ms per stage of the requests near p50, p90, p99 and
    of the tail, per condition; each stack sums to its band's mean TTFT.

    plotly orders each condition's bands by where a band label was first seen on the axis,
    so the labels are the same in every condition (an ``n=`` in them would shuffle the
    bands); the request counts are written at the mean-TTFT marks instead.
    """
    fig = go.Figure()
    x_group, x_band, totals, counts = [], [], [], []
    stages: set[str] = set()
    for group, bands in data.bands.items():
        stages.update(c for c in bands.columns if c not in ("requests", "ttft_ms"))
        for band, row in bands.iterrows():
            x_group.append(data.group_label[group].replace(" (", "<br>("))
            x_band.append(str(band).replace(" ", "<br>", 1))  # "tail<br>≥ p99": narrow
            totals.append(row["ttft_ms"])
            counts.append(int(row["requests"]))
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
        text=[  # short enough to sit above a bar at 900 px
            f"{t:,.0f}<br>n={n:,}" if t >= 100 else f"{t:.3g}<br>n={n:,}"
            for t, n in zip(totals, counts, strict=True)
        ],
        textposition="top center",
        textfont=dict(size=10),
        cliponaxis=False,
        marker=dict(symbol="line-ew", size=18, color="#111", line=dict(width=2)),
        name="band mean TTFT",
        customdata=counts,
        hovertemplate="mean TTFT %{y:,.2f} ms of %{customdata:,} requests<extra></extra>",
    )
    fig.update_layout(
        _LAYOUT,
        barmode="stack",
        title=_title(
            f"Where TTFT goes at the {data.attribution.boundary} boundary",
            "mean attributed ms per stage of the requests near each TTFT percentile",
        ),
        yaxis=dict(title="attributed time (ms)", range=[0, 1.18 * max(totals, default=1)]),
        xaxis=dict(
            title="requests near TTFT percentile (mark: their mean TTFT ms, n requests)",
            tickangle=0,  # the band labels fit level at 900 px; plotly would turn them
        ),
        height=540,
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
        title=_title(f"TTFT distribution at the {data.attribution.boundary} boundary (CDF)"),
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
        fig.add_bar(
            y=_plain(part["lane"]),
            x=(part["end_ms"] - part["start_ms"]).clip(lower=1e-3),
            base=part["start_ms"],
            orientation="h",
            name=stage,
            marker=dict(
                color=colour(stage), pattern_shape=[_PATTERN[clock_kind(c)] for c in part["clock"]]
            ),
            customdata=np.stack(
                [_plain(part["name"]), _plain(part["clock"]), part["end_ms"] - part["start_ms"]],
                axis=1,
            ),
            hovertemplate="<b>%{customdata[0]}</b> (" + stage + ")<br>clock %{customdata[1]}"
            "<br>%{base:,.3f} → %{x:,.3f} ms<br>duration %{customdata[2]:,.3f} ms"
            "<extra></extra>",
        )
    lo, hi = w.window_ms
    fig.add_vrect(x0=lo, x1=hi, fillcolor="#ffd166", opacity=0.15, line_width=0, layer="below")
    order = lane_order(spans["lane"])
    x_range = [
        min(lo, float(spans["start_ms"].min()) if len(spans) else lo) - 0.02 * hi,
        1.12 * hi,
    ]
    if w.events:
        ys = w.event_lanes
        order += [y for y in dict.fromkeys(ys) if y not in order]
        boundary_event = [name in BOUNDARY_EVENTS for name, _, _ in w.events]
        fig.add_scatter(
            x=[t for _, _, t in w.events],
            y=_plain(ys),
            mode="markers",
            marker=dict(
                symbol="diamond",
                size=10,
                color=["#d00000" if b else "#555" for b in boundary_event],
                line=dict(color="#fff", width=1),
            ),
            name="events",
            text=_plain([name for name, _, _ in w.events]),
            customdata=_plain([clock for _, clock, _ in w.events]),
            hovertemplate="<b>%{text}</b> at %{x:,.3f} ms (clock %{customdata})<extra></extra>",
        )
        for (name, _, t_ms), y, (shift, right) in zip(
            w.events, ys, _label_places(w.events, ys, x_range), strict=True
        ):
            fig.add_annotation(
                x=t_ms,
                y=_plain(y),
                text=_plain(name),
                showarrow=False,
                font=dict(size=10),
                bgcolor="rgba(255,255,255,0.75)",
                xanchor="right" if right else "left",
                xshift=-6 if right else 6,
                yshift=shift,
            )
    fig.add_vline(x=hi, line=dict(color="#d00000", width=1.5, dash="dot"))
    cond = w.condition or "condition unknown"
    fig.update_layout(
        _LAYOUT,
        title=_title(
            f"The {w.label} request: TTFT {w.ttft_ms:,.2f} ms ({cond})",
            _plain(w.tag),
        ),
        xaxis_title=f"ms from the start of the {boundary} window (shaded)",
        yaxis=dict(categoryorder="array", categoryarray=_plain(order[::-1]),
                   title="worker · lane"),
        # Focus on the window; spans running on past it (to the last byte) are cut off.
        xaxis_range=x_range,
        barmode="overlay",
        margin_l=170,
        **_legend_below(fig, max(300, 150 + _LANE_PX * len(order))),
    )
    return fig


def _label_places(
    events: list[tuple[str, str, float]], ys: list[str], x_range: list[float]
) -> list[tuple[int, bool]]:
    """``(vertical offset px, ends at its marker)`` per event label: a label on the right
    part of the axis ends at its marker (to stay inside), and its offset is the first of
    `_SHIFTS_PX` at which it clears every earlier label of its lane at that offset."""
    ms_per_px = (x_range[1] - x_range[0]) / _PLOT_PX
    taken: dict[tuple[str, int], list[tuple[float, float]]] = {}
    places: dict[int, tuple[int, bool]] = {}
    for i in sorted(range(len(events)), key=lambda i: events[i][2]):
        name, _, t_ms = events[i]
        width_ms = (len(name) * _LABEL_PX + 8) * ms_per_px
        right = t_ms > x_range[0] + 0.6 * (x_range[1] - x_range[0])
        box = (t_ms - width_ms, t_ms) if right else (t_ms, t_ms + width_ms)
        for shift in _SHIFTS_PX:
            boxes = taken.setdefault((ys[i], shift), [])
            if all(box[1] <= a or box[0] >= b for a, b in boxes):
                break
        boxes.append(box)
        places[i] = (shift, right)
    return [places[i] for i in range(len(events))]


def _legend_below(fig: go.Figure, height_px: int) -> dict:
    """Layout that puts ``fig``'s legend under its x axis title (as a page 900 px wide
    lays it out in rows), the figure ``height_px`` tall plus the legend."""
    rows, used = 1, 0
    for trace in fig.data:
        item = 50 + int(len(trace.name or "") * 7.2)
        if used and used + item > 820:
            rows, used = rows + 1, 0
        used += item
    legend_px = 24 * rows + 8
    return dict(legend=_BELOW, margin_b=60 + legend_px, height=height_px + legend_px)


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
        title=_title(
            "Wait blame", "what the engine executed while requests waited (mean ms per request)"
        ),
        xaxis_title="mean wait per request (ms)",
        yaxis=dict(autorange="reversed"),
        height=max(300, 110 + 40 * len(labels)),
        margin_l=230,
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
        fit = data.explaining_fits.get(cond)
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
        title=_title(
            "Prefill compute time vs prompt tokens computed",
            "the request's own chunks; fits drawn where R² ≥ "
            f"{FIT_MIN_R2:g}, over the lengths measured only",
        ),
        xaxis_title="prompt tokens computed (prompt − cached)",
        yaxis_title="prefill compute (ms)",
        **_legend_below(fig, 440),
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
            f"{peaks.bytes_per_s / 1e9:,.3g} GB/s ({_plain(peaks.source)})",
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
        title=_title(f"Prefill chunks on the roofline of {_plain(device)}"),
        xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte moved)"),
        yaxis=dict(type="log", title="achieved TFLOP/s"),
        **_legend_below(fig, 440),
    )
    return fig

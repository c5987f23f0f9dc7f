"""A load sweep (``ttft sweep``'s ``sweep.json``) in the terminal and as a self-contained
HTML page: where TTFT goes as load rises, beside throughput and goodput, the knee marked.

Every figure comes from the sweep summary as written (``reports/runs/sweep.py``); nothing is
recomputed here. The page inlines the same vendored plotly.js basic bundle as the trace
report (`ttft.reports.html_report.plotly_js`), once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from rich.console import Console
from rich.text import Text

from ttft.reports import _figures
from ttft.reports._colours import colour
from ttft.reports._html import _CSS, _e, _figure, _rows, folded
from ttft.reports._text import plain
from ttft.reports.html_report import plotly_js
from ttft.reports.terminal import FittedTable
from ttft.reports.terminal_report import _fitted_bars, _legend, _stacked
from ttft.reports.views.metadata import metadata_rows
from ttft.tracer.schema import STAGE_NAMES

__all__ = ["goodput_figure", "knee_text", "level_text", "render_sweep", "render_sweep_html",
           "stack_figure", "step_table", "throughput_figure", "write_sweep_html"]

STACK_TITLE = "Where TTFT goes as load rises"
THROUGHPUT_TITLE = "Throughput as load rises"
GOODPUT_TITLE = "Goodput as load rises"
_THROUGHPUT_PX = 560
"""Height of the throughput figure: two panels of about the other charts' plot height."""
_UNIT = {"rate": "req/s", "concurrency": "in flight"}
_SHORT = {"TTFT p50 ms": "p50 ms", "TTFT p99 ms": "p99 ms", "output tok/s": "tok/s",
          "goodput": "good", "failed": "fail", "concurrency": "conc."}


def level_text(mode: str, level: float) -> str:
    """``rate 2 req/s`` or ``concurrency 4 in flight``."""
    return f"{mode} {level:g} {_UNIT[mode]}"


def _number(value: float | None, digits: str = ",.1f") -> str:
    return "–" if value is None else format(value, digits)


def step_table(steps: list[dict[str, Any]], mode: str, *, slo: bool,
               knee: float | None = None, title: str | None = None) -> FittedTable:
    """A row per step: its level, TTFT p50 and p99, request and output-token throughput,
    goodput (with SLOs), failures (count and share), and its status where it did not run
    whole (its error in the caption); the knee's row marked ``◆ knee``. Fits the console it
    is drawn in: headers shortened, then wrapped, numbers never cut."""
    table = FittedTable(title=title, title_justify="left", short=_SHORT)
    table.add_column("step", justify="right")
    table.add_column(mode, justify="right")
    for name in ("TTFT p50 ms", "TTFT p99 ms", "req/s", "output tok/s"):
        table.add_column(name, justify="right")
    if slo:
        table.add_column("goodput", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("status")
    errors = []
    for step in steps:
        ttft = step["ttft_ms"] or {}
        put = step["throughput"] or {}
        failures = step["failures"]
        row = [f"{step['index']}", f"{step['level']:g}", _number(ttft.get("p50")),
               _number(ttft.get("p99")), _number(put.get("requests_per_s"), ",.2f"),
               _number(put.get("output_tokens_per_s"))]
        if slo:
            good = step["goodput"]
            row.append("–" if not good else f"{good['share']:.0%}")
        row.append("–" if not failures
                   else f"{failures['count']} ({failures['rate']:.0%})")
        status = "◆ knee" if knee is not None and step["level"] == knee else ""
        if step["status"] != "ok":  # the error goes below: a URL in a cell would not wrap
            status = step["status"]
            errors.append(f"step {step['index']} {step['status']}: {step['error']}")
        table.add_row(*row, plain(status, "bold red" if step["status"] != "ok" else "bold"))
    if errors:
        table.caption = plain("\n".join(errors), "red")
        table.caption_justify = "left"
    return table


def _stack_table(steps: list[dict[str, Any]], mode: str, bar_chars: int) -> FittedTable:
    ran = [s for s in steps if s["stack"] and s["stack"]["p50_ttft_ms"] is not None]
    scale = max((s["stack"]["p50_ttft_ms"] for s in ran), default=0.0)
    table = FittedTable(
        title=f"{STACK_TITLE.lower()}: ms per stage of the requests near TTFT p50",
        title_justify="left", caption="bars share one scale", caption_justify="left")
    table.add_column(mode, justify="right")
    table.add_column("p50 ms", justify="right")
    table.add_column("stages", no_wrap=True)
    table.add_column("largest parts")
    stages: set[str] = set()
    for step in ran:
        parts = step["stack"]["p50"]
        stages.update(s for s, v in parts.items() if v > 0)
        top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
        total = step["stack"]["p50_ttft_ms"]
        table.add_row(f"{step['level']:g}", f"{total:,.1f}",
                      _stacked(parts, total, scale, bar_chars),
                      plain(", ".join(f"{s} {v:,.1f}" for s, v in top if v > 0)))
    table.caption = Text.assemble(table.caption, "\n", _legend(stages))
    return table


def _heading(sweep: dict[str, Any]) -> Text:
    slo = sweep["slo"]
    limits = ", ".join(f"{k} ≤ {v:,.4g} ms" for k, v in slo.items()) if slo else "none"
    prompts = "the same prompts every step" if sweep["same_prompts"] else "fresh prompts per step"
    return plain(f"load sweep of {sweep['url']}: {sweep['mode']} "
                 f"{', '.join(f'{x:g}' for x in sweep['levels'])} ({_UNIT[sweep['mode']]}); "
                 f"{prompts} (base seed {sweep['base_seed']}); SLO {limits}")


def knee_text(sweep: dict[str, Any]) -> str:
    """The knee line: its level and why, as ``sweep.json`` states it."""
    knee = sweep["knee"]
    where = "none" if knee["level"] is None else level_text(sweep["mode"], knee["level"])
    return f"knee: {where} ({knee['reason']})"


def render_sweep(sweep: dict[str, Any], console: Console) -> None:
    """The sweep in the terminal: what was swept, the steps' table, the stacks of where
    TTFT goes at each level (letters as well as colours), and the knee."""
    console.print(_heading(sweep), soft_wrap=False)
    console.print(step_table(sweep["steps"], sweep["mode"], slo=bool(sweep["slo"]),
                             knee=sweep["knee"]["level"], title="steps"))
    if any(s["stack"] for s in sweep["steps"]):
        console.print(_fitted_bars(
            lambda chars: _stack_table(sweep["steps"], sweep["mode"], chars), console))
    console.print(plain(knee_text(sweep), "bold"))
    if sweep["stopped"]:
        console.print(plain(f"stopped early: {sweep['stopped']}", "yellow"))
    if not sweep["finished"]:
        console.print(plain("the sweep did not finish: these are the steps it recorded",
                            "yellow"))


def _labels(steps: list[dict[str, Any]]) -> list[str]:
    return [f"{s['level']:g}" for s in steps]


def _mark_knee(fig: go.Figure, sweep: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """A shaded column and a label at the knee's level. On a category axis a number is a
    category's index (a label like ``"8"`` would be read as index 8, not as that label)."""
    levels = [s["level"] for s in steps]
    if sweep["knee"]["level"] not in levels:
        return
    at = levels.index(sweep["knee"]["level"])
    fig.add_shape(type="rect", xref="x", yref="paper", x0=at - 0.45, x1=at + 0.45, y0=0,
                  y1=1, fillcolor="rgba(179,38,30,0.08)", line=dict(color="#b3261e",
                                                                   dash="dash", width=1),
                  layer="below")
    fig.add_annotation(x=at, xref="x", y=1, yref="paper", yanchor="bottom", showarrow=False,
                       text="knee", font=dict(color="#b3261e"))


def _axes(fig: go.Figure, sweep: dict[str, Any], steps: list[dict[str, Any]], title: str,
          detail: str, y: str) -> None:
    """Layout, titles and axes of a chart against load: one category per step (the
    range padded half a category each side, so the knee's column stays inside)."""
    fig.update_layout(
        _figures._LAYOUT, title=_figures._title(title, detail), height=460,
        xaxis=dict(title=f"{sweep['mode']} ({_UNIT[sweep['mode']]})", type="category",
                   range=[-0.5, len(steps) - 0.5]),
        yaxis=dict(title=y, rangemode="tozero"),
    )


def stack_figure(sweep: dict[str, Any]) -> go.Figure:
    """Stacked bars: ms per stage of the requests near TTFT p50 at each level (each stack
    sums to their mean TTFT, the black mark), the knee marked."""
    steps = [s for s in sweep["steps"] if s["stack"] and s["stack"]["p50_ttft_ms"] is not None]
    x = _labels(steps)
    fig = go.Figure()
    stages = {st for s in steps for st, v in s["stack"]["p50"].items() if v > 0}
    for stage in (s for s in STAGE_NAMES if s in stages):
        fig.add_bar(x=x, y=[s["stack"]["p50"].get(stage, 0.0) for s in steps], name=stage,
                    marker_color=colour(stage),
                    hovertemplate=f"<b>{stage}</b> %{{y:,.2f}} ms<extra></extra>")
    fig.add_scatter(x=x, y=[s["stack"]["p50_ttft_ms"] for s in steps], mode="markers",
                    name="their mean TTFT",
                    marker=dict(symbol="line-ew", size=18, color="#111", line=dict(width=2)),
                    hovertemplate="mean TTFT %{y:,.2f} ms<extra></extra>")
    _axes(fig, sweep, steps, STACK_TITLE, "mean attributed ms per stage of the requests near "
          "TTFT p50, at each load level", "attributed time (ms)")
    fig.update_layout(barmode="stack")
    _mark_knee(fig, sweep, steps)
    return fig


def throughput_figure(sweep: dict[str, Any]) -> go.Figure:
    """Two panels against load on one x axis: completed requests/s and goodput requests/s
    above, output tokens/s below, each on its own y axis in its unit, the knee marked. (At
    a fixed output length tokens/s is requests/s times that length: two lines on one plot,
    each axis scaled to its own maximum, would lie exactly on top of each other.)"""
    steps = [s for s in sweep["steps"] if s["throughput"]]
    x = _labels(steps)
    fig = go.Figure()
    fig.add_scatter(x=x, y=[s["throughput"]["requests_per_s"] for s in steps],
                    mode="lines+markers", name="completed requests/s")
    if sweep["slo"]:
        fig.add_scatter(x=x, y=[(s["goodput"] or {}).get("per_s") for s in steps],
                        mode="lines+markers", name="requests/s meeting the SLO")
    fig.add_scatter(x=x, y=[s["throughput"]["output_tokens_per_s"] for s in steps],
                    mode="lines+markers", name="output tokens/s (lower panel)", yaxis="y2",
                    line=dict(color="#7b4fb3"))
    _axes(fig, sweep, steps, THROUGHPUT_TITLE, "from each step's client spans: requests "
          "above, output tokens below", "requests/s")
    fig.update_layout(
        height=_THROUGHPUT_PX, legend=_figures._BELOW,
        xaxis=dict(anchor="y2"),  # the level axis under the lower panel, shared by both
        yaxis=dict(domain=[0.56, 1.0]),
        yaxis2=dict(title="output tokens/s", domain=[0.0, 0.44], anchor="x",
                    rangemode="tozero", automargin=True),
    )
    _mark_knee(fig, sweep, steps)
    return fig


def goodput_figure(sweep: dict[str, Any]) -> go.Figure | None:
    """Goodput share (requests meeting every SLO) against load with the target and the
    knee; None without SLOs."""
    if not sweep["slo"]:
        return None
    steps = [s for s in sweep["steps"] if s["goodput"]]
    x = _labels(steps)
    fig = go.Figure()
    fig.add_scatter(x=x, y=[100 * s["goodput"]["share"] for s in steps],
                    mode="lines+markers", name="goodput (% of requests)")
    fig.add_scatter(x=x, y=[100 * sweep["goodput_target"]] * len(x), mode="lines",
                    name=f"target {sweep['goodput_target']:.0%}",
                    line=dict(dash="dash", color="#7b8794"))
    limits = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:,.4g} ms" for k, v in sweep["slo"].items())
    _axes(fig, sweep, steps, GOODPUT_TITLE, f"share of requests meeting {limits}", "goodput (%)")
    fig.update_layout(yaxis=dict(range=[0, 105]), legend=_figures._BELOW)
    _mark_knee(fig, sweep, steps)
    return fig


def _steps_html(sweep: dict[str, Any]) -> str:
    head = ["step", sweep["mode"], "TTFT p50 ms", "TTFT p99 ms", "req/s", "output tok/s",
            "goodput", "failed", "status"]
    rows = []
    for s in sweep["steps"]:
        ttft, put, good = s["ttft_ms"] or {}, s["throughput"] or {}, s["goodput"]
        failed = s["failures"]
        cells = [s["index"], f"{s['level']:g}", _number(ttft.get("p50"), ",.2f"),
                 _number(ttft.get("p99"), ",.2f"), _number(put.get("requests_per_s"), ",.3g"),
                 _number(put.get("output_tokens_per_s"), ",.4g"),
                 f"{good['share']:.1%}" if good else "–",
                 f"{failed['count']} ({failed['rate']:.0%})" if failed else "–",
                 s["status"] if s["status"] != "ok" else f"ok · {s['trace']}"]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f'<table id="steps"><tr>{header}</tr>{"".join(rows)}</table>'


def _settings(sweep: dict[str, Any]) -> list[tuple[str, str]]:
    """The sweep's settings as key / value rows (the workload's keys as ``workload.KEY``)."""
    keys = ("url", "mode", "levels", "base_seed", "same_prompts", "slo", "goodput_target")
    return metadata_rows({**{key: sweep[key] for key in keys}, "workload": sweep["workload"]})


def _settings_line(sweep: dict[str, Any]) -> str:
    """The folded settings' one-line summary: the workload per step, and how many settings
    the table holds."""
    work = sweep["workload"]
    shown = [f"{'–'.join(map(str, v)) if isinstance(v, list) else v} {what}"
             for key, what in (("requests", "requests per step"),
                               ("prompt_tokens", "prompt tokens"),
                               ("output_tokens", "output tokens"))
             if (v := work.get(key)) is not None]
    return "; ".join([*shown, f"{len(_settings(sweep)):,} settings in all"])


def render_sweep_html(sweep: dict[str, Any]) -> str:
    """The sweep's page as one string: the steps' table, the three charts (stacked
    attribution, throughput, goodput against load), the knee and the sweep's settings."""
    sections = [
        f"<h1>{_e(STACK_TITLE)}</h1>",
        f'<div class="sub">{_e(_heading(sweep).plain)}</div>',
        f'<p class="note"><b>{_e(knee_text(sweep))}</b></p>',
        _steps_html(sweep),
        _figure(stack_figure(sweep), "sweep-stack", ""),
        '<p class="note">Each stack is the mean attributed time of a step\'s requests in a '
        "band around its TTFT p50, so it sums to their mean TTFT (the black mark).</p>",
        _figure(throughput_figure(sweep), "sweep-throughput", ""),
        _figure(goodput_figure(sweep), "sweep-goodput",
                f"{GOODPUT_TITLE}: no --slo was given, so no goodput and no knee."),
        "<h2>Sweep settings</h2>",
        folded(_settings_line(sweep), _rows(_settings(sweep), "<tr><th>setting</th>"
                                            "<th>value</th></tr>", ' id="settings"'),
               "settings-fold"),
    ]
    if sweep["stopped"]:
        sections.insert(3, f'<p class="failures">stopped early: {_e(sweep["stopped"])}</p>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>ttft sweep: {_e(sweep['url'])}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{_CSS}</style><script>{plotly_js()}</script></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )


def write_sweep_html(path: str | Path, sweep: dict[str, Any]) -> int:
    """Write the sweep's page to ``path``; returns its size in bytes."""
    page = render_sweep_html(sweep)
    Path(path).write_text(page, encoding="utf-8")
    return len(page.encode("utf-8"))

"""The self-contained HTML latency report: one file, plotly's JavaScript inlined, no network.

Every string that comes from the trace (span names, metadata, paths) is HTML-escaped, and
figure data is JSON that cannot close its ``<script>`` element, so a hostile trace cannot
inject markup into the page.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from ttft.analysis.quality import MEANING
from ttft.reports import _figures
from ttft.reports._colours import colour
from ttft.reports.report_data import ReportData

_CONFIG = {"displaylogo": False, "responsive": True}
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       background: #f5f7fa; color: #1f2933; }
main { max-width: 1180px; margin: 0 auto; padding: 24px; }
h1 { margin: 0 0 4px; font-size: 26px; } h2 { margin: 32px 0 8px; font-size: 20px; }
.sub { color: #52606d; margin-bottom: 18px; }
.cards { display: flex; flex-wrap: wrap; gap: 14px; }
.card { background: #fff; border-radius: 10px; padding: 14px 18px; min-width: 250px;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); flex: 1; }
.card h3 { margin: 0 0 6px; font-size: 15px; color: #52606d; font-weight: 600; }
.big { font-size: 28px; font-weight: 700; } .unit { font-size: 14px; color: #52606d; }
.pcts span { margin-right: 14px; } .biggest { margin-top: 8px; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
          margin-right: 5px; vertical-align: -1px; }
.panel { background: #fff; border-radius: 10px; padding: 8px; margin: 14px 0;
         box-shadow: 0 1px 3px rgba(0,0,0,.12); }
table { border-collapse: collapse; background: #fff; font-size: 13px; width: 100%; }
th, td { padding: 5px 10px; border-bottom: 1px solid #e4e7eb; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.text { text-align: left; } tr.total td { font-weight: 700; border-top: 2px solid #9aa5b1; }
.note { color: #52606d; font-size: 13px; margin: 6px 0 0; }
.ok { color: #2f8132; } .warn { color: #b44d12; }
.failures { color: #b3261e; font-weight: 600; margin-bottom: 4px; }
pre { background: #fff; padding: 12px; border-radius: 8px; overflow-x: auto; font-size: 12px; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _figure(fig: go.Figure | None, div_id: str, empty: str) -> str:
    if fig is None:
        return f'<p class="note">{_e(empty)}</p>'
    body = fig.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG, div_id=div_id)
    return f'<div class="panel">{body}</div>'


def _headline(data: ReportData) -> str:
    summary = data.summary
    cards = []
    for group, mask in data.groups.items():
        part = summary.group(group)
        ttft = part["ttft_ms"]
        stages = part["stages"]
        biggest = max(stages.items(), key=lambda kv: kv[1]["share"]) if stages else None
        big = (
            f'<div class="biggest"><span class="swatch" style="background:'
            f'{colour(biggest[0])}"></span>biggest stage: <b>{_e(biggest[0])}</b> '
            f"{biggest[1]['share']:.1%} of TTFT, {_ms(biggest[1]['mean'])} ms mean</div>"
            if biggest
            else ""
        )
        cards.append(
            f'<div class="card"><h3>{_e(data.group_label[group])}</h3>'
            f"{_failures(part['failures'], int(mask.sum()))}"
            f'<div><span class="big">{_ms(ttft["p50"])}</span> <span class="unit">ms TTFT '
            f"p50 · {int(mask.sum()):,} ok requests</span></div>"
            f'<div class="pcts"><span>p90 <b>{_ms(ttft["p90"])}</b> ms</span>'
            f"<span>p99 <b>{_ms(ttft['p99'])}</b> ms</span></div>{big}</div>"
        )
    return f'<div class="cards">{"".join(cards)}</div>'


def _failures(failures: dict[str, int], ok: int) -> str:
    """A headline's failure line (first, in red): count and share of each kind."""
    failed = sum(failures.values())
    if not failed:
        return '<div class="ok">no failed requests</div>'
    total = failed + ok
    kinds = ", ".join(f"{_e(kind)} {n:,}" for kind, n in failures.items())
    return (
        f'<div class="failures">{failed:,} of {total:,} requests failed '
        f"({failed / total:.1%}): {kinds}</div>"
    )


def _raw_table(data: ReportData) -> str:
    stages = data.summary.stages
    if not stages:
        return '<p class="note">No request has a TTFT window at this boundary.</p>'
    rows = []
    raw_total = att_total = 0.0
    for stage, row in sorted(stages.items(), key=lambda kv: -kv[1]["raw_mean"]):
        raw_total += row["raw_mean"]
        att_total += row["mean"]
        rows.append(
            f'<tr><td><span class="swatch" style="background:{colour(stage)}"></span>'
            f"{_e(stage)}</td><td>{_ms(row['raw_mean'])}</td><td>{_ms(row['mean'])}</td>"
            f"<td>{_ms(row['overlap_mean'])}</td><td>{row['share']:.1%}</td></tr>"
        )
    rows.append(
        f'<tr class="total"><td>sum</td><td>{_ms(raw_total)}</td><td>{_ms(att_total)}</td>'
        f"<td>{_ms(raw_total - att_total)}</td><td></td></tr>"
    )
    ttft_mean = data.summary.ttft_ms["mean"]
    return (
        "<table><tr><th>stage</th><th>raw mean ms (durations clipped to the window)</th>"
        "<th>attributed mean ms</th><th>overlap ms (double counting avoided)</th>"
        f"<th>share of TTFT</th></tr>{''.join(rows)}</table>"
        f'<p class="note">Adding the stages\' durations would give {_ms(raw_total)} ms per '
        f"request; the mean TTFT is {_ms(ttft_mean)} ms, which the attributed parts sum to "
        "exactly. Stages and spans overlap (nesting, CPU/GPU asynchrony, batching, the "
        "client's and the server's view of one interval).</p>"
    )


def _regime_missing(data: ReportData) -> str:
    found = data.regime
    if found is None or found.frame is None:
        return (
            "The trace does not say which model it ran (no model_config in its metadata, no "
            "engine_info event): pass --model-config FILE.json to see each prefill chunk's "
            "regime."
        )
    return "The trace has no prefill.chunk spans."


def _regime_table(data: ReportData) -> str:
    found = data.regime
    if found is None or found.summary is None or found.summary.empty:
        return ""
    rows = []
    for r in found.summary.itertuples(index=False):
        pct = f"{r.roofline_fraction:.0%}" if r.roofline_fraction == r.roofline_fraction else "-"
        rows.append(
            f"<tr><td>{_e(r.condition)}</td><td>{_e(r.chunk_bucket)}</td><td>{r.chunks:,}</td>"
            f"<td>{r.median_intensity:,.3g}</td><td>{_e(r.bound or '-')}</td><td>{pct}</td>"
            f"<td>{r.achieved_flops_per_s / 1e9:,.3g}</td></tr>"
        )
    if found.peaks is None:
        where = (
            "No peaks for this device (none measured in the trace, not a known GPU): pass "
            "--peak-tflops and --peak-bandwidth-gbs to place the chunks against a roofline."
        )
    else:
        where = (
            f"Peaks: {found.peaks.flops_per_s / 1e12:,.3g} TFLOP/s and "
            f"{found.peaks.bytes_per_s / 1e9:,.3g} GB/s, {_e(found.peaks.device)} "
            f"({_e(found.peaks.source)}); never taken from the machine making this report."
        )
    return (
        "<table><tr><th>condition</th><th>chunk tokens</th><th>chunks</th>"
        "<th>median FLOP/B</th><th>bound</th><th>of roofline</th><th>achieved GFLOP/s</th>"
        f'</tr>{"".join(rows)}</table><p class="note">{where}</p>'
    )


def _quality(data: ReportData) -> str:
    counts = {k: v for k, v in data.summary.quality.items() if v}
    examples = data.attribution.quality.examples
    parts = []
    if not counts:
        parts.append('<p class="ok">No defects found.</p>')
    else:
        rows = "".join(
            f"<tr><td>{_e(defect)}</td><td>{count:,}</td><td class='text'>"
            f"{_e(MEANING.get(defect, ''))}</td><td class='text'>"
            f"{_e(', '.join(examples.get(defect, [])[:3]))}</td></tr>"
            for defect, count in counts.items()
        )
        parts.append(
            "<table><tr><th>defect</th><th>count</th><th>meaning</th><th>examples</th></tr>"
            f"{rows}</table>"
        )
    for c in data.summary.clocks or []:
        state = "applied" if c["applied"] else "not applied"
        parts.append(
            f'<p class="warn">clocks: {_e(c["server_clock"])} → {_e(c["client_clock"])}: '
            f"offset {c['offset_ms']:+,.3f} ms {state} (estimate {c['estimate_ms']:+,.3f} ms, "
            f"spread {c['spread_ms']:,.3f} ms over {c['requests']:,} requests)</p>"
        )
    for note in data.notes:
        parts.append(f'<p class="note">{_e(note)}</p>')
    return "".join(parts)


def _metadata(data: ReportData) -> str:
    text = json.dumps(data.metadata, indent=2, sort_keys=True, default=str)
    return f"<pre>{_e(text)}</pre>"


def _version() -> str:
    try:
        return version("ttft")
    except PackageNotFoundError:
        return "unknown"


def render_html(data: ReportData) -> str:
    """The whole report page as one string (plotly's JavaScript inlined)."""
    boundary = data.attribution.boundary
    s = data.summary
    waterfalls = "".join(
        _figure(_figures.waterfall(w, boundary), f"waterfall-{w.label}", "")
        for w in data.waterfalls
    )
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        "<h1>Where did the time to first token go?</h1>",
        f'<div class="sub">{_e(data.trace)} · boundary <b>{_e(boundary)}</b> · policy '
        f"<b>{_e(s.policy)}</b> · {s.requests:,} requests with a window · ttft "
        f"{_e(_version())} · {made}</div>",
        _headline(data),
        "<h2>Where TTFT goes</h2>",
        _figure(_figures.stage_bars(data), "stage-bars", "No request has a window."),
        '<p class="note">Each stack is the mean attributed time of the requests in a band '
        "around the percentile, so it sums to that band's mean TTFT (the black mark); "
        "per-stage percentiles would not add up.</p>",
        "<h2>TTFT distribution</h2>",
        _figure(_figures.ttft_cdf(data), "ttft-cdf", "No request has a window."),
        "<h2>Requests up close</h2>",
        waterfalls or '<p class="note">No request has a window.</p>',
        '<p class="note">Bars: solid = client clock, hatched = server host clock, crossed = '
        "GPU clock; overlapping spans of a clock sit on separate lanes. Dotted red lines mark "
        "the boundary events, the shaded band the TTFT window.</p>",
        "<h2>Wait blame</h2>",
        _figure(
            _figures.blame(data),
            "blame",
            "No queue or between-chunk waits in this trace (it needs queue, prefill.chunk "
            "and step spans).",
        ),
        "<h2>Prefill scaling</h2>",
        _figure(
            _figures.prefill_scaling(data),
            "prefill-scaling",
            "No prefill.chunk spans with chunk_tokens in this trace.",
        ),
        "<h2>Prefill regime</h2>",
        _figure(_figures.roofline(data), "roofline", _regime_missing(data)),
        _regime_table(data),
        "<h2>Raw durations against attributed time</h2>",
        _raw_table(data),
        "<h2>Data quality</h2>",
        _quality(data),
        "<h2>Run metadata</h2>",
        _metadata(data),
    ]
    script = get_plotlyjs()
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>ttft report: {_e(Path(data.trace).name)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{_CSS}</style><script>{script}</script></head>"
        f"<body><main>{''.join(sections)}</main></body></html>\n"
    )


def write_html(path: Path, data: ReportData) -> int:
    """Write the report to ``path``; returns its size in bytes."""
    page = render_html(data)
    path.write_text(page, encoding="utf-8")
    return len(page.encode("utf-8"))

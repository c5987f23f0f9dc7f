"""The self-contained HTML latency report: one file, plotly's JavaScript inlined, no network.

The JavaScript is plotly's basic bundle (scatter and bar traces, the only ones the report
draws), vendored as ``assets/plotly-basic.min.js`` at the plotly.js version the installed
plotly package bundles (`PLOTLY_JS_VERSION`), and inlined once per page.

Every string that comes from the trace (span names, metadata, paths) is HTML-escaped, and
figure data is JSON that cannot close its ``<script>`` element, so a hostile trace cannot
inject markup into the page.
"""

from __future__ import annotations

from datetime import datetime, timezone
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

from ttft.analysis.quality import MEANING
from ttft.analysis.regime import RegimeResult
from ttft.reports import _figures
from ttft.reports._colours import colour
from ttft.reports._html import _CSS, _e, _figure, _ms, _rows, folded
from ttft.reports._text import moved_in_all, spread_words
from ttft.reports.report_data import FIT_MIN_R2, ReportData
from ttft.reports.views.metadata import metadata_rows, metadata_summary
from ttft.reports.views.regime import ABOVE_PEAK, excess_line
from ttft.reports.views.transfer import transfer_html

PLOTLY_JS_VERSION = "4.1.1"
"""The plotly.js version of the vendored bundle: the one ``plotly.offline.get_plotlyjs_version``
of the plotly package the report is built with returns (a test pins the two together). To
move it, ``npm pack plotly.js-basic-dist-min@VERSION`` and copy the tarball's
``plotly-basic.min.js`` and ``LICENSE`` into ``assets/``."""


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
            f"{_left_out(summary.quality.get('no_window', 0) if group == 'all' else 0)}"
            + ('<div><span class="unit">no TTFT: no request that did not fail has a window '
               "at this boundary</span></div></div>" if ttft is None else
               f'<div><span class="big">{_ms(ttft["p50"])}</span> <span class="unit">ms TTFT '
               f"p50 · {int(mask.sum()):,} ok requests</span></div>"
               f'<div class="pcts"><span>p90 <b>{_ms(ttft["p90"])}</b> ms</span>'
               f"<span>p99 <b>{_ms(ttft['p99'])}</b> ms</span></div>{big}</div>")
        )
    return f'<div class="cards">{"".join(cards)}{_load(data)}</div>'


def _load(data: ReportData) -> str:
    """A headline card of the summary's ``load`` and ``goodput``, each where it has them
    (a figure it lacks, None, is left out)."""
    summary = data.summary.to_dict()
    load, good = summary.get("load") or {}, summary.get("goodput") or {}
    if not load and not good:
        return ""
    lines = []
    if load.get("requests_per_s") is not None:
        lines.append(
            f'<span class="big">{load["requests_per_s"]:,.3g}</span> <span class="unit">'
            f"requests/s · {load['requests']:,} completed in {load['duration_s']:,.3g} s</span>"
        )
    if load.get("output_tokens_per_s") is not None:
        lines.append(f"output <b>{load['output_tokens_per_s']:,.4g}</b> tokens/s")
    if load.get("content_filter"):
        lines.append(f"{load['content_filter']:,} ended by the content filter")
    e2e = load.get("e2e_ms")
    if e2e:
        lines.append(
            f"end to end p50 <b>{_ms(e2e['p50'])}</b> ms · p99 <b>{_ms(e2e['p99'])}</b> ms"
        )
    if good:
        slo = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:,.4g} ms" for k, v in good["slo"].items())
        rate = f", {good['per_s']:,.3g}/s" if good.get("per_s") is not None else ""
        lines.append(
            f"goodput <b>{good['share']:.1%}</b> ({good['requests']:,} requests{rate}) "
            f"meet {_e(slo)}"
        )
        if good.get("ttft_stages"):
            from ttft.reports.terminal import slo_stages_text

            lines.append(f'<span class="unit">{_e(slo_stages_text(good["ttft_stages"]))}</span>')
    body = "".join(f"<div>{line}</div>" for line in lines)
    return f'<div class="card load"><h3>load</h3>{body}</div>'


def _left_out(count: int) -> str:
    """The requests that did not fail but have no window at the boundary (``no_window``)."""
    text = f"{count:,} more requests left out: no TTFT window at this boundary"
    return f'<div class="unit">{text}</div>' if count else ""


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
    ttft_mean = data.summary.ttft_ms["mean"]  # stages exist: some request has a TTFT
    table = (
        "<table><tr><th>stage</th><th>raw mean ms (durations clipped to the window)</th>"
        "<th>attributed mean ms</th><th>overlap ms (double counting avoided)</th>"
        f"<th>share of TTFT</th></tr>{''.join(rows)}</table>"
    )
    return (
        folded(f"per stage: {len(stages):,} stages, raw against attributed mean ms, their "
               "overlap and share of TTFT", table, "raw-fold")
        + f'<p class="note">Adding the stages\' durations would give {_ms(raw_total)} ms per '
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
        pct = ABOVE_PEAK if r.above_roofline else pct
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
    table = (
        "<table><tr><th>condition</th><th>chunk tokens</th><th>chunks</th>"
        "<th>median FLOP/B</th><th>bound</th><th>of roofline</th><th>achieved GFLOP/s</th>"
        f'</tr>{"".join(rows)}</table>'
    )
    return (folded(_regime_fold(found), table, "regime-fold")
            + f'<p class="note">{where}</p>{_above_roofline(found)}')


def _regime_fold(found: RegimeResult) -> str:
    """The regime table's one-line summary: its rows and chunks, and how many rows each
    bound has."""
    bounds = found.summary["bound"].fillna("-").value_counts()
    each = ", ".join(f"{n:,} {bound}" for bound, n in sorted(bounds.items()))
    rows, chunks = len(found.summary), int(found.summary["chunks"].sum())
    return (f"per condition and chunk size: {rows:,} row{'' if rows == 1 else 's'} over "
            f"{chunks:,} chunks (bound: {each})")


def _above_roofline(found: RegimeResult) -> str:
    """A warning when chunks ran above their roofline (`RegimeResult.excess`): the peaks
    understate what the device did, so the fractions and bounds drawn from them are
    unreliable; those rows say "above peak" instead of a percentage over 100%."""
    excess = found.excess
    if excess is None:
        return ""
    return (
        f'<p class="warn">{_e(excess_line(excess, found.peaks).plain)}. The peaks '
        f"({_e(found.peaks.source)}) are lower than what the chunks achieved, or the model "
        "config overstates their FLOPs or understates their bytes (a wrong dtype, head count "
        "or device), so the fractions and bounds above cannot be trusted: pass --peak-tflops "
        "and --peak-bandwidth-gbs, or the model's --model-config, to correct them.</p>"
    )


def _fits(data: ReportData) -> str:
    """What the prefill scaling figure draws of each condition's fit, and why a fit is left
    out."""
    notes = []
    for cond, fit in data.prefill_fits.items():
        if fit.r2 >= FIT_MIN_R2:
            part = data.prefill_points[data.prefill_points["condition"] == cond]
            tokens = part["computed_tokens"]
            notes.append(
                f"{_e(cond)}: the fit (R² {fit.r2:.3f}, {fit.points:,} requests) is drawn "
                f"over the {tokens.min():,}–{tokens.max():,} tokens measured only."
            )
        else:
            notes.append(
                f"{_e(cond)}: no fit drawn: a + b·n + c·n² explains only R² {fit.r2:.3f} of "
                f"the variance of {fit.points:,} requests (under {FIT_MIN_R2:g}), so it would "
                "not describe these times."
            )
    return "".join(f'<p class="note">{n}</p>' for n in notes)


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
        also = _e(moved_in_all(data.summary.clocks, c))
        parts.append(
            f'<p class="warn">clocks: {_e(c["server_clock"])} → {_e(c["client_clock"])}: '
            f"offset {c['offset_ms']:+,.3f} ms {state} (estimate {c['estimate_ms']:+,.3f} ms, "
            f"{_e(spread_words(c))} over {c['requests']:,} requests){also}</p>"
        )
    return "".join(parts)


def _metadata(data: ReportData) -> str:
    rows = metadata_rows(data.metadata)
    if not rows:
        return '<p class="note">The trace has no run metadata.</p>'
    return folded(metadata_summary(data.metadata),
                  _rows(rows, "<tr><th>key</th><th>value</th></tr>", ' id="metadata"'),
                  "metadata-fold")


@cache
def plotly_js() -> str:
    """The vendored plotly.js basic bundle (read once per process)."""
    return files("ttft.reports").joinpath("assets/plotly-basic.min.js").read_text("utf-8")


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
        *(f'<div class="sub"><b>{_e(note)}</b></div>' for note in data.notes),
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
        "GPU clock; overlapping spans of a worker sit on separate lanes, its K/V transfer and "
        "engine steps on lanes of their own. Dotted red lines mark the boundary events, the "
        "shaded band the TTFT window.</p>",
        transfer_html(s.kv_transfer),
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
        _fits(data),
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
    script = plotly_js()
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

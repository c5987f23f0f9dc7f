"""``ttft report`` in the terminal: the HTML report's story told with rich tables and bars."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ttft.reports._colours import colour
from ttft.reports._text import plain
from ttft.reports.report_data import FIT_MIN_R2, ReportData
from ttft.reports.terminal import (
    fit,
    render_failures,
    render_load,
    render_quality,
    render_transfer,
    request_counts,
)
from ttft.reports.views.stage import RAW_DROP, StageBlock
from ttft.tracer.schema import STAGE_NAMES

_BAR_CHARS = 48
_MIN_BAR_CHARS = 12
# Each stage's letter in a stacked bar and its legend: the bar reads without colour.
LETTERS = {
    "client": "c", "connect": "C", "server": "s", "tokenize": "t", "queue": "q",
    "schedule": "S", "batch_wait": "b", "prefill": "p", "prefill.chunk": "P", "sample": "a",
    "preempted": "w", "detokenize": "d", "holdback": "h", "deliver": "D", "kv_transfer": "k",
    "stream": "r",
    "step": "e", "forward": "f", "gpu": "g", "network": "n", "untraced": "x",
    "unattributed": "u", "other": "o", "event": "v",
}  # fmt: skip
_CDF_PCTS = (10, 25, 50, 75, 90, 99, 99.9)


def _swatch(stage: str) -> str:
    """The style of a stage's run: its letter on its colour, in black or white ink,
    whichever reads on that colour."""
    rgb = colour(stage).lstrip("#")
    red, green, blue = (int(rgb[i : i + 2], 16) for i in (0, 2, 4))
    ink = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 140 else "white"
    return f"{ink} on {colour(stage)}"


def _stacked(
    parts: dict[str, float], total_ms: float, scale_ms: float, bar_chars: int
) -> Text:
    """A bar ``bar_chars`` wide for ``scale_ms``, one run of the stage's letter on its
    colour per stage in stage order, widths rounded so the runs add up to the whole bar's
    rounded width."""
    bar = Text()
    width = round(bar_chars * total_ms / scale_ms) if scale_ms > 0 else 0
    done_ms = drawn = 0
    for stage in (s for s in STAGE_NAMES if parts.get(s, 0) > 0):
        done_ms += parts[stage]
        upto = round(width * done_ms / total_ms) if total_ms > 0 else 0
        bar.append(LETTERS.get(stage, "?") * (upto - drawn), style=_swatch(stage))
        drawn = upto
    return bar


def _legend(stages: set[str]) -> Text:
    text = Text()
    for stage in (s for s in STAGE_NAMES if s in stages):
        text.append(LETTERS.get(stage, "?"), style=_swatch(stage))
        text.append(f" {stage}  ")
    return text


def _fitted_bars(build: Callable[[int], Table], console: Console) -> Table:
    """``build(bar_chars)`` with bars ``_BAR_CHARS`` wide, or as much narrower (down to
    ``_MIN_BAR_CHARS``) as drawing every column at its natural width in ``console.width``
    needs: the text columns then wrap at spaces, never cut."""
    table = build(_BAR_CHARS)
    options = console.options.update_width(10_000)
    excess = Measurement.get(console, options, table).maximum - console.width
    if excess > 0:
        table = build(max(_MIN_BAR_CHARS, _BAR_CHARS - excess))
    return fit(table, console)


def _headline(data: ReportData) -> Table:
    table = Table(title="headline", title_justify="left")
    table.add_column("group · ok requests")
    for name in ("failed", "TTFT p50 ms", "p90 ms", "p99 ms"):
        table.add_column(name, justify="right")
    table.add_column("biggest stage (share of TTFT)")
    for group, mask in data.groups.items():
        part = data.summary.group(group)
        stages = part["stages"]
        biggest = max(stages.items(), key=lambda kv: kv[1]["share"]) if stages else None
        big = Text()
        if biggest:
            big.append(LETTERS.get(biggest[0], "?"), style=_swatch(biggest[0]))
            big.append(" ")
            big.append(plain(f"{biggest[0]} {biggest[1]['share']:.1%}"))
        ttft = part["ttft_ms"]
        failed = sum(part["failures"].values())
        table.add_row(
            plain(f"{data.group_label[group]} · {int(mask.sum()):,}"),
            Text(f"{failed:,}", style="bold red") if failed else Text("0", style="green"),
            f"{ttft['p50']:,.2f}",
            f"{ttft['p90']:,.2f}",
            f"{ttft['p99']:,.2f}",
            big,
        )
    return table


def _bands(data: ReportData, bar_chars: int) -> Table:
    scale = max((float(b["ttft_ms"].max()) for b in data.bands.values() if len(b)), default=0)
    table = Table(
        title="where TTFT goes: mean attributed ms of the requests near each percentile",
        title_justify="left",
        caption="each bar sums to its band's mean TTFT; bars share one scale",
        caption_justify="left",
    )
    table.add_column("group · band")
    table.add_column("n", justify="right")
    table.add_column("mean TTFT ms", justify="right")
    table.add_column("stages", no_wrap=True)
    table.add_column("largest parts")
    stages: set[str] = set()
    for group, bands in data.bands.items():
        for band, row in bands.iterrows():
            parts = {c: float(row[c]) for c in bands.columns if c not in ("requests", "ttft_ms")}
            stages.update(s for s, v in parts.items() if v > 0)
            top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
            table.add_row(
                plain(f"{data.group_label[group]} · {band}"),
                f"{int(row['requests']):,}",
                f"{row['ttft_ms']:,.2f}",
                _stacked(parts, float(row["ttft_ms"]), scale, bar_chars),
                plain(", ".join(f"{s} {v:,.1f}" for s, v in top if v > 0)),
            )
        table.add_section()
    table.caption = Text.assemble(table.caption, "\n", _legend(stages))
    return table


def _cdf(data: ReportData) -> Table:
    table = Table(title="TTFT distribution (ms)", title_justify="left")
    table.add_column("group")
    for p in _CDF_PCTS:
        table.add_column(f"p{p:g}", justify="right")
    table.add_column("max", justify="right")
    for group, values in data.cdf_ms.items():
        if len(values) == 0:
            continue
        pcts = np.percentile(values, _CDF_PCTS)
        cells = (*(f"{v:,.1f}" for v in pcts), f"{values[-1]:,.1f}")
        table.add_row(plain(data.group_label[group]), *cells)
    return table


def _waterfalls(data: ReportData, bar_chars: int) -> Table:
    scale = max((w.ttft_ms for w in data.waterfalls), default=0)
    table = Table(title="requests up close (attributed parts)", title_justify="left")
    table.add_column("request")
    table.add_column("TTFT ms", justify="right")
    table.add_column("stages", no_wrap=True)
    table.add_column("largest parts")
    for w in data.waterfalls:
        top = sorted(w.parts_ms.items(), key=lambda kv: -kv[1])[:3]
        table.add_row(
            plain(f"{w.label} ({w.condition or '?'}) {w.tag}"),
            f"{w.ttft_ms:,.2f}",
            _stacked(w.parts_ms, w.ttft_ms, scale, bar_chars),
            plain(", ".join(f"{s} {v:,.1f}" for s, v in top)),
        )
    return table


_BLAME_DROP = ("unknown", "requests", "idle")
_PREFILL_DROP = ("at 2048 ms", "c ns/token²", "points")


def _blame(data: ReportData) -> Table | None:
    frame = data.blame
    if frame.empty:
        return None
    table = Table(
        title="wait blame: what the engine executed while requests waited (mean ms)",
        title_justify="left",
    )
    for name in ("condition", "wait", "requests", "wait ms"):
        table.add_column(name, justify="left" if name in ("condition", "wait") else "right")
    for name in ("others' prefill", "decode", "unknown", "idle"):
        table.add_column(name, justify="right")
    for r in frame.itertuples():
        table.add_row(
            plain(r.condition),
            plain(r.wait),
            f"{int(r.requests):,}",
            f"{r.wait_ms_mean:,.2f}",
            *(
                f"{getattr(r, f'{k}_ms_mean'):,.2f} ({getattr(r, f'share_{k}'):.0%})"
                for k in ("prefill", "decode", "unknown", "idle")
            ),
        )
    return table


def _prefill(data: ReportData) -> Table | None:
    if not data.prefill_fits:
        return None
    table = Table(
        title="prefill compute (own chunks) vs tokens computed: a + b·n + c·n²",
        title_justify="left",
        caption=f"a fit explaining under R² {FIT_MIN_R2:g} of the variance is not shown, and "
        "none is read outside the tokens measured (—)",
        caption_justify="left",
    )
    for name in ("condition", "points", "tokens", "a ms", "b µs/token", "c ns/token²", "R²"):
        table.add_column(name, justify="left" if name == "condition" else "right")
    sizes = (512, 2048)
    for n in sizes:
        table.add_column(f"at {n} ms", justify="right")
    points = data.prefill_points
    for cond, found in data.prefill_fits.items():
        tokens = points.loc[points["condition"] == cond, "computed_tokens"]
        lo, hi = (int(tokens.min()), int(tokens.max())) if len(tokens) else (0, -1)
        shown = found.r2 >= FIT_MIN_R2
        at = found.predict_ns(np.array(sizes, dtype=np.float64)) / 1e6
        coefficients = (
            (f"{found.a_ns / 1e6:,.3f}", f"{found.b_ns_per_token / 1e3:,.3f}",
             f"{found.c_ns_per_token2:,.4f}") if shown else ("—", "—", "—")
        )
        table.add_row(
            plain(cond),
            f"{found.points:,}",
            f"{lo:,}–{hi:,}" if hi >= lo else "—",
            *coefficients,
            f"{found.r2:.3f}",
            *(f"{v:,.2f}" if shown and lo <= n <= hi else "—" for n, v in zip(sizes, at,
                                                                              strict=True)),
        )
    return table


def _metadata(metadata: dict[str, Any]) -> Table:
    table = Table(title="run metadata", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for key in sorted(metadata):
        value = metadata[key]
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        table.add_row(plain(key), plain(text if len(text) <= 200 else text[:197] + "…"))
    return table


def render_report(data: ReportData, console: Console) -> None:
    """Print the report of ``data`` on ``console``."""
    s = data.summary
    console.print(
        Text.assemble(
            ("ttft report ", "bold"),
            plain(data.trace, "bold cyan"),
            plain(
                f"  boundary={s.boundary}  policy={s.policy}  {request_counts(s)}"
            ),
        )
    )
    for note in data.notes:
        console.print(plain(note, "bold"), overflow="fold")
    render_failures(s, console)
    render_load(s, console)
    render_transfer(s, console)
    if s.requests_ok == 0:
        console.print(Text("No request has a TTFT window at this boundary.", style="yellow"))
    else:
        console.print(fit(_headline(data), console, ("p90 ms",)))
        console.print(_fitted_bars(lambda chars: _bands(data, chars), console))
        console.print(fit(_cdf(data), console, ("p10", "p75", "p99.9")))
        console.print(_fitted_bars(lambda chars: _waterfalls(data, chars), console))
        block = StageBlock(console, s.boundary, s.policy, drop=RAW_DROP)
        block.add("raw durations against attributed time", s.ttft_ms, s.stages)
        console.print(block.render())
    for table, drop in ((_blame(data), _BLAME_DROP), (_prefill(data), _PREFILL_DROP)):
        if table is not None:
            console.print(fit(table, console, drop))
    found = data.regime
    if found is not None:
        from ttft.reports.views.regime import render_regime

        render_regime(found, console)
    render_quality(s, console)
    if data.metadata:
        console.print(_metadata(data.metadata))

"""The prefill regime in the terminal: per condition and chunk-size bucket, intensity
against the ridge, the bound, achieved FLOP/s and the fraction of the roofline (never over
100%: a row above its roofline says so instead, and a line says how far the trace went past
the peaks); a line naming where the peaks came from, or what is missing and which flags
supply it; and the line that tells a prefill profile from a request trace."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ttft.analysis.assemble import Assembly
from ttft.analysis.regime import Peaks, RegimeResult, RooflineExcess
from ttft.reports._text import plain
from ttft.reports.terminal import fit

__all__ = [
    "ABOVE_PEAK",
    "excess_line",
    "fmt_bound",
    "fmt_si",
    "peaks_line",
    "profile_line",
    "render_regime",
]

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_SOURCES = {
    "measured": "measured on the traced machine",
    "known-gpu": "from the known-GPU datasheet table",
    "flags": "from the command-line flags",
}
_CONDITION_LABEL = {"all": "all (mixes cold and prefix_hit)"}
ABOVE_PEAK = "above peak"
"""What a row above its roofline shows instead of a percentage (`excess_line` says why)."""
_EXCEEDS = {
    "measured": "achieved exceeds the measured peak (peak measured under load?)",
    "known-gpu": "achieved exceeds the datasheet peak (is the GPU or the model config wrong?)",
    "flags": "achieved exceeds the peak of --peak-tflops/--peak-bandwidth-gbs",
}
PROFILE_TOOL = "ttft profile-prefill"


def fmt_si(value: float, unit: str) -> str:
    """``value`` with an SI prefix and three significant digits: ``221 GFLOP/s``."""
    if value is None or not math.isfinite(value):
        return "-"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def fmt_bound(bound: str | None, fraction: float, above: bool = False) -> Text:
    """``compute 41%``, the bound coloured (compute cyan, else magenta); ``compute above
    peak`` where the row ran above its roofline (no percentage over 100%); ``-`` when
    unknown."""
    if bound is None:
        return Text("-")
    if above:
        pct = Text(f" {ABOVE_PEAK}", style="yellow")
    else:
        pct = f" {fraction:.0%}" if fraction is not None and math.isfinite(fraction) else ""
    return Text.assemble(plain(bound, "cyan" if bound == "compute" else "magenta"), pct)


def peaks_line(peaks: Peaks) -> Text:
    """``peaks: 989 TFLOP/s, 3.35 TB/s (ridge 295 FLOP/B), <device>, <where from>``, as
    plain text (the device's name comes from the trace)."""
    return plain(
        f"peaks: {fmt_si(peaks.flops_per_s, 'FLOP/s')}, {fmt_si(peaks.bytes_per_s, 'B/s')} "
        f"(ridge {peaks.ridge:.3g} FLOP/B), {peaks.device}, "
        f"{_SOURCES.get(peaks.source, peaks.source)}"
    )


def excess_line(excess: RooflineExcess, peaks: Peaks, unit: str = "chunks") -> Text:
    """The warning for chunks above their roofline: ``achieved exceeds the measured peak
    (peak measured under load?): 3 of 30 chunks ran above the roofline, up to 21.9
    GFLOP/s, so the device does at least that; they show "above peak", not a %``. The best
    rates named are those above the peaks, so no peak is left standing below what the
    trace achieved. ``unit`` names what was counted."""
    best = []
    if excess.flops:
        best.append(fmt_si(excess.best_flops_per_s, "FLOP/s"))
    if excess.bytes:
        best.append(f"{fmt_si(excess.best_bytes_per_s, 'B/s')} (bytes by the cost model)")
    rates = f", up to {' and '.join(best)}, so the device does at least that" if best else ""
    return plain(
        f"{_EXCEEDS.get(peaks.source, _EXCEEDS['measured'])}: {excess.chunks:,} of "
        f"{excess.of_chunks:,} {unit} ran above the roofline{rates}; they show "
        f'"{ABOVE_PEAK}", not a %',
        "yellow",
    )


def profile_line(metadata: dict[str, Any], asm: Assembly | None) -> str | None:
    """For a ``ttft profile-prefill`` trace (its metadata's ``tool``), what it is: ``a
    prefill profile (ttft profile-prefill): 30 timed prefill runs of the small model, no
    requests: TTFT, stages and defects do not apply; see its regime (--regime)``; None
    for any other trace. ``asm`` is the trace assembled (None: merged from partitions,
    where the runs are not counted)."""
    if metadata.get("tool") != PROFILE_TOOL:
        return None
    runs = "" if asm is None else f"{len(asm.rows.of('prefill')):,} "
    model = metadata.get("model")
    of = f" of the {model} model" if model else ""
    return (
        f"a prefill profile ({PROFILE_TOOL}): {runs}timed prefill runs{of}, no requests: "
        "TTFT, its stages and request defects do not apply"
    )


def render_regime(found: RegimeResult, console: Console) -> None:
    """Print the regime table of a `ttft.analysis.regime.RegimeResult`: its summary, the
    peaks used and how far the chunks went past them; what is missing (the model, the
    peaks) and the flags that give it."""
    summary, peaks, device_name = found.summary, found.peaks, found.device_name
    if summary is None:
        console.print(
            Text(
                "regime: the trace does not say which model it ran (no model_config in its "
                "metadata, no engine_info event); pass --model-config FILE.json (a Hugging "
                "Face config.json or ttft ModelConfig fields, with dtype)",
                style="yellow",
            )
        )
    if peaks is None:
        device = f"device {device_name!r}" if device_name else "the device"
        console.print(
            plain(
                f"regime: no peaks for {device}: the trace has no measured peaks and the name "
                "is not in the known-GPU table; pass --peak-tflops and --peak-bandwidth-gbs",
                "yellow",
            )
        )
    if summary is None:
        return
    if summary.empty:
        console.print(Text("regime: the trace has no prefill.chunk spans", style="yellow"))
        return
    table = Table(title="prefill regime (per chunk: FLOPs and bytes from the model shape)")
    for name in ("condition", "chunk tokens", "chunks", "tokens", "median FLOP/B", "ridge",
                 "regime", "compute-bound", "achieved"):  # fmt: skip
        table.add_column(name, justify="left" if name in ("condition", "regime") else "right",
                         no_wrap=name == "regime")  # fmt: skip
    for r in summary.itertuples(index=False):
        table.add_row(
            plain(_CONDITION_LABEL.get(r.condition, r.condition)),
            plain(r.chunk_bucket),
            f"{r.chunks:,}",
            f"{r.tokens:,}",
            f"{r.median_intensity:.3g}",
            "-" if not math.isfinite(r.ridge) else f"{r.ridge:.3g}",
            fmt_bound(r.bound, r.roofline_fraction, bool(r.above_roofline)),
            "-" if peaks is None else f"{r.compute_bound_share:.0%}",
            fmt_si(r.achieved_flops_per_s, "FLOP/s"),
        )
    console.print(fit(table, console, ("chunks", "tokens")))
    console.print(
        Text(
            "regime: compute-bound when FLOP/B reaches the ridge; the % is achieved FLOP/s "
            "over the roofline's attainable min(peak, FLOP/B × bandwidth)"
        )
    )
    if peaks is not None:
        console.print(peaks_line(peaks))
        if found.excess is not None:
            console.print(excess_line(found.excess, peaks))

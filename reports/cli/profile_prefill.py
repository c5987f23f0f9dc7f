"""``ttft profile-prefill``: the engine's prefill alone (no server, no decode) at each
prompt length and chunk size, cold and with prefix reuse, written as a trace; prints time,
tokens/s, FLOP/s, the regime and the quadratic fit per condition (a fit under R² 0.9 as
the points it failed to fit, not as coefficients)."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, require_engine, stdout_console

if TYPE_CHECKING:
    import pandas as pd

    from ttft.analysis.prefill import QuadraticFit
    from ttft.reports.runs.profile_prefill import ProfileSummary

Preset = Enum("Preset", {p: p for p in ("tiny", "small", "base")}, type=str)  # type: ignore[misc]
Device = Enum("Device", {d: d for d in ("cpu", "cuda")}, type=str)  # type: ignore[misc]
_CONDITION_TITLE = {
    "cold": "cold (nothing cached)",
    "prefix_hit": "prefix_hit (the first half of the prompt in the prefix cache)",
}


def _ints(option: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise fail(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise fail(f"{option}: expected positive integers, got {text!r}")
    return values


@app.command("profile-prefill")
def profile_prefill(
    output: Annotated[Path, typer.Option("-o", "--output", help="the trace file to write")],
    model: Annotated[Preset, typer.Option(help="model preset")] = Preset["small"],
    lengths: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,...",
            help="prompt lengths [default: 128,512,2048,4096, those that fit the model]",
        ),
    ] = None,
    chunk_sizes: Annotated[
        str, typer.Option(metavar="N,N,...", help="prefill chunk sizes")
    ] = "256,1024",
    prefix_reuse: Annotated[
        bool, typer.Option(help="also run each prompt with its first half already cached")
    ] = False,
    repeats: Annotated[int, typer.Option(min=1, help="timed runs per case")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help="untimed runs before them")] = 1,
    device: Annotated[
        Device | None, typer.Option(help="where to run [default: cuda if available]")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of the weights and prompts")] = 0,
) -> None:
    """Profile prefill apart from decode: per length, the median time of the engine's
    chunked prefill, tokens/s, FLOP/s, compute- or memory-bound against this machine's
    measured peaks, and the quadratic fit a + b·n + c·n² per condition and chunk size."""
    require_engine("profile-prefill")
    import torch

    from ttft.collectors import write_trace
    from ttft.engine.model import ModelConfig
    from ttft.reports.runs.profile_prefill import (
        DEFAULT_LENGTHS,
        ProfileSpec,
        profile_summary,
        run_profile,
    )

    dev = device.value if device else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda: CUDA is not available here (torch sees no GPU)")
    limit = ModelConfig.preset(model.value).max_seq_len
    if lengths is None:
        chosen = tuple(n for n in DEFAULT_LENGTHS if n <= limit)
        skipped = [n for n in DEFAULT_LENGTHS if n > limit]
        if skipped:
            err.print(
                plain(
                    f"note: skipping default length(s) {', '.join(map(str, skipped))}: "
                    f"above the {model.value} model's max_seq_len {limit}",
                    "yellow",
                )
            )
    else:
        chosen = _ints("--lengths", lengths)
    spec = ProfileSpec(
        model=model.value,
        lengths=chosen,
        chunk_sizes=_ints("--chunk-sizes", chunk_sizes),
        prefix_reuse=prefix_reuse,
        repeats=repeats,
        warmup=warmup,
        device=dev,
        seed=seed,
    )
    try:
        spec.check()
    except ValueError as e:
        raise fail(str(e)) from None

    if not output.parent.is_dir():
        raise fail(f"{output}: the folder {output.parent} does not exist")

    started = time.perf_counter()
    what = f"profiling prefill of the {model.value} model on {dev}"
    if err.is_terminal:
        with err.status(plain(what)) as status:
            run = run_profile(
                spec, on_step=lambda step: status.update(plain(f"{what}: {step}"))
            )
    else:
        run = run_profile(spec)
    try:
        write_trace(output, run.table, run.metadata)
    except OSError as exc:
        raise fail(f"{output}: cannot write ({exc.strerror or exc})") from None
    _render(run.metadata, profile_summary(run), stdout_console())
    err.print(
        f"wrote {output}: {len(run.runs)} timed runs, {run.table.num_rows:,} spans "
        f"in {time.perf_counter() - started:.1f} s"
    )


def _render(metadata: dict[str, Any], summary: ProfileSummary, console: Console) -> None:
    from ttft.reports.views.regime import excess_line, fmt_bound, fmt_si, peaks_line

    rows, peaks = summary.rows, summary.peaks
    config, device = metadata["model_config"], metadata["device"]
    console.print(
        plain(
            f"model {metadata['model']} ({config['n_layer']} layers, d_model "
            f"{config['d_model']}, {config['dtype']}) on {device['type']}: {device['name']}; "
            f"{metadata['repeats']} timed runs per case after {metadata['warmup']} warm-up"
        )
    )
    if peaks is not None:
        console.print(peaks_line(peaks))
        if summary.excess is not None:
            console.print(excess_line(summary.excess, peaks, unit="prefill chunks"))
    for condition in ("cold", "prefix_hit"):
        part = rows[rows["condition"] == condition]
        if part.empty:
            continue
        table = Table(title=f"prefill: {_CONDITION_TITLE[condition]}", title_justify="left")
        for name in ("length", "chunk", "cached", "time ms", "tokens/s", "FLOP/s", "FLOP/B",
                     "regime, % of roofline"):  # fmt: skip
            table.add_column(name, justify="left" if name.startswith("regime") else "right")
        for r in part.sort_values(["length", "chunk_size"]).itertuples(index=False):
            table.add_row(
                f"{r.length:,}",
                f"{r.chunk_size:,}",
                f"{r.cached_tokens:,}",
                f"{r.time_ns / 1e6:,.2f}",
                f"{r.tokens_per_s:,.0f}",
                fmt_si(r.flops_per_s, "FLOP/s"),
                f"{r.intensity:.3g}",
                fmt_bound(r.bound, r.roofline_fraction, bool(r.above_roofline)),
            )
        console.print(table)
        for chunk in dict.fromkeys(metadata["chunk_sizes"]):
            _print_fit(console, chunk, summary.fits.get((condition, chunk)), part)


def _print_fit(console: Console, chunk: int, fit: QuadraticFit | None, part: pd.DataFrame
               ) -> None:  # fmt: skip
    """One fit line: the formula where it explains the times (R² ≥ ``FIT_MIN_R2``, with a
    word on any negative term), else the median times it failed to fit. ``part`` is the
    condition's rows of `profile_summary`; the fit's are those run at ``chunk`` (or the
    whole prompt, when shorter)."""
    from ttft.reports.report_data import FIT_MIN_R2

    label = f"fit, chunk {chunk} (n = tokens computed)"
    if fit is None:
        console.print(f"  {label}: needs 3 or more distinct lengths")
        return
    used = part[part["chunk_size"] == part["computed_tokens"].clip(upper=chunk)]
    if fit.r2 < FIT_MIN_R2:
        medians = ", ".join(
            f"n {r.computed_tokens:,}: {r.time_ns / 1e6:,.2f} ms"
            for r in used.sort_values("computed_tokens").itertuples(index=False)
        )
        console.print(
            plain(
                f"  {label}: no good quadratic fit (R² {fit.r2:.2f}, under {FIT_MIN_R2:g}, "
                f"{fit.points} runs): the times vary too much to follow a + b·n + c·n²; "
                f"medians {medians}",
                "yellow",
            )
        )
        return
    a_ms = f"{fit.a_ns / 1e6:.4g}".replace("-", "−")
    console.print(
        f"  {label}: time ≈ {a_ms} ms {_signed(fit.b_ns_per_token / 1e3)} "
        f"µs·n {_signed(fit.c_ns_per_token2)} ns·n²  (R² {fit.r2:.4f}, "
        f"{fit.points} runs)"
    )
    if fit.negative_terms:
        names = " and ".join(f"{n} ({_TERM_MEANING[n]})" for n in fit.negative_terms)
        lo, hi = used["computed_tokens"].min(), used["computed_tokens"].max()
        console.print(
            plain(
                f"    negative {names}: no prefill costs less than nothing; the formula "
                f"fits the {lo:,}–{hi:,} tokens measured and is no cost model to read "
                "outside them",
                "yellow",
            )
        )


_TERM_MEANING = {"a": "fixed cost", "b": "cost per token", "c": "cost per token pair"}


def _signed(value: float) -> str:
    """``+ 1.23`` or ``− 1.23``, for a term of a formula."""
    return f"{'−' if value < 0 else '+'} {abs(value):.4g}"

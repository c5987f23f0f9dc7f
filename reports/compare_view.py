"""``ttft compare`` in the terminal: per condition, TTFT and each stage of A and B, the
delta with its bootstrap interval, marked worse or better when the interval excludes 0."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ttft.analysis.transfer import deployment
from ttft.reports._text import plain
from ttft.reports.terminal import fit
from ttft.tracer.schema import CONDITIONS


def render_compare(
    table: pd.DataFrame,
    paths: tuple[str, str],
    boundary: str,
    policy: str,
    resamples: int,
    seed: int,
    attrs: list,
    counts: list[pd.Series],
    console: Console,
    confidence: float,
    deployments: Sequence[str | None] = (None, None),
) -> None:
    """Print `ttft.analysis.compare.compare`'s table: a table per condition (TTFT first,
    then the stages either trace has at p99), the conditions only one trace has, and how
    the intervals were made. When either side is disaggregated, the header says which
    (``deployments``: each side's, `side_deployments`)."""
    n_a, n_b = (len(attr.requests) for attr in attrs)
    left = [attr.quality.counts["no_window"] for attr in attrs]
    left_out = (f"  left out, no TTFT window at this boundary: A {left[0]:,} B {left[1]:,}"
                if any(left) else "")
    sides: tuple = ()
    if any(d and d.startswith("disaggregated") for d in deployments):
        sides = ("\n", plain("  ".join(f"{side} {d or 'co-located (no kv_transfer)'}"
                                        for side, d in zip("AB", deployments, strict=True))))
    console.print(
        Text.assemble(
            ("ttft compare ", "bold"),
            ("A ", "bold"),
            plain(paths[0], "bold cyan"),
            ("  B ", "bold"),
            plain(paths[1], "bold cyan"),
            "\n",
            plain(f"boundary={boundary}  policy={policy}  requests A={n_a:,} B={n_b:,}"
                  + left_out),
            *sides,
        )
    )
    conditions = list(dict.fromkeys(table["condition"]))
    for cond in conditions:
        console.print(
            fit(
                _condition_table(table[table["condition"] == cond], cond, conditions, confidence),
                console,
                ("Δ %",),
            )
        )
    for cond in CONDITIONS:
        in_a, in_b = (int(c.get(cond, 0)) for c in counts)
        if (in_a == 0) != (in_b == 0):
            console.print(
                Text(
                    f"{cond}: not compared, only one trace has such requests "
                    f"(A {in_a:,}, B {in_b:,})",
                    style="yellow",
                )
            )
    console.print(
        Text(
            f"Δ = B - A. CI: bootstrap percentile interval of Δ, {resamples:,} resamples of "
            f"each trace's requests (seed {seed}); worse/better: the interval excludes 0. "
            "Stages shown where either trace's p99 > 0.",
            style="dim",
        )
    )


def side_deployments(metadata: Sequence[Mapping[str, Any]], attrs: Sequence[Any]
                     ) -> list[str | None]:
    """How each trace was served: ``ttft.analysis.transfer.deployment`` of its run
    ``metadata`` (``engine.disaggregated``); where it names no engine (another format, an
    imported trace), ``disaggregated (kv_transfer spans)`` when its attribution gives
    ``kv_transfer`` time, else None."""
    out = []
    for meta, attr in zip(metadata, attrs, strict=True):
        found = deployment(meta)
        att = attr.attributed
        if found is None and "kv_transfer" in att.columns and (att["kv_transfer"] > 0).any():
            found = "disaggregated (kv_transfer spans)"
        out.append(found)
    return out


def _condition_table(
    rows: pd.DataFrame, cond: str, conditions: list[str], confidence: float
) -> Table:
    first = rows.iloc[0]
    if cond == "all":
        label = "all requests"
        others = [c for c in conditions if c != "all"]
        if len(others) > 1:
            label += " (mixes " + " and ".join(others) + ")"
    else:
        label = cond
    title = f"{label}: A {first['a_requests']:,} · B {first['b_requests']:,} requests"
    out = Table(title=plain(title, "table.title"), title_justify="left")
    out.add_column("metric")
    out.add_column("pct", justify="right")
    for name in ("A ms", "B ms", "Δ ms", "Δ %"):
        out.add_column(name, justify="right")
    out.add_column(f"{confidence:.0%} CI of Δ ms", justify="center", no_wrap=True)
    out.add_column("")
    shown = rows[rows["percentile"] == 99].set_index("metric")
    shown = shown.index[(shown["a_ms"] > 0) | (shown["b_ms"] > 0)]
    ttft = rows[rows["metric"] == "ttft"]
    stages = rows[(rows["metric"] != "ttft") & rows["metric"].isin(shown)]
    for i, row in enumerate(ttft.itertuples(index=False)):
        out.add_row(*_cells(row), style="bold", end_section=i == len(ttft) - 1)
    for row in stages.itertuples(index=False):
        out.add_row(*_cells(row))
    return out


def _cells(row: Any) -> list[str | Text]:
    pct = "—" if math.isnan(row.delta_pct) else f"{row.delta_pct:+.1f}%"
    marker = _marker(row.ci_lo_ms, row.ci_hi_ms)
    return [
        plain("TTFT" if row.metric == "ttft" else row.metric),
        f"p{row.percentile}",
        f"{row.a_ms:,.2f}",
        f"{row.b_ms:,.2f}",
        f"{row.delta_ms:+,.2f}",
        pct,
        f"{row.ci_lo_ms:+,.2f} … {row.ci_hi_ms:+,.2f}",
        marker,
    ]


def render_failure_rates(table: pd.DataFrame, console: Console, confidence: float) -> None:
    """The failure rate of A and B per condition, first: TTFT deltas below are over the
    requests that did not fail."""
    out = Table(title="failed requests (TTFT below is over the ok ones)", title_justify="left")
    for name in ("condition", "A failed", "B failed", "Δ points",
                 f"{confidence:.0%} CI of Δ", "", "A kinds", "B kinds"):  # fmt: skip
        out.add_column(name, justify="left" if name in ("condition", "A kinds", "B kinds")
                       else "right")
    for row in table.itertuples(index=False):
        out.add_row(
            plain(row.condition),
            f"{row.a_failed:,}/{row.a_requests:,} ({row.a_rate:.1%})",
            f"{row.b_failed:,}/{row.b_requests:,} ({row.b_rate:.1%})",
            f"{row.delta_pp:+.1f}",
            f"{row.ci_lo_pp:+.1f} … {row.ci_hi_pp:+.1f}",
            _marker(row.ci_lo_pp, row.ci_hi_pp),
            _kinds(row.a_kinds),
            _kinds(row.b_kinds),
        )
    console.print(fit(out, console, ("Δ points", "B kinds", "A kinds")))


def _marker(ci_lo: float, ci_hi: float) -> Text:
    """``worse`` or ``better`` when the interval of the rise excludes 0, else ``~``."""
    if ci_lo > 0:
        return Text("worse", style="bold red")
    if ci_hi < 0:
        return Text("better", style="bold green")
    return Text("~", style="dim")


def _kinds(kinds: dict[str, int]) -> Text:
    return plain(", ".join(f"{kind} {n:,}" for kind, n in kinds.items()) or "-")


_LOAD_LABELS = {
    "requests_per_s": "requests/s",
    "output_tokens_per_s": "output tokens/s",
    "e2e_p50": "end-to-end p50 ms",
    "e2e_p99": "end-to-end p99 ms",
    "goodput_share": "goodput share",
    "goodput_per_s": "goodput requests/s",
}


def render_load_compare(table: pd.DataFrame, console: Console, slo: str | None) -> None:
    """`ttft.analysis.compare.compare_load`'s table: A, B and Δ = B - A of each load
    figure (``slo``: the SLOs goodput was measured against, as text); nothing when empty."""
    if table.empty:
        return
    title = "load" + (f" (goodput: meeting {slo})" if slo else "")
    out = Table(title=plain(title, "table.title"), title_justify="left")
    out.add_column("metric")
    for name in ("A", "B", "Δ", "Δ %"):
        out.add_column(name, justify="right")
    for row in table.itertuples(index=False):
        share = row.metric == "goodput_share"
        cells = [_load_cell(v, share, signed=i == 2) for i, v in
                 enumerate((row.a, row.b, row.delta))]
        pct = "—" if math.isnan(row.delta_pct) else f"{row.delta_pct:+.1f}%"
        out.add_row(plain(_LOAD_LABELS.get(row.metric, row.metric)), *cells, pct)
    console.print(fit(out, console))


def _load_cell(value: float, share: bool, signed: bool) -> str:
    if math.isnan(value):
        return "—"
    if share:
        return f"{value * 100:+.1f} pts" if signed else f"{value:.1%}"
    return f"{value:+,.2f}" if signed else f"{value:,.2f}"

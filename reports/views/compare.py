"""``ttft compare`` in the terminal: a warning first when A and B ran under different
load; then per condition TTFT and the stages that changed, A and B, the delta with its
bootstrap interval and Holm-adjusted p-value, marked worse or better when it is a change
(`ttft.analysis.compare`); then one line saying how many of the comparisons changed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ttft.analysis.compare import TAIL_REQUESTS
from ttft.analysis.transfer import deployment
from ttft.reports._text import plain
from ttft.reports.terminal import fit
from ttft.tracer.schema import CONDITIONS


def render_load_warning(checks: Sequence[Mapping[str, Any]], console: Console) -> bool:
    """The load checks that differ (`ttft.analysis.load_compare.load_checks`), as a warning
    that the deltas after it compare different loads; whether there was one."""
    differ = [c for c in checks if c["differs"]]
    if not differ:
        return False
    lines: list[Text | str] = [
        Text.assemble(("warning: ", "bold yellow"), "A and B ran under different load, so "
                      "their deltas measure the load as well as the change:")]
    for check in differ:
        lines += ["\n", plain(f"  {check['check']}: A {check['a']}; B {check['b']} "
                                f"({check['why']})", "yellow")]
    console.print(Text.assemble(*lines))
    return True


def render_header(paths: tuple[str, str], boundary: str, policy: str, attrs: Sequence[Any],
                  console: Console, deployments: Sequence[str | None] = (None, None)
                  ) -> None:
    """What is compared: A and B, the boundary, the policy and the requests of each; when
    either side is disaggregated, which (``deployments``: each side's, `side_deployments`)."""
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


def render_compare(table: pd.DataFrame, counts: list[pd.Series], console: Console,
                   confidence: float, all_rows: bool = False) -> None:
    """`ttft.analysis.compare.compare`'s table, a table per condition: its TTFT rows, then
    the stage rows that changed (every stage either trace has at p99 with ``all_rows``) and
    how many others did not; then the conditions only one trace has."""
    conditions = list(dict.fromkeys(table["condition"]))
    for cond in conditions:
        rows = table[table["condition"] == cond]
        out, hidden = _condition_table(rows, cond, conditions, confidence, all_rows)
        console.print(fit(out, console, ("Δ %", f"{confidence:.0%} CI of Δ ms")))
        if any(hidden):
            parts = [f"{n:,} {what}" for n, what in zip(hidden, ("no change", "untested"),
                                                        strict=True) if n]
            console.print(Text(f"  stage rows left out: {', '.join(parts)} (--all shows "
                               "them)", style="dim"))
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


def render_verdict(table: pd.DataFrame, console: Console, confidence: float,
                   floor: tuple[float, float]) -> None:
    """One line: how many of the tested rows changed, under which correction and floor."""
    rule = f"Holm {1 - confidence:.0%}, floor max({floor[0]:g} ms, {floor[1]:g}% of A)"
    tested = int(table["p_value"].notna().sum())
    changed = table[table["significant"]]
    if changed.empty:
        console.print(Text(f"no significant change in {tested:,} comparisons ({rule})",
                           style="bold green"))
        return
    worse = int((changed["delta_ms"] > 0).sum())
    console.print(Text(f"{len(changed):,} of {tested:,} comparisons changed: {worse:,} "
                       f"worse, {len(changed) - worse:,} better ({rule})", style="bold"))


def render_method(table: pd.DataFrame, console: Console, confidence: float, resamples: int,
                  seed: int) -> None:
    """How the intervals and p-values were made, and which rows were not tested."""
    tested = table["p_value"].notna()
    untested = int((~tested).sum())
    blocks = table.groupby("condition", sort=False)[["a_block", "b_block"]].first()
    block_text = ", ".join(f"{cond} A {row.a_block:,} B {row.b_block:,}"
                           for cond, row in blocks.iterrows())
    notes = (
        f"Δ = B - A. CI: the {confidence:.0%} bootstrap percentile interval of Δ, of its row "
        f"alone: {resamples:,} resamples of each trace's requests in blocks of consecutive "
        f"requests in arrival order (block length: {block_text}; seed {seed}). p (Holm): "
        f"two-sided, Δ over the s.d. of its resamples, adjusted over the "
        f"{int(tested.sum()):,} tested rows; worse/better: p (Holm) < {1 - confidence:g} and "
        "|Δ| at least the floor."
    )
    if untested:
        notes += (f" {untested:,} rows not tested: a percentile needs {TAIL_REQUESTS} "
                  "requests beyond it on each side (p99 500 requests, p90 50, p50 10).")
    console.print(Text(notes, style="dim"))


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


def _condition_table(rows: pd.DataFrame, cond: str, conditions: list[str], confidence: float,
                     all_rows: bool) -> tuple[Table, tuple[int, int]]:
    """The condition's table and how many of its stage rows it leaves out: tested with no
    change, and not tested."""
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
    out.add_column("p (Holm)", justify="right")
    out.add_column("")
    shown = rows[rows["percentile"] == 99].set_index("metric")
    shown = shown.index[(shown["a_ms"] > 0) | (shown["b_ms"] > 0)]
    ttft = rows[rows["metric"] == "ttft"]
    stages = rows[(rows["metric"] != "ttft") & rows["metric"].isin(shown)]
    kept = stages if all_rows else stages[stages["significant"]]
    alpha = 1 - confidence
    for i, row in enumerate(ttft.itertuples(index=False)):
        out.add_row(*_cells(row, alpha), style="bold", end_section=i == len(ttft) - 1)
    for row in kept.itertuples(index=False):
        out.add_row(*_cells(row, alpha))
    left = stages.drop(kept.index)
    untested = int(left["p_value"].isna().sum())
    return out, (len(left) - untested, untested)


def _cells(row: Any, alpha: float) -> list[str | Text]:
    pct = "—" if math.isnan(row.delta_pct) else f"{row.delta_pct:+.1f}%"
    p = row.p_holm
    return [
        plain("TTFT" if row.metric == "ttft" else row.metric),
        f"p{row.percentile}",
        f"{row.a_ms:,.2f}",
        f"{row.b_ms:,.2f}",
        f"{row.delta_ms:+,.2f}",
        pct,
        f"{row.ci_lo_ms:+,.2f} … {row.ci_hi_ms:+,.2f}",
        "untested" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}",
        _row_marker(row, alpha),
    ]


def _row_marker(row: Any, alpha: float) -> Text:
    """``worse``/``better`` for a change; ``< floor`` for a significant delta under the
    floor; nothing for a percentile too far in the tail (its p cell says ``untested``);
    else ``~``."""
    if row.significant:
        return _marker(row.delta_ms, row.delta_ms)
    if math.isnan(row.p_holm):
        return Text("")
    if row.p_holm < alpha:
        return Text("< floor", style="dim")
    return Text("~", style="dim")


def render_failure_rates(table: pd.DataFrame, console: Console, confidence: float) -> None:
    """The failure rate of A and B per condition, first: TTFT deltas below are over the
    requests that did not fail. One line when neither trace has a failure."""
    if not (table["a_failed"].any() or table["b_failed"].any()):
        console.print(Text("failed requests: none in A or B", style="dim"))
        return
    out = Table(title="failed requests (TTFT below is over the ok ones)", title_justify="left")
    for name in ("condition", "A failed", "B failed", "Δ points",
                 f"{confidence:.0%} CI of Δ", "p (Holm)", "", "A kinds", "B kinds"):  # fmt: skip
        out.add_column(name, justify="left" if name in ("condition", "A kinds", "B kinds")
                       else "right")
    for row in table.itertuples(index=False):
        out.add_row(
            plain(row.condition),
            f"{row.a_failed:,}/{row.a_requests:,} ({row.a_rate:.1%})",
            f"{row.b_failed:,}/{row.b_requests:,} ({row.b_rate:.1%})",
            f"{row.delta_pp:+.1f}",
            f"{row.ci_lo_pp:+.1f} … {row.ci_hi_pp:+.1f}",
            "<0.001" if row.p_holm < 0.001 else f"{row.p_holm:.3f}",
            _marker(row.delta_pp, row.delta_pp) if row.significant else Text("~", style="dim"),
            _kinds(row.a_kinds),
            _kinds(row.b_kinds),
        )
    console.print(fit(out, console, ("Δ points", "B kinds", "A kinds")))


def _marker(ci_lo: float, ci_hi: float) -> Text:
    """``worse`` when ``ci_lo > 0``, ``better`` when ``ci_hi < 0``, else ``~``."""
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

"""Rich terminal rendering of ``ttft analyze`` results."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ttft.analysis.quality import MEANING
from ttft.analysis.summary import Summary
from ttft.reports._text import labelled, moved_in_all, plain, spread_words
from ttft.reports.table_fit import FittedTable, allot, fit
from ttft.reports.views.stage import StageBlock, stage_table
from ttft.reports.views.transfer import TITLE, transfer_rows
from ttft.tracer.schema import CLIENT_CLOCK

__all__ = [  # the fitting and the stage table are re-exported for the other renderers
    "FittedTable", "allot", "fit", "render_analysis", "render_decode", "render_failures",
    "render_load", "render_quality", "render_transfer", "request_counts", "slo_stages_text",
    "slo_text", "stage_table",
]


def render_analysis(summary: Summary, console: Console) -> None:
    """Print an analysis's summary (``Analysis.summary``)."""
    conditions = summary.conditions
    head = Text.assemble(
        ("ttft analyze ", "bold"),
        plain(summary.trace, "bold cyan"),
        plain(
            f"  boundary={summary.boundary}  policy={summary.policy}  {request_counts(summary)}"
        ),
    )
    console.print(head)
    render_failures(summary, console)
    if summary.requests_ok == 0:
        console.print(Text("No request has a TTFT window at this boundary.", style="yellow"))
    else:
        label = "ok requests" if summary.failures else "all requests"
        if len(conditions) > 1:
            label += " (mixes " + " and ".join(conditions) + ")"
        block = StageBlock(console, summary.boundary, summary.policy)
        block.add(label, summary.ttft_ms, summary.stages)
        for cond, part in conditions.items():
            block.add(f"{cond}: {part['requests']:,} requests", part["ttft_ms"],
                      part["stages"], scope=cond)
        console.print(block.render())
    if summary.tail:
        tail = Table(title="tail: TTFT ≥ p99 against p40–p60", title_justify="left")
        tail.add_column("stage")
        tail.add_column("tail mean ms", justify="right")
        tail.add_column("middle mean ms", justify="right")
        for stage, row in sorted(summary.tail.items(), key=lambda kv: -kv[1]["tail_mean"]):
            tail.add_row(plain(stage), f"{row['tail_mean']:,.2f}", f"{row['median_mean']:,.2f}")
        console.print(tail)
    render_decode(summary, console)
    render_load(summary, console)
    render_transfer(summary, console)
    render_quality(summary, console)


_DECODE = (
    ("ttst_ms", "time to second token"),
    ("itl_ms", "inter-token latency (per request)"),
    ("tpot_ms", "time per output token"),
    ("chunk_gap_ms", "chunk gaps (pooled)"),
    ("ttfrt_ms", "time to first reasoning token"),
)


def _figure_line(label: str, value: dict, counted: str) -> Text:
    return Text(
        f"{label}  p50 {value['p50']:,.2f} ms  p90 {value['p90']:,.2f} ms  "
        f"p99 {value['p99']:,.2f} ms  ({value['requests']:,} {counted})"
    )


def render_decode(summary: Summary, console: Console) -> None:
    """After the first token, over the ok requests: one line per figure there is."""
    for key, label in _DECODE:
        value = getattr(summary, key)
        if value:
            console.print(
                _figure_line(label, value, "gaps" if key == "chunk_gap_ms" else "requests")
            )


def _rate(per_s: float | None, unit: str) -> str:
    return f"{per_s:,.2f} {unit}/s" if per_s is not None else f"{unit}/s n/a (no duration)"


def slo_text(slo: dict[str, float]) -> str:
    """The SLOs of `Summary.goodput` as ``ttft ≤ 500 ms, e2e ≤ 2,000 ms``."""
    return ", ".join(f"{key.removesuffix('_ms')} ≤ {ms:,g} ms" for key, ms in slo.items())


def render_load(summary: Summary, console: Console) -> None:
    """The load the trace carried (from the client's view) and, with SLOs, the goodput:
    a line each, left out when the summary has neither."""
    load, good = summary.load, summary.goodput
    if load is not None:
        rates = (f"{_rate(load['requests_per_s'], 'requests')}, "
                 f"{_rate(load['output_tokens_per_s'], 'output tokens')}")
        text = f"{load['requests']:,} requests completed in {load['duration_s']:,.2f} s: "
        filtered = load.get("content_filter") or 0
        if filtered:  # ok, so in TTFT, but the answer was cut by the server's filter
            rates += f"; {filtered:,} of them ended by the content filter"
        console.print(labelled("load:", "bold", text + rates))
        if load["e2e_ms"]:
            console.print(_figure_line("end-to-end latency", load["e2e_ms"], "requests"))
    if good is not None:
        meeting = f"{good['requests']:,} of {summary.requests:,} requests ({good['share']:.1%})"
        text = f"{meeting} meet {slo_text(good['slo'])}, {_rate(good['per_s'], 'requests')}"
        console.print(labelled("goodput:", "bold", text + " (a failed request meets none)"))
        stages = good.get("ttft_stages")
        if stages is not None:
            console.print(plain(slo_stages_text(stages)))


def render_transfer(summary: Summary, console: Console) -> None:
    """Disaggregated serving's K/V transfer (`Summary.kv_transfer`) as a two-column table
    fitted to the console; nothing when the trace has no transfer."""
    if summary.kv_transfer is None:
        return
    table = FittedTable(title=TITLE, title_justify="left")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    for name, value in transfer_rows(summary.kv_transfer):
        table.add_row(plain(name), plain(value))
    console.print(table)


def request_counts(summary: Summary) -> str:
    """A headline's ``requests=N (M ok)``, then the requests that did not fail but have no
    window at the boundary (``no_window``: in neither count, so they are named here)."""
    text = f"requests={summary.requests:,} ({summary.requests_ok:,} ok)"
    if left := summary.quality.get("no_window", 0):
        text += f", {left:,} more left out: no TTFT window at this boundary"
    return text


def slo_stages_text(found: dict) -> str:
    """What stands between the requests and the TTFT SLO, in one paragraph."""
    slo = f"TTFT ≤ {found['slo_ms']:g} ms"
    if not found["missing"]:
        return f"  every request meets {slo}"
    rescue = [f"{name} {v['share']:.0%}" for name, v in found["stages"].items() if v["rescued"]]
    line = (f"  {found['missing']:,} of {found['requests']:,} requests miss {slo}; at its "
            "condition's median one stage would rescue: "
            + (", ".join(rescue[:6]) if rescue else "none alone"))
    chosen = found["smallest_set"]
    if chosen is None:
        return line + (f"; even every stage cut to its median leaves p99 at "
                       f"{found['p99_after_ms']:.1f} ms")
    if not chosen:
        return line + f"; p99 ({found['p99_ms']:.1f} ms) already meets it"
    return line + (f"; to bring p99 from {found['p99_ms']:.1f} to "
                   f"{found['p99_after_ms']:.1f} ms, cut to median: {' + '.join(chosen)}"
                   + (" (greedy search)" if found["search"] == "greedy" else ""))


def render_failures(summary: Summary, console: Console) -> None:
    """The failed requests first, by kind with a few examples: TTFT figures are over the
    ok requests only, and say so."""
    failed = sum(summary.failures.values())
    if not failed:
        return
    total = summary.requests
    kinds = ", ".join(f"{kind} {n:,} ({n / total:.1%})" for kind, n in summary.failures.items())
    console.print(
        labelled(
            "failures:",
            "bold red",
            f"{failed:,} of {total:,} requests ({failed / total:.1%}): {kinds}; "
            f"TTFT below is over the {summary.requests_ok:,} ok requests",
        ),
        overflow="fold",
    )
    for kind, examples in summary.failure_examples.items():
        for example in examples:
            code, error = example["status_code"], example["error"] or "-"
            status = f" HTTP {code}" if code and not error.startswith(f"HTTP {code}") else ""
            line = plain(f"  {kind}: {example['trace_id']}{status}: {error}", style="red")
            console.print(line, overflow="fold")  # wrapped to the width, nothing cut
    seen = summary.failed_first_token
    if seen:
        console.print(
            Text(
                f"  {seen['requests']:,} failed requests saw a first token (TTFT p50 "
                f"{seen['ttft_ms']['p50']:,.2f} ms, p99 {seen['ttft_ms']['p99']:,.2f} ms), "
                "not counted above"
            )
        )


def render_quality(summary: Summary, console: Console) -> None:
    """The data-quality lines and, when a clock pair disagrees, the clock lines."""
    quality = {k: v for k, v in summary.quality.items() if v}
    if quality:
        for defect, count in quality.items():
            line = f"{count:,} {defect}: {MEANING[defect]}"
            console.print(labelled("data quality:", "yellow", line))
    else:
        console.print(Text("data quality: no defects found", style="green"))
    for c in summary.clocks or []:  # present only when a clock pair disagrees
        pair = f"{c['server_clock']} → {c['client_clock']}"
        how = (
            f"estimate {c['estimate_ms']:+,.3f} ms, {spread_words(c)}, "
            f"{c['requests']:,} requests; "
            + ("server interval outside the client's: " if c["client_clock"] == CLIENT_CLOCK
               else "worker spans outside the server's: ")
            + f"{c['violations_before']:,} → {c['violations_after']:,}"
        )
        if c["applied"]:
            line = f"{pair} offset {c['offset_ms']:+,.3f} ms ({how})"
        else:
            line = f"{pair} not adjusted ({how})"
        console.print(labelled("clocks:", "yellow", line + moved_in_all(summary.clocks, c)))


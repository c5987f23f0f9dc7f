"""``ttft compare A B``: percentile deltas of two traces per condition and stage, with
bootstrap confidence intervals, and an optional regression gate for CI jobs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from rich.table import Table
from rich.text import Text

from ttft.reports._app import (
    BoundaryName,
    PolicyName,
    PolicyOption,
    app,
    err,
    fail,
    progress,
    stdout_console,
)
from ttft.reports._load import FormatOption, MappingOption
from ttft.tracer.schema import BOUNDARY_NAMES, CONDITIONS

_CONFIDENCE = 0.95


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(metavar="A", help="the baseline trace (file or directory)")],
    b: Annotated[Path, typer.Argument(metavar="B", help="the trace compared with A")],
    as_json: Annotated[bool, typer.Option("--json", help="print the table as JSON")] = False,
    max_regression: Annotated[
        float | None,
        typer.Option(
            metavar="PCT",
            min=0.0,
            help="exit 1 when TTFT p50 or p99 (any condition) got significantly worse by "
            "more than PCT percent",
        ),
    ] = None,
    boundary: Annotated[
        BoundaryName | None,
        typer.Option(help="TTFT boundary (default: the outermost both traces support)"),
    ] = None,
    policy: PolicyOption = PolicyName["exclusive"],
    resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples per trace")] = 1000,
    seed: Annotated[int, typer.Option(min=0, help="seed of the bootstrap")] = 0,
    format: FormatOption = None,
    mapping: MappingOption = None,
) -> None:
    """Compare B against A: TTFT and every stage's p50/p90/p99 per condition (all, cold,
    prefix_hit), the delta B - A with a bootstrap 95% confidence interval, flagged when the
    interval excludes zero."""
    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute
    from ttft.analysis.compare import compare as compare_attributions
    from ttft.analysis.compare import regressions
    from ttft.reports._load import load_trace

    tables = [load_trace(path, format=format, mapping=mapping)[0] for path in (a, b)]
    with progress("assembling requests"):
        asms = [assemble(table) for table in tables]
    chosen = boundary.value if boundary else _common_boundary(asms, (a, b))
    with progress(f"attributing at the {chosen} boundary"):
        attrs = [attribute(asm, chosen, policy.value) for asm in asms]
    for path, attr in zip((a, b), attrs, strict=True):
        if len(attr.requests) == 0:
            raise fail(f"{path}: no request has a TTFT window at the {chosen} boundary")
    with progress(f"bootstrapping {resamples:,} resamples per trace"):
        table = compare_attributions(
            attrs[0], attrs[1], resamples=resamples, seed=seed, confidence=_CONFIDENCE
        )
    if as_json:
        out = {
            "a": str(a),
            "b": str(b),
            "boundary": chosen,
            "policy": policy.value,
            "resamples": resamples,
            "seed": seed,
            "rows": _records(table),
        }
        sys.stdout.write(json.dumps(out, indent=2, allow_nan=False) + "\n")
    else:
        counts = [attr.requests["condition"].value_counts() for attr in attrs]
        _render(table, (str(a), str(b)), chosen, policy.value, resamples, seed, attrs, counts)
    if max_regression is None:
        return
    worse = regressions(table, max_regression)
    for row in worse.itertuples(index=False):
        err.print(
            Text(
                f"TTFT p{row.percentile} ({row.condition}) {row.delta_pct:+.1f}% "
                f"[CI {row.ci_lo_ms:+,.1f}…{row.ci_hi_ms:+,.1f} ms] "
                f"exceeds {max_regression:g}%",
                style="red",
            ),
            soft_wrap=True,
        )
    if len(worse):
        raise typer.Exit(code=1)
    err.print(Text(f"no significant regression over {max_regression:g}%", style="green"))


def _common_boundary(asms: list, paths: tuple[Path, Path]) -> str:
    """The outermost boundary that both traces support (some request has its window)."""
    supported = [[n for n in BOUNDARY_NAMES if asm.has_window(n).any()] for asm in asms]
    for name in BOUNDARY_NAMES:
        if all(name in names for names in supported):
            return name
    what = "; ".join(
        f"{path} supports {', '.join(names) or 'none'}"
        for path, names in zip(paths, supported, strict=True)
    )
    raise fail(f"the traces share no TTFT boundary ({what})")


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain JSON values, NaN as None."""
    rows = []
    for record in table.to_dict("records"):
        row = {}
        for key, value in record.items():
            if hasattr(value, "item"):  # a numpy scalar
                value = value.item()
            if isinstance(value, float) and math.isnan(value):
                value = None
            row[key] = value
        rows.append(row)
    return rows


def _render(
    table: pd.DataFrame,
    paths: tuple[str, str],
    boundary: str,
    policy: str,
    resamples: int,
    seed: int,
    attrs: list,
    counts: list[pd.Series],
) -> None:
    console = stdout_console()
    n_a, n_b = (len(attr.requests) for attr in attrs)
    console.print(
        Text.assemble(
            ("ttft compare ", "bold"),
            ("A ", "bold"),
            (paths[0], "bold cyan"),
            ("  B ", "bold"),
            (paths[1], "bold cyan"),
            f"\nboundary={boundary}  policy={policy}  requests A={n_a:,} B={n_b:,}",
        )
    )
    conditions = list(dict.fromkeys(table["condition"]))
    for cond in conditions:
        console.print(_condition_table(table[table["condition"] == cond], cond, conditions))
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


def _condition_table(rows: pd.DataFrame, cond: str, conditions: list[str]) -> Table:
    first = rows.iloc[0]
    if cond == "all":
        label = "all requests"
        others = [c for c in conditions if c != "all"]
        if len(others) > 1:
            label += " (mixes " + " and ".join(others) + ")"
    else:
        label = cond
    title = f"{label}: A {first['a_requests']:,} · B {first['b_requests']:,} requests"
    out = Table(title=title, title_justify="left")
    out.add_column("metric")
    out.add_column("pct", justify="right")
    for name in ("A ms", "B ms", "Δ ms", "Δ %"):
        out.add_column(name, justify="right")
    out.add_column(f"{_CONFIDENCE:.0%} CI of Δ ms", justify="center", no_wrap=True)
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
    if row.ci_lo_ms > 0:
        marker = Text("worse", style="bold red")
    elif row.ci_hi_ms < 0:
        marker = Text("better", style="bold green")
    else:
        marker = Text("~", style="dim")
    return [
        "TTFT" if row.metric == "ttft" else row.metric,
        f"p{row.percentile}",
        f"{row.a_ms:,.2f}",
        f"{row.b_ms:,.2f}",
        f"{row.delta_ms:+,.2f}",
        pct,
        f"{row.ci_lo_ms:+,.2f} … {row.ci_hi_ms:+,.2f}",
        marker,
    ]

"""``ttft compare A B``: percentile deltas of two traces per condition and stage, with
bootstrap confidence intervals and Holm-corrected p-values, a warning when the two ran
under different load, and an optional regression gate for CI jobs that uses the corrected
decisions."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, progress, stdout_console
from ttft.reports.cli._options import (
    BoundaryName,
    FormatOption,
    MappingOption,
    PolicyName,
    PolicyOption,
    SchedulerOption,
    SloOption,
    WorkersOption,
)
from ttft.reports.cli._where import analysed
from ttft.tracer.schema import BOUNDARY_NAMES

if TYPE_CHECKING:
    import pandas as pd

# analysis.compare's defaults, repeated so that --help shows them without loading the
# analysis (ttft.analysis imports pandas); tests/reports/test_cmd_compare.py pins them equal.
CORRECTION = "holm"
FLOOR_MS = 0.1
FLOOR_PCT = 1.0

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
    floor_ms: Annotated[float, typer.Option(
        metavar="MS", min=0.0, help="practical floor: a smaller delta is never a change"
    )] = FLOOR_MS,
    floor_pct: Annotated[float, typer.Option(
        metavar="PCT", min=0.0, help="practical floor: a delta under PCT percent of A's "
        "value is never a change"
    )] = FLOOR_PCT,
    all_rows: Annotated[bool, typer.Option(
        "--all", help="show every stage row, not only those that changed")] = False,
    format: FormatOption = None,
    mapping: MappingOption = None,
    slo: SloOption = None,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
) -> None:
    """Compare B against A: TTFT and every stage's p50/p90/p99 per condition (all, cold,
    prefix_hit), the delta B - A with a bootstrap 95% confidence interval (blocks of
    consecutive requests, which are not independent) and a p-value Holm-adjusted over every
    comparison; a change is flagged when its adjusted p is under 0.05 and it is at least
    max(--floor-ms, --floor-pct of A). A warning comes first when the two runs had
    different load (offered or achieved rate, concurrency, output length, prompt lengths).
    Then each trace's throughput, end-to-end latency and, with --slo, goodput, with their
    deltas. With --workers or --scheduler, A and B are partitioned datasets (ttft
    partition) analysed one partition per Dask task, with exactly the table of one process
    (a dataset's prompt lengths are not compared, with or without workers)."""
    from ttft.analysis.compare import compare as compare_attributions
    from ttft.analysis.compare import compare_failures, failure_regressions, regressions
    from ttft.analysis.load_compare import compare_load, load_checks

    given = boundary.value if boundary else None
    analyses = _analysed((a, b), given, policy.value, format, mapping, slo, workers, scheduler)
    attrs = [x.attribution for x in analyses]
    summaries = [x.summary for x in analyses]
    metadata = [x.metadata for x in analyses]
    from ttft.analysis.load_compare import prompt_tokens
    from ttft.collectors import TraceLocation

    # A partitioned dataset's prompt lengths are not gathered across its partitions (see
    # `compare`): one process leaves them out too, so both give one answer for one dataset.
    prompts = None if any(TraceLocation(str(path)).kind == "dataset" or x.assembly is None
                          for path, x in zip((a, b), analyses, strict=True)) else tuple(
        prompt_tokens(x.assembly) for x in analyses)
    chosen = attrs[0].boundary
    load = compare_load(*summaries)
    checks = load_checks((metadata[0], metadata[1]), (summaries[0], summaries[1]), prompts)
    # A trace whose every request failed has no TTFT to compare, and its failure rate is
    # what a gate must catch: the rates are compared whenever either trace has requests.
    empty = [path for path, attr in zip((a, b), attrs, strict=True) if len(attr.requests) == 0]
    for path, attr in zip((a, b), attrs, strict=True):
        if len(attr.requests) == 0 and len(attr.failed) == 0:
            raise fail(f"{path}: no request has a TTFT window at the {chosen} boundary")
    with progress(f"bootstrapping {resamples:,} resamples per trace"):
        table = None if empty else compare_attributions(
            attrs[0], attrs[1], resamples=resamples, seed=seed, confidence=_CONFIDENCE,
            floor_ms=floor_ms, floor_pct=floor_pct,
        )
        failures = compare_failures(
            attrs[0], attrs[1], resamples=resamples, seed=seed, confidence=_CONFIDENCE
        )
    from ttft.reports.views.compare import (
        render_compare,
        render_failure_rates,
        render_header,
        render_load_compare,
        render_load_warning,
        render_method,
        render_verdict,
        side_deployments,
    )

    console = stdout_console()
    # The warning comes before anything else: on stdout above the tables, on stderr with
    # --json (whose stdout is the JSON alone).
    render_load_warning(checks, err if as_json else console)
    for path in empty:
        err.print(plain(f"{path}: no request that did not fail has a TTFT window at the "
                        f"{chosen} boundary: TTFT is not compared, failure rates are"),
                  soft_wrap=True)
    if as_json:
        rows = [] if table is None else _records(table)
        out = {
            "a": str(a),
            "b": str(b),
            "boundary": chosen,
            "policy": policy.value,
            "resamples": resamples,
            "seed": seed,
            "correction": CORRECTION,
            "alpha": round(1 - _CONFIDENCE, 10),
            "floor": {"ms": floor_ms, "pct": floor_pct},
            "comparisons": sum(r["p_value"] is not None for r in rows),
            "changed": sum(bool(r["significant"]) for r in rows),
            "load_differs": any(c["differs"] for c in checks),
            "load_checks": checks,
            "rows": rows,
            "failures": _records(failures),
            "slo": {f"{name}_ms": ms for name, ms in slo.items()} if slo else None,
            "load": _records(load),
            # ok requests without a window at the boundary: in neither TTFT nor failures
            "no_window": {side: attr.quality.counts["no_window"]
                          for side, attr in zip("ab", attrs, strict=True)},
        }
        sys.stdout.write(json.dumps(out, indent=2, allow_nan=False) + "\n")
    else:
        counts = [attr.requests["condition"].value_counts() for attr in attrs]
        from ttft.reports.terminal import slo_text

        render_header((str(a), str(b)), chosen, policy.value, attrs, console,
                      side_deployments(metadata, attrs))
        if table is not None:
            render_verdict(table, console, _CONFIDENCE, (floor_ms, floor_pct))
        render_failure_rates(failures, console, _CONFIDENCE)
        if table is not None:
            render_compare(table, counts, console, _CONFIDENCE, all_rows)
        good = summaries[0].goodput
        render_load_compare(load, console, slo_text(good["slo"]) if good else None)
        if table is not None:
            render_method(table, console, _CONFIDENCE, resamples, seed)
    if max_regression is None:
        return
    lines = [
        f"TTFT p{row.percentile} ({row.condition}) {row.delta_pct:+.1f}% "
        f"[CI {row.ci_lo_ms:+,.1f}…{row.ci_hi_ms:+,.1f} ms, p (Holm) {row.p_holm:.2g}] "
        f"exceeds {max_regression:g}%"
        for row in (() if table is None else
                    regressions(table, max_regression).itertuples(index=False))
    ] + [
        f"failures ({row.condition}) {row.a_rate:.1%} → {row.b_rate:.1%} "
        f"[CI of the rise {row.ci_lo_pp:+.1f}…{row.ci_hi_pp:+.1f} points, p (Holm) "
        f"{row.p_holm:.2g}] exceeds {max_regression:g}%"
        for row in failure_regressions(failures, max_regression).itertuples(index=False)
    ]
    for line in lines:
        err.print(plain(line, "red"), soft_wrap=True)
    if lines:
        raise typer.Exit(code=1)
    err.print(Text(f"no significant regression over {max_regression:g}% (Holm-corrected, "
                   f"floor max({floor_ms:g} ms, {floor_pct:g}% of A))", style="green"))


def _analysed(paths: tuple[Path, Path], given: str | None, policy: str, format: str | None,
              mapping: Path | None, slo: dict[str, float] | None, workers: int | None,
              scheduler: str | None) -> list:
    """Both traces analysed (in this process, or on Dask with ``workers`` or
    ``scheduler``) at ``given``, else at the outermost boundary both support."""
    from ttft.reports.runs.analyses import compare_locations

    with analysed(list(paths), format=format, mapping=mapping, workers=workers,
                  scheduler=scheduler) as where:
        return compare_locations(
            where.locations, where.runner, boundary=given, policy=policy, slo=slo,
            choose=lambda found: _common_boundary(found, paths), on_done=where.on_done)


def _common_boundary(supported: list[tuple[str, ...]], paths: tuple[Path, Path]) -> str:
    """The outermost boundary that both traces support (some request has its window;
    ``supported`` lists each trace's); a trace that supports none (every request failed
    before a first token) takes the other's, where only failure rates are compared."""
    known = [names for names in supported if names] or supported
    for name in BOUNDARY_NAMES:
        if all(name in names for names in known):
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

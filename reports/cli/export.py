"""``ttft export``: write a trace in another tool's format (Perfetto / Chrome trace JSON) or
its requests as CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._text import labelled, plain
from ttft.reports.cli._app import app, err, fail, progress
from ttft.reports.cli._options import (
    BoundaryOption,
    FormatOption,
    MappingOption,
    PolicyName,
    PolicyOption,
    TraceArgument,
)


@app.command()
def export(
    trace: TraceArgument,
    perfetto: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.json",
            help="write Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing",
        ),
    ] = None,
    csv: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.csv",
            help="write one row per request: ids, condition, outcome, status code, start "
            "(start_ns, start_time in ISO 8601 UTC, start_offset_ms from the first request), "
            "TTFT, "
            "each stage's attributed ms, TPOT, ITL, end-to-end ms, prompt and completion "
            "tokens (failed requests included; a blank cell: not known)",
        ),
    ] = None,
    requests: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="export the first N requests by start time and the engine steps around "
            "them (0: all; large exports make the UI slow)",
        ),
    ] = 100,
    format: FormatOption = None,
    mapping: MappingOption = None,
    boundary: BoundaryOption = None,
    policy: PolicyOption = PolicyName["exclusive"],
) -> None:
    """Export requests as a timeline: a process per service and clock, one track per
    request (overlapping spans on separate lanes), GPU work per device, the boundary
    events as markers, and a flow from each client span to its server span; or, with
    --csv, every request's figures as a table (its TTFT split at --boundary under
    --policy; --requests does not apply)."""
    from ttft.reports.cli._app import analyze_trace, load_trace

    if perfetto is None and csv is None:
        raise fail("nothing to export: give --perfetto OUT.json or --csv OUT.csv")
    if csv is not None:
        analysis = analyze_trace(trace, boundary=boundary.value if boundary else None,
                                 policy=policy.value, format=format, mapping=mapping)
        _write_csv(csv, analysis)
        from ttft.tracer.span_ids import to_v1

        table = to_v1(analysis.table)  # read with ids as bytes for the analysis
    else:
        table, _ = load_trace(trace, format=format, mapping=mapping)
    if perfetto is not None:
        _write_perfetto(trace, table, perfetto, requests)


def _write_csv(path: Path, analysis) -> None:
    """``analysis.load.request_table`` of ``analysis`` as CSV (blank for unknown)."""
    from ttft.analysis.load import request_table

    frame = request_table(analysis.assembly, analysis.attribution)
    try:
        frame.to_csv(path, index=False, na_rep="")
    except OSError as exc:
        raise fail(f"{path}: cannot write ({exc.strerror or exc})") from None
    err.print(plain(f"wrote {path}: {len(frame):,} requests, {frame.shape[1]} columns "
                    f"(TTFT at the {analysis.attribution.boundary} boundary)"), soft_wrap=True)


def _write_perfetto(trace: str, table, perfetto: Path, requests: int) -> None:
    from ttft.reports.perfetto import perfetto_trace, request_traces, write_perfetto

    with progress(f"exporting {table.num_rows:,} spans"):
        count = len(request_traces(table, requests))
        document = perfetto_trace(table, requests=requests)
    events = document["traceEvents"]
    try:
        write_perfetto(perfetto, document)
    except OSError as exc:
        raise fail(f"{perfetto}: cannot write ({exc.strerror or exc})") from None
    if not count:
        err.print(labelled("note:", "yellow", f"{trace} holds no requests; the file has no events"))
    err.print(
        plain(
            f"wrote {perfetto}: {count:,} requests, {len(events):,} events; "
            "open it in https://ui.perfetto.dev or chrome://tracing"
        ),
        soft_wrap=True,
    )

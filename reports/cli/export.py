"""``ttft export``: write a trace in another tool's format (Perfetto / Chrome trace JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._text import labelled, plain
from ttft.reports.cli._app import app, err, fail, progress
from ttft.reports.cli._options import FormatOption, MappingOption, TraceArgument


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
) -> None:
    """Export requests as a timeline: a process per service and clock, one track per
    request (overlapping spans on separate lanes), GPU work per device, the boundary
    events as markers, and a flow from each client span to its server span."""
    from ttft.reports.cli._app import load_trace
    from ttft.reports.perfetto import perfetto_events, request_traces, write_perfetto

    if perfetto is None:
        raise fail("nothing to export: give --perfetto OUT.json")
    table, _ = load_trace(trace, format=format, mapping=mapping)
    with progress(f"exporting {table.num_rows:,} spans"):
        count = len(request_traces(table, requests))
        events = perfetto_events(table, requests=requests)
    try:
        write_perfetto(perfetto, events)
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

"""``ttft synth`` and ``ttft analyze``: make a trace, split its TTFTs into stages."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._app import BoundaryName, PolicyName, app, err, fail, progress, stdout_console
from ttft.reports._load import FormatOption, MappingOption, TraceArgument
from ttft.tracer.schema import SCHEMA_VERSION


@app.command()
def synth(
    out: Annotated[Path, typer.Option("-o", "--out", help="trace file to write (.parquet)")],
    requests: Annotated[int, typer.Option(min=1, help="number of requests")] = 1000,
    seed: Annotated[int, typer.Option(help="seed for everything random")] = 0,
    expected: Annotated[
        bool,
        typer.Option(help="also write the attribution the generator expects, beside OUT"),
    ] = False,
) -> None:
    """Write a realistic synthetic trace: client, server, engine and GPU spans that overlap
    the way real ones do (GPU work outlasting its host span, a neighbour's steps between
    prefill chunks, a client window around the server's), some prefix-cache hits."""
    from ttft.collectors.store import write_trace
    from ttft.collectors.synthetic import expected_path, generate, write_expected

    started = time.perf_counter()
    with progress(f"generating {requests:,} requests"):
        synthetic = generate(requests, seed=seed)
    try:
        with progress(f"writing {out}"):
            write_trace(out, synthetic.table, synthetic.metadata)
            if expected:
                write_expected(synthetic, expected_path(out))
    except OSError as exc:
        raise fail(f"{out}: cannot write ({exc.strerror or exc})") from None
    took = time.perf_counter() - started
    err.print(
        f"wrote {out}: {requests:,} requests, {synthetic.table.num_rows:,} spans "
        f"in {took:.1f} s" + (f"; expected attribution in {expected_path(out)}" if expected else "")
    )


@app.command()
def analyze(
    trace: TraceArgument,
    boundary: Annotated[
        BoundaryName | None,
        typer.Option(help="TTFT boundary (default: the outermost the trace supports)"),
    ] = None,
    policy: Annotated[
        PolicyName, typer.Option(help="how overlapping spans share a segment")
    ] = PolicyName["exclusive"],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    per_request: Annotated[
        Path | None,
        typer.Option(help="write one row per request and stage to this Parquet file"),
    ] = None,
    format: FormatOption = None,
    mapping: MappingOption = None,
) -> None:
    """Split every request's TTFT into stages that sum exactly to it, and summarize them
    per stage and per condition (cold, prefix_hit), with the data-quality defects found."""
    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute
    from ttft.analysis.summary import summarize
    from ttft.reports._load import load_trace

    table, metadata = load_trace(trace, format=format, mapping=mapping)
    with progress(f"attributing {table.num_rows:,} spans"):
        asm = assemble(table)
        result = attribute(asm, boundary.value if boundary else None, policy.value)
        summary = summarize(
            result,
            asm,
            trace=str(trace),
            schema_version=int(metadata.get("schema_version", SCHEMA_VERSION)),
        )
    if per_request is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pq.write_table(
                pa.Table.from_pandas(result.per_request(), preserve_index=False), per_request
            )
        except OSError as exc:
            raise fail(f"{per_request}: cannot write ({exc.strerror or exc})") from None
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from ttft.reports.terminal import render_analysis

    render_analysis(summary, stdout_console())

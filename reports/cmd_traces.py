"""``ttft synth`` and ``ttft analyze``: make a trace, split its TTFTs into stages."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports._app import (
    BoundaryOption,
    PolicyName,
    PolicyOption,
    app,
    err,
    fail,
    progress,
    stdout_console,
)
from ttft.reports._load import (
    FormatOption,
    MappingOption,
    ModelConfigOption,
    PeakBandwidthOption,
    PeakTflopsOption,
    RegimeFlag,
    TraceArgument,
)
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
    boundary: BoundaryOption = None,
    policy: PolicyOption = PolicyName["exclusive"],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    per_request: Annotated[
        Path | None,
        typer.Option(help="write one row per request and stage to this Parquet file"),
    ] = None,
    format: FormatOption = None,
    mapping: MappingOption = None,
    regime: RegimeFlag = False,
    peak_tflops: PeakTflopsOption = None,
    peak_bandwidth_gbs: PeakBandwidthOption = None,
    model_config: ModelConfigOption = None,
) -> None:
    """Split every request's TTFT into stages that sum exactly to it, and summarize them
    per stage and per condition (cold, prefix_hit), with the data-quality defects found;
    with --regime, also whether each prefill chunk was compute- or memory-bound."""
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
    found = None
    if regime:
        from ttft.reports.regime_view import compute_regime

        with progress("computing the prefill regime"):
            found = compute_regime(
                table,
                metadata,
                model_config=model_config,
                peak_tflops=peak_tflops,
                peak_bandwidth_gbs=peak_bandwidth_gbs,
            )
    if as_json:
        if found is not None:
            summary["regime"] = _regime_json(found)
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    from ttft.reports.terminal import render_analysis

    console = stdout_console()
    render_analysis(summary, console)
    if found is not None:
        from ttft.reports.regime_view import render_regime

        render_regime(
            found.frame, found.summary, found.peaks, console, device_name=found.device_name
        )


def _regime_json(found) -> dict:
    """The ``regime`` key of ``analyze --json --regime``: the peaks used (or null) and the
    summary rows (an empty list without a model shape); NaN becomes null."""
    peaks = found.peaks
    rows = [] if found.summary is None else json.loads(found.summary.to_json(orient="records"))
    return {
        "peaks": None
        if peaks is None
        else {
            "flops_per_s": peaks.flops_per_s,
            "bytes_per_s": peaks.bytes_per_s,
            "device": peaks.device,
            "source": peaks.source,
        },
        "model_known": found.frame is not None,
        "rows": rows,
    }

"""``ttft report``: the latency report of a trace, as a self-contained HTML file or in the
terminal."""

from __future__ import annotations

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
    TraceArgument,
)


@app.command()
def report(
    trace: TraceArgument,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="write a self-contained HTML report here (opens with no network); "
            "without it the report is printed in the terminal",
        ),
    ] = None,
    boundary: BoundaryOption = None,
    policy: PolicyOption = PolicyName["exclusive"],
    format: FormatOption = None,
    mapping: MappingOption = None,
    peak_tflops: PeakTflopsOption = None,
    peak_bandwidth_gbs: PeakBandwidthOption = None,
    model_config: ModelConfigOption = None,
) -> None:
    """Where each request's TTFT went: headline per condition, stage stacks at p50/p90/p99
    and the tail, the TTFT CDF, waterfalls of the median, p99 and slowest requests, queue
    blame, prefill scaling with its fit, each prefill chunk on the traced device's roofline,
    raw durations against attributed time, data quality and the run's metadata."""
    from ttft.reports import report_data
    from ttft.reports._load import load_trace

    started = time.perf_counter()
    table, metadata = load_trace(trace, format=format, mapping=mapping)
    with progress(f"analyzing {table.num_rows:,} spans"):
        data = report_data.build(
            table,
            metadata,
            trace=str(trace),
            boundary=boundary.value if boundary else None,
            policy=policy.value,
            regime_flags={
                "model_config": model_config,
                "peak_tflops": peak_tflops,
                "peak_bandwidth_gbs": peak_bandwidth_gbs,
            },
        )
    if out is None:
        from ttft.reports.terminal_report import render_report

        render_report(data, stdout_console())
        return
    from ttft.reports.html_report import write_html

    try:
        with progress(f"writing {out}"):
            size = write_html(out, data)
    except OSError as exc:
        raise fail(f"{out}: cannot write ({exc.strerror or exc})") from None
    err.print(
        f"wrote {out}: {data.summary['requests']:,} requests, {size / 1e6:.1f} MB "
        f"in {time.perf_counter() - started:.1f} s; open it in a browser (works offline)"
    )

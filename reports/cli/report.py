"""``ttft report``: the latency report of a trace, as a self-contained HTML file or in the
terminal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ttft.reports.cli._app import app, err, fail, progress, stdout_console
from ttft.reports.cli._options import (
    BoundaryOption,
    FormatOption,
    MappingOption,
    ModelConfigOption,
    PeakBandwidthOption,
    PeakTflopsOption,
    PolicyName,
    PolicyOption,
    SchedulerOption,
    SloOption,
    TraceArgument,
    WorkersOption,
)
from ttft.reports.cli._where import analysed, regime_options


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
    slo: SloOption = None,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
) -> None:
    """Where each request's TTFT went: headline per condition, stage stacks at p50/p90/p99
    and the tail, the TTFT CDF, waterfalls of the median, p99 and slowest requests, queue
    blame, prefill scaling with its fit, each prefill chunk on the traced device's roofline,
    raw durations against attributed time, data quality and the run's metadata; the load
    (throughput, end-to-end latency) and, with --slo, the goodput. With --workers or
    --scheduler, a partitioned dataset (ttft partition) is analysed one partition per Dask
    task, with exactly the report of one process."""
    from ttft.reports.cli.sweep import report_sweep

    if report_sweep(trace, out):  # a sweep directory (ttft sweep) has its own report
        return
    started = time.perf_counter()
    from ttft.reports.runs.analyses import report_location

    options = regime_options(model_config, peak_tflops, peak_bandwidth_gbs)
    with analysed([trace], format=format, mapping=mapping, workers=workers,
                  scheduler=scheduler, what="analyzing (blame, prefill, waterfalls)") as where:
        data = report_location(
            where.locations[0], where.runner, boundary=boundary.value if boundary else None,
            policy=policy.value, slo=slo, regime=options, on_done=where.on_done)
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
        f"wrote {out}: {data.summary.requests:,} requests, {size / 1e6:.1f} MB "
        f"in {time.perf_counter() - started:.1f} s; open it in a browser (works offline)"
    )


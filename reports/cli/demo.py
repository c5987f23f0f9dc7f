"""``ttft demo``: the whole loop on one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttft.reports.cli._app import app, err, fail, stdout_console


@app.command()
def demo(
    requests: Annotated[int, typer.Option(min=1, help="requests to send")] = 200,
    out: Annotated[
        Path, typer.Option("-o", "--out", help="folder for the trace and report.html")
    ] = Path("ttft-demo"),
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "small",
    rate: Annotated[float, typer.Option(min=0.01, help="Poisson arrivals per second")] = 6.0,
    seed: Annotated[int, typer.Option(help="seed for everything random")] = 0,
) -> None:
    """Start the reference server in-process on a free loopback port (CPU), trace a mixed
    Poisson workload from the client and the server into one Parquet trace, and print
    where each request's time to first token went; the HTML report goes beside the trace."""
    from ttft.reports.cli._progress import RunDisplay
    from ttft.reports.runs.demo import run_demo
    from ttft.reports.terminal import render_analysis

    err.print(f"starting the reference server (model {model!r}, CPU) on a loopback port")
    try:
        with RunDisplay(err) as display:
            result = run_demo(
                out,
                requests=requests,
                model=model,
                rate_per_s=rate,
                seed=seed,
                callbacks=display.callbacks(),
            )
    except OSError as exc:
        raise fail(f"{out}: {exc.strerror or exc}") from None
    render_analysis(result.summary, stdout_console())
    from ttft.reports import report_data
    from ttft.reports.html_report import write_html

    report = out / "report.html"
    try:
        write_html(report, report_data.build_report(result.analysis))
    except OSError as exc:
        raise fail(f"{report}: cannot write ({exc.strerror or exc})") from None
    err.print(
        f"{result.requests} requests ({result.errors} failed, {result.joined} joined with "
        f"the server's spans) in {result.seconds:.1f} s; trace: {result.trace}; "
        f"report: {report} (open it in a browser; try also: ttft report {result.trace}, "
        f"ttft analyze {result.trace} --boundary engine)"
    )

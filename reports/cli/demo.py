"""``ttft demo``: the whole loop on one machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ttft.reports.cli._app import app, err, fail, require_engine, stdout_console
from ttft.reports.cli._load import print_load

if TYPE_CHECKING:
    from ttft.reports.runs.capacity import Capacity
    from ttft.reports.runs.demo import DemoResult


@app.command()
def demo(
    requests: Annotated[
        int | None,
        typer.Option(min=1, help="requests to send (default: 200, or as many as arrive in "
                     "about 60 s at the offered rate when that is fewer, at least 50)"),
    ] = None,
    out: Annotated[
        Path, typer.Option("-o", "--out", help="folder for the trace and report.html")
    ] = Path("ttft-demo"),
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "small",
    rate: Annotated[
        float | None,
        typer.Option(min=0.01, help="Poisson arrivals per second (default: 60% of the "
                     "capacity a probe measures first; giving it skips the probe)"),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed for everything random")] = 0,
) -> None:
    """Start the reference server in-process on a free loopback port (CPU), trace a mixed
    Poisson workload from the client and the server into one Parquet trace, and print
    where each request's time to first token went; the HTML report goes beside the trace.
    Unless --rate is given, a closed loop first measures what this machine serves (until
    its rate is known to 10%, at most 30 s) and the demo offers 60% of it."""
    require_engine("demo")
    from ttft.reports.cli._progress import RunDisplay
    from ttft.reports.runs.capacity import PROBE_CONCURRENCY, PROBE_MAX_S, PROBE_TOLERANCE
    from ttft.reports.runs.demo import run_demo
    from ttft.reports.terminal import render_analysis

    err.print(f"starting the reference server (model {model!r}, CPU) on a loopback port")
    if rate is None:
        err.print(f"measuring capacity: {PROBE_CONCURRENCY} requests in flight until the rate "
                  f"is known to {PROBE_TOLERANCE:.0%}, at most {PROBE_MAX_S:.0f} s (--rate "
                  "skips this)")
    try:
        with RunDisplay(err) as display:
            result = run_demo(out, requests=requests, model=model, rate_per_s=rate, seed=seed,
                              on_rate=lambda c, r, n: _print_rate(c, r, n, requests, seed),
                              callbacks=display.callbacks())
    except OSError as exc:
        raise fail(f"{out}: {exc.strerror or exc}") from None
    except RuntimeError as exc:
        raise fail(f"{exc} (--rate R skips the capacity probe)") from None
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
    _print_load(result)


def _print_rate(capacity: Capacity | None, rate_per_s: float, requests: int,
                asked: int | None, seed: int) -> None:
    """The capacity the probe measured and the rate the demo offers, before the run (and
    the rate its seeded schedule really offers, where that differs by more than 1%); and
    the requests it sends, with why where fewer than 200 were chosen for a slow rate."""
    from ttft.reports.runs.capacity import PROBE_TOLERANCE
    from ttft.reports.runs.demo import (
        DEMO_ARRIVALS_S,
        DEMO_REQUESTS,
        LOAD_FRACTION,
        schedule_rate_per_s,
    )

    drawn = schedule_rate_per_s(rate_per_s, requests, seed)
    schedule = (f"; seed {seed}'s {requests} arrivals come at {drawn:.2f}/s"
                if drawn is not None and abs(drawn / rate_per_s - 1) > 0.01 else "")
    if asked is None and requests < DEMO_REQUESTS:
        schedule += (f"; {requests} requests, not {DEMO_REQUESTS}: about "
                     f"{DEMO_ARRIVALS_S:.0f} s of arrivals at this rate (--requests N sets it)")
    if capacity is None:
        err.print(f"offered rate: {rate_per_s:.2f} requests/s (Poisson), as given by --rate"
                  f"{schedule}")
        return
    err.print(f"capacity: {capacity.rate_per_s:.2f} ± {capacity.spread_per_s:.2f} requests/s "
              f"(95% interval; {capacity.completions} completions after the warm-up, "
              f"{capacity.concurrency} in flight, probe {capacity.probe_s:.1f} s)")
    if not capacity.settled:
        relative = capacity.spread_per_s / capacity.rate_per_s
        err.print(Text(f"the capacity is known only to ±{relative:.0%} "
                       f"(the probe stops at {PROBE_TOLERANCE:.0%} or its time limit): this "
                       "machine is busy or noisy; --rate R sets the load instead",
                       style="yellow"), soft_wrap=True)
    err.print(f"offered rate: {rate_per_s:.2f} requests/s (Poisson), {LOAD_FRACTION:.0%} of "
              f"the capacity{schedule}")


def _print_load(result: DemoResult) -> None:
    """The achieved against the offered rate (one yellow line when the server did not keep
    up), and one yellow line when any request was shed or failed."""
    print_load(err, result.load)
    failed = result.errors - result.shed
    parts = ([f"{result.shed} shed (HTTP 429/503)"] if result.shed else []) + (
        [f"{failed} failed"] if failed else [])
    if parts:
        err.print(Text(f"{' and '.join(parts)} of {result.requests} requests: lower the load "
                       f"with --rate (offered {result.rate_per_s:.2f}/s)",
                       style="yellow"), soft_wrap=True)

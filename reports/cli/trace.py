"""``ttft trace``: trace a live server from the client side, receiving its own spans over
OTLP, into one trace, and print where the time to first token went."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from ttft.reports._text import plain
from ttft.reports.cli._app import analyze_trace, app, err, fail, print_summary
from ttft.reports.cli._interrupt import RunTally
from ttft.reports.cli._load import print_load
from ttft.reports.cli._progress import RunDisplay
from ttft.reports.cli._workload import UrlArgument, Workload, workload_options


@app.command()
@workload_options(after={"endpoint": ("rate",), "arrival": (
    "concurrency", "burst", "replay", "scale_tokens", "scale_time")})
def trace(
    url: UrlArgument,
    out: Annotated[Path, typer.Option("-o", "--out", help="trace file to write (.parquet)")],
    rate: Annotated[float | None, typer.Option(min=0.001, help="arrivals per second")] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="closed loop: this many requests in flight")
    ] = None,
    burst: Annotated[int | None, typer.Option(min=1, help="this many requests at once")] = None,
    replay: Annotated[
        Path | None, typer.Option(help="replay a request trace (Mooncake JSONL or CSV)")
    ] = None,
    scale_tokens: Annotated[float, typer.Option(min=0.0001, help="replay: scale lengths")] = 1.0,
    scale_time: Annotated[float, typer.Option(min=0.0, help="replay: scale arrival times")] = 1.0,
    *,
    workload: Workload,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the analysis as ttft analyze --json does")
    ] = False,
) -> None:
    """Send a workload to an OpenAI-compatible server (streaming), trace every request from
    the client, receive the server's own spans over OTLP, write both into one trace with
    the run's metadata, and print where the time to first token went.

    Point the server's OTLP exporter at the receiver (for example vLLM:
    --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces; ttft serve: --otlp-endpoint).
    A server that exports nothing still gets the client's view: connect, TTFT, and the
    rest as untraced (the server and the network together)."""
    try:  # the load generator's imports take seconds: Ctrl-C may come here
        from ttft.collectors.trace_run import trace_server
    except KeyboardInterrupt:
        err.print(plain(RunTally({}, out).interrupted_line(), "yellow"), soft_wrap=True)
        raise typer.Exit(code=130) from None

    spec = workload.spec(
        url, rate=rate, concurrency=concurrency, burst=burst,
        replay=str(replay) if replay else None, scale_tokens=scale_tokens, scale_time=scale_time,
    )
    with RunDisplay(err) as display:
        tally = RunTally(display.callbacks(), out)
        try:
            run = trace_server(spec, out, **tally.callbacks())
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the trace is closed; say what it kept
            run = None
        except (ValueError, ConnectionError) as exc:  # may quote a server's body: fail
            raise fail(str(exc)) from None  # prints it as plain text
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""  # a busy port names itself
            raise fail(f"{where}{exc.strerror or exc}") from None
    if run is None:
        err.print(plain(tally.interrupted_line(), "yellow"), soft_wrap=True)
        raise typer.Exit(code=130)
    lengths = run.prompt_lengths.partition(" (")[0]  # exact, mostly exact or approximate
    err.print(
        plain(
            f"{len(run.results)} requests ({run.errors} failed) in {run.seconds:.1f} s; prompt "
            f"lengths {lengths}; {run.server_spans} span rows from the server, "
            f"{run.joined}/{len(run.results)} requests joined; trace: {run.trace}"
        )
    )
    print_load(err, run.load)  # offered against achieved: a yellow line if it did not keep up
    for note in run.notes:  # approximate prompt lengths and why; a model not checked
        err.print(plain(note, "yellow"), soft_wrap=True)
    if run.server_spans == 0:
        from ttft.tracer.schema import REPORTED_SERVICE

        reported = sum(any(row["service"] == REPORTED_SERVICE for row in r.rows)
                       for r in run.results)
        err.print(
            Text.assemble(
                plain(f"the server sent no spans to {run.receiver}", "yellow"),
                Text(
                    ": the analysis below is the client's view only (connect, and the rest of "
                    "TTFT untraced: the server and the network together)" if not reported else
                    ": the analysis below is the client's view and the timings the server "
                    f"reported in {reported} of its responses (estimated spans)",
                    style="yellow",
                ),
            )
        )
    print_summary(analyze_trace(out), as_json=as_json)
    if run.cold and run.cached:  # last, where it is seen: the numbers above are not cold
        err.print(plain(
            f"{run.cached} of {len(run.results)} requests of a cold workload came back with "
            f"cached prompt tokens: the server had seen these prompts (seed {run.seed}) "
            "before; this is not a cold run", "yellow"), soft_wrap=True)

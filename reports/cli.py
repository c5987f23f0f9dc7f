"""The ``ttft`` command line.

Every command reads or writes files the user names; errors a user can act on (a missing
or corrupt trace, a bad option) print one line naming what was wrong and exit with code 2,
without a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ttft.tracer.schema import BOUNDARY_NAMES, METADATA_KEY, POLICIES, SCHEMA_VERSION

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ttft: where did the time to first token go? Trace, attribute, report.",
    rich_markup_mode=None,
)
err = Console(stderr=True, highlight=False)

BoundaryName = Enum("BoundaryName", {b: b for b in BOUNDARY_NAMES}, type=str)  # type: ignore[misc]
PolicyName = Enum("PolicyName", {p: p for p in POLICIES}, type=str)  # type: ignore[misc]


def fail(message: str) -> typer.Exit:
    """Print one error line and return the exit (code 2) to raise."""
    err.print(f"[bold red]error:[/bold red] {message}", soft_wrap=True)
    return typer.Exit(code=2)


@contextmanager
def progress(message: str):
    """A spinner on stderr while ``message`` runs (only on a terminal)."""
    if err.is_terminal:
        with err.status(message):
            yield
    else:
        yield


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
    trace: Annotated[
        Path, typer.Argument(metavar="TRACE", help="a trace file or a directory of part files")
    ],
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
) -> None:
    """Split every request's TTFT into stages that sum exactly to it, and summarize them
    per stage and per condition (cold, prefix_hit), with the data-quality defects found."""
    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute
    from ttft.analysis.summary import summarize
    from ttft.collectors.store import TraceFileError, read_trace

    try:
        with progress(f"reading {trace}"):
            table = read_trace(trace)
    except TraceFileError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{trace}: {exc.strerror or exc}") from None
    metadata = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
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

    render_analysis(summary, Console(highlight=False, width=None if sys.stdout.isatty() else 140))


def _delays(values: list[str]) -> dict[str, float]:
    """``STAGE=MS`` pairs → ``{stage: ms}``, with an error naming a bad pair."""
    out: dict[str, float] = {}
    for value in values:
        stage, sep, ms = value.partition("=")
        try:
            if not sep:
                raise ValueError
            out[stage.strip()] = float(ms)
        except ValueError:
            raise fail(f"--inject-delay {value!r}: expected STAGE=MS, e.g. queue=50") from None
    return out


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "tiny",
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    max_batch_tokens: Annotated[int, typer.Option(min=1, help="token budget per step")] = 512,
    chunk_size: Annotated[int, typer.Option(min=1, help="prefill chunk size")] = 256,
    max_queue: Annotated[int, typer.Option(min=1, help="waiting requests before 429")] = 64,
    api_key: Annotated[str | None, typer.Option(help="require 'Authorization: Bearer KEY'")] = None,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="also export spans over OTLP/HTTP to this URL")
    ] = None,
    trace_out: Annotated[
        Path | None, typer.Option(help="write the server's spans to this Parquet trace")
    ] = None,
    inject_delay: Annotated[
        list[str] | None,
        typer.Option(help="STAGE=MS: a known delay inside a stage (repeatable)"),
    ] = None,
) -> None:
    """Serve the reference engine over an OpenAI-compatible HTTP API, traced: every
    request's server, engine and forward spans go to --trace-out and/or --otlp-endpoint."""
    from ttft.engine.server import build_engine
    from ttft.engine.server import serve as run_server

    exporters = []
    if trace_out is not None:
        from ttft.collectors.otel_exporter import ParquetSpanExporter

        try:
            exporters.append(ParquetSpanExporter(trace_out))
        except (OSError, ValueError) as exc:
            raise fail(f"{trace_out}: cannot write a trace there ({exc})") from None
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter(endpoint=otlp_endpoint))
    delays = _delays(inject_delay or [])
    try:
        engine = build_engine(
            model,
            device=device,
            max_batch_tokens=max_batch_tokens,
            chunk_size=chunk_size,
            max_queue=max_queue,
            inject_delay_ms=delays,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    err.print(f"serving model {model!r} on http://{host}:{port}/v1 (Ctrl-C to stop)")
    run_server(engine, host=host, port=port, api_key=api_key, exporters=exporters, model_name=model)


@app.command()
def demo(
    requests: Annotated[int, typer.Option(min=1, help="requests to send")] = 200,
    out: Annotated[Path, typer.Option("-o", "--out", help="folder for the trace")] = Path(
        "ttft-demo"
    ),
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "small",
    rate: Annotated[float, typer.Option(min=0.01, help="Poisson arrivals per second")] = 6.0,
    seed: Annotated[int, typer.Option(help="seed for everything random")] = 0,
) -> None:
    """Start the reference server in-process on a free loopback port (CPU), trace a mixed
    Poisson workload from the client and the server into one Parquet trace, and print
    where each request's time to first token went."""
    from ttft.reports.demo import run_demo
    from ttft.reports.terminal import render_analysis

    try:
        with progress(f"serving {model!r} and sending {requests} requests"):
            result = run_demo(out, requests=requests, model=model, rate_per_s=rate, seed=seed)
    except OSError as exc:
        raise fail(f"{out}: {exc.strerror or exc}") from None
    render_analysis(
        result.summary, Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    )
    err.print(
        f"{result.requests} requests ({result.errors} failed) in {result.seconds:.1f} s; "
        f"trace: {result.trace} (try: ttft analyze {result.trace} --boundary engine)"
    )


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

"""``ttft collect``: receive spans over OTLP/HTTP and OTLP/gRPC into a trace directory."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ttft.reports.cli._app import app, err, fail

_POLL_S = 0.2  # how often the wait loop wakes; bounds how late --duration stops


def _trace_path(out: Path) -> Path:
    """A new trace file in ``out``: one per run, so runs into one directory accumulate and
    ``read_spans(out)`` reads them all."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return out / f"collect-{stamp}-{os.getpid()}.parquet"


def _wait(stop: threading.Event, duration_s: float | None) -> None:
    """Block until ``stop`` is set (a signal) or ``duration_s`` has passed."""
    deadline_s = None if duration_s is None else time.monotonic() + duration_s
    while not stop.is_set():
        left_s = _POLL_S if deadline_s is None else min(_POLL_S, deadline_s - time.monotonic())
        if left_s <= 0:
            return
        stop.wait(left_s)


def _trap_signals(stop: threading.Event) -> dict[int, Any]:
    """Make SIGINT and SIGTERM set ``stop``; returns the handlers they replaced (none off the
    main thread, where handlers cannot be installed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {number: signal.signal(number, lambda *_: stop.set())
            for number in (signal.SIGINT, signal.SIGTERM)}


@app.command()
def collect(
    out: Annotated[Path, typer.Option("-o", "--out", help="directory for the trace (created "
                                      "if missing); each run adds one .parquet file")],
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(min=0, max=65535,
                                           help="OTLP/HTTP port; 0 picks a free one")] = 4318,
    grpc_port: Annotated[int, typer.Option(min=0, max=65535,
                                           help="OTLP/gRPC port; 0 picks a free one")] = 4317,
    no_http: Annotated[bool, typer.Option("--no-http", help="do not listen for OTLP/HTTP")] = False,
    no_grpc: Annotated[bool, typer.Option("--no-grpc", help="do not listen for OTLP/gRPC")] = False,
    token: Annotated[str | None, typer.Option(
        envvar="TTFT_COLLECT_TOKEN",
        help="require 'Authorization: Bearer TOKEN' on every export")] = None,
    duration: Annotated[float | None, typer.Option(
        min=0, help="stop by itself after this many seconds")] = None,
) -> None:
    """Receive spans that OpenTelemetry SDKs export over OTLP (HTTP and gRPC) and write them
    as one ttft trace file in --out, until Ctrl-C, SIGTERM or --duration. While it runs, the
    spans so far are readable from the file's '.parts' directory."""
    from ttft.collectors import TraceWriter
    from ttft.collectors.otlp_grpc import Collector

    if no_http and no_grpc:
        raise fail("--no-http and --no-grpc together leave nothing to listen on")
    if out.exists() and not out.is_dir():
        raise fail(f"{out}: not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        writer = TraceWriter(_trace_path(out), log=True)
    except OSError as exc:
        raise fail(f"{out}: cannot write a trace there ({exc.strerror or exc})") from None
    collector = Collector(writer, host=host, http_port=None if no_http else http_port,
                          grpc_port=None if no_grpc else grpc_port, token=token)
    stop = threading.Event()
    previous = _trap_signals(stop)  # before start, so an early Ctrl-C still closes the writer
    try:
        try:
            collector.start()
        except OSError as exc:
            writer.close()
            writer.path.unlink(missing_ok=True)  # the empty trace of a run that never started
            raise fail(exc.strerror or str(exc)) from None
        writer.set_metadata(workload={"command": "ttft collect",
                                      "otlp_http": collector.http_endpoint,
                                      "otlp_grpc": collector.grpc_endpoint})
        for protocol, endpoint in (("OTLP/HTTP", collector.http_endpoint),
                                   ("OTLP/gRPC", collector.grpc_endpoint)):
            if endpoint is not None:
                err.print(f"{protocol} listening on {endpoint}", markup=False, soft_wrap=True)
        err.print(f"writing spans to {writer.path} (Ctrl-C to stop)", markup=False,
                  soft_wrap=True)
        try:
            _wait(stop, duration)
        finally:
            drained = collector.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
    try:
        writer.close()
    except OSError as exc:
        raise fail(f"{writer.path}: could not finish the trace ({exc})") from None
    notes = [] if drained else ["a request was still being served at exit"]
    if writer.dropped_rows:
        notes.append(f"{writer.dropped_rows} rows lost to failed writes")
    err.print(
        f"collected {collector.spans_received} spans from {collector.requests} requests "
        f"({collector.rejected} requests rejected, {collector.spans_rejected} spans rejected"
        + "".join(f"; {note}" for note in notes) + f") into {writer.path}",
        markup=False, soft_wrap=True,
    )

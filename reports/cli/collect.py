"""``ttft collect``: receive spans over OTLP/HTTP and OTLP/gRPC into a trace directory."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ttft.reports._text import plain
from ttft.reports.cli._app import _count, app, err, fail, progress

if TYPE_CHECKING:
    from ttft.collectors import TraceLocation

_POLL_S = 0.2  # how often the wait loop wakes; bounds how late --duration stops


def _wait(stop: threading.Event, duration_s: float | None, tick: Any = None) -> None:
    """Block until ``stop`` is set (a signal) or ``duration_s`` has passed, calling ``tick``
    (if any) each time the loop wakes."""
    deadline_s = None if duration_s is None else time.monotonic() + duration_s
    while not stop.is_set():
        left_s = _POLL_S if deadline_s is None else min(_POLL_S, deadline_s - time.monotonic())
        if left_s <= 0:
            return
        stop.wait(left_s)
        if tick is not None:
            tick()


class _RejectedRecord:
    """Keeps the run metadata's ``rejected`` (what analysis counts as ``rejected_span``) up
    to the receivers' count: the writer's log carries each new count as it changes, so a
    collector killed before its stop still leaves a run that says what it dropped."""

    def __init__(self, writer: Any, collector: Any) -> None:
        self._writer, self._collector = writer, collector
        self._recorded = 0

    def __call__(self, *, final: bool = False) -> None:
        count = self._collector.spans_rejected
        if count == self._recorded:
            return
        try:
            self._writer.set_metadata(rejected={"count": count,
                                                "examples": self._collector.rejected_examples})
        except OSError:
            # held in memory all the same: the next try, and the closed file, carry it
            if final:
                raise
            return
        self._recorded = count


def _trap_signals(stop: threading.Event) -> dict[int, Any]:
    """Make SIGINT and SIGTERM set ``stop``; returns the handlers they replaced (none off the
    main thread, where handlers cannot be installed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {number: signal.signal(number, lambda *_: stop.set())
            for number in (signal.SIGINT, signal.SIGTERM)}


@dataclass
class _Listen:
    """Where and how ``ttft collect`` listens."""

    host: str
    http_port: int | None
    grpc_port: int | None
    token: str | None


def _receive(out: TraceLocation, listen: _Listen, duration_s: float | None, *,
             staged: bool) -> None:
    """Receive into a new run appended to ``out`` (``staged``: in the dataset's staging)
    until a signal or ``duration_s``, then close it and say what was collected."""
    from ttft.collectors.otlp_grpc import Collector

    try:
        writer = out.writer(staged=staged, log=True)
    except OSError as exc:
        where = out.staging if staged else out.path
        raise fail(f"{where}: cannot write a trace there ({exc.strerror or exc})") from None
    collector = Collector(writer, host=listen.host, http_port=listen.http_port,
                          grpc_port=listen.grpc_port, token=listen.token)
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
        record = _RejectedRecord(writer, collector)
        try:
            _wait(stop, duration_s, record)
        finally:
            drained = collector.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
    problem = None
    try:
        record(final=True)
    except OSError as exc:  # the log is failing; closing still writes the merged file
        problem = exc
    try:
        writer.close()
    except OSError as exc:
        raise fail(f"{writer.path}: could not finish the trace ({exc})") from None
    if problem is not None:
        err.print(f"warning: {writer.path}: the span log could not record the rejected "
                  f"count ({problem}); the finished trace holds it", markup=False,
                  soft_wrap=True)
    notes = [] if drained else ["a request was still being served at exit"]
    if writer.dropped_rows:
        notes.append(f"{writer.dropped_rows} rows lost to failed writes")
    err.print(
        f"collected {collector.spans_received} spans from {collector.requests} requests "
        f"({collector.rejected} requests rejected, {collector.spans_rejected} spans rejected"
        + "".join(f"; {note}" for note in notes) + f") into {writer.path}",
        markup=False, soft_wrap=True,
    )


@app.command()
def collect(
    out: Annotated[Path, typer.Option("-o", "--out", help="directory for the trace (created "
                                      "if missing); each run adds one .parquet file; with "
                                      "--partitions, the dataset directory")],
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
    partitions: Annotated[int | None, typer.Option(
        "--partitions", metavar="N",
        help="write --out as a partitioned dataset of N partitions (as ttft partition "
             "does): spans are received durably into OUT/_incoming/ and partitioned at "
             "the stop, which holds them all in memory (and, collecting into an existing "
             "dataset of N partitions, its spans too: about what ttft analyze of them "
             "needs)")] = None,
) -> None:
    """Receive spans that OpenTelemetry SDKs export over OTLP (HTTP and gRPC) and write them
    as one ttft trace file in --out, until Ctrl-C, SIGTERM or --duration. While it runs, the
    spans so far are readable from the file's '.parts' directory.

    With --partitions N, --out is a partitioned dataset: new, empty, or one an earlier
    collect wrote with the same N, whose spans are partitioned again with the new ones into
    a new dataset swapped in at the stop (the old one stays readable until then). Spans a
    killed collect staged are partitioned in by the next one."""
    if no_http and no_grpc:
        raise fail("--no-http and --no-grpc together leave nothing to listen on")
    if out.exists() and not out.is_dir():
        raise fail(f"{out}: not a directory")
    listen = _Listen(host, None if no_http else http_port, None if no_grpc else grpc_port,
                     token)
    if partitions is None:
        from ttft.collectors import TraceLocation

        location = TraceLocation(str(out))
        try:
            location.appendable()
        except ValueError as exc:
            raise fail(str(exc)) from None
        _receive(location, listen, duration, staged=False)
        return
    if partitions < 1:
        raise fail(f"--partitions must be at least 1, not {partitions}")
    _collect_dataset(out, partitions, listen, duration)


def _collect_dataset(out: Path, partitions: int, listen: _Listen,
                     duration_s: float | None) -> None:
    """``ttft collect --partitions``: receive into the dataset's staging, then partition
    it in (``reports/runs/partitioned.py``), holding the dataset's lock throughout."""
    from ttft.collectors import TraceFileError, TraceLocation
    from ttft.collectors.staging import holding, recover
    from ttft.reports.cli.partition import describe_written
    from ttft.reports.runs.partitioned import finish_staging

    staging = TraceLocation(str(out)).staging
    try:
        with holding(out):
            recover(out)
            location = TraceLocation(str(out))  # looked at after a crashed swap is put right
            location.appendable(partitions)
            if earlier := location.staged_runs():
                err.print(plain(f"{staging}: {_count(len(earlier), 'run')} of an earlier "
                                "collect, partitioned in at the stop"), soft_wrap=True)
            try:
                _receive(location, listen, duration_s, staged=True)
            except typer.Exit:
                if staging.is_dir() and not any(staging.iterdir()):
                    staging.rmdir()  # a run that never started leaves no staging
                raise
            written = finish_staging(out, partitions, progress)
    except KeyboardInterrupt:
        raise fail(f"interrupted while partitioning; the spans stay staged in {staging}: "
                   f"run ttft collect -o {out} --partitions {partitions} again") from None
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: cannot write ({exc.strerror or exc})") from None
    if written is not None:
        err.print(plain(describe_written(written)), soft_wrap=True)

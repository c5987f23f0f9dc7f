"""``ttft serve``: the reference engine behind an OpenAI-compatible HTTP API, traced."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from ttft.reports.cli._app import app, err, fail


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


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` as uvicorn binds one (``SO_REUSEADDR``, so a
    restart right after a stop works; a port another server listens on still fails), with an
    error naming the address when it cannot be.

    Its protocol is named (``IPPROTO_TCP``, not 0): asyncio turns Nagle's algorithm off
    (``TCP_NODELAY``) only on accepted sockets whose ``proto`` says TCP. With proto 0 a
    kept-alive connection's first SSE chunk waited for the client's delayed ACK, about 40 ms
    on loopback, and ``ttft trace`` saw it as ``network``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise fail(f"cannot serve on {where}: {exc.strerror or exc}") from None
    return sock


def _engine_modules() -> tuple[Any, Any]:
    """``build_engine`` and ``serve`` of the reference server, or one line saying how to
    install the engine's dependencies (PyTorch) when they are missing."""
    try:
        from ttft.engine.server import build_engine
        from ttft.engine.server import serve as run_server
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise fail("ttft serve needs PyTorch, which is not installed: "
                   "pip install 'ttft[engine]'") from None
    return build_engine, run_server


TRACE_OUT_FLUSH_S = 0.5
"""How often ``--trace-out`` writes the spans it holds as a part file (the tracer hands
spans over at least every 0.5 s too)."""


def _exporters(trace_out: Path | None, otlp_endpoint: str | None) -> list[Any]:
    """The span exporters ``--trace-out`` and ``--otlp-endpoint`` ask for."""
    exporters: list[Any] = []
    if trace_out is not None:
        from ttft.collectors.otel_exporter import ParquetSpanExporter

        try:
            # parts at least every TRACE_OUT_FLUSH_S, and one at once: a SIGKILL loses at
            # most about a second of spans and always leaves a readable trace
            exporters.append(ParquetSpanExporter(
                trace_out, flush_interval_s=TRACE_OUT_FLUSH_S, initial_part=True))
        except (OSError, ValueError) as exc:
            raise fail(f"{trace_out}: cannot write a trace there ({exc})") from None
    if otlp_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from ttft.tracer.export_log import OneLineFailures

        # one line while no receiver listens (and one when it does), not one per batch
        exporters.append(OneLineFailures(OTLPSpanExporter(endpoint=otlp_endpoint),
                                         otlp_endpoint))
    return exporters


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="model preset: tiny, small or base")] = "tiny",
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    max_batch_tokens: Annotated[int, typer.Option(min=1, help="token budget per step")] = 512,
    chunk_size: Annotated[int, typer.Option(min=1, help="prefill chunk size")] = 256,
    max_queue: Annotated[int, typer.Option(min=1, help="waiting requests before 429")] = 64,
    preemption: Annotated[
        str,
        typer.Option(help="'off' (reserve every block a request can grow into) or "
                     "'recompute' (reserve the prompt's; when K/V blocks run out, preempt the "
                     "request admitted last and recompute it later, as vLLM does)"),
    ] = "off",
    kv_blocks: Annotated[
        int, typer.Option(min=1, help="K/V cache blocks of 16 positions (a small pool "
                          "makes --preemption recompute preempt)"),
    ] = 1024,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TTFT_API_KEY",
            show_envvar=True,
            help="require 'Authorization: Bearer KEY' (also /openapi.json); prefer the "
            "environment variable, which stays out of the process's command line",
        ),
    ] = None,
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
    disaggregate: Annotated[
        bool,
        typer.Option(help="prefill in a worker process of its own; its K/V blocks go to the "
                     "decode worker (this process) over a socket on 127.0.0.1, or through "
                     "shared memory (--kv-channel shm)"),
    ] = False,
    first_token: Annotated[
        str,
        typer.Option(help="with --disaggregate: deliver the first token from the 'decode' "
                     "side after the K/V transfer (TTFT includes it) or from the 'prefill' "
                     "side at once (the transfer shows in the second token)"),
    ] = "decode",
    report_timings: Annotated[
        bool,
        typer.Option(help="say each answer's times in it, for clients that get no spans: "
                     "a llama.cpp-style 'timings' object (with queue_ms) in the final stream "
                     "chunk or the body, and a Server-Timing header (server_queue, "
                     "server_ttft, server_e2e) on whole answers"),
    ] = False,
    kv_channel: Annotated[
        str | None,
        typer.Option(help="with --disaggregate: how the K/V blocks travel, 'socket' (the "
                     "default: in the channel's messages) or 'shm' (a shared-memory ring on "
                     "this host; only small control messages use the socket)"),
    ] = None,
) -> None:
    """Serve the reference engine over an OpenAI-compatible HTTP API, traced: every
    request's server, engine and forward spans go to --trace-out and/or --otlp-endpoint
    (with --disaggregate the prefill worker's spans too, in its own clock domain).

    The port is bound first, so a busy one fails at once, before the model loads."""
    if first_token not in ("decode", "prefill"):
        raise fail(f"--first-token {first_token!r}: expected decode or prefill")
    if first_token != "decode" and not disaggregate:
        raise fail("--first-token needs --disaggregate")
    if kv_channel is not None and not disaggregate:
        raise fail("--kv-channel needs --disaggregate (no K/V transfer otherwise)")
    if kv_channel not in (None, "socket", "shm"):
        raise fail(f"--kv-channel {kv_channel!r}: expected socket or shm")
    if preemption not in ("off", "recompute"):
        raise fail(f"--preemption {preemption!r}: expected off or recompute")
    if preemption != "off" and disaggregate:
        raise fail("--preemption recompute is not supported with --disaggregate")
    delays = _delays(inject_delay or [])
    if "kv_transfer" in delays and not disaggregate:
        raise fail("--inject-delay kv_transfer=MS needs --disaggregate (no transfer otherwise)")
    sock = _bind(host, port)
    try:
        build_engine, run_server = _engine_modules()
        exporters = _exporters(trace_out, otlp_endpoint)
        err.print(f"loading model {model!r}", markup=False)
        engine = build_engine(
            model,
            device=device,
            max_batch_tokens=max_batch_tokens,
            chunk_size=chunk_size,
            max_queue=max_queue,
            inject_delay_ms=delays,
            disaggregate=disaggregate,
            first_token=first_token,
            kv_channel=kv_channel or "socket",
            preemption=preemption,
            num_blocks=kv_blocks,
        )
    except ValueError as exc:
        sock.close()
        raise fail(str(exc)) from None
    except BaseException:
        sock.close()
        raise
    port = sock.getsockname()[1]  # the OS's pick for --port 0
    mode = (f", disaggregated (first token from {first_token}, K/V over "
            f"{kv_channel or 'socket'})" if disaggregate else "")
    mode += ", recompute preemption" if preemption == "recompute" else ""
    err.print(f"serving model {model!r}{mode} on http://{host}:{port}/v1 (Ctrl-C to stop)")
    run_server(engine, host=host, port=port, api_key=api_key, exporters=exporters,
               model_name=model, sock=sock, report_timings=report_timings)

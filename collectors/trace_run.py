"""Trace a live OpenAI-compatible server: the load generator's client spans and the spans
the server exports to our OTLP receiver, written into one trace with the run's metadata.

This is ``ttft trace`` without the terminal (and what ``ttft demo`` runs against its
in-process server). It imports nothing of the reference engine, so any server will do; one
that exports no spans still gives the client's view (``connect``, ``network``, TTFT).
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from types import FrameType
from typing import Any

from ttft.collectors import loadgen, workloads
from ttft.collectors._server_models import choose_model, server_models
from ttft.collectors._span_wait import last_spans, wait_for_spans
from ttft.collectors._trace_process import TraceProcess
from ttft.collectors.load_rates import LoadClock, LoadRates
from ttft.collectors.workloads import WorkItem
from ttft.tracer.schema import OUTCOME_OK

__all__ = ["TraceRun", "TraceSpec", "build_workload", "server_models", "server_root",
           "trace_server"]

ARRIVALS = ("poisson", "constant")


@dataclass(frozen=True)
class TraceSpec:
    """What to send and how. Exactly one of ``rate``, ``concurrency``, ``burst`` or
    ``replay`` chooses the arrivals; ``requests`` or ``duration_s`` how many there are.

    Attributes:
        url: the server's root URL (``/v1/...`` is appended); a URL ending in ``/v1`` (the
            openai client's ``base_url``) is taken as its root, see :func:`server_root`.
        model: the ``model`` field; None asks the server's ``/v1/models`` for its first.
        endpoint: ``completions`` or ``chat``.
        rate: arrivals per second (``arrival``: ``poisson`` or ``constant`` gaps).
        concurrency: a closed loop with this many requests in flight.
        burst: this many requests all at once.
        replay: a request trace (Mooncake JSONL or CSV), see :func:`workloads.read_replay`.
        requests, duration_s: stop after this many requests / arrivals in this many seconds.
        warmup: untraced requests sent first (they open connections and warm the server).
        prompt_tokens: prompt lengths drawn uniformly from this range (tokens).
        output_tokens: ``max_tokens`` of every request.
        shared_prefix, prefix_tokens: P prefixes x S suffixes, each prefix this long.
        shared_fraction: the share of requests that take a shared prefix.
        seed: for everything random; None (the default) draws a fresh one per run, recorded
            in the trace's metadata, so a second run against a warm server sends new
            prompts instead of becoming prefix-cache hits.
        api_key: sent as ``Authorization: Bearer``; never written to the trace.
        timeout_s: the longest one request may take.
        receiver_host, receiver_port: where the OTLP/HTTP receiver listens (0: any port).
        receiver_grpc_port: where the OTLP/gRPC receiver listens; None: no gRPC receiver.
        receiver_token: bearer token the receiver requires; None: none.
        span_wait_s: after the last response, how long to wait for the server's spans.
    """

    url: str
    model: str | None = None
    endpoint: str = "completions"
    rate: float | None = None
    arrival: str = "poisson"
    concurrency: int | None = None
    burst: int | None = None
    replay: str | None = None
    scale_tokens: float = 1.0
    scale_time: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    warmup: int = 1
    prompt_tokens: tuple[int, int] = (128, 512)
    output_tokens: int = 32
    shared_prefix: tuple[int, int] | None = None
    prefix_tokens: int | None = None
    shared_fraction: float = 1.0
    seed: int | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    receiver_host: str = "127.0.0.1"
    receiver_port: int = 4318
    receiver_grpc_port: int | None = None
    receiver_token: str | None = field(default=None, repr=False)
    span_wait_s: float = 10.0

    def check(self) -> None:
        """Raise ValueError naming the first option that does not make sense."""
        chosen = [n for n in ("rate", "concurrency", "burst", "replay") if getattr(self, n)]
        if len(chosen) != 1:
            raise ValueError("choose exactly one of --rate, --concurrency, --burst, --replay"
                             + (f" (got {', '.join(chosen)})" if chosen else ""))
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"--endpoint must be completions or chat, not {self.endpoint!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"--arrival must be one of {ARRIVALS}, not {self.arrival!r}")
        if self.requests is None and self.duration_s is None and not (self.burst or self.replay):
            raise ValueError("give --requests N or --duration S")
        if self.requests is not None and self.duration_s is not None:
            raise ValueError("give --requests or --duration, not both")
        if self.concurrency and self.duration_s is not None:
            raise ValueError("--concurrency runs a fixed number of requests: use --requests")

    def is_cold(self) -> bool:
        """True when no request is meant to reuse another's prefix (no shared prefixes, no
        replay, whose rows may share them)."""
        return self.shared_prefix is None and self.replay is None

    def seeded(self) -> TraceSpec:
        """This spec with ``seed`` fixed: a fresh random one where it is None."""
        return self if self.seed is not None else replace(self, seed=secrets.randbits(31))

    def count(self) -> int | None:
        """The number of requests the arrivals give (None for a replay: the file's rows)."""
        if self.requests is not None:
            return self.requests
        if self.burst:
            return self.burst
        if self.rate and self.duration_s is not None:
            return max(1, int(self.rate * self.duration_s))
        return None


def server_root(url: str) -> str:
    """The server's root URL: ``url`` without trailing slashes and one trailing ``/v1``, so
    ``http://h:8000/v1/`` (an openai client's ``base_url``) and ``http://h:8000`` name the
    same server. Any other path (a proxy's prefix) is kept."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def build_workload(spec: TraceSpec) -> list[WorkItem]:
    """The spec's requests with their arrival offsets and approximate-length prompts.

    Raises:
        ValueError: a bad option or a bad replay row. OSError: the replay file.
    """
    spec.check()
    spec = spec.seeded()
    n = spec.count()
    if spec.replay:
        items = workloads.read_replay(spec.replay, scale_tokens=spec.scale_tokens,
                                      scale_time=spec.scale_time, limit=n)
        if spec.duration_s is not None:
            items = [it for it in items if it.arrival_s < spec.duration_s]
        if not items:
            raise ValueError(f"{spec.replay}: no requests to replay")
        return items
    assert n is not None
    if spec.rate:
        offsets = (workloads.poisson(spec.rate, n, spec.seed) if spec.arrival == "poisson"
                   else workloads.constant(spec.rate, n))
    else:
        offsets = workloads.burst(n)
    return workloads.generated_prompts(offsets, prompt_tokens=spec.prompt_tokens,
                               max_tokens=spec.output_tokens, shared_prefix=spec.shared_prefix,
                               prefix_tokens=spec.prefix_tokens,
                               shared_fraction=spec.shared_fraction, seed=spec.seed)


@dataclass
class TraceRun:
    """What a traced run did.

    Attributes:
        trace: the trace file written.
        results: the client's view of every request, in workload order.
        model: the model traced.
        exact_prompts: True when the server's tokenizer fitted every prompt exactly.
        prompt_lengths: how exact they are and why, as the run metadata says it.
        seed: the seed the workload was drawn with (``--seed`` repeats the run's prompts).
        cached: requests that came back with prompt tokens served from a prefix cache (the
            usage's ``cached_tokens``, or the server's spans').
        cold: True when the workload was meant to be cold (:meth:`TraceSpec.is_cold`): then
            any ``cached`` request means the server had seen its prompt before.
        notes: what the user should know about the run, one line each: approximate prompt
            lengths and why, a model taken on trust because ``/v1/models`` listed none.
        server_spans: span rows the receiver stored.
        joined: requests with at least one span from the server.
        receiver: the OTLP/HTTP endpoint the server could export to.
        seconds: wall time of the whole run.
        load: the rate the schedule offered and the rate the server achieved
            (:mod:`ttft.collectors.load_rates`).
    """

    trace: Path
    results: list[loadgen.RequestResult]
    model: str
    exact_prompts: bool
    prompt_lengths: str
    seed: int
    cached: int
    cold: bool
    notes: tuple[str, ...]
    server_spans: int
    joined: int
    receiver: str
    seconds: float
    load: LoadRates

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if r.outcome != OUTCOME_OK)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("ttft", "httpx", "opentelemetry-proto", "pyarrow"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            pass
    return out


def trace_server(spec: TraceSpec, out: str | Path, *,
                 on_start: Callable[[int, str], None] | None = None,
                 on_sent: Callable[[int], None] | None = None,
                 on_result: Callable[[loadgen.RequestResult], None] | None = None,
                 on_waiting: Callable[[], None] | None = None,
                 after_load: Callable[[], None] | None = None) -> TraceRun:
    """Run ``spec`` against its server and write one trace to ``out``.

    Steps: ask ``/v1/models`` (a server without it is traced with ``spec.model``); build
    the workload and fit its prompts exactly through the server's tokenizer endpoint when
    it has one (:func:`workloads.fit_prompts`: any failure there leaves them approximate,
    the reason in the metadata and in ``notes``); start the OTLP receiver(s); send it;
    wait (at most ``span_wait_s``) until every answered request's trace has spans from the
    server; stop.

    Interrupted by Ctrl-C (``KeyboardInterrupt``) or, while it runs, by SIGTERM (which it
    handles as Ctrl-C; on the main thread only, the previous handler is restored after), it
    stops sending; stopped during the load, it ends the requests in flight ``cancelled``
    and waits briefly for the server's last spans (``_span_wait.last_spans``: at most
    3 s, a second Ctrl-C cuts it short); then it stops the receivers
    and closes the trace, which holds the server's spans received so far and the client
    spans of every request sent; then the ``KeyboardInterrupt`` goes on.

    Args:
        on_start: called with the number of requests and the receiver endpoint.
        on_sent, on_result: passed to :func:`loadgen.run`.
        on_waiting: called when the load is done and the wait for server spans begins.
        after_load: called when the load is done, before the wait (an in-process server
            stops and flushes its spans here, so even its longest spans arrive).

    Raises:
        ValueError: a bad option. ConnectionError: the server is unreachable, has no such
        model, or no model is known (no ``spec.model`` and no model list). OSError: a
        receiver cannot bind (the message names the protocol and the address; no file is
        written then), or ``out`` cannot be written.
        KeyboardInterrupt: Ctrl-C or SIGTERM, after the trace was closed.
    """
    started = time.perf_counter()
    spec = spec.seeded()
    url = server_root(spec.url)
    with _sigterm_as_interrupt():
        items = build_workload(spec)
        model, models = choose_model(url, spec.model, spec.api_key)
        fit = asyncio.run(workloads.fit_prompts(url, items, model=model,
                                                api_key=spec.api_key))
        items = fit.items
        lengths = _prompt_lengths(fit)
        notes = tuple(([] if fit.exact else [f"prompt lengths {lengths}"])
                      + ([f"model {model!r} not checked: {models['error']}"]
                         if "error" in models else []))
        recorder = TraceProcess(out, _run_metadata(spec, model, models, fit),
                                receivers=_receivers(spec))  # a busy port: no file, named
        try:
            endpoint = recorder.http_endpoint or ""
            if on_start is not None:
                on_start(len(items), endpoint)
            clock = LoadClock(on_sent, on_result)
            try:
                results = asyncio.run(loadgen.run(
                    url, items, chat=spec.endpoint == "chat", model=model,
                    concurrency=spec.concurrency, warmup=spec.warmup, api_key=spec.api_key,
                    timeout_s=spec.timeout_s, writer=recorder.rows, on_sent=clock.on_sent,
                    on_result=clock.on_result))
            except KeyboardInterrupt:
                last_spans(recorder, spec.span_wait_s, on_waiting)
                raise
            if on_waiting is not None:
                on_waiting()
            if after_load is not None:
                after_load()
            wait_for_spans(recorder, {r.trace_id for r in results if r.status_code == 200},
                           spec.span_wait_s)
        finally:
            closed = recorder.close()
            if closed.error is not None and sys.exc_info()[0] is None:
                raise closed.error
    joined = len({r.trace_id for r in results} & closed.trace_ids)
    cached = sum(1 for r in results
                 if (r.cached_tokens or 0) > 0 or r.trace_id in closed.cached_ids)
    assert spec.seed is not None
    return TraceRun(Path(out), results, model, fit.exact, lengths, spec.seed, cached,
                    spec.is_cold(), notes, closed.server_rows, joined, endpoint,
                    time.perf_counter() - started, clock.rates([it.arrival_s for it in items]))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM does what Ctrl-C does: inside ``asyncio.run`` its SIGINT
    handler cancels the main task (whose ``finally`` blocks run) and then raises
    ``KeyboardInterrupt``; elsewhere Python's raises it at once. The previous SIGTERM
    handler is restored after. Off the main thread (where no handler can be installed)
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored or left to the OS: still stop cleanly
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _prompt_lengths(fit: workloads.PromptFit) -> str:
    """``exact (…)``, ``mostly exact (…)`` or ``approximate (…)``, with the tokenizer
    endpoint that counted or the reason it could not."""
    if fit.exact:
        return f"exact ({fit.tokenizer})" if fit.tokenizer else "exact (nothing to fit)"
    if fit.tokenizer is not None:
        return f"mostly exact ({fit.reason})"
    return f"approximate (one word per token; {fit.reason})"


def _run_metadata(spec: TraceSpec, model: str, models: dict[str, Any],
                  fit: workloads.PromptFit) -> dict[str, Any]:
    """The trace's run metadata: command, arguments (no secrets), server, prompt lengths
    (and the tokenizer endpoint that counted them), versions."""
    arguments = {k: v for k, v in asdict(spec).items() if k not in ("api_key", "receiver_token")}
    return {
        "command": "ttft trace",
        "arguments": arguments,
        "server": {"url": server_root(spec.url), "model": model, "models": models},
        "prompt_lengths": _prompt_lengths(fit),
        "prompt_tokenizer": fit.tokenizer,
        "versions": _versions(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _receivers(spec: TraceSpec) -> dict[str, Any]:
    """The run's OTLP/HTTP receiver and, with ``receiver_grpc_port``, its OTLP/gRPC one:
    :class:`~ttft.collectors.otlp_grpc.Collector`'s arguments, for the recorder process
    (whose start names a busy port)."""
    return {"host": spec.receiver_host, "http_port": spec.receiver_port,
            "grpc_port": spec.receiver_grpc_port, "token": spec.receiver_token}

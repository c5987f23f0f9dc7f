"""Receiver throughput: spans/s acknowledged by the OTLP receivers before and after the span
log (acknowledge only once the spans are fsynced), measured side by side in one run.

    python benchmarks/receiver.py [--sizes 512 64] [--spans 65536] [--rounds 5]
                                  [--senders 4] [--fsync-delay-ms 0] [--no-grpc] [--json PATH]

A real ``OTLPReceiver`` (and ``OTLPGrpcReceiver``) on 127.0.0.1, port 0, is fed by
``--senders`` threads, each posting OTLP protobuf exports over its own keep-alive
connection (``http.client``; a gRPC channel for gRPC). The exports are built and
serialized before timing (``--sizes`` spans each: 512 is the OpenTelemetry SDK's default
batch, 64 shows what a small request's fsync costs); a configuration's figure is the spans
of one round (``--spans``) over the time from the first send to the last answer.
Configurations, on a fresh trace each round:

- before: the sink is ``TraceWriter(path, log=False).append``: answered once buffered.
- after: ``OTLPReceiver(TraceWriter(path, log=True))``, as ``ttft collect`` runs it: the
  receiver appends with ``durable=True``, so concurrent requests share one fsync.
- no group commit (HTTP only, for insight): ``append(durable=True)`` under one lock, so
  every request pays its own fsync.

Rounds alternate the configurations (ABAB), after an untimed warm-up round of each, and
medians are printed. After each round the trace is closed and read back: its rows must be
exactly the spans acknowledged. fsyncs per request count every ``os.fsync`` in the process
during the timed window (log syncs, and the part files written when 50,000 rows are
buffered); ``--fsync-delay-ms`` makes each of them that much slower, to see the figures on
a disk slower than this one. Goal: after/before ≥ 0.5.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

GOAL_RATIO = 0.5
GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0_NS = 1_700_000_000_000_000_000
STAGES = ("queue", "prefill", "decode", "detokenize")


def build_bodies(total_spans: int, size: int) -> list[bytes]:
    """Serialized exports of ``size`` spans each (``total_spans`` in all, ids unique), spans
    shaped like an instrumented server's: a parent, a stage name and three attributes."""
    bodies = []
    for index in range(total_spans // size):
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        attr = resource_spans.resource.attributes.add(key="service.name")
        attr.value.string_value = "bench-server"
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = "ttft.bench"
        for offset in range(size):
            n = index * size + offset + 1
            span = scope_spans.spans.add(name=STAGES[n % len(STAGES)], kind=1)
            span.trace_id = (n // 8 + 1).to_bytes(16, "big")
            span.span_id = n.to_bytes(8, "big")
            span.parent_span_id = (n + 1 << 32).to_bytes(8, "big")
            span.start_time_unix_nano = T0_NS + n * 1_000
            span.end_time_unix_nano = span.start_time_unix_nano + 700
            for key, value in (("ttft.request_id", f"req-{n // 8}"), ("gen_ai.system", "ttft")):
                span.attributes.add(key=key).value.string_value = value
            span.attributes.add(key="tokens").value.int_value = n % 2048
        bodies.append(request.SerializeToString())
    return bodies


class FsyncCounter:
    """Counts ``os.fsync`` calls while installed (every caller looks it up on ``os``), each
    made ``delay_s`` slower to stand in for a slower disk."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.count = 0
        self._delay_s = delay_s
        self._real = os.fsync
        self._lock = threading.Lock()

    def _fsync(self, fd: int) -> None:
        with self._lock:
            self.count += 1
        self._real(fd)
        if self._delay_s:
            time.sleep(self._delay_s)

    def __enter__(self) -> FsyncCounter:
        os.fsync = self._fsync
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.fsync = self._real


def fsync_latency_s(directory: Path, samples: int = 20) -> float:
    """Median seconds to append 64 KiB to a file and fsync it, in ``directory`` (context:
    what one log sync costs on this disk)."""
    took = []
    with tempfile.TemporaryFile(dir=directory) as probe:
        for _ in range(samples):
            probe.write(b"\0" * 65_536)
            probe.flush()
            started = time.perf_counter()
            os.fsync(probe.fileno())
            took.append(time.perf_counter() - started)
    return statistics.median(took)


def _http_sender(port: int, bodies: list[bytes]) -> Callable[[], None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-protobuf"}

    def send() -> None:
        try:
            for body in bodies:
                connection.request("POST", "/v1/traces", body, headers)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
        finally:
            connection.close()

    return send


def _grpc_sender(port: int, bodies: list[bytes]) -> Callable[[], None]:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    export = channel.unary_unary(GRPC_METHOD)  # bytes in, bytes out
    grpc.channel_ready_future(channel).result(timeout=10)

    def send() -> None:
        try:
            for body in bodies:
                export(body, timeout=60)
        finally:
            channel.close()

    return send


@dataclass
class Config:
    """One configuration: its receiver, whether the writer keeps a log, what the receiver is
    given as its sink, and each size's (spans/s, fsyncs per request) per round."""

    name: str
    protocol: str  # "http" or "grpc"
    log: bool
    sink: Callable[[object], object]  # TraceWriter -> what the receiver is given
    results: dict[int, list[tuple[float, float]]] = field(default_factory=dict)


def _serialized(writer: object) -> Callable[[object], None]:
    """A sink making each table durable on its own: one append and fsync at a time."""
    lock = threading.Lock()

    def sink(table: object) -> None:
        with lock:
            writer.append(table, durable=True)

    return sink


def configs(grpc: bool) -> list[Config]:
    """The configurations, each protocol's "before" first (the ratios are to it)."""
    found = [
        Config("HTTP before (ack after buffering)", "http", False, lambda w: w.append),
        Config("HTTP after (ack after fsync)", "http", True, lambda w: w),
        Config("HTTP after, no group commit", "http", True, _serialized),
    ]
    if grpc:
        found += [
            Config("gRPC before (ack after buffering)", "grpc", False, lambda w: w.append),
            Config("gRPC after (ack after fsync)", "grpc", True, lambda w: w),
        ]
    return found


def run_round(config: Config, bodies: list[bytes], size: int, senders: int, tmp: Path,
              fsync_delay_s: float = 0.0) -> tuple[float, float]:
    """One round on a fresh trace: (spans/s, fsyncs per request). Checks the trace holds
    every acknowledged span."""
    from ttft.collectors import OTLPReceiver, TraceWriter, read_spans
    from ttft.collectors.otlp_grpc import OTLPGrpcReceiver

    path = Path(tempfile.mkdtemp(dir=tmp)) / "trace.parquet"
    writer = TraceWriter(path, log=config.log)
    kind = OTLPReceiver if config.protocol == "http" else OTLPGrpcReceiver
    receiver = kind(config.sink(writer), port=0).start()
    make = _http_sender if config.protocol == "http" else _grpc_sender
    errors: list[BaseException] = []
    sends = [make(receiver.port, bodies[i::senders]) for i in range(senders)]
    start = threading.Barrier(senders + 1)

    def run(send: Callable[[], None]) -> None:
        start.wait()
        try:
            send()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in sends]
    for thread in threads:
        thread.start()
    with FsyncCounter(fsync_delay_s) as fsyncs:
        start.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        took_s = time.perf_counter() - started
    receiver.stop()
    writer.close()
    if errors:
        raise RuntimeError(f"{config.name}: a sender failed: {errors[0]!r}")
    sent = len(bodies) * size
    stored = read_spans(path).num_rows
    if stored != sent or receiver.spans_received != sent:
        raise RuntimeError(f"{config.name}: {sent} spans acknowledged, "
                           f"{receiver.spans_received} received, {stored} in the trace")
    return sent / took_s, fsyncs.count / len(bodies)


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 64],
                        help="spans per request")
    parser.add_argument("--spans", type=int, default=65_536, help="spans per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--fsync-delay-ms", type=float, default=0.0,
                        help="add this to every timed fsync, as a slower disk would")
    parser.add_argument("--no-grpc", action="store_true", help="skip the gRPC receiver")
    add_json_option(parser)
    args = parser.parse_args()

    measured = configs(not args.no_grpc)
    with tempfile.TemporaryDirectory() as tmp:
        fsync_s = fsync_latency_s(Path(tmp))
        for size in args.sizes:
            bodies = build_bodies(args.spans, size)
            for config in measured:  # warm-up: imports, connections, first trace
                run_round(config, bodies[: 2 * args.senders], size, args.senders, Path(tmp))
                config.results[size] = []
            for _ in range(args.rounds):
                for config in measured:  # ABAB: every configuration once per round
                    config.results[size].append(
                        run_round(config, bodies, size, args.senders, Path(tmp),
                                  args.fsync_delay_ms / 1e3))
    print(f"{args.senders} senders, {args.spans:,} spans a round, medians of {args.rounds} "
          f"rounds; trace in {tempfile.gettempdir()}, where a 64 KiB write + fsync takes "
          f"{fsync_s * 1e3:.2f} ms"
          + (f" (+ {args.fsync_delay_ms:g} ms added)" if args.fsync_delay_ms else ""))
    print(f"{'configuration':<36}{'spans/req':>10}{'spans/s':>12}{'fsyncs/req':>12}"
          f"{'× before':>10}")
    figures = [Figure("receiver", "64 KiB write + fsync (this disk)", fsync_s * 1e3, "ms")]
    for size in args.sizes:
        before: dict[str, float] = {}
        for config in measured:
            rates = [r for r, _ in config.results[size]]
            rate = statistics.median(rates)
            per_request = statistics.median(f for _, f in config.results[size])
            before.setdefault(config.protocol, rate)
            ratio = rate / before[config.protocol]
            print(f"{config.name:<36}{size:>10}{rate:>12,.0f}{per_request:>12.2f}"
                  f"{ratio:>10.2f}")
            label = f"{config.name}, {size} spans/req"
            figures.append(Figure("receiver", label, rate, "spans/s"))
            if config.log:
                figures.append(Figure("receiver", f"{label}: fsyncs/req", per_request, "/req"))
            if config.name.endswith("(ack after fsync)"):
                figures.append(Figure("receiver", f"{label}: after/before", ratio, "×",
                                      f"≥ {GOAL_RATIO}", ratio >= GOAL_RATIO))
    print(f"goal: after/before ≥ {GOAL_RATIO}; every round's trace held every acknowledged span")
    write(args.json, figures)


if __name__ == "__main__":
    main()

"""Receiver throughput: spans/s acknowledged by the OTLP receivers before and after the span
log (acknowledge only once the spans are fsynced), with the compiled decoder and with the
reference one, measured side by side in one run.

    python benchmarks/receiver.py [--sizes 512 64] [--spans 65536] [--rounds 5]
                                  [--senders 4] [--fsync-delay-ms 0] [--no-grpc] [--json PATH]

A real ``OTLPReceiver`` (and ``OTLPGrpcReceiver``) on 127.0.0.1, port 0, is fed by
``--senders`` threads of another process (this script, started with ``--send``), each
posting OTLP protobuf exports over its own keep-alive connection (``http.client``; a gRPC
channel for gRPC). The exports are built and
serialized before timing (``--sizes`` spans each: 512 is the OpenTelemetry SDK's default
batch, 64 shows what a small request's fsync costs); a configuration's figure is the spans
of one round (``--spans``) over the time from the first send to the last answer.
Configurations, on a fresh trace each round:

- before: the sink is ``TraceWriter(path, log=False).append``: answered once buffered.
- after: ``OTLPReceiver(TraceWriter(path, log=True))``, as ``ttft collect`` runs it: the
  receiver appends with ``durable=True``, so concurrent requests share one fsync.
- reference decoder: "after" with the compiled decoder off (``ttft.collectors.otlp_decode``):
  protobuf's parser, then rows built in Python, as every receiver decoded before.
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
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

GOAL_RATIO = 0.5
GOAL_RATE = {"http": 200_000, "grpc": 150_000}
"""Spans/s "after" must reach at 512 spans a request (issue 35)."""
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
    compiled: bool = True  # the compiled decoder, or the reference
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
        Config("HTTP after, reference decoder", "http", True, lambda w: w, False),
        Config("HTTP after, no group commit", "http", True, _serialized),
    ]
    if grpc:
        found += [
            Config("gRPC before (ack after buffering)", "grpc", False, lambda w: w.append),
            Config("gRPC after (ack after fsync)", "grpc", True, lambda w: w),
            Config("gRPC after, reference decoder", "grpc", True, lambda w: w, False),
        ]
    return found


def write_bodies(bodies: list[bytes], path: Path) -> Path:
    """The bodies in one file, each after its u32 length, for the sending process."""
    with open(path, "wb") as out:
        for body in bodies:
            out.write(struct.pack("<I", len(body)) + body)
    return path


def read_bodies(path: Path) -> list[bytes]:
    data = path.read_bytes()
    bodies, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from("<I", data, at)
        bodies.append(data[at + 4:at + 4 + size])
        at += 4 + size
    return bodies


def send_main(protocol: str, port: int, path: Path, senders: int) -> None:
    """The sending process: connect every sender, say ``ready``, wait for a line on stdin,
    send, then print the seconds from the first send to the last answer (or the error)."""
    bodies = read_bodies(path)
    make = _http_sender if protocol == "http" else _grpc_sender
    sends = [make(port, bodies[i::senders]) for i in range(senders)]
    errors: list[BaseException] = []
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
    print("ready", flush=True)
    sys.stdin.readline()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    took_s = time.perf_counter() - started
    print(f"error {errors[0]!r}" if errors else f"took {took_s!r}", flush=True)


def run_round(config: Config, bodies: Path, n_bodies: int, size: int, senders: int,
              tmp: Path, fsync_delay_s: float = 0.0) -> tuple[float, float]:
    """One round on a fresh trace: (spans/s, fsyncs per request). Checks the trace holds
    every acknowledged span."""
    from ttft.collectors import OTLPReceiver, TraceWriter, otlp_decode, read_spans
    from ttft.collectors.otlp_grpc import OTLPGrpcReceiver

    otlp_decode._enable(config.compiled)
    path = Path(tempfile.mkdtemp(dir=tmp)) / "trace.parquet"
    writer = TraceWriter(path, log=config.log)
    kind = OTLPReceiver if config.protocol == "http" else OTLPGrpcReceiver
    receiver = kind(config.sink(writer), port=0).start()
    sender = subprocess.Popen(
        [sys.executable, __file__, "--send", config.protocol, str(receiver.port), str(bodies),
         str(senders)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if sender.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{config.name}: the sending process did not start")
        with FsyncCounter(fsync_delay_s) as fsyncs:
            sender.stdin.write("go\n")
            sender.stdin.flush()
            answer = sender.stdout.readline().split(maxsplit=1)
    finally:
        sender.stdin.close()
        sender.wait(timeout=60)
        receiver.stop()
        writer.close()
    if not answer or answer[0] != "took":
        raise RuntimeError(f"{config.name}: a sender failed: {answer}")
    sent = n_bodies * size
    stored = read_spans(path).num_rows
    if stored != sent or receiver.spans_received != sent:
        raise RuntimeError(f"{config.name}: {sent} spans acknowledged, "
                           f"{receiver.spans_received} received, {stored} in the trace")
    return sent / float(answer[1]), fsyncs.count / n_bodies


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    if len(sys.argv) == 6 and sys.argv[1] == "--send":  # the sending process
        send_main(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
        return
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
            warm_up = write_bodies(bodies[: 2 * args.senders], Path(tmp) / "warm-up")
            every = write_bodies(bodies, Path(tmp) / "bodies")
            for config in measured:  # warm-up: imports, connections, first trace
                run_round(config, warm_up, 2 * args.senders, size, args.senders, Path(tmp))
                config.results[size] = []
            for _ in range(args.rounds):
                for config in measured:  # ABAB: every configuration once per round
                    config.results[size].append(
                        run_round(config, every, len(bodies), size, args.senders, Path(tmp),
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
        after: dict[str, float] = {}
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
                after[config.protocol] = rate
                if size == 512:
                    goal = GOAL_RATE[config.protocol]
                    figures.append(Figure("receiver", f"{label}: acknowledged", rate,
                                          "spans/s", f"≥ {goal:,}", rate >= goal))
            elif not config.compiled:
                gain = after[config.protocol] / rate
                print(f"{'':<36}{'':>10}{'compiled / reference':>24}{gain:>10.2f}")
                figures.append(Figure("receiver", f"{label}: compiled / reference", gain, "×"))
    print(f"goals: after/before ≥ {GOAL_RATIO}; after ≥ {GOAL_RATE['http']:,} spans/s (HTTP), "
          f"≥ {GOAL_RATE['grpc']:,} (gRPC) at 512 spans/req; every round's trace held every "
          "acknowledged span")
    write(args.json, figures)


if __name__ == "__main__":
    main()

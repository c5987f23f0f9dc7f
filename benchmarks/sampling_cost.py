"""What tracing costs the reference server at 1%, 10% and 100% sampling, side by side with
the same server untraced, in one run.

    python benchmarks/sampling_cost.py [--requests 200] [--concurrency 4] [--rounds 2]

Each round starts ``ttft serve --model tiny`` five times in a separate process: untraced
(no exporter configured and no request sampled: nothing recorded), and traced
(``--trace-out``) with the load generator marking 100%, 10%, 1% and 0% of requests
"sampled" in their ``traceparent`` (by trace id: what a client-side ratio sampler does;
the server records the sampled ones, and every span under them; 0% is what tracing costs
while it records nothing). Each round starts with another mode, so none is always first.
Each time the same workload runs from this process: ``--requests`` requests of about 60
prompt words (some 230 tokens), 16 tokens out, at ``--concurrency`` in flight, after 4
warm-up requests. Printed per mode, medians over rounds: client TTFT p50 and p99, and
completed requests per second, each also as a ratio to untraced.
On two cores the server and the load generator share the machine, so figures move by a
few per cent between rounds; the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = (("untraced", None), ("100%", 1.0), ("10%", 0.1), ("1%", 0.01), ("0%", 0.0))


def _start(port: int, trace_out: Path | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ttft.reports.cli", "serve", "--model", "tiny", "--port",
           str(port)]
    if trace_out is not None:
        cmd += ["--trace-out", str(trace_out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ttft serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("ttft serve did not start")


def one_run(sample: float | None, requests: int, concurrency: int) -> dict:
    """One server start, one workload: client TTFT p50/p99 (ms) and requests/s."""
    from ttft.collectors.loadgen import run
    from ttft.collectors.workloads import workload
    from ttft.engine.server.inprocess import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = _start(port, None if sample is None else Path(tmp) / "server.parquet")
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base_url, proc)
            words = " ".join(f"word{i % 50}" for i in range(60))
            prompts = [f"Request {i}: {words}" for i in range(requests)]
            work = workload([0.0] * requests, prompts, max_tokens=16)
            started = time.perf_counter()
            results = asyncio.run(run(base_url, work, model="tiny", concurrency=concurrency,
                                      warmup=4, timeout_s=120.0, sample=sample or 0.0))
            took = time.perf_counter() - started
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    ok = [r for r in results if r.error is None and r.ttft_s is not None]
    if len(ok) < requests:
        first = next(r.error for r in results if r.error is not None or r.ttft_s is None)
        raise RuntimeError(f"{requests - len(ok)} of {requests} requests failed: {first}")
    ttft = np.array([r.ttft_s for r in ok]) * 1e3
    return {"p50": float(np.percentile(ttft, 50)), "p99": float(np.percentile(ttft, 99)),
            "rps": len(ok) / took}


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    add_json_option(parser)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name, _ in MODES}
    for k in range(args.rounds):  # each round starts one mode later: no mode always first
        for name, sample in MODES[k % len(MODES):] + MODES[:k % len(MODES)]:
            runs[name].append(one_run(sample, args.requests, args.concurrency))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("p50", "p99", "rps")}
           for name, rs in runs.items()}
    base = med["untraced"]
    print(f"ttft serve --model tiny, {args.requests} requests at concurrency "
          f"{args.concurrency}, medians of {args.rounds} rounds")
    print(f"{'mode':<10}{'TTFT p50 ms':>12}{'× untraced':>11}{'TTFT p99 ms':>13}"
          f"{'× untraced':>11}{'requests/s':>12}{'× untraced':>11}")
    figures = []
    for name, m in med.items():
        r50, r99, rr = m["p50"] / base["p50"], m["p99"] / base["p99"], m["rps"] / base["rps"]
        print(f"{name:<10}{m['p50']:>12.1f}{r50:>11.3f}{m['p99']:>13.1f}{r99:>11.3f}"
              f"{m['rps']:>12.1f}{rr:>11.3f}")
        if name != "untraced":
            figures += [Figure("sampling cost", f"{name} sampled: TTFT p50 / untraced", r50, "×"),
                        Figure("sampling cost", f"{name} sampled: requests/s / untraced", rr,
                               "×")]
    print("spread over rounds (min–max):")
    for name, rs in runs.items():
        p50s, rpss = [r["p50"] for r in rs], [r["rps"] for r in rs]
        print(f"  {name:<10} TTFT p50 {min(p50s):.1f}–{max(p50s):.1f} ms, requests/s "
              f"{min(rpss):.1f}–{max(rpss):.1f}")
    write(args.json, figures)


if __name__ == "__main__":
    main()

"""The step join at a step id reused within one engine trace: N requests, each with one
prefill chunk saying step 0, and one engine trace whose N steps (a `step` span and its gpu
span each) all say step 0 (an engine that numbers steps per batch, or restarts its counter
without a new trace).

    python benchmarks/step_join.py [--requests 1000 3000 30000] [--json PATH]

Each request's own gpu span (40 µs) runs inside its own chunk, 100 µs after the previous
request's; requests overlap their neighbours. Run twice: with the engine's `step` span
around each gpu span (the reuse is evident) and without step spans or parents (only the
times tell the steps apart, and each gpu span starts inside its neighbour's chunk too).
Printed per size: assemble + attribute time, the gpu copies joined (N² was the cross
product), the reused_step_id count and the largest gpu time any request was given (its
own is 40 µs). Goals: time per 10× the requests at most 20× (linear), at most 2 copies a
request, and with step spans no request above its own gpu time.
"""

from __future__ import annotations

import argparse
import json
import time

import pyarrow as pa

GOAL_RATIO = 20.0
GPU_NS = 40_000


def reused_step_table(n: int, steps: bool = True) -> pa.Table:
    """``n`` requests sharing step id 0 with one engine trace of ``n`` gpu spans, each a
    child of its own ``step`` span (``steps``) or of nothing (no evidence of the steps but
    the times: each gpu span starts inside its own chunk and its neighbour's)."""
    from ttft.tracer.schema import SPAN_SCHEMA, with_run_metadata

    rows = []
    engine = f"{n + 1:032x}"
    for i in range(n):
        t0, trace = 1_000_000 + 100_000 * i, f"{i + 1:032x}"

        def span(k: int, name: str, stage: str, a: int, b: int, parent: int | None = 1,
                 tr: str = trace, **attrs: int) -> dict:
            return dict(trace_id=tr, span_id=f"{k:016x}", parent_id=None if parent is None
                        else f"{parent:016x}", request_id=None, name=name, stage=stage,
                        start_ns=a, end_ns=b, clock="host:s", service="s",
                        attributes=json.dumps(attrs))

        rows += [span(1, "server", "server", t0, t0 + 500_000, None),
                 span(2, "queue", "queue", t0, t0 + 50_000),
                 span(3, "prefill.chunk", "prefill.chunk", t0 + 50_000, t0 + 250_000,
                      step_id=0),
                 span(4, "sample", "sample", t0 + 250_000, t0 + 300_000),
                 span(5, "first_byte", "event", t0 + 400_000, t0 + 400_000),
                 span(10 + i, "gpu", "gpu", t0 + 100_000, t0 + 100_000 + GPU_NS,
                      2 * n + 10 + i if steps else None, engine, step_id=0)]
        if steps:
            rows.append(span(2 * n + 10 + i, "step", "step", t0 + 40_000, t0 + 260_000, None,
                             engine, step_id=0))
    table = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
    return with_run_metadata(table, {"schema_version": 1, "source": "benchmark"})


def measure(n: int, steps: bool = True) -> dict:
    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute

    table = reused_step_table(n, steps)
    t0 = time.perf_counter()
    asm = assemble(table)
    attr = attribute(asm, "server", "exclusive")
    seconds = time.perf_counter() - t0
    return {"requests": n, "seconds": seconds, "gpu_copies": int(len(asm.rows.gpu_row)),
            "reused_step_id": int(asm.quality.counts.get("reused_step_id", 0)),
            "max_gpu_ns": int(attr.attributed["gpu"].max())}


def _table(results: list[dict], tag: str, figure: type) -> list:
    print(f"{'requests':>9} {'seconds':>8} {'gpu copies':>11} {'reused':>7} "
          f"{'max gpu µs':>10}")
    figures = []
    for r in results:
        print(f"{r['requests']:>9,} {r['seconds']:>8.3f} {r['gpu_copies']:>11,} "
              f"{r['reused_step_id']:>7,} {r['max_gpu_ns'] / 1000:>10.1f}")
        n = f"{tag}{r['requests']:,} requests"
        figures += [
            figure("step_join", f"{n}: assemble + attribute", r["seconds"], "s"),
            figure("step_join", f"{n}: gpu copies per request", r["gpu_copies"] / r["requests"],
                   "×", "≤ 2", r["gpu_copies"] <= 2 * r["requests"]),
            figure("step_join", f"{n}: most gpu time given a request", r["max_gpu_ns"] / 1000,
                   "µs", f"≤ {GPU_NS / 1000:g} (its own)" if not tag else "-",
                   r["max_gpu_ns"] <= GPU_NS if not tag else None),
        ]
    for a, b in zip(results, results[1:], strict=False):
        ratio = (b["seconds"] / a["seconds"]) / (b["requests"] / a["requests"]) * 10
        print(f"{a['requests']:,} → {b['requests']:,}: time per 10× requests {ratio:.1f} "
              f"(goal ≤ {GOAL_RATIO:g})")
        figures.append(figure("step_join", f"{tag}time per 10× requests, {a['requests']:,} → "
                              f"{b['requests']:,}", ratio, "×", f"≤ {GOAL_RATIO:g}",
                              ratio <= GOAL_RATIO))
    return figures


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[1_000, 3_000, 30_000])
    add_json_option(parser)
    args = parser.parse_args()
    measure(50)  # warm-up: compiled kernels and imports
    figures = []
    for steps in (True, False):
        print("with the engine's step spans" if steps else
              "\nwithout step spans or parents (times the only evidence)")
        results = [measure(n, steps) for n in args.requests]
        figures += _table(results, "" if steps else "no steps, ", Figure)
    write(args.json, figures)


if __name__ == "__main__":
    main()

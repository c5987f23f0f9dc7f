"""Wide requests: one request of N spans, attributed under every policy, at two sizes 10×
apart, side by side in one run; the time ratio shows whether the cost is linear in spans.

    python benchmarks/wide_request.py [--spans 10000 100000] [--json PATH]

The request: a client span, a server span and N server-side children (queue, tokenize,
prefill, other; 15 ns each, 10 ns apart, so each overlaps the next), one trace. Each size
is assembled once, then attributed under each policy (compile time excluded: a warm-up on a
small request first). Goal: 10× the spans costs at most 20× the time (linear, with room for
the log factor and a noisy machine).
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa

GOAL_RATIO = 20.0


def wide_request(n: int) -> pa.Table:
    """One request of ``n`` child spans as a span table (``SPAN_SCHEMA``)."""
    from ttft.tracer.schema import SPAN_SCHEMA, with_run_metadata

    trace = "0123456789abcdef0123456789abcdef"
    end = 10_000_000 + 10 * n
    rows = [
        dict(span_id=f"{1:016x}", parent_id=None, name="client", stage="client", start_ns=0,
             end_ns=end, clock="client", service="c"),
        dict(span_id=f"{2:016x}", parent_id=f"{1:016x}", name="first_token", stage="event",
             start_ns=end // 2, end_ns=end // 2, clock="client", service="c"),
        dict(span_id=f"{3:016x}", parent_id=f"{1:016x}", name="server", stage="server",
             start_ns=1_000, end_ns=end - 1_000_000, clock="host:s", service="s"),
    ]
    stages = ("queue", "tokenize", "prefill", "other")
    rows += [dict(span_id=f"{10 + i:016x}", parent_id=f"{3:016x}", name=f"op{i % 7}",
                  stage=stages[i % 4], start_ns=2_000 + 10 * i, end_ns=2_015 + 10 * i,
                  clock="host:s", service="s") for i in range(n)]
    columns = {f.name: [r.get(f.name) for r in rows] for f in SPAN_SCHEMA}
    columns["trace_id"] = [trace] * len(rows)
    columns["attributes"] = ["{}"] * len(rows)
    table = pa.table({f.name: pa.array(columns[f.name]).cast(f.type) for f in SPAN_SCHEMA},
                     schema=SPAN_SCHEMA)
    return with_run_metadata(table, {"schema_version": 1})


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    from ttft.analysis import assemble, attribute
    from ttft.tracer.schema import POLICIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, nargs=2, default=[10_000, 100_000])
    add_json_option(parser)
    args = parser.parse_args()
    small, large = args.spans
    warm = assemble(wide_request(200))
    for policy in POLICIES:  # compile the kernels before any timing
        attribute(warm, "client", policy)
    seconds: dict[tuple[int, str], float] = {}
    for n in (small, large):
        asm = assemble(wide_request(n))
        for policy in POLICIES:
            started = time.perf_counter()
            attr = attribute(asm, "client", policy)
            seconds[n, policy] = time.perf_counter() - started
            assert int(attr.attributed.to_numpy().sum()) == int(attr.requests["ttft_ns"].sum())
    print(f"one request of N spans, attributed at the client boundary "
          f"({large / small:g}× the spans)")
    print(f"{'policy':<16}{f'N={small:,} s':>14}{f'N={large:,} s':>16}{'ratio':>8}")
    figures = []
    for policy in POLICIES:
        ratio = seconds[large, policy] / seconds[small, policy]
        print(f"{policy:<16}{seconds[small, policy]:>14.3f}{seconds[large, policy]:>16.3f}"
              f"{ratio:>8.1f}")
        figures += [
            Figure("wide_request", f"{policy}, {large:,} spans in one request",
                   seconds[large, policy], "s"),
            Figure("wide_request", f"{policy}: time ratio for {large / small:g}× the spans",
                   ratio, "×", f"≤ {GOAL_RATIO:g}", ratio <= GOAL_RATIO),
        ]
    print(f"goal: the ratio ≤ {GOAL_RATIO:g} (linear in spans, with room for a log factor)")
    write(args.json, figures)


if __name__ == "__main__":
    main()

"""Attribution throughput and memory, side by side with a plain per-request Python sweep.

    python benchmarks/attribution.py [--requests 1000000] [--sample 2000] [--seed 0]

Generates a synthetic trace (``ttft.collectors.synthetic``), writes it to a temporary
Parquet file (schema version 2: ids as bytes), and in a fresh process reads it back as the
analysis does and times ``assemble`` + ``attribute`` for each policy, recording the peak
resident memory above the loaded input table (VmHWM reset through /proc/self/clear_refs;
Arrow's pool chosen as a ``ttft`` command's process chooses it, ``reports/arrow_pool.py``);
the exclusive policy once more on the same rows with their ids as text (version 1, what
files written before version 2 hold), side by side. The plain sweep does the same job one request
at a time in Python (group rows, join GPU spans by step id, build the tree, call
``ttft.analysis.reference.attribute_request``) on a sample of the same workload, and must give
the same parts. Goals on a 2-core machine: exclusive ≥ 4,000,000 spans/s, shared and
critical-path ≥ 2,000,000, ≥ 30× the sweep, ≤ 120 bytes per span above the input.
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

CHILD = "--child"
TEXT_IDS = "exclusive, v1"
"""The row of the exclusive policy on the ids as text (schema version 1)."""


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _settle() -> None:
    """Return freed memory to the OS, so the baseline is what is really held."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def child(path: str, policy: str, layout: str = "v2") -> None:
    """Read the trace (ids as bytes, or with ``layout`` ``v1`` as text), then time and
    measure one policy; print one JSON line."""
    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute
    from ttft.collectors import read_spans

    read_started = time.perf_counter()
    table = read_spans(path, native=layout == "v2")
    read_s = time.perf_counter() - read_started
    _settle()
    base_kib = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    asm = assemble(table)
    assembled = time.perf_counter()
    result = attribute(asm, "client", policy)
    done = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_SELF)
    peak_kib = _rss_kib("VmHWM")
    assert len(result.requests) == len(asm.requests)
    print(
        json.dumps(
            {
                "rows": table.num_rows,
                "input_bytes": table.nbytes,
                "read_s": read_s,
                "assemble_s": assembled - started,
                "attribute_s": done - assembled,
                "peak_above_input_bytes": (peak_kib - base_kib) * 1024,
                "user_s": after.ru_utime - before.ru_utime,
                "sys_s": after.ru_stime - before.ru_stime,
            }
        )
    )


def plain_sweep(rows: list[dict]) -> tuple[dict[str, dict[str, int]], int]:
    """Client-boundary exclusive attribution, one request at a time in plain Python."""
    from ttft.analysis.reference import ReferenceSpan, attribute_request

    traces: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        traces[row["trace_id"]].append(row)
    gpu_by_step: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for row in rows:
        if row["stage"] == "gpu":
            step = json.loads(row["attributes"]).get("step_id")
            if step is not None:
                gpu_by_step[(row["service"], step)].append(row)
    out: dict[str, dict[str, int]] = {}
    for trace_id, spans in traces.items():
        client = next((s for s in spans if s["stage"] == "client"), None)
        first_token = min(
            (s["start_ns"] for s in spans if s["stage"] == "event" and s["name"] == "first_token"),
            default=None,
        )
        if client is None or first_token is None:
            continue
        server = next((s for s in spans if s["stage"] == "server"), None)
        first_byte = min(
            (s["start_ns"] for s in spans if s["stage"] == "event" and s["name"] == "first_byte"),
            default=None,
        )
        cut = None
        if server is not None:
            cut = (server["start_ns"], first_byte if first_byte is not None else server["end_ns"])
        own = [s for s in spans if s["stage"] not in ("event", "step")]
        for s in list(own):
            if s["stage"] == "prefill.chunk":
                step = json.loads(s["attributes"]).get("step_id")
                for g in gpu_by_step.get((s["service"], step), ()):
                    own.append({**g, "parent_id": s["span_id"]})
        by_id = {s["span_id"]: s for s in own}

        def depth(s: dict, by_id: dict = by_id) -> int:
            d = 0
            while s["parent_id"] in by_id:
                s, d = by_id[s["parent_id"]], d + 1
            return d

        index = {s["span_id"]: i for i, s in enumerate(own)}
        root = index[client["span_id"]]
        sweep = []
        for s in own:
            parent = index.get(s["parent_id"], -1)
            sweep.append(
                ReferenceSpan(
                    s["start_ns"],
                    s["end_ns"],
                    s["stage"],
                    depth(s),
                    s["span_id"],
                    -1 if parent == root else parent,
                    cut if s["clock"] != "client" else None,
                )
            )
        a, b = client["start_ns"], first_token
        out[trace_id] = attribute_request(
            sweep, a, b, root=root, root_stage="network", policy="exclusive"
        )
    return out, len(rows)


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=2_000, help="requests for the sweep")
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    args = parser.parse_args()

    from ttft.analysis.assemble import assemble
    from ttft.analysis.attribution import attribute
    from ttft.collectors import write_trace
    from ttft.collectors.synthetic import generate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.parquet"
        t0 = time.perf_counter()
        synthetic = generate(args.requests, seed=args.seed)
        write_trace(path, synthetic.table, synthetic.metadata)
        rows = synthetic.table.num_rows
        del synthetic
        print(
            f"synthetic trace: {args.requests:,} requests, {rows:,} spans "
            f"({rows / args.requests:.1f} per request; events and engine spans included), "
            f"made in {time.perf_counter() - t0:.1f} s"
        )
        figures = {}
        runs = [(p, p, "v2") for p in ("exclusive", "shared", "critical-path")]
        for name, policy, layout in [*runs, (TEXT_IDS, "exclusive", "v1")]:
            done = subprocess.run(
                [sys.executable, __file__, CHILD, str(path), policy, layout],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                sys.exit(f"measuring {name} failed:\n{done.stderr}")
            figures[name] = json.loads(done.stdout.strip().splitlines()[-1])

    sample = generate(args.sample, seed=args.seed + 1)
    rows_sample = sample.table.to_pylist()
    t0 = time.perf_counter()
    parts, n_rows = plain_sweep(rows_sample)
    sweep_s = time.perf_counter() - t0
    sweep_rate = n_rows / sweep_s
    t0 = time.perf_counter()
    vec = attribute(assemble(sample.table), "client", "exclusive")
    vec_small_s = time.perf_counter() - t0
    long = vec.per_request()
    got = defaultdict(dict)
    for trace_id, stage, ns in zip(long.trace_id, long.stage, long.attributed_ns, strict=True):
        if ns:
            got[trace_id][stage] = int(ns)
    same = dict(got) == parts

    print()
    print(
        f"{'policy':<15}{'read s':>8}{'input MB':>10}{'assemble s':>12}{'attribute s':>13}"
        f"{'spans/s':>12}{'× sweep':>9}{'peak MB':>9}{'B/span':>8}{'user s':>8}{'sys s':>7}"
    )
    for policy, f in figures.items():
        total = f["assemble_s"] + f["attribute_s"]
        rate = f["rows"] / total
        print(
            f"{policy:<15}{f['read_s']:>8.2f}{f['input_bytes'] / 2**20:>10,.0f}"
            f"{f['assemble_s']:>12.2f}{f['attribute_s']:>13.2f}{rate:>12,.0f}"
            f"{rate / sweep_rate:>9.1f}{f['peak_above_input_bytes'] / 2**20:>9,.0f}"
            f"{f['peak_above_input_bytes'] / f['rows']:>8.0f}{f['user_s']:>8.2f}{f['sys_s']:>7.2f}"
        )
    print(
        f"plain sweep (exclusive, {args.sample:,} requests, {n_rows:,} spans): "
        f"{sweep_rate:,.0f} spans/s; vectorized on the same sample: "
        f"{n_rows / vec_small_s:,.0f} spans/s; same parts: {same}"
    )
    print(f"input table: {figures['exclusive']['input_bytes'] / 2**20:,.0f} MB in memory with "
          f"the ids as bytes (schema version 2), "
          f"{figures[TEXT_IDS]['input_bytes'] / 2**20:,.0f} MB as text (version 1: the "
          f"'{TEXT_IDS}' row)")
    print("user s / sys s: the CPU time of assemble + attribute in the process and in the kernel; "
          "on a VM whose memory the host backs on first touch, sys (page faults) swings "
          "from run to run with how recently the pages were used (README, performance)")
    print("goals: exclusive ≥ 4,000,000 spans/s, shared and critical-path ≥ 2,000,000, "
          "≥ 30× the sweep, ≤ 120 B/span above the input")
    out = []
    for policy, f in figures.items():
        if policy == TEXT_IDS:
            continue
        rate = f["rows"] / (f["assemble_s"] + f["attribute_s"])
        per_span = f["peak_above_input_bytes"] / f["rows"]
        goal = 4e6 if policy == "exclusive" else 2e6
        out += [
            Figure("attribution", f"{policy}: spans/s ({args.requests:,} requests)", rate,
                   "spans/s", f"≥ {goal:,.0f}", rate >= goal),
            Figure("attribution", f"{policy}: × the plain sweep", rate / sweep_rate, "×",
                   "≥ 30", rate / sweep_rate >= 30),
            Figure("attribution", f"{policy}: peak memory above the input", per_span,
                   "B/span", "≤ 120", per_span <= 120),
        ]
    out.append(Figure("attribution", "vectorized parts equal the plain sweep's", float(same),
                      "bool", "= 1", same))
    write(args.json, out)
    if not same:
        sys.exit("the vectorized parts differ from the plain sweep's")


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == CHILD:
        from ttft.reports import arrow_pool

        arrow_pool.choose_for_command()  # the child is measured as a command's process is
        child(*sys.argv[2:])
    else:
        main()

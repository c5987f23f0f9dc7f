"""``ttft partition`` at two input sizes 4x apart: peak memory and time of the streamed
path the command takes, beside the in-memory path (the whole table read, then
``write_partitioned``), each in a fresh process.

    python benchmarks/partition.py [--requests 250000 1000000] [--partitions 8] [--json PATH]

The inputs are synthetic ttft traces (``ttft.collectors.synthetic``, about 24 spans a
request, written with ``write_trace``: row groups of 1M rows) in a temporary directory,
deleted at the end. Peak memory is the child's ``ru_maxrss`` (``os.wait4``). Goals: the
streamed peak at the larger size at most 1.5x the smaller's (memory bounded by the
traces, not the spans; the fixed part is one row group read and 256 MB of write buffers),
and below the in-memory path's at the larger size. Both datasets must hold the same
counts (requests, spans, copies).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_GROWTH = 1.5

_GENERATE = """
import sys
from ttft.collectors import write_trace
from ttft.collectors.synthetic import generate
trace = generate(int(sys.argv[1]), seed=0)
write_trace(sys.argv[2], trace.table, trace.metadata)
"""
_WHOLE = """
import sys
from ttft.collectors import read_spans, run_metadata
from ttft.reports.cli.partition import describe_written, merged_metadata
from ttft.reports.runs.partitioned import write_partitioned
table = read_spans(sys.argv[1])
meta = merged_metadata([(sys.argv[1], run_metadata(table))])
print(describe_written(write_partitioned(sys.argv[2], table, int(sys.argv[3]), meta)),
      file=sys.stderr)
"""


def _run(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds, peak MB, stderr) of ``cmd`` run as a child."""
    started = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = child.stderr.read() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)
    took = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    return took, usage.ru_maxrss / 1024, err


def _counts(line: str) -> str:
    return line.split(": ", 1)[1].split(", largest")[0].strip()


def main() -> None:
    from _figures import Figure, add_json_option, write  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs=2, default=[250_000, 1_000_000])
    parser.add_argument("--partitions", type=int, default=8)
    add_json_option(parser)
    args = parser.parse_args()
    ttft = str(Path(sys.executable).with_name("ttft"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ttft-partition-bench-") as tmp:
        for n in args.requests:
            trace = Path(tmp) / f"t{n}.parquet"
            subprocess.run([sys.executable, "-c", _GENERATE, str(n), str(trace)], check=True)
            streamed = _run([ttft, "partition", str(trace), "-o", f"{tmp}/s{n}",
                             "--partitions", str(args.partitions)])
            whole = _run([sys.executable, "-c", _WHOLE, str(trace), f"{tmp}/w{n}",
                          str(args.partitions)])
            same = _counts(streamed[2]) == _counts(whole[2])
            rows.append((n, streamed, whole, same))
            print(f"{n:>9,} requests  {_counts(streamed[2])}")
            print(f"          streamed {streamed[0]:6.1f} s {streamed[1]:7,.0f} MB   "
                  f"in memory {whole[0]:6.1f} s {whole[1]:7,.0f} MB   same counts: {same}")
            for path in Path(tmp).glob("[sw]*"):
                subprocess.run(["rm", "-rf", str(path)], check=True)
            trace.unlink()
    (a, sa, wa, _), (b, sb, wb, _) = rows
    growth = sb[1] / sa[1]
    print(f"streamed peak {a:,} → {b:,} requests: {growth:.2f}× (goal ≤ {GOAL_GROWTH:g}); "
          f"in memory {wb[1] / wa[1]:.2f}×; streamed / in memory at {b:,}: "
          f"{sb[1] / wb[1]:.2f}")
    figures = [
        Figure("partition", f"streamed peak, {a:,} → {b:,} requests", growth, "×",
               f"≤ {GOAL_GROWTH:g}", growth <= GOAL_GROWTH),
        Figure("partition", f"streamed peak at {b:,} requests", sb[1], "MB",
               "below in memory", sb[1] < wb[1]),
        Figure("partition", f"in-memory peak at {b:,} requests", wb[1], "MB"),
        Figure("partition", f"streamed / in-memory time at {b:,} requests", sb[0] / wb[0], "×"),
        Figure("partition", "same dataset counts both ways", float(all(r[3] for r in rows)),
               "bool", "yes", all(r[3] for r in rows)),
    ]
    write(args.json, figures)


if __name__ == "__main__":
    main()

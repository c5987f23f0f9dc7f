"""Every benchmark, one table: figures and ratios measured side by side in one run, with
the goal beside each.

    python benchmarks/run.py [--quick] [--only NAME ...] [--markdown] [--verbose]

Runs each benchmark script in a fresh process (so one's memory, threads and frozen garbage
collector never touch another's figures) with ``--json``, then prints one table. Each
script also runs alone and prints its own detailed table. ``--quick`` uses smaller sizes
(a smoke run of a few minutes; its figures are noisier), ``--markdown`` prints the table
as Markdown for the README's "Performance" section. Exit code 0 even when a goal is
missed: the table says so; 1 when a benchmark fails to run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    # name: (full arguments, --quick arguments)
    "attribution": (["--requests", "1000000"], ["--requests", "100000", "--sample", "500"]),
    "tracing_overhead": ([], ["--spans", "50000", "--rounds", "3", "--forwards", "8"]),
    "client_accuracy": ([], ["--requests", "300", "--rates", "200", "--wire-requests", "100",
                             "--rounds", "1"]),
    "prefill": ([], ["--lengths", "256", "1024", "--chunks", "256", "--repeats", "2"]),
    "storage": ([], ["--requests", "5000"]),
    "receiver": ([], ["--spans", "16384", "--rounds", "3"]),
    "scale": ([], ["--quick"]),
    "wide_request": ([], ["--spans", "5000", "50000"]),
    "step_join": ([], ["--requests", "1000", "10000"]),
    "partition": ([], ["--requests", "25000", "100000"]),
    "sampling_cost": (["--requests", "600", "--rounds", "4"],
                      ["--requests", "60", "--rounds", "1"]),
}


def _fmt(value: float, unit: str) -> str:
    if unit == "bool":
        return "yes" if value else "no"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.3g}"


def _verdict(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "MISSED")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a smoke run")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--verbose", action="store_true", help="show each benchmark's output")
    args = parser.parse_args()
    names = args.only or list(BENCHMARKS)
    figures: list[dict] = []
    failed: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            full, quick = BENCHMARKS[name]
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, str(HERE / f"{name}.py"), *(quick if args.quick else full)]
            print(f"running {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            done = subprocess.run(
                [*cmd, "--json", str(out)],
                capture_output=not args.verbose,
                text=True,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            took = time.perf_counter() - t0
            if done.returncode != 0 or not out.exists():
                failed.append(name)
                print(f"  {name} failed (exit {done.returncode}):", file=sys.stderr)
                print((done.stderr or "")[-2000:], file=sys.stderr)
                continue
            print(f"  {name}: {took:.0f} s", file=sys.stderr, flush=True)
            figures.extend(json.loads(out.read_text()))
    header = ("benchmark", "figure", "value", "unit", "goal", "")
    rows = [
        (f["benchmark"], f["name"], _fmt(f["value"], f["unit"]), f["unit"], f["goal"],
         _verdict(f["met"]))
        for f in figures
    ]  # fmt: skip
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        f"{', quick sizes' if args.quick else ''}; {time.perf_counter() - started:.0f} s"
    )
    if args.markdown:
        print("| " + " | ".join(header[:-1]) + " | |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(f"\n{machine}")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        line = "  ".join(
            h.rjust(w) if i == 2 else h.ljust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
        print(line)
        print("-" * len(line))
        for row in rows:
            print(
                "  ".join(
                    c.rjust(w) if i == 2 else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
        print(machine)
    missed = sum(1 for f in figures if f["met"] is False)
    print(
        f"{len(figures)} figures, {missed} goal(s) missed"
        + (f"; failed to run: {', '.join(failed)}" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

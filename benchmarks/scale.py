"""Scale: a partitioned dataset analysed on Dask, 1 against 2 workers, spans/s end to end
(reading included), and each worker's peak memory at two dataset sizes.

    python benchmarks/scale.py [--spans 10000000] [--partitions 16] [--sizes S1 S2]
                               [--rounds 2] [--chunk-spans 4000000] [--single-max-spans N]
                               [--seed 0] [--quick] [--datasets DIR] [--json PATH]

The dataset is synthetic (``ttft.collectors.synthetic``, about 24 spans a request),
generated in chunks of at most ``--chunk-spans`` spans so that no process ever holds all
of it: chunk ``c`` is ``generate(requests, seed=seed + c)`` (so its trace and span ids are
its own) with its request ids prefixed ``c<c>-`` and its engine's service renamed
``engine-<c>`` (so its engine steps, joined to requests by ``(service, step_id)``, are its
own; the ``request_ids`` lists in step attributes keep the unprefixed ids, which the
analysis does not read). Each chunk is partitioned (``partition_rows``) into its share of
the partitions and written with ``write_dataset``; its ``part=K`` directories are renamed
into the dataset as partitions ``c·P/C ... (c+1)·P/C - 1`` and ``_ttft_dataset.json`` is
written once all are in (``spans`` and ``copies`` summed, the key rule saying how chunks
map to partitions). Every partition still holds whole requests with the step traces they
joined, which is all the analysis needs. The datasets live in a temporary directory,
deleted at the end.

Measured, in one run:

- speed, on the ``--spans`` dataset in ``--partitions`` partitions: ``analyze_location``
  (both passes: clock bounds, then assemble and attribute per partition; driver merge)
  on a ``LocalCluster`` of 1 and of 2 worker processes with one thread each, each cluster
  started once and reused (``scheduler=cluster.scheduler_address``); an untimed-for-the-
  figure warm-up run on each, then ``--rounds`` rounds alternating 1, 2 workers; medians.
  Beside them, for context, one process: ``analyze(read_spans(DATASET))`` (skipped above
  ``--single-max-spans``), and whether its summary equals the distributed one. spans/s
  counts the dataset's own spans (not the borrowed step rows that partitions copy).
  Each configuration's line also gives the CPU seconds its workers (together) and the
  driver spent in a run, and the 1-minute load average is printed: on a shared 2-core
  machine, workers' CPU well under ``workers × wall`` means they waited for a core.
  Goals: 2 workers ≥ 1.8× 1 worker, and no slower than the one process. Beside them,
  what this machine allows (`measure_ceiling`): the same per-partition tasks in one plain
  process against two at once, no Dask and no driver; on 2 cores the driver and the
  scheduler share the cores with the 2 workers, and with the 1 worker they have one of
  their own. And what Dask itself allows (`measure_dask_ceiling`): the same tasks on the
  same clusters with no driver work, their parts dropped on the workers, or sent to a
  driver that drops them.
- memory, at each of ``--sizes`` spans with the partition size held constant (partitions
  = ``--partitions`` × size / ``--spans``): a fresh 2-worker cluster analyses the dataset
  once, then each worker's peak RSS (``VmHWM`` in ``/proc/self/status``, via
  ``client.run``; see `_peak_rss_bytes`) is read. Goals: ≤ 2 GiB per worker at every
  size, and the largest size's peak ≤ 1.25× the smallest's (independent of dataset size).

With ``--datasets DIR`` the datasets are kept in ``DIR`` and a later run reuses them
(the 100M-span dataset takes about half an hour to build here).

The default (10M spans in 16 partitions; memory at 2.5M and 10M) finishes in about ten
minutes on a 2-core machine. The issue's 100M-span run is
``--spans 100000000 --partitions 64`` (memory at 25M and 100M spans; about 4 GB of disk,
and well over an hour here: about 10 minutes per 1-worker run). ``--quick`` is 1M spans
in 8 partitions, sizes 250k and 1M, one round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

GOAL_SPEEDUP = 1.8
GOAL_PEAK_GIB = 2.0
GOAL_PEAK_GROWTH = 1.25
SPANS_PER_REQUEST = 23.8  # generate()'s rows per request, measured
GIB = 2**30


def _chunk_count(partitions: int, spans: int, chunk_spans: int) -> int:
    """The fewest chunks of at most ``chunk_spans`` spans that divide ``partitions``."""
    chunks = min(partitions, max(1, math.ceil(spans / chunk_spans)))
    while partitions % chunks:
        chunks += 1
    return chunks


def _chunk_table(requests: int, seed: int, chunk: int) -> tuple[Any, dict[str, Any]]:
    """Chunk ``chunk`` of a dataset: its own request ids and engine service (docstring)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ttft.collectors.synthetic import generate

    synth = generate(requests, seed=seed)
    table = synth.table
    rid = pc.binary_join_element_wise(f"c{chunk}-", table.column("request_id"), "")
    service = table.column("service").combine_chunks()
    names = [f"engine-{chunk}" if s == "engine" else s
             for s in service.dictionary.to_pylist()]
    service = pa.DictionaryArray.from_arrays(service.indices, pa.array(names, pa.string()))
    table = table.set_column(table.schema.get_field_index("request_id"),
                             table.schema.field("request_id"), rid)
    table = table.set_column(table.schema.get_field_index("service"),
                             table.schema.field("service"), service)
    return table, {**synth.metadata, "chunk": chunk}


def build_dataset(out: Path, spans: int, partitions: int, chunk_spans: int, seed: int
                  ) -> dict[str, Any]:
    """Write a synthetic dataset of about ``spans`` spans in ``partitions`` partitions at
    ``out`` (a new directory), chunk by chunk; returns its ``_ttft_dataset.json`` values
    plus ``chunks`` and ``build_s``."""
    from ttft.analysis.partition import KEY_RULE, partition_rows
    from ttft.collectors.dataset import DATASET_FILE, dataset_info
    from ttft.collectors.dataset_write import write_dataset

    started = time.perf_counter()
    chunks = _chunk_count(partitions, spans, chunk_spans)
    per = partitions // chunks
    requests = max(1, round(spans / chunks / SPANS_PER_REQUEST))
    out.mkdir(parents=True)
    info: dict[str, Any] = {}
    own = copies = 0
    for c in range(chunks):
        table, metadata = _chunk_table(requests, seed + c, c)
        rows = partition_rows(table, per)
        scratch = out / f".chunk-{c}"
        write_dataset(scratch, table, rows.owner, rows.copy_rows, rows.copy_partitions, per,
                      rows.key, metadata)
        del table, rows
        info = info or dataset_info(scratch)
        chunk_info = dataset_info(scratch)
        own += chunk_info["spans"]
        copies += chunk_info["copies"]
        for k in range(per):
            os.replace(scratch / f"part={k}", out / f"part={c * per + k}")
        (scratch / DATASET_FILE).unlink()
        scratch.rmdir()
    key = (f"{KEY_RULE}; within each of {chunks} generated chunks of distinct requests, "
           f"chunk c owning partitions c*{per}..c*{per}+{per - 1}")
    info.update(partitions=partitions, spans=own, copies=copies, key=key)
    # Each chunk's files name the chunk's dataset id and its own partition numbers; the
    # dataset assembled from them has no id of its own, so its files are not checked
    # against one (as a dataset written before files named their dataset).
    info.pop("id", None)
    (out / DATASET_FILE).write_text(json.dumps(info, sort_keys=True))
    return {**info, "chunks": chunks, "build_s": time.perf_counter() - started}


def _dataset(path: Path, size: int, partitions: int, args: argparse.Namespace
             ) -> dict[str, Any]:
    """`build_dataset` at ``path``; with ``--datasets``, one built there before (its
    ``_ttft_dataset.json`` written, so whole) is reused, its build figures read from
    ``spans-S.build.json`` beside it (None where it did not record them)."""
    from ttft.collectors.dataset import DATASET_FILE

    record = path.with_name(path.name + ".build.json")
    if args.datasets and (path / DATASET_FILE).exists():
        info = json.loads((path / DATASET_FILE).read_text())
        if info["partitions"] != partitions:
            raise SystemExit(f"{path} has {info['partitions']} partitions, not {partitions}: "
                             "remove it or name another --datasets")
        built = json.loads(record.read_text()) if record.exists() else {}
        print(f"reusing {path} ({info['spans']:,} spans)", file=sys.stderr, flush=True)
        return {**info, "chunks": built.get("chunks"), "build_s": built.get("build_s")}
    if path.exists():
        shutil.rmtree(path)  # a build that did not finish
    print(f"building {size:,} spans in {partitions} partitions ...", file=sys.stderr,
          flush=True)
    info = build_dataset(path, size, partitions, args.chunk_spans, args.seed)
    if args.datasets:
        record.write_text(json.dumps({k: info[k] for k in ("chunks", "build_s")}))
    return info


def _cpu_s() -> float:
    """This process's CPU time (user + system), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_bytes() -> int:
    """This process's peak RSS: ``VmHWM`` of ``/proc/self/status``, which starts afresh at
    ``exec``. Not ``getrusage().ru_maxrss``: Linux keeps that across ``execve``, so a
    spawned worker's would start at its parent's (the driver's) RSS at the fork.
    ``ru_maxrss`` (KiB on Linux) only where there is no ``/proc``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cluster(stack: ExitStack, workers: int) -> tuple[Any, Any]:
    """A local cluster of ``workers`` one-thread processes (as ``ttft analyze --workers``
    starts one) and a client of it, closed with ``stack``."""
    from distributed import Client

    from ttft.reports.runs.analyses import local_cluster

    cluster = stack.enter_context(local_cluster(workers, dashboard_address=None))
    client = stack.enter_context(Client(cluster))
    client.wait_for_workers(workers)
    return cluster, client


def _timed(path: Path, address: str, client: Any) -> tuple[float, Any, float, float]:
    """One ``analyze_location`` run on the cluster: wall seconds, its analysis, and the CPU
    seconds the workers (together) and this driver process spent in it."""
    from ttft.collectors import TraceLocation
    from ttft.reports.runs.analyses import analyze_location, runner

    workers_cpu = sum(client.run(_cpu_s).values())
    driver_cpu = _cpu_s()
    started = time.perf_counter()
    with runner(scheduler=address) as on_dask:
        result = analyze_location(TraceLocation(str(path)), on_dask)
    took = time.perf_counter() - started
    return (took, result, sum(client.run(_cpu_s).values()) - workers_cpu,
            _cpu_s() - driver_cpu)


def _comparable(summary: Any) -> dict[str, Any]:
    return {k: v for k, v in summary.to_dict().items() if k not in ("trace", "inputs")}


def measure_speed(path: Path, rounds: int, single: bool) -> dict[str, Any]:
    """Warm-up and timed rounds of 1 and 2 workers, alternating; the single process."""
    out: dict[str, Any] = {"warmup_s": {}, "times_s": {1: [], 2: []}, "cpu_s": {1: [], 2: []},
                           "load": []}
    with ExitStack() as stack:
        clusters = {n: _cluster(stack, n) for n in (1, 2)}
        for n, (cluster, client) in clusters.items():
            out["warmup_s"][n], out["result"], *_ = _timed(path, cluster.scheduler_address,
                                                           client)
        for _ in range(rounds):
            for n, (cluster, client) in clusters.items():
                took, _, workers_cpu, driver_cpu = _timed(path, cluster.scheduler_address,
                                                          client)
                out["times_s"][n].append(took)
                out["cpu_s"][n].append((workers_cpu, driver_cpu))
                out["load"].append(os.getloadavg()[0])
        out["dask"] = measure_dask_ceiling(path, {n: c for n, (_, c) in clusters.items()},
                                           rounds)
    if single:
        from ttft.analysis import analyze
        from ttft.collectors import read_spans

        started = time.perf_counter()
        table = read_spans(path)
        out["read_s"] = time.perf_counter() - started
        analysis = analyze(table, trace=str(path))
        out["single_s"] = time.perf_counter() - started
        out["same"] = _comparable(analysis.summary) == _comparable(out["result"].summary)
    return out


def _plain_tasks(path: str, pieces: list[int]) -> float:
    """Seconds of the per-partition first task (``_first_task``, what a worker runs) over
    ``pieces``, here, without Dask."""
    from ttft.collectors import TraceLocation
    from ttft.reports.runs.analyses import _first_task

    location = TraceLocation(path)
    started = time.perf_counter()
    for piece in pieces:
        _first_task(location, piece, None, "exclusive")
    return time.perf_counter() - started


def _first_task_returned(path: str, piece: int) -> Any:
    """A worker's first task of ``piece``, its result (the part) sent to the driver."""
    from ttft.collectors import TraceLocation
    from ttft.reports.runs.analyses import _first_task

    return _first_task(TraceLocation(path), piece, None, "exclusive")


def _first_task_dropped(path: str, piece: int) -> None:
    """`_first_task_returned`, its result dropped on the worker."""
    _first_task_returned(path, piece)


def measure_dask_ceiling(path: Path, clients: dict[int, Any], rounds: int
                         ) -> dict[tuple[int, str], list[float]]:
    """What Dask itself allows: every partition's first task on each cluster (``clients``:
    workers → client), as ``analyze_location`` submits them, with no driver work at all:
    ``dropped``, nothing sent back; ``returned``, each part sent to this process, which
    drops it as it comes (what moving the parts costs). Wall seconds, ``rounds`` each,
    alternating, after the clusters' warm-up."""
    from distributed import as_completed

    from ttft.collectors import TraceLocation

    partitions = TraceLocation(str(path)).partitions()
    out: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for n, client in clients.items():
            for name, task in (("dropped", _first_task_dropped),
                               ("returned", _first_task_returned)):
                started = time.perf_counter()
                futures = client.map(task, [str(path)] * partitions, range(partitions),
                                     pure=False)
                for future in as_completed(futures):
                    future.result()
                    future.release()
                out.setdefault((n, name), []).append(time.perf_counter() - started)
                del futures
    return out


def measure_ceiling(path: Path, partitions: int, rounds: int) -> dict[str, list[float]]:
    """What 2 workers can get on this machine at best: every partition's first task in one
    plain process, and split between two running at once (``multiprocessing``, spawned,
    partitions dealt alternately), no Dask and no driver; wall seconds, ``rounds`` each,
    alternating, after a warm-up of both processes."""
    import multiprocessing

    out: dict[str, list[float]] = {"one": [], "two": []}
    pieces = list(range(partitions))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.starmap(_plain_tasks, [(str(path), pieces[:1]), (str(path), pieces[1:2])])
        for _ in range(rounds):
            started = time.perf_counter()
            pool.apply(_plain_tasks, (str(path), pieces))
            out["one"].append(time.perf_counter() - started)
            started = time.perf_counter()
            pool.starmap(_plain_tasks, [(str(path), pieces[0::2]), (str(path), pieces[1::2])])
            out["two"].append(time.perf_counter() - started)
    return out


_DRIVER = """
import sys, time
from ttft.collectors import TraceLocation
from ttft.reports.runs import analyses
from scale import _peak_rss_bytes
merging = []
merge_rows = analyses.merge_rows
def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
        return merge_rows(*args, **kwargs)
    finally:
        merging.append(time.perf_counter() - started)
analyses.merge_rows = timed
started = time.perf_counter()
with analyses.runner(scheduler=sys.argv[2]) as on_dask:
    analysis = analyses.analyze_location(TraceLocation(sys.argv[1]), on_dask)
print(time.perf_counter() - started, _peak_rss_bytes(), sum(merging))
"""


def measure_memory(path: Path) -> tuple[float, list[int], int, float]:
    """One run on a fresh 2-worker cluster: its time, each worker's peak RSS and the
    driver's: a fresh process of its own (``runner(scheduler=...)`` and
    ``analyze_location``, as ``ttft analyze DATASET --scheduler`` runs them), so that its
    peak is the analysis's alone, not what building the datasets left in this one; and
    the seconds of the driver's merge (``merge_rows``: the summary's reductions over the
    parts, serial, after the last task)."""
    import subprocess

    with ExitStack() as stack:
        cluster, client = _cluster(stack, 2)
        done = subprocess.run([sys.executable, "-c", _DRIVER, str(path),
                               cluster.scheduler_address], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent)
        took, driver, merge = done.stdout.split()
        peaks = client.run(_peak_rss_bytes)
    return float(took), sorted(peaks.values()), int(driver), float(merge)


def _arguments() -> argparse.Namespace:
    from _figures import add_json_option  # benchmarks/ is the script's folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--sizes", type=int, nargs=2, default=None, metavar=("S1", "S2"),
                        help="spans of the memory runs (default: spans/4 and spans)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk-spans", type=int, default=4_000_000)
    parser.add_argument("--single-max-spans", type=int, default=30_000_000,
                        help="skip the single-process run above this many spans")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1M spans, 8 partitions, 1 round")
    parser.add_argument("--memory-only", action="store_true",
                        help="only the memory runs at --sizes (the 100M-span check without "
                             "the hour of speed rounds)")
    parser.add_argument("--datasets", type=Path, default=None, metavar="DIR",
                        help="keep the datasets in DIR and reuse those a run built there "
                             "before (default: a temporary directory, deleted at the end)")
    add_json_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.spans, args.partitions, args.rounds = 1_000_000, 8, 1
    args.sizes = sorted(args.sizes or [args.spans // 4, args.spans])
    return args


def _print_speed(info: dict[str, Any], speed: dict[str, Any], rounds: int) -> dict[str, float]:
    spans = info["spans"]
    rate = {n: spans / statistics.median(times) for n, times in speed["times_s"].items()}
    print(f"{'configuration':<40}{'s (median)':>11}{'spans/s':>13}{'warm-up s':>11}"
          f"{'workers CPU s':>15}{'driver CPU s':>14}")
    if "single_s" in speed:
        rate["single"] = spans / speed["single_s"]
        print(f"{'1 process: analyze(read_spans(DATASET))':<40}{speed['single_s']:>11.2f}"
              f"{rate['single']:>13,.0f}{'-':>11}  (reading {speed['read_s']:.2f} s)")
    for n in (1, 2):
        label = f"Dask LocalCluster, {n} worker{'s' if n > 1 else ''}"
        workers_cpu, driver_cpu = (statistics.median(c) for c in zip(*speed["cpu_s"][n],
                                                                      strict=True))
        print(f"{label:<40}{statistics.median(speed['times_s'][n]):>11.2f}{rate[n]:>13,.0f}"
              f"{speed['warmup_s'][n]:>11.2f}{workers_cpu:>15.2f}{driver_cpu:>14.2f}")
    times = ", ".join(f"{n} worker(s) " + " ".join(f"{t:.2f}" for t in ts)
                      for n, ts in speed["times_s"].items())
    print(f"2 workers / 1 worker: {rate[2] / rate[1]:.2f}× (goal ≥ {GOAL_SPEEDUP}); "
          f"{rounds} round(s) each, alternating, after a warm-up run; times s: {times}; "
          f"1-min load average during the rounds {min(speed['load']):.1f}"
          f"-{max(speed['load']):.1f} on {os.cpu_count()} CPUs")
    ceiling = speed.get("ceiling")
    if ceiling is not None:
        one, two = (statistics.median(ceiling[k]) for k in ("one", "two"))
        rate["ceiling"] = one / two
        print(f"this machine's ceiling: the same first tasks in 2 plain processes / 1, no Dask "
              f"and no driver: {rate['ceiling']:.2f}× ({one:.2f} s / {two:.2f} s); "
              f"2 workers / 1 worker reach {rate[2] / rate[1] / rate['ceiling']:.0%} of it")
    dask = speed.get("dask")
    if dask is not None:
        for name, what in (("dropped", "nothing sent back"),
                           ("returned", "each part sent to a driver that drops it")):
            one, two = (statistics.median(dask[(n, name)]) for n in (1, 2))
            rate[f"dask_{name}"] = one / two
            print(f"Dask's own ceiling, the same first tasks on the same clusters, {what}: "
                  f"{one / two:.2f}× ({one:.2f} s / {two:.2f} s)")
    if "single" in rate:
        print(f"2 workers / 1 process: {rate[2] / rate['single']:.2f}× (goal ≥ 1)")
    if "same" in speed:
        print(f"distributed summary equals the single-process one: "
              f"{'yes' if speed['same'] else 'NO'}")
    return rate


def main() -> None:
    from _figures import Figure, write

    args = _arguments()
    if args.spans >= 100_000_000:
        print("note: the issue's 100M-span run; expect well over an hour on 2 cores",
              file=sys.stderr)
    with ExitStack() as scratch:
        tmp = args.datasets or scratch.enter_context(
            tempfile.TemporaryDirectory(prefix="ttft-scale-"))
        datasets: dict[int, tuple[Path, dict[str, Any]]] = {}
        wanted = set(args.sizes) if args.memory_only else {args.spans, *args.sizes}
        for size in sorted(wanted):
            path = Path(tmp) / f"spans-{size}"
            partitions = max(1, round(args.partitions * size / args.spans))
            datasets[size] = (path, _dataset(path, size, partitions, args))
        path, info = datasets[args.spans if not args.memory_only else args.sizes[-1]]
        speed = (None if args.memory_only else
                 measure_speed(path, args.rounds, info["spans"] <= args.single_max_spans))
        if speed is not None:
            speed["ceiling"] = measure_ceiling(path, info["partitions"], args.rounds)
        memory = {size: measure_memory(datasets[size][0]) for size in args.sizes}
    for size in sorted(datasets):
        built = datasets[size][1]
        how = ("built before" if built["build_s"] is None else
               f"generated in {built['chunks']} chunk(s) and written in "
               f"{built['build_s']:.1f} s")
        print(f"dataset: {built['spans']:,} spans (+{built['copies']:,} borrowed step rows) in "
              f"{built['partitions']} partitions, {how}; {os.cpu_count()} CPUs"
              f"{' (--quick)' if args.quick else ''}")
    rate = {} if speed is None else _print_speed(info, speed, args.rounds)
    print(f"\n{'memory: dataset spans':<26}{'partitions':>11}{'spans/part':>12}"
          f"{'2-worker run s':>16}{'spans/s':>12}{'peak RSS per worker (GiB)':>28}"
          f"{'driver (GiB)':>14}{'its merge s':>13}")
    for size in args.sizes:
        size_info = datasets[size][1]
        took, peaks, driver, merge = memory[size]
        print(f"{size_info['spans']:<26,}{size_info['partitions']:>11}"
              f"{size_info['spans'] / size_info['partitions']:>12,.0f}{took:>16.2f}"
              f"{size_info['spans'] / took:>12,.0f}"
              f"{'  '.join(f'{p / GIB:.2f}' for p in peaks):>28}{driver / GIB:>14.2f}"
              f"{merge:>13.2f}")
    peak = {size: max(memory[size][1]) / GIB for size in args.sizes}
    small, large = args.sizes
    growth = peak[large] / peak[small]
    print(f"largest / smallest size's peak: {growth:.2f}× for {large / small:.0f}× the spans "
          f"(goals: ≤ {GOAL_PEAK_GIB} GiB per worker, ≤ {GOAL_PEAK_GROWTH}×); the issue's "
          "100M-span run is --spans 100000000 --partitions 64")
    figures = [] if speed is None else [
        Figure("scale", f"1 worker, end to end, {info['spans'] / 1e6:.0f}M spans", rate[1],
               "spans/s"),
        Figure("scale", "2 workers, end to end", rate[2], "spans/s"),
        Figure("scale", "2 workers / 1 worker", rate[2] / rate[1], "×", f"≥ {GOAL_SPEEDUP}",
               rate[2] / rate[1] >= GOAL_SPEEDUP),
    ]
    if "ceiling" in rate:
        figures.append(Figure("scale", "2 plain processes / 1, the same tasks (the ceiling)",
                              rate["ceiling"], "×"))
    for name, what in (("dropped", "nothing sent back"), ("returned", "parts sent back")):
        if f"dask_{name}" in rate:
            figures.append(Figure("scale", f"Dask's ceiling, the same tasks, {what}",
                                  rate[f"dask_{name}"], "×"))
    if "single" in rate:
        figures += [Figure("scale", "1 process, read_spans + analyze", rate["single"],
                           "spans/s"),
                    Figure("scale", "2 workers / 1 process", rate[2] / rate["single"], "×",
                           "≥ 1", rate[2] >= rate["single"]),
                    Figure("scale", "distributed summary = 1 process", float(speed["same"]),
                           "bool", "= 1", speed["same"])]
    figures += [Figure("scale", f"peak RSS per worker, {datasets[s][1]['spans'] / 1e6:.3g}M "
                       f"spans", peak[s], "GiB", f"≤ {GOAL_PEAK_GIB}", peak[s] <= GOAL_PEAK_GIB)
                for s in args.sizes]
    figures.append(Figure("scale", f"peak RSS, {large / small:.0f}× the spans", growth, "×",
                          f"≤ {GOAL_PEAK_GROWTH}", growth <= GOAL_PEAK_GROWTH))
    driver = {s: memory[s][2] / GIB for s in args.sizes}
    figures += [Figure("scale", f"driver's peak RSS, {datasets[s][1]['spans'] / 1e6:.3g}M "
                       f"spans", driver[s], "GiB", f"≤ {GOAL_PEAK_GIB}",
                       driver[s] <= GOAL_PEAK_GIB) for s in args.sizes]
    write(args.json, figures)


if __name__ == "__main__":
    main()

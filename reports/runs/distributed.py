"""A partitioned dataset analysed on a Dask cluster: ``ttft analyze DATASET --workers N`` or
``--scheduler ADDRESS`` (README, "Beyond one machine").

Two passes over the partitions, each one task per partition that reads it whole
(``read_partition``: its own rows and the step traces it borrowed; never a piece of one):
the first returns each partition's clock bounds, from which the driver estimates the
offsets over all requests; the second assembles and attributes each partition with those
offsets (``analysis.partial``). With no boundary given, a partition whose outermost
boundary is not the dataset's is attributed again at the dataset's. The driver merges the
parts into exactly the summary one process gives (``merge_parts``) and, when asked, writes
each partition's per-request parts as ``OUT/part=K.parquet``.

Dask (``distributed``) is the ``dask`` extra: ``pip install 'ttft[dask]'``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttft.analysis.attribution import Attribution
from ttft.analysis.clocks import Bounds, ClockOffset, offsets_from_bounds
from ttft.analysis.partial import Part, analyze_part, default_boundary, merge_parts, part_bounds
from ttft.analysis.summary import Summary
from ttft.collectors.dataset import dataset_info, read_partition

__all__ = ["DaskMissing", "DatasetAnalysis", "analyze_dataset"]

INSTALL_HINT = "pip install 'ttft[dask]'"


class DaskMissing(ImportError):
    """``distributed`` is not installed; the message says how to install it."""


@dataclass
class DatasetAnalysis:
    """A dataset analysed in partitions: the merged summary and attribution, the offsets
    used, and how many partitions and workers took part."""

    summary: Summary
    attribution: Attribution
    offsets: list[ClockOffset]
    partitions: int
    workers: int


def _read(path: str, k: int, mapping: str | None) -> tuple[Any, int]:
    """Partition ``k`` with stages mapped as ``read_spans`` maps them (row for row: the
    own rows stay first)."""
    from ttft.collectors.importers.mapping import default_mapping, load_mapping

    table, own_rows = read_partition(path, k)
    rules = default_mapping() if mapping is None else load_mapping(mapping)
    return rules.apply(table), own_rows


def _bounds_task(path: str, k: int, mapping: str | None) -> Bounds:
    table, _ = _read(path, k, mapping)
    return part_bounds(table)


def _part_task(path: str, k: int, mapping: str | None, offsets: Sequence[ClockOffset],
               boundary: str | None, policy: str) -> Part:
    table, own_rows = _read(path, k, mapping)
    return analyze_part(table, own_rows, offsets, boundary, policy)


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None) -> Iterator[Any]:
    """A ``distributed.Client``: on a ``LocalCluster`` of ``workers`` processes (one thread
    each, on 127.0.0.1; its status server on a free port, never a fixed one another
    process may hold), or connected to the scheduler at ``scheduler``.

    Raises:
        DaskMissing: ``distributed`` is not installed.
        OSError: the scheduler cannot be reached (within 30 s).
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise DaskMissing(f"--workers and --scheduler need Dask: {INSTALL_HINT}") from exc
    if scheduler is not None:
        with Client(scheduler, timeout="30s") as client:
            yield client
        return
    with LocalCluster(n_workers=workers or 1, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address="127.0.0.1:0",
                      silence_logs=40) as cluster, Client(cluster) as client:
        yield client


def _gather(client: Any, function: Callable[..., Any], path: str, partitions: Sequence[int],
            *args: Any, on_done: Callable[[], None] | None = None) -> list[Any]:
    """``function(path, k, *args)`` for every partition ``k``, one task each, results in
    partition order. Each result is fetched as its task ends and its future released at
    once, so a worker holds what it is computing, never every partition's result."""
    from distributed import as_completed

    futures = {client.submit(function, path, k, *args, pure=False): k for k in partitions}
    results: dict[int, Any] = {}
    for future, result in as_completed(list(futures), with_results=True):
        results[futures.pop(future)] = result
        future.release()
        if on_done is not None:
            on_done()
    return [results[k] for k in partitions]


def analyze_dataset(path: str | os.PathLike[str], *, boundary: str | None = None,
                    policy: str = "exclusive", workers: int | None = None,
                    scheduler: str | None = None, per_request: Path | None = None,
                    mapping: str | None = None, slo: Mapping[str, float] | None = None,
                    on_done: Callable[[], None] | None = None) -> DatasetAnalysis:
    """Analyse a dataset in partitions on a Dask cluster (see the module docstring).

    Args:
        path: the dataset (``ttft partition``), a local path or an fsspec URL every
            worker can read.
        boundary, policy: as ``ttft.analysis.analyze``.
        workers: processes of a local cluster (ignored with ``scheduler``).
        scheduler: the address of a running ``distributed`` scheduler.
        per_request: a directory to write each partition's per-request parts to.
        mapping: a TOML file of extra stage rules, as ``read_spans`` takes (the workers
            read it).
        slo: SLO limits in ms per metric, for the summary's goodput.
        on_done: called after each partition task of each pass (a progress bar).

    Raises:
        DaskMissing: ``distributed`` is not installed.
        TraceFileError: the dataset or one of its partitions cannot be read.
        ValueError: an unknown boundary or policy.
    """
    info = dataset_info(path)
    n = int(info["partitions"])
    shown = os.fspath(path)
    with dask_client(workers, scheduler) as client:
        n_workers = len(client.scheduler_info().get("workers", {}))
        everything = list(range(n))
        offsets = offsets_from_bounds(_gather(client, _bounds_task, shown, everything,
                                              mapping, on_done=on_done))
        parts = _gather(client, _part_task, shown, everything, mapping, offsets, boundary,
                        policy, on_done=on_done)
        chosen = boundary or default_boundary(parts)
        again = [k for k, part in enumerate(parts) if part.attribution.boundary != chosen]
        if again:
            redone = _gather(client, _part_task, shown, again, mapping, offsets, chosen,
                             policy)
            for k, part in zip(again, redone, strict=True):
                parts[k] = part
    attribution, summary = merge_parts(parts, offsets, trace=shown,
                                       schema_version=int(info["schema_version"]), slo=slo)
    if per_request is not None:
        write_per_request(parts, per_request)
    return DatasetAnalysis(summary, attribution, offsets, n, n_workers)


def write_per_request(parts: Sequence[Part], out: Path) -> None:
    """Each partition's per-request parts (``Attribution.per_request``) as
    ``out/part=K.parquet``.

    Raises:
        OSError: ``out`` cannot be written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(parts):
        frame = part.attribution.per_request()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False),
                       out / f"part={k}.parquet")

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

``ttft report`` (`report_dataset`) adds to the first pass each partition's own ``step``
spans and ``engine_info`` events, from which the driver builds the dataset's step table
(one row per engine step, broadcast to the workers) and finds the model and device; the
second pass returns, with each `Part`, its requests' blame against the global steps, its
prefill points and its chunks' regime rows (``analysis.partial_report``); a third pass
reads only the partitions of the median, p99 and slowest requests for their waterfalls.
The driver never holds more than those rows and the per-request parts.

Dask (``distributed``) is the ``dask`` extra: ``pip install 'ttft[dask]'``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ttft.analysis.attribution import Attribution
from ttft.analysis.clock_offset import ClockOffset
from ttft.analysis.clocks import Bounds, offsets_from_bounds
from ttft.analysis.partial import (
    Part,
    analyze_part,
    assemble_part,
    default_boundary,
    locate,
    merge_parts,
    part_bounds,
)
from ttft.analysis.partial_report import (
    ReportPart,
    Survey,
    global_steps,
    merge_report_parts,
    report_part,
    survey_part,
)
from ttft.analysis.regime import RegimeResult
from ttft.analysis.summary import Summary
from ttft.collectors.dataset import dataset_info, read_partition
from ttft.reports.report_data import (
    ReportData,
    Waterfall,
    chosen_requests,
    combine_report,
    request_spans,
    waterfall,
)

__all__ = ["DaskMissing", "DatasetAnalysis", "DatasetReport", "analyze_dataset",
           "compare_datasets", "dataset_regime", "report_dataset"]

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
    boundaries: tuple[str, ...] = ()
    """The boundaries some request of some partition supports (outermost first)."""


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


def _survey_task(path: str, k: int, mapping: str | None) -> Survey:
    table, own_rows = _read(path, k, mapping)
    return survey_part(table, own_rows)


def _report_task(path: str, k: int, mapping: str | None, offsets: Sequence[ClockOffset],
                 boundary: str | None, policy: str, steps: Any, shape: Any, peaks: Any
                 ) -> ReportPart:
    table, own_rows = _read(path, k, mapping)
    return report_part(table, own_rows, offsets, boundary, policy, steps, shape, peaks)


def _spans_task(path: str, k: int, mapping: str | None, offsets: Sequence[ClockOffset],
                steps: Any, wanted: Sequence[tuple[int, int, int]]) -> list[pd.DataFrame]:
    """`request_spans` of each ``(request, a_ns, b_ns)`` of partition ``k``."""
    table, own_rows = _read(path, k, mapping)
    asm = assemble_part(table, own_rows, offsets)
    return [request_spans(asm, request, a_ns, b_ns, steps) for request, a_ns, b_ns in wanted]


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
            *args: Any, on_done: Callable[[], None] | None = None,
            each: Mapping[int, tuple[Any, ...]] | None = None) -> list[Any]:
    """``function(path, k, *args, *each[k])`` for every partition ``k``, one task each,
    results in partition order. Each result is fetched as its task ends and its future
    released at once, so a worker holds what it is computing, never every partition's
    result."""
    from distributed import as_completed

    futures = {client.submit(function, path, k, *args, *(each or {}).get(k, ()), pure=False): k
               for k in partitions}
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
                    on_done: Callable[[], None] | None = None, client: Any = None
                    ) -> DatasetAnalysis:
    """Analyse a dataset in partitions on a Dask cluster (see the module docstring).

    Args:
        path: the dataset (``ttft partition``), a local path or an fsspec URL every
            worker can read.
        boundary, policy: as ``ttft.analysis.analyze``.
        workers: processes of a local cluster (ignored with ``scheduler`` or ``client``).
        scheduler: the address of a running ``distributed`` scheduler.
        per_request: a directory to write each partition's per-request parts to.
        mapping: a TOML file of extra stage rules, as ``read_spans`` takes (the workers
            read it).
        slo: SLO limits in ms per metric, for the summary's goodput.
        on_done: called after each partition task of each pass (a progress bar).
        client: a ``distributed.Client`` to run on (`dask_client`) instead of a new one.

    Raises:
        DaskMissing: ``distributed`` is not installed.
        TraceFileError: the dataset or one of its partitions cannot be read.
        ValueError: an unknown boundary or policy.
    """
    if client is None:
        with dask_client(workers, scheduler) as own:
            return analyze_dataset(path, boundary=boundary, policy=policy,
                                   per_request=per_request, mapping=mapping, slo=slo,
                                   on_done=on_done, client=own)
    info = dataset_info(path)
    n = int(info["partitions"])
    shown = os.fspath(path)
    everything = list(range(n))
    offsets = offsets_from_bounds(_gather(client, _bounds_task, shown, everything, mapping,
                                          on_done=on_done))
    parts = _gather(client, _part_task, shown, everything, mapping, offsets, boundary, policy,
                    on_done=on_done)
    parts = _at_one_boundary(client, shown, parts, mapping, offsets, boundary, policy)
    attribution, summary = merge_parts(parts, offsets, trace=shown,
                                       schema_version=int(info["schema_version"]), slo=slo)
    if per_request is not None:
        write_per_request(parts, per_request)
    return DatasetAnalysis(summary, attribution, offsets, n, _workers(client),
                           _supported(parts))


def compare_datasets(paths: Sequence[str | os.PathLike[str]], *, boundary: str | None = None,
                     policy: str = "exclusive", workers: int | None = None,
                     scheduler: str | None = None, mapping: str | None = None,
                     slo: Mapping[str, float] | None = None,
                     choose: Callable[[list[tuple[str, ...]]], str] | None = None,
                     on_done: Callable[[], None] | None = None) -> list[DatasetAnalysis]:
    """Several datasets analysed (`analyze_dataset`) on one cluster at one boundary, for
    ``ttft compare``: ``boundary``, else ``choose`` of the boundaries each supports (default:
    the first one's outermost); a dataset analysed at another is analysed again at it.

    Raises:
        as `analyze_dataset`, and whatever ``choose`` raises.
    """
    with dask_client(workers, scheduler) as client:
        def run(path: str | os.PathLike[str], at: str | None, done: Any) -> DatasetAnalysis:
            return analyze_dataset(path, boundary=at, policy=policy, mapping=mapping, slo=slo,
                                   on_done=done, client=client)

        results = [run(path, boundary, on_done) for path in paths]
        chosen = boundary or (choose or (lambda found: found[0][0]))(
            [r.boundaries for r in results])
        return [r if r.attribution.boundary == chosen else run(path, chosen, None)
                for path, r in zip(paths, results, strict=True)]


def _workers(client: Any) -> int:
    return len(client.scheduler_info().get("workers", {}))


def _supported(parts: Sequence[Part]) -> tuple[str, ...]:
    from ttft.tracer.schema import BOUNDARY_NAMES

    return tuple(name for name in BOUNDARY_NAMES if any(name in p.boundaries for p in parts))


def _at_one_boundary(client: Any, path: str, parts: list[Part], mapping: str | None,
                     offsets: Sequence[ClockOffset], boundary: str | None, policy: str
                     ) -> list[Part]:
    """``parts`` with those attributed at another boundary than the dataset's (``boundary``,
    else `default_boundary`) attributed again at it."""
    chosen = boundary or default_boundary(parts)
    again = [k for k, part in enumerate(parts) if part.attribution.boundary != chosen]
    if not again:
        return parts
    redone = dict(zip(again, _gather(client, _part_task, path, again, mapping, offsets, chosen,
                                     policy), strict=True))
    return [redone.get(k, part) for k, part in enumerate(parts)]


@dataclass
class DatasetReport:
    """A dataset's report data (`ReportData`, as ``build_report`` gives for the whole) and
    how many partitions and workers made it."""

    data: ReportData
    partitions: int
    workers: int


def report_dataset(path: str | os.PathLike[str], *, boundary: str | None = None,
                   policy: str = "exclusive", workers: int | None = None,
                   scheduler: str | None = None, mapping: str | None = None,
                   slo: Mapping[str, float] | None = None,
                   regime: Mapping[str, Any] | None = None,
                   on_done: Callable[[], None] | None = None, client: Any = None
                   ) -> DatasetReport:
    """Everything ``ttft report`` shows of a dataset, made in partitions on a Dask cluster
    (see the module docstring), equal to what one process makes of the whole.

    Args:
        path, boundary, policy, workers, scheduler, mapping, slo, on_done: as
            `analyze_dataset` (``on_done`` is called after each task of the first two
            passes).
        regime: keyword arguments of ``compute_regime`` beyond the assembly and metadata
            (``model_config``, ``model_origin``, ``peak_tflops``, ``peak_bandwidth_gbs``).
        client: a ``distributed.Client`` to run on (`dask_client`) instead of a new one.

    Raises:
        DaskMissing: ``distributed`` is not installed.
        TraceFileError: the dataset or one of its partitions cannot be read.
        ValueError: an unknown boundary or policy, or a model config that is not a model
            shape.
    """
    if client is None:
        with dask_client(workers, scheduler) as own:
            return report_dataset(path, boundary=boundary, policy=policy, mapping=mapping,
                                  slo=slo, regime=regime, on_done=on_done, client=own)
    info = dataset_info(path)
    n = int(info["partitions"])
    shown = os.fspath(path)
    everything = list(range(n))
    surveys = _gather(client, _survey_task, shown, everything, mapping, on_done=on_done)
    offsets = offsets_from_bounds([survey.bounds for survey in surveys])
    steps = client.scatter(global_steps(surveys, offsets), broadcast=True)
    found, shape = dataset_regime(surveys, regime or {})
    parts = _gather(client, _report_task, shown, everything, mapping, offsets, boundary,
                    policy, steps, shape, found.peaks, on_done=on_done)
    plain = _at_one_boundary(client, shown, [p.part for p in parts], mapping, offsets,
                             boundary, policy)
    attribution, summary = merge_parts(plain, offsets, trace=shown,
                                       schema_version=int(info["schema_version"]), slo=slo)
    waterfalls = _waterfalls(client, shown, mapping, offsets, steps, attribution, plain)
    blame_rows, points, chunks = merge_report_parts(parts)
    if chunks is not None:
        found = RegimeResult(chunks, None, found.peaks, found.device_name)
    data = combine_report(summary, surveys[0].metadata, attribution, waterfalls, blame_rows,
                          points, found)
    return DatasetReport(data, n, _workers(client))


def _waterfalls(client: Any, path: str, mapping: str | None, offsets: Sequence[ClockOffset],
                steps: Any, attribution: Attribution, parts: Sequence[Part]) -> list[Waterfall]:
    """The waterfalls of `chosen_requests`, each request's spans read from its partition
    (one task per partition holding one) and the engine steps from ``steps``."""
    chosen = chosen_requests(attribution)
    if not chosen:
        return []
    where = [locate(parts, int(attribution.requests["request"].iloc[row])) for _, row in chosen]
    wanted: dict[int, list[tuple[int, int, int]]] = {}
    for (k, local), (_, row) in zip(where, chosen, strict=True):
        a_ns = int(attribution.requests["a_ns"].iloc[row])
        b_ns = a_ns + int(attribution.requests["ttft_ns"].iloc[row])
        wanted.setdefault(k, []).append((local, a_ns, b_ns))
    fetched = _gather(client, _spans_task, path, sorted(wanted), mapping, offsets, steps,
                      each={k: (w,) for k, w in wanted.items()})
    frames = {(k, local): frame
              for k, batch in zip(sorted(wanted), fetched, strict=True)
              for (local, _, _), frame in zip(wanted[k], batch, strict=True)}
    return [waterfall(label, attribution.requests.iloc[row], attribution.attributed.iloc[row],
                      frames[at]) for (label, row), at in zip(chosen, where, strict=True)]


def dataset_regime(surveys: Sequence[Survey], options: Mapping[str, Any]
                   ) -> tuple[RegimeResult, Any]:
    """The regime's peaks and device as one process finds them in the whole dataset (its
    last ``engine_info`` event, in partition order, and partition 0's metadata), with no
    chunks yet, and the model shape to cost each partition's chunks with (None without
    one); ``options`` are ``compute_regime``'s keyword arguments.

    Raises:
        ValueError: the model config (given or the dataset's) is not a model shape.
    """
    import pyarrow as pa

    from ttft.analysis.assemble import assemble
    from ttft.analysis.regime import ModelShape, compute_regime, find_model_and_device

    info = pa.concat_tables([survey.engine_info for survey in surveys])
    metadata = surveys[0].metadata
    found = compute_regime(assemble(info), metadata, **options)
    if found.frame is None:
        return found, None
    model = options.get("model_config") or find_model_and_device(info, metadata)[0]
    return found, ModelShape.from_dict(model)


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

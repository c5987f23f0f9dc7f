"""Span tables into a partitioned dataset: the one path ``ttft partition`` and ``ttft collect
--partitions`` both take (``analysis.partition.partition_rows``, then
``collectors.dataset.write_dataset``), and the finish of a collect's staging
(``collectors/staging.py``): its staged runs and the dataset's own rows partitioned again
into a new dataset that is swapped in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from ttft.collectors import TraceLocation

__all__ = ["Written", "finish_staging", "write_partitioned"]

Progress = Callable[[str], AbstractContextManager[Any]]
"""``progress(message)``: a context manager shown while a step runs."""


@dataclass
class Written:
    """A dataset written: where, its partition count, requests, own spans, copied step rows
    and the spans of its largest partition (own and copied)."""

    out: str
    partitions: int
    requests: int
    spans: int
    copies: int
    largest: int


def _counts(partition_of: np.ndarray, partitions: int) -> np.ndarray:
    """How many entries of ``partition_of`` name each partition 0..partitions-1."""
    return np.bincount(np.asarray(partition_of, dtype=np.int64), minlength=partitions)


def write_partitioned(
    out: str | os.PathLike[str],
    table: pa.Table,
    partitions: int,
    metadata: Mapping[str, Any],
    progress: Progress = lambda _: nullcontext(),
) -> Written:
    """Partition ``table`` (stages mapped, ``SPAN_SCHEMA``) and write it as a dataset at
    ``out``, with ``metadata`` as its run metadata.

    Raises:
        ValueError: ``partitions`` below 1, or ``out`` not a new or empty directory.
        TraceFileError: a URL whose filesystem package is missing.
        OSError: a file cannot be written.
    """
    from ttft.analysis.partition import partition_rows
    from ttft.collectors import write_dataset

    with progress(f"partitioning {table.num_rows:,} spans"):
        rows = partition_rows(table, partitions)
    with progress(f"writing {out}"):
        write_dataset(out, table, rows.owner, rows.copy_rows, rows.copy_partitions,
                      partitions, rows.key, dict(metadata))
    largest = _counts(rows.owner, partitions) + _counts(rows.copy_partitions, partitions)
    return Written(os.fspath(out), partitions, rows.requests, table.num_rows,
                   len(rows.copy_rows), int(largest.max()))


def _staged(dataset: TraceLocation) -> tuple[list[pa.Table], dict[str, Any], list[str]]:
    """The tables to partition at ``dataset`` (its own rows, then its staged runs), the
    newest run metadata and the inputs (the dataset's, then each staged run's path)."""
    from ttft.collectors import TraceLocation, is_dataset, read_inputs, run_metadata
    from ttft.tracer.schema import newest_run_metadata

    tables, metadata, inputs = [], {}, []
    if is_dataset(dataset.path):
        table = dataset.read()
        metadata = run_metadata(table)
        tables.append(table)
        inputs = list(metadata.get("inputs", []))
    if dataset.staged_runs():
        table = TraceLocation(str(dataset.staging)).read()
        staged = run_metadata(table)
        metadata = {**metadata, **newest_run_metadata([metadata, staged])}
        tables.append(table)
        runs = read_inputs(table) or [{"path": str(dataset.staging)}]
        inputs += [str(Path(run["path"]).relative_to(dataset.path)) for run in runs]
    return tables, metadata, inputs


def finish_staging(dataset: Path, partitions: int,
                   progress: Progress = lambda _: nullcontext()) -> Written | None:
    """Partition ``dataset``'s own rows and its staged runs (``ttft collect --partitions``)
    into a new dataset beside it and swap it in; the staging goes with the replaced one.
    Call while holding ``collectors.staging.holding(dataset)``, after ``recover``.

    Returns:
        What was written; None when nothing is staged (the dataset stays as it is).

    Raises:
        TraceFileError: a staged run or the dataset cannot be read.
        ValueError: a dataset of another partition count.
        OSError: a file cannot be written or renamed.
    """
    from ttft.collectors import TraceLocation
    from ttft.collectors.staging import next_path, swap_in
    from ttft.tracer.schema import SPAN_SCHEMA

    location = TraceLocation(os.fspath(dataset))
    if not location.staging.is_dir():
        return None
    location.appendable(partitions)
    tables, metadata, inputs = _staged(location)
    table = pa.concat_tables(tables) if tables else SPAN_SCHEMA.empty_table()
    written = write_partitioned(next_path(dataset), table, partitions,
                                {**metadata, "inputs": inputs}, progress)
    swap_in(dataset)
    return replace(written, out=os.fspath(dataset))

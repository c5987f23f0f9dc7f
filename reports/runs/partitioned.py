"""Span tables into a partitioned dataset: the one path ``ttft partition`` and ``ttft collect
--partitions`` both take (``analysis.partition.partition_rows``, then
``collectors.dataset_write.write_dataset``), and the finish of a collect's staging
(``collectors/staging.py``): its staged runs and the dataset's own rows partitioned again
into a new dataset that is swapped in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from ttft.collectors import TraceLocation

__all__ = ["Source", "Written", "finish_staging", "source_of", "stream_partitioned",
           "write_partitioned"]

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


# --- bounded memory: the same partitioning, streamed ------------------------------------


@dataclass
class Source:
    """A trace read a batch at a time, as often as needed: `batches` reads it again from
    the start. ``metadata`` is its run metadata (read without its rows); ``inputs`` what
    the first read found (``ttft.collectors.read_inputs``' list), for a directory or an
    unfinished run, else None."""

    name: str
    metadata: dict[str, Any]
    read: Callable[[list[dict[str, Any]] | None], Iterator[pa.Table]]
    inputs: list[dict[str, Any]] | None = None
    reads: int = 0

    def batches(self) -> Iterator[pa.Table]:
        found: list[dict[str, Any]] | None = [] if self.reads == 0 else None
        self.reads += 1
        yield from self.read(found)
        if found and (Path(self.name).is_dir() or found[0].get("state") != "finished"):
            self.inputs = found


def source_of(path: str | os.PathLike[str], format: str | None = None) -> Source | None:
    """The trace at ``path`` as a `Source` when it can be read a batch at a time: a local
    ttft Parquet file, directory of runs or dataset (a dataset's own rows, partition by
    partition); None for anything else (another format, a stream, a URL), which is read
    whole.

    Raises:
        TraceFileError: the path cannot be read (as ``read_spans``).
    """
    from ttft.collectors import TraceFileError, guess_format
    from ttft.collectors.dataset import (
        checked_dataset,
        is_url,
        iter_partitions,
        looks_like_dataset,
    )
    from ttft.collectors.parquet import iter_batches, read_parquet_metadata
    from ttft.collectors.reader import STDIN

    if format not in (None, "ttft") or is_url(path) or os.fspath(path) == STDIN:
        return None
    try:  # a FIFO or another format is not ttft's (guessing never opens a FIFO)
        if guess_format(path) != "ttft":
            return None
    except TraceFileError:
        return None
    name = os.fspath(path)
    if looks_like_dataset(path):
        info = checked_dataset(path)
        return Source(name, dict(info.get("metadata") or {}),
                      lambda _found: iter_partitions(path))

    def read(found: list[dict[str, Any]] | None) -> Iterator[pa.Table]:
        for batch in iter_batches(path, inputs=found):
            yield pa.Table.from_batches([batch])

    return Source(name, read_parquet_metadata(path), read)


class NotStreamed(Exception):
    """The inputs must be read whole: a rule of the stage mapping fits some of their spans
    (other systems' spans; a join or interval rule acts on rows of several batches
    together, so a batch it fits is not read alone)."""


def stream_partitioned(
    out: str | os.PathLike[str],
    sources: Sequence[Source],
    partitions: int,
    metadata: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    progress: Progress = lambda _: nullcontext(),
    mapping: Any = None,
) -> Written:
    """``write_partitioned`` of ``sources`` read twice a batch at a time
    (``analysis.partition.PartitionPlan``): first what decides each trace's partition,
    then each batch routed to its partitions' files (``collectors.dataset_write.DatasetWriter``).
    The dataset is the one ``write_partitioned`` writes of the same rows (rows within a
    file may lie in another order); memory is bounded by the traces, not the spans.

    Args:
        metadata: the dataset's run metadata, or a function giving it once the first read
            is done (what the sources' ``inputs`` say is known then).
        mapping: the stage rules the inputs are read with (None: the built-in ones); a
            batch some rule can act on (``StageMapping.inert``) is not streamed.

    Raises:
        NotStreamed: before anything is written, when the inputs must be read whole.
        ValueError, TraceFileError, OSError: as ``write_partitioned``; ValueError also when
            an input changed between the two passes.
    """
    from ttft.analysis.partition import KEY_RULE, PartitionPlan
    from ttft.collectors.dataset_write import DatasetWriter
    from ttft.collectors.importers.mapping import default_mapping

    rules = mapping if mapping is not None else default_mapping()
    plan = PartitionPlan(partitions)
    first = f"reading {_names(sources)} (1 of 2: requests and step keys)"
    with progress(first) as update:
        for source in sources:
            for batch in source.batches():
                if not rules.inert(batch):
                    raise NotStreamed(f"{source.name}: the stage mapping maps some of its "
                                      "spans")
                plan.survey(batch)
                _said(update, f"{first}: {plan.rows:,} spans")
        plan.finish()
    writer = DatasetWriter(out, partitions, KEY_RULE,
                           dict(metadata() if callable(metadata) else metadata))
    largest = np.zeros(partitions, np.int64)
    rows = 0
    try:
        second = f"writing {out} (2 of 2)"
        with progress(second) as update:
            for source in sources:
                for batch in source.batches():
                    routed = plan.route(batch)
                    writer.add(batch, routed.owner, routed.copy_rows, routed.copy_partitions)
                    largest += (_counts(routed.owner, partitions)
                                + _counts(routed.copy_partitions, partitions))
                    rows += batch.num_rows
                    _said(update, f"{second}: {rows:,} of {plan.rows:,} spans")
        if rows != plan.rows:
            raise ValueError(f"{_names(sources)}: {rows:,} spans on the second read, "
                             f"{plan.rows:,} on the first: the input changed while it was "
                             "partitioned")
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return Written(os.fspath(out), partitions, plan.requests, writer.spans, writer.copies,
                   int(largest.max()))


def _said(update: Any, text: str) -> None:
    """Show ``text`` on the progress line (``progress`` may yield nothing to update)."""
    if callable(update):
        update(text)


def _names(sources: Sequence[Source]) -> str:
    return ", ".join(s.name for s in sources) if len(sources) <= 3 else f"{len(sources)} traces"


def _staged_metadata(dataset: TraceLocation, own: dict[str, Any] | None,
                     staged: dict[str, Any] | None,
                     staged_inputs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The run metadata of a dataset partitioned again with its staged runs: the newest
    (``own``: the dataset's, ``staged``: the staged runs', each None when absent), with
    ``inputs`` the dataset's then each staged run's path."""
    from ttft.tracer.schema import newest_run_metadata

    metadata = dict(own or {})
    inputs = list(metadata.get("inputs", []))
    if staged is not None:
        metadata = {**metadata, **newest_run_metadata([metadata, staged])}
        runs = staged_inputs or [{"path": str(dataset.staging)}]
        inputs += [str(Path(run["path"]).relative_to(dataset.path)) for run in runs]
    return {**metadata, "inputs": inputs}


def _staged(dataset: TraceLocation) -> tuple[list[pa.Table], dict[str, Any]]:
    """The tables to partition at ``dataset`` (its own rows, then its staged runs) and
    their run metadata (`_staged_metadata`)."""
    from ttft.collectors import TraceLocation, is_dataset, read_inputs, run_metadata

    tables, own, staged, runs = [], None, None, None
    if is_dataset(dataset.path):
        tables.append(dataset.read())
        own = run_metadata(tables[-1])
    if dataset.staged_runs():
        tables.append(TraceLocation(str(dataset.staging)).read())
        staged, runs = run_metadata(tables[-1]), read_inputs(tables[-1])
    return tables, _staged_metadata(dataset, own, staged, runs)


def _staged_streamed(dataset: TraceLocation, out: Path, partitions: int,
                     progress: Progress) -> Written | None:
    """`stream_partitioned` of the dataset's own rows and its staged runs; None (nothing
    written) when they must be read whole."""
    from ttft.collectors import is_dataset

    own = source_of(dataset.path) if is_dataset(dataset.path) else None
    staged = source_of(dataset.staging) if dataset.staged_runs() else None
    if (own is None and is_dataset(dataset.path)) or (staged is None
                                                        and dataset.staged_runs()):
        return None
    sources = [s for s in (own, staged) if s is not None]
    try:
        return stream_partitioned(
            out, sources, partitions,
            lambda: _staged_metadata(dataset, own and own.metadata,
                                     staged and staged.metadata, staged and staged.inputs),
            progress)
    except NotStreamed:
        return None


def finish_staging(dataset: Path, partitions: int,
                   progress: Progress = lambda _: nullcontext()) -> Written | None:
    """Partition ``dataset``'s own rows and its staged runs (``ttft collect --partitions``)
    into a new dataset beside it and swap it in; the staging goes with the replaced one.
    Call while holding ``collectors.staging.holding(dataset)``, after ``recover``. They
    are streamed (`stream_partitioned`) unless they must be read whole.

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
    written = _staged_streamed(location, next_path(dataset), partitions, progress)
    if written is None:
        tables, metadata = _staged(location)
        table = pa.concat_tables(tables) if tables else SPAN_SCHEMA.empty_table()
        written = write_partitioned(next_path(dataset), table, partitions, metadata, progress)
    swap_in(dataset)
    return replace(written, out=os.fspath(dataset))

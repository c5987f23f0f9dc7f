"""Where a trace lies, resolved once: what every command analyses.

A `TraceLocation` is a path (a trace file in any format, a directory of runs, a partitioned
dataset, also at an fsspec URL) with the format and stage mapping to read it by. It is
read whole (``read()``) or, a dataset, one partition at a time (``read(k)``), both through
``read_spans``, so the stage mapping is applied in one place whichever way the trace is
analysed (docs/architecture.md, "One program"). It pickles (a Dask task carries it to a
worker) without the table it may hold: a table read in this process stays here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ttft.collectors.dataset import checked_dataset

__all__ = ["TraceLocation"]


@dataclass
class TraceLocation:
    """A trace to analyse: ``path``, the ``format`` to read it as (None: guessed) and the
    ``mapping`` file of extra stage rules (None: the built-in ones); ``table`` is the whole
    trace when it was already read in this process."""

    path: str
    format: str | None = None
    mapping: str | None = None
    table: pa.Table | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "table": None}

    def __str__(self) -> str:
        return self.path

    def partitions(self) -> int:
        """The dataset's partition count, the dataset checked against its dataset file
        (``checked_dataset``), as reading it whole checks it.

        Raises:
            TraceFileError: not a readable dataset, or one changed after it was written.
        """
        return int(checked_dataset(self.path)["partitions"])

    def read(self, partition: int | None = None) -> pa.Table:
        """The whole trace (``partition`` None; the table already read, if any) or one
        partition of a dataset, as ``read_spans`` reads it.

        Raises:
            TraceFileError, ValueError: as ``read_spans``.
        """
        from ttft.collectors.reader import read_spans

        if partition is None and self.table is not None:
            return self.table
        return read_spans(self.path, format=self.format, mapping=self.mapping,
                          partition=partition)

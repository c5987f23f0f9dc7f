"""Where a trace lies, resolved once: what every command reads, appends to and merges.

A `TraceLocation` is a path with the format and stage mapping to read it by. What lies there
(its `kind`) is decided here, once, from the layout (``collectors/layout.py``: files, parts,
logs, runs) and the dataset layout (``collectors/dataset.py``), and every command asks the
location rather than looking at the path itself (docs/architecture.md, "One program"):

- **read**: whole (``read()``) or, a dataset, one partition (``read(k)``), both through
  ``read_spans``, so the stage mapping is applied in one place however it is analysed;
- **append**: ``writer()`` opens a new run in it (a directory of runs gains a file; a
  dataset's run is staged, ``collectors/staging.py``), the one way ``ttft collect`` writes;
- **merge**: a dataset's staged runs are partitioned in by
  ``reports/runs/partitioned.finish_staging``, which needs the analysis's request grouping
  (``analysis.partition``) that collectors may not import; it asks the location what is
  staged (`staged_runs`).

It pickles (a Dask task carries it to a worker) without the table it may hold: a table read
in this process stays here.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from ttft.collectors.dataset import (
    DATASET_FILE,
    STAGING_DIR,
    checked_dataset,
    dataset_info,
    is_dataset,
    is_url,
    looks_like_dataset,
)
from ttft.collectors.layout import log_files, parts_dir, stored_spans
from ttft.collectors.staging import staging_path
from ttft.tracer.span_ids import to_v1

if TYPE_CHECKING:
    from ttft.collectors.writer import TraceWriter

__all__ = ["Kind", "TraceLocation"]

Kind = Literal["new", "empty", "file", "run", "runs", "dataset", "stream"]
"""What a location holds: nothing yet (``new``), an empty directory (``empty``), one trace
file in any format (``file``), one writer's parts directory, live or killed (``run``), a
directory of runs (``runs``), a partitioned dataset, also at a URL or not fully written
(``dataset``), or standard input (``stream``)."""

_DATASET_ENTRY = re.compile(r"part=\d+")


@dataclass
class TraceLocation:
    """A trace at ``path``, the ``format`` to read it as (None: guessed) and the
    ``mapping`` file of extra stage rules (None: the built-in ones); ``table`` is the whole
    trace when it was already read in this process."""

    path: str
    format: str | None = None
    mapping: str | None = None
    table: pa.Table | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("table", "kind")} | {
            "table": None}

    def __str__(self) -> str:
        return self.path

    @cached_property
    def kind(self) -> Kind:
        """What lies at the path (`Kind`), looked at once."""
        if self.path == "-":
            return "stream"
        if is_url(self.path) or looks_like_dataset(self.path):
            return "dataset"
        path = Path(self.path)
        if not path.exists():
            return "run" if parts_dir(path).is_dir() else "new"
        if not path.is_dir():
            return "file"
        if path.name.endswith(".parts") or log_files(path):
            return "run"
        return "runs" if any(path.iterdir()) else "empty"

    def partitions(self) -> int:
        """The dataset's partition count, the dataset checked against its dataset file
        (``checked_dataset``), as reading it whole checks it.

        Raises:
            TraceFileError: not a readable dataset, or one changed after it was written.
        """
        return int(checked_dataset(self.path)["partitions"])

    def read(self, partition: int | None = None, *, native: bool = False) -> pa.Table:
        """The whole trace (``partition`` None; the table already read, if any) or one
        partition of a dataset, as ``read_spans`` reads it (``native``: its ids as bytes
        where the files hold them so, for the analysis).

        Raises:
            TraceFileError, ValueError: as ``read_spans``.
        """
        from ttft.collectors.reader import read_spans

        if partition is None and self.table is not None:
            return self.table if native else to_v1(self.table)
        return read_spans(self.path, format=self.format, mapping=self.mapping,
                          partition=partition, native=native)

    def stored_spans(self) -> int | None:
        """The spans a trace file or directory of runs holds, from its Parquet footers
        (`ttft.collectors.layout.stored_spans`); None for another kind or format, or a run
        being written."""
        if self.kind not in ("file", "run", "runs") or self.format not in (None, "ttft"):
            return None
        return stored_spans(self.path)

    # --- appending ---------------------------------------------------------------------

    @property
    def staging(self) -> Path:
        """Where runs appended to a dataset wait to be partitioned in."""
        return staging_path(Path(self.path))

    def staged_runs(self) -> list[Path]:
        """The runs appended to a dataset and not partitioned in yet (a collect killed or
        still running): not in what ``read`` returns."""
        if self.kind != "dataset" or is_url(self.path) or not self.staging.is_dir():
            return []
        return sorted(child for child in self.staging.iterdir()
                      if not child.name.startswith("."))

    def appendable(self, partitions: int | None = None) -> None:
        """Check that a new run may be appended here: with ``partitions`` None, a new or
        empty directory or a directory of runs; else a new or empty directory, or a dataset
        of ``partitions`` whose directory holds nothing that is not the dataset's (merging
        swaps the whole directory: anything else would be lost).

        Raises:
            ValueError: the message says what the location is and what to do.
        """
        kind, path = self.kind, self.path
        if partitions is None:
            if kind == "dataset":
                n = self._dataset_partitions() if is_dataset(path) else "N"
                raise ValueError(
                    f"{path}: a partitioned dataset; collect into it with --partitions {n} "
                    "(spans are staged in it and partitioned in at the stop), or into "
                    "another directory")
            if kind in ("file", "stream"):
                raise ValueError(f"{path}: not a directory")
            return
        if kind in ("new", "empty"):
            return
        staged_only = not is_dataset(path) and all(  # a first collect --partitions killed
            child.name == STAGING_DIR for child in Path(path).iterdir())
        if kind != "dataset" or is_url(path) or not (is_dataset(path) or staged_only):
            raise ValueError(f"{path}: neither a ttft dataset nor empty; collect a dataset into "
                             "a new or empty directory, or one an earlier collect "
                             "--partitions wrote")
        if is_dataset(path) and (have := self._dataset_partitions()) != partitions:
            raise ValueError(f"{path}: a dataset of {have} partitions, not {partitions}; "
                             f"collect into it with --partitions {have}, or into a new "
                             "directory")
        foreign = sorted(child.name for child in Path(path).iterdir()
                         if child.name not in (DATASET_FILE, STAGING_DIR)
                         and not _DATASET_ENTRY.fullmatch(child.name))
        if foreign:
            raise ValueError(f"{path}: holds {', '.join(foreign[:3])}"
                             f"{' and more' if len(foreign) > 3 else ''}, which is not part "
                             "of the dataset and would be lost when the new dataset is "
                             "swapped in; move it out first")

    def writer(self, *, staged: bool = False, **options: Any) -> TraceWriter:
        """A `TraceWriter` of a new run appended here (``options`` are its own): a new
        file in a directory of runs (created if missing), or, ``staged``, a run staged in
        a dataset (new or not). Call `appendable` first.

        Raises:
            OSError: the directory cannot be made or written.
        """
        from ttft.collectors.writer import TraceWriter

        directory = self.staging if staged else Path(self.path)
        directory.mkdir(parents=True, exist_ok=True)
        # One file per run, so runs into one directory accumulate and `read` reads them all;
        # never the name of an earlier run (two in one second would replace it).
        stem = f"collect-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
        path, n = directory / f"{stem}.parquet", 1
        while path.exists() or parts_dir(path).exists():
            n += 1
            path = directory / f"{stem}-{n}.parquet"
        return TraceWriter(path, **options)

    def _dataset_partitions(self) -> int:
        return int(dataset_info(self.path)["partitions"])

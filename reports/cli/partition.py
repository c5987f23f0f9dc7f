"""``ttft partition``: split traces into a partitioned dataset whose partitions keep each
request whole (``ttft.collectors.dataset``), for one task per partition."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, load_trace, progress
from ttft.reports.cli._options import FormatOption, MappingOption

if TYPE_CHECKING:
    import numpy as np


def _refuse_nonempty(out: str) -> None:
    """Exit before reading anything when the local ``out`` is a file or a non-empty
    directory (``write_dataset`` checks a URL itself)."""
    from ttft.collectors.dataset import is_url

    target = Path(out)
    if is_url(out) or not target.exists():
        return
    if not target.is_dir() or any(target.iterdir()):
        raise fail(f"{out}: exists and is not an empty directory; write the dataset to a new "
                   "or empty directory")


@app.command("partition")
def partition(
    traces: Annotated[
        list[Path],
        typer.Argument(metavar="TRACE", help="traces to split, in any format ttft reads; "
                       "all of them go into one dataset"),
    ],
    out: Annotated[
        str,
        typer.Option("-o", "--out", help="dataset directory to write (new or empty); a URL "
                     "such as s3://bucket/path is written through fsspec"),
    ],
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="number of partitions"),
    ],
    format: FormatOption = None,
    mapping: MappingOption = None,
) -> None:
    """Split traces into a partitioned dataset (hive-style part=K/ directories of ttft
    Parquet files and a _ttft_dataset.json): every request is owned by one partition, with
    its client and server traces, and the engine step traces it ran in are copied into its
    partition, so each partition is analysed alone. ttft analyze, report, compare and
    export read a dataset as one trace."""
    import pyarrow as pa

    from ttft.analysis.partition import partition_rows
    from ttft.collectors import TraceFileError, write_dataset

    _refuse_nonempty(out)
    tables, first = [], None
    for trace in traces:
        table, metadata = load_trace(trace, format=format, mapping=mapping)
        tables.append(table)
        first = metadata if first is None else first
    metadata = {**(first or {}), "inputs": [str(trace) for trace in traces]}
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    with progress(f"partitioning {table.num_rows:,} spans"):
        rows = partition_rows(table, partitions)
    try:
        with progress(f"writing {out}"):
            write_dataset(out, table, rows.owner, rows.copy_rows, rows.copy_partitions,
                          partitions, rows.key, metadata)
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: cannot write ({exc.strerror or exc})") from None
    copies = len(rows.copy_rows)
    largest = int((_counts(rows.owner, partitions)
                   + _counts(rows.copy_partitions, partitions)).max())
    share = 100 * copies / table.num_rows if table.num_rows else 0.0
    err.print(plain(
        f"wrote {out}: {partitions:,} partitions, {rows.requests:,} requests, "
        f"{table.num_rows:,} spans (+{copies:,} copied step rows, {share:.1f}%), "
        f"largest partition {largest:,} spans"), soft_wrap=True)


def _counts(partition_of: np.ndarray, partitions: int) -> np.ndarray:
    """How many entries of ``partition_of`` name each partition 0..partitions-1."""
    import numpy as np

    return np.bincount(np.asarray(partition_of, dtype=np.int64), minlength=partitions)

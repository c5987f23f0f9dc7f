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
    from ttft.reports.runs.partitioned import Written


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

    from ttft.collectors import TraceFileError
    from ttft.reports.runs.partitioned import write_partitioned

    _refuse_nonempty(out)
    tables, first, missing = [], None, []
    for trace in traces:
        table, metadata = load_trace(trace, format=format, mapping=mapping)
        tables.append(table)
        first = metadata if first is None else first
        missing += (metadata or {}).get("query_errors", [])  # what any input could not find
    metadata = {**(first or {}), "inputs": [str(trace) for trace in traces]}
    if missing:
        metadata["query_errors"] = missing
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    try:
        written = write_partitioned(out, table, partitions, metadata, progress)
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: cannot write ({exc.strerror or exc})") from None
    err.print(plain(describe_written(written)), soft_wrap=True)


def describe_written(written: Written) -> str:
    """The line saying what a dataset write wrote (``ttft partition``, ``ttft collect
    --partitions``)."""
    share = 100 * written.copies / written.spans if written.spans else 0.0
    return (f"wrote {written.out}: {written.partitions:,} partitions, {written.requests:,} "
            f"requests, {written.spans:,} spans (+{written.copies:,} copied step rows, "
            f"{share:.1f}%), largest partition {written.largest:,} spans")

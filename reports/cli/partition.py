"""``ttft partition``: split traces into a partitioned dataset whose partitions keep each
request whole (``ttft.collectors.dataset``), for one task per partition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ttft.reports._text import plain
from ttft.reports.cli._app import app, err, fail, load_trace, progress
from ttft.reports.cli._options import FormatOption, MappingOption
from ttft.tracer.schema import COUNTED, SKIPPED, counted_sums

if TYPE_CHECKING:
    from ttft.reports.runs.partitioned import Written


def _refuse_nonempty(out: str) -> None:
    """Exit before reading anything when ``out`` is not new or an empty directory (a URL
    is checked by ``write_dataset`` itself)."""
    from ttft.collectors import TraceLocation
    from ttft.collectors.dataset import is_url

    if not is_url(out) and TraceLocation(out).kind not in ("new", "empty"):
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
    export read a dataset as one trace. Local ttft traces and datasets are read twice, a
    batch at a time, in memory that grows with their traces, not their spans; other
    formats, streams and traces holding spans the stage mapping maps are read whole."""
    import pyarrow as pa

    from ttft.collectors import TraceFileError
    from ttft.reports.runs.partitioned import write_partitioned

    _refuse_nonempty(out)
    written = _streamed(traces, out, partitions, format, mapping)
    if written is not None:
        err.print(plain(describe_written(written)), soft_wrap=True)
        return
    tables, runs = [], []
    for trace in traces:
        table, metadata = load_trace(trace, format=format, mapping=mapping)
        tables.append(table)
        runs.append((str(trace), metadata or {}))
    metadata = merged_metadata(runs)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    try:
        written = write_partitioned(out, table, partitions, metadata, progress)
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: cannot write ({exc.strerror or exc})") from None
    err.print(plain(describe_written(written)), soft_wrap=True)


def _streamed(traces: list[Path], out: str, partitions: int, format: str | None,
              mapping: Path | None) -> Written | None:
    """The dataset written a batch at a time, in memory bounded by the traces' count
    (``reports.runs.partitioned.stream_partitioned``), when every input is a local ttft
    trace and the stage mapping leaves its spans as they are; None (nothing written) when
    the inputs must be read whole."""
    from ttft.analysis.transfer import deployment_note
    from ttft.collectors import TraceFileError
    from ttft.reports.cli._app import describe_inputs, note_staged
    from ttft.reports.runs.partitioned import NotStreamed, source_of, stream_partitioned

    try:
        sources = [source_of(trace, format) for trace in traces]
        if any(source is None for source in sources):
            return None
        rules = None
        if mapping is not None:
            from ttft.collectors.importers.mapping import load_mapping

            rules = load_mapping(mapping)
        metadata = merged_metadata([(str(t), s.metadata) for t, s in zip(traces, sources,
                                                                           strict=True)])
        written = stream_partitioned(out, sources, partitions, metadata, progress, rules)
    except NotStreamed as exc:
        err.print(plain(f"{exc}: reading the traces whole"), soft_wrap=True)
        return None
    except (TraceFileError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.filename or out}: cannot write ({exc.strerror or exc})") from None
    for trace, source in zip(traces, sources, strict=True):  # as `load_trace` says them
        note_staged(trace)
        if source.inputs is not None:
            err.print(plain(describe_inputs(trace, source.inputs)), soft_wrap=True)
        if (note := deployment_note(source.metadata)) is not None:
            err.print(plain(note), soft_wrap=True)
    return written


def merged_metadata(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The run metadata of the inputs ``(name, metadata)`` of one dataset.

    A key every input gives one value (the same JSON) keeps it. A key the inputs disagree
    on, or that only some give, is kept per input under ``differs`` (``{key: {input:
    value}}``) and not at the top: one input's device or model standing for all would price
    every request by it. An input's own ``differs`` (a dataset partitioned again) is carried
    forward under the names it holds, and its keys are never taken as agreed. Inputs of one
    name are told apart by a ``#N`` suffix. The defects counted in metadata (``rejected``,
    ``estimated``) are summed, with the smallest distinct examples; ``skipped_events`` are
    summed per event; ``query_errors`` (what any input could not find) are joined;
    ``inputs`` names the inputs."""
    runs = list(zip(_unique_names([name for name, _ in runs]), (m for _, m in runs),
                    strict=True))
    merged: dict[str, Any] = {}
    differs: dict[str, dict[str, Any]] = {}
    for _, meta in runs:
        earlier = meta.get("differs")
        for key, per in (earlier.items() if isinstance(earlier, dict) else ()):
            if isinstance(per, dict):
                differs.setdefault(key, {}).update(per)
    special = {*COUNTED, SKIPPED, "query_errors", "inputs", "differs"}
    for key in dict.fromkeys(k for _, meta in runs for k in meta if k not in special):
        values = [_canonical(meta[key]) if key in meta else None for _, meta in runs]
        if key not in differs and all(v is not None and v == values[0] for v in values):
            merged[key] = runs[0][1][key]
        else:
            differs.setdefault(key, {}).update(
                {name: meta[key] for name, meta in runs if key in meta})
    merged.update(counted_sums(meta for _, meta in runs))
    missing = [e for _, meta in runs if isinstance(meta.get("query_errors"), list)
               for e in meta["query_errors"]]
    if missing:
        merged["query_errors"] = missing
    if differs:
        merged["differs"] = differs
    merged["inputs"] = [name for name, _ in runs]
    return merged


def _canonical(value: Any) -> str:
    """A value as the JSON it is stored as, so agreement is JSON's: ``NaN`` agrees with
    itself, ``true`` is not ``1``, key order does not count."""
    return json.dumps(value, sort_keys=True, default=str)


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def describe_written(written: Written) -> str:
    """The line saying what a dataset write wrote (``ttft partition``, ``ttft collect
    --partitions``)."""
    share = 100 * written.copies / written.spans if written.spans else 0.0
    return (f"wrote {written.out}: {written.partitions:,} partitions, {written.requests:,} "
            f"requests, {written.spans:,} spans (+{written.copies:,} copied step rows, "
            f"{share:.1f}%), largest partition {written.largest:,} spans")

"""Reading ttft's own Parquet traces, checking what is read: the footer's run metadata and
schema version, the columns, every batch's data (docs/design.md, "The span record").

This is the ``ttft`` format's implementation; commands and library code read every format,
this one included, through :func:`ttft.collectors.read_spans`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ttft.collectors._log import LogError, read_log
from ttft.collectors._spans import Fail, conform
from ttft.collectors.errors import MAX_DECOMPRESSED_BYTES, MAX_PARQUET_RATIO, TraceFileError
from ttft.collectors.layout import Run, refreshed, trace_runs
from ttft.tracer.schema import (
    COLUMNS,
    INPUTS_KEY,
    METADATA_KEY,
    SCHEMA_VERSION,
    SPAN_SCHEMA,
    newest_run_metadata,
)
from ttft.tracer.span_ids import same_layout, to_v1

__all__ = ["iter_batches", "read_parquet", "read_parquet_metadata", "trace_files"]


def trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files of a trace, in order: ``path`` itself, the parts of a parts
    directory, or every run's files in a directory of runs (see :func:`trace_runs`; log
    segments are not files of this list).

    Raises:
        TraceFileError: nothing to read at ``path``.
    """
    return [part for run in trace_runs(path) for part in run.parts]


_AS_DICTIONARY = ["name"]
"""String columns read as Arrow dictionaries (what their pages hold; ``conform`` then decodes
them to the schema's type): a span name is one of a few dozen values, and Parquet's own
dictionary read as one, then decoded, took 0.30 s in place of 0.76 s for 23.8M rows."""


def _parquet_file(file: Path, **options: Any) -> pq.ParquetFile:
    """``pq.ParquetFile(file, **options)``, an unreadable file as `TraceFileError` (a
    vanished one as `FileNotFoundError`, which a reader of a live run looks at again)."""
    try:
        return pq.ParquetFile(file, **options)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:  # a torn footer: UnicodeDecodeError
        raise TraceFileError(file, f"not a readable Parquet file ({exc})") from exc


def _open_checked(file: Path) -> tuple[pq.ParquetFile, bytes]:
    """Open one trace file and check its footer: ttft metadata, version and columns."""
    source = _parquet_file(file)
    try:
        try:
            raw = (source.metadata.metadata or {}).get(METADATA_KEY)
            names = source.schema_arrow.names
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise TraceFileError(file, f"not a readable Parquet file ({exc})") from exc
        if raw is None:
            raise TraceFileError(file, f"no ttft run metadata (key-value key "
                                       f"{METADATA_KEY.decode()!r}); not a ttft trace")
        try:
            metadata = json.loads(raw)
        except ValueError as exc:
            raise TraceFileError(file, f"run metadata is not valid JSON ({exc})") from exc
        version = metadata.get("schema_version") if isinstance(metadata, dict) else None
        if not isinstance(version, int) or isinstance(version, bool):
            raise TraceFileError(file, "run metadata has no integer schema_version")
        if version > SCHEMA_VERSION:
            raise TraceFileError(file, f"schema_version {version} is newer than this ttft "
                                       f"supports ({SCHEMA_VERSION}); upgrade ttft")
        missing = [name for name in COLUMNS if name not in names]
        if missing:
            raise TraceFileError(file, f"missing column(s): {', '.join(missing)}")
        # Its columns known to be there, read again with those of them that hold strings
        # as dictionaries (the footer as parsed: not read twice).
        schema = source.schema_arrow
        wanted = [c for c in _AS_DICTIONARY if pa.types.is_string(schema.field(c).type)]
        if not wanted:
            return source, raw
        reading = _parquet_file(file, metadata=source.metadata, read_dictionary=wanted)
    except BaseException:
        source.close()
        raise
    source.close()
    return reading, raw


def _file_fail(file: Path, row_offset: int = 0) -> Fail:
    def fail(reason: str, row: int | None = None, field: str | None = None) -> Exception:
        return TraceFileError(file, reason, row=None if row is None else row + row_offset,
                              field=field)

    return fail


class _Budget:
    """Bytes decoded so far against `MAX_DECOMPRESSED_BYTES` and `MAX_PARQUET_RATIO`."""

    def __init__(self) -> None:
        self.disk_bytes = 0
        self.decoded_bytes = 0

    def decoded(self, file: Path, nbytes: int) -> None:
        self.decoded_bytes += nbytes
        if (self.decoded_bytes > MAX_DECOMPRESSED_BYTES
                and self.decoded_bytes > MAX_PARQUET_RATIO * self.disk_bytes):
            raise TraceFileError(file, f"decodes to more than {MAX_DECOMPRESSED_BYTES} bytes, "
                                       f"over {MAX_PARQUET_RATIO} times its size on disk (the "
                                       "limits MAX_DECOMPRESSED_BYTES, MAX_PARQUET_RATIO)")


_ATTEMPTS = 3  # looks at a run whose files keep vanishing under a live writer

READ_BATCH_BYTES = 128 << 20
"""About the most a batch decodes to when a whole trace is read (`read_parquet`, `_batches`):
a trace's spans decode to about 100 bytes each, so its 1M-row groups are read whole."""


def _read_tables(path: str | os.PathLike[str], batch_rows: int, inputs: list[dict] | None = None,
                 runs: list[bytes] | None = None, batch_bytes: int | None = None
                 ) -> Iterator[tuple[pa.Table, bytes]]:
    """Checked tables of a trace, each with its file's raw run metadata (an empty table for
    a file without rows). A bad row is reported by its number within its file. With
    ``inputs``, one entry per run read is appended to it (see :func:`read_parquet`); with
    ``runs``, each run's raw metadata (its newest); ``batch_rows`` and ``batch_bytes`` as
    `_batches` takes them.

    A finished run is read lazily; an unfinished one (a live or killed writer's parts and
    log) whole, and looked at again if a file vanishes meanwhile (its part was written, or
    the run merged), so no row is read twice or missed."""
    budget = _Budget()
    for run in trace_runs(path):
        if run.finished:
            count = 0
            try:
                for table, raw in _file_tables(run.parts[0], batch_rows, budget, batch_bytes):
                    count += table.num_rows
                    yield table, raw
            except FileNotFoundError:
                raise TraceFileError(run.parts[0], "vanished while being read") from None
            if inputs is not None:
                inputs.append({"path": str(run.path), "state": "finished", "spans": count})
            if runs is not None:
                runs.append(raw)
            continue
        for attempt in range(_ATTEMPTS):
            try:
                tables, described = _unfinished_tables(run, batch_rows, budget)
                break
            except FileNotFoundError:
                if attempt == _ATTEMPTS - 1:
                    raise TraceFileError(run.path, "its files kept changing while being "
                                                   "read; try again") from None
                run = refreshed(run)
        if inputs is not None:
            inputs.append(described)
        if runs is not None and tables:
            runs.append(tables[-1][1])
        yield from tables


def _unfinished_tables(run: Run, batch_rows: int, budget: _Budget
                       ) -> tuple[list[tuple[pa.Table, bytes]], dict[str, Any]]:
    if run.finished:  # it was merged while being looked at
        tables = list(_file_tables(run.parts[0], batch_rows, budget))
        return tables, {"path": str(run.path), "state": "finished",
                        "spans": sum(t.num_rows for t, _ in tables)}
    tables = [item for part in run.parts for item in _file_tables(part, batch_rows, budget)]
    records = torn = 0
    for segment in run.logs:
        try:
            contents = read_log(segment)
        except LogError as exc:
            raise TraceFileError(segment, str(exc)) from None
        if not contents.metadata:  # its header never whole (a full disk): nothing in it
            torn += contents.torn_bytes
            continue
        budget.disk_bytes += segment.stat().st_size
        fail = _file_fail(segment)
        table = conform(contents.table, fail, extra_ok=True, check_rows=False)
        budget.decoded(segment, table.nbytes)
        raw = json.dumps(contents.metadata, sort_keys=True).encode()
        tables.append((table, raw))
        records += contents.records
        torn += contents.torn_bytes
    if not tables:  # an unfinished run with nothing written yet
        tables.append((SPAN_SCHEMA.empty_table(), json.dumps(
            {"schema_version": SCHEMA_VERSION}).encode()))
    return tables, {"path": str(run.path), "state": "unfinished", "parts": len(run.parts),
                    "log_segments": len(run.logs), "log_records": records,
                    "torn_bytes": torn, "spans": sum(t.num_rows for t, _ in tables)}


def _file_tables(file: Path, batch_rows: int, budget: _Budget, batch_bytes: int | None = None
                 ) -> Iterator[tuple[pa.Table, bytes]]:
    source, raw = _open_checked(file)
    budget.disk_bytes += file.stat().st_size
    with source:
        batches = _batches(source, batch_rows, batch_bytes)
        offset = 0
        while True:
            try:
                batch = next(batches, None)
                if batch is not None:
                    # Out-of-range dictionary indices or bad UTF-8 would otherwise reach
                    # the analysis as IndexError (about 0.1 s per million rows).
                    batch.validate(full=True)
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise TraceFileError(file, f"corrupt Parquet data ({exc})") from exc
            if batch is None:
                if offset == 0:
                    yield SPAN_SCHEMA.empty_table(), raw
                break
            table = conform(pa.Table.from_batches([batch]), _file_fail(file, offset),
                            extra_ok=True, check_rows=False)
            budget.decoded(file, table.nbytes)
            yield table, raw
            offset += batch.num_rows


def _batches(source: pq.ParquetFile, batch_rows: int, batch_bytes: int | None = None
             ) -> Iterator[pa.RecordBatch]:
    """A file's batches of ``batch_rows`` rows, one row group's reader at a time: one reader
    over the whole file held 573 MB of Arrow memory by the end of a 23.8M-row file of
    1M-row groups, against 70-84 MB read group by group (the most one group needs).

    With ``batch_bytes``, a row group after the first is read in batches of as many rows
    as ``batch_bytes`` hold at the bytes a row decoded to so far (never fewer than
    ``batch_rows``): a whole table read at once (`read_parquet`) is read in a few large
    batches (23.8M spans: 38 batches, not 364; 0.7–1.1 s less), while a file whose rows decode
    large (a compression bomb) is still read, and refused, a small batch at a time."""
    rows, decoded, seen = batch_rows, 0, 0
    for group in range(source.metadata.num_row_groups):
        for batch in source.iter_batches(batch_size=rows, row_groups=[group],
                                         columns=list(COLUMNS)):
            decoded, seen = decoded + batch.nbytes, seen + batch.num_rows
            yield batch
        if batch_bytes is not None and seen:
            rows = max(batch_rows, batch_bytes * seen // max(decoded, 1))


def _newest_with_counts(runs: list[bytes]) -> bytes:
    """`newest_run_metadata` of raw run metadata (one that is not a JSON object: empty)."""
    parsed = []
    for raw in runs:
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError):
            meta = {}
        parsed.append(meta if isinstance(meta, dict) else {})
    return json.dumps(newest_run_metadata(parsed)).encode()


def read_parquet(path: str | os.PathLike[str]) -> pa.Table:
    """Read a whole trace (a file or a directory of parts) into one table.

    Returns:
        A table with exactly SPAN_SCHEMA, or SPAN_SCHEMA_V2 when every file holding rows
        has its ids as bytes (``tracer.span_ids.same_layout``), whose schema metadata holds
        the run metadata under
        METADATA_KEY (for a directory, that of its last part or log, the most recent, with
        the defects every run counted summed: `_newest_with_counts`). For a
        directory or an unfinished run, the schema metadata's ``INPUTS_KEY`` says what was
        read (:func:`ttft.collectors.reader.read_inputs`): a JSON list, per run
        its ``path``, ``state`` (``finished``, or ``unfinished``: a writer still writing it
        or killed), ``spans``, and for an unfinished run its ``parts``, ``log_segments``,
        ``log_records`` and ``torn_bytes`` (a last record not yet whole, left out).

    Raises:
        TraceFileError: the path is missing, a file is not Parquet or is corrupt, lacks the
            ttft metadata or a column, has a newer schema_version, or holds a bad row; or
            its data decodes beyond `MAX_DECOMPRESSED_BYTES` at more than
            `MAX_PARQUET_RATIO` times its size on disk (a compression bomb).
    """
    inputs: list[dict[str, Any]] = []
    runs: list[bytes] = []
    read = list(_read_tables(path, batch_rows=65_536, inputs=inputs, runs=runs,
                             batch_bytes=READ_BATCH_BYTES))
    table = pa.concat_tables(same_layout([table for table, _ in read]))
    metadata = {METADATA_KEY: _newest_with_counts(runs) if len(runs) > 1 else read[-1][1]}
    if Path(path).is_dir() or not inputs[0]["state"] == "finished":
        metadata[INPUTS_KEY] = json.dumps(inputs).encode()
    return table.replace_schema_metadata(metadata)


def iter_batches(path: str | os.PathLike[str], *, batch_rows: int = 65_536,
                 inputs: list[dict[str, Any]] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield a trace's rows lazily as batches with exactly SPAN_SCHEMA, each carrying its
    file's run metadata; with ``inputs``, one entry per run read is appended to it as
    :func:`read_parquet` lists them. Raises as :func:`read_parquet` does, on reaching the
    bad file or row."""
    for table, raw in _read_tables(path, batch_rows, inputs):
        yield from to_v1(table).replace_schema_metadata({METADATA_KEY: raw}).to_batches()


def read_parquet_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The run metadata of a trace without reading its rows: the file's footer; for a
    directory, what :func:`read_parquet` gives (the newest run's, with the defects every
    run counted summed).

    Raises:
        TraceFileError: as :func:`read_parquet`, for the file whose footer is read.
    """
    runs = [_run_metadata(run) for run in trace_runs(path)]
    raw = _newest_with_counts(runs) if len(runs) > 1 else runs[-1]
    metadata: dict[str, Any] = json.loads(raw)
    return metadata


def _run_metadata(run: Run) -> bytes:
    """One run's raw metadata as `read_parquet` takes it: its last log segment's, else its
    last part's."""
    for segment in reversed(run.logs):  # the newest segment whose header is whole
        try:
            metadata = read_log(segment).metadata
        except LogError as exc:
            raise TraceFileError(segment, str(exc)) from None
        if metadata:
            return json.dumps(metadata, sort_keys=True).encode()
    if not run.parts:
        return json.dumps({"schema_version": SCHEMA_VERSION}).encode()
    source, raw = _open_checked(run.parts[-1])
    source.close()
    return raw

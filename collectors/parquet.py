"""Reading ttft's own Parquet traces, checking what is read: the footer's run metadata and
schema version, the columns, every batch's data (DESIGN.md, "The span record").

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

from ttft.collectors._files import part_files, parts_dir
from ttft.collectors._spans import Fail, conform
from ttft.collectors.errors import MAX_DECOMPRESSED_BYTES, MAX_PARQUET_RATIO, TraceFileError
from ttft.tracer.schema import COLUMNS, METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

__all__ = ["iter_batches", "read_parquet", "read_parquet_metadata", "trace_files"]


def trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """The Parquet files of a trace, in order: ``path`` itself, or the parts of a directory
    (dot- and underscore-files skipped). A missing ``path`` whose ``<path>.parts`` exists (a
    writer that did not close) reads as that directory.

    Raises:
        TraceFileError: nothing to read at ``path``.
    """
    target = Path(path)
    if not target.exists():
        if not parts_dir(target).is_dir():
            raise TraceFileError(target, "does not exist")
        target = parts_dir(target)
    if not target.is_dir():
        return [target]
    files = part_files(target)
    if not files:
        raise TraceFileError(target, "directory holds no Parquet part files")
    return files


def _open_checked(file: Path) -> tuple[pq.ParquetFile, bytes]:
    """Open one trace file and check its footer: ttft metadata, version and columns."""
    try:
        source = pq.ParquetFile(file)
    except (pa.ArrowException, OSError, ValueError) as exc:  # a torn footer: UnicodeDecodeError
        raise TraceFileError(file, f"not a readable Parquet file ({exc})") from exc
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
    except BaseException:
        source.close()
        raise
    return source, raw


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


def _read_tables(path: str | os.PathLike[str], batch_rows: int
                 ) -> Iterator[tuple[pa.Table, bytes]]:
    """Checked tables of a trace, each with its file's raw run metadata (an empty table for
    a file without rows). A bad row is reported by its number within its file."""
    budget = _Budget()
    for file in trace_files(path):
        source, raw = _open_checked(file)
        budget.disk_bytes += file.stat().st_size
        with source:
            batches = source.iter_batches(batch_size=batch_rows, columns=list(COLUMNS))
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


def read_parquet(path: str | os.PathLike[str]) -> pa.Table:
    """Read a whole trace (a file or a directory of parts) into one table.

    Returns:
        A table with exactly SPAN_SCHEMA whose schema metadata holds the run metadata under
        METADATA_KEY (for a directory, that of its last part, the most recent).

    Raises:
        TraceFileError: the path is missing, a file is not Parquet or is corrupt, lacks the
            ttft metadata or a column, has a newer schema_version, or holds a bad row; or
            its data decodes beyond `MAX_DECOMPRESSED_BYTES` at more than
            `MAX_PARQUET_RATIO` times its size on disk (a compression bomb).
    """
    read = list(_read_tables(path, batch_rows=65_536))
    table = pa.concat_tables([table for table, _ in read])
    return table.replace_schema_metadata({METADATA_KEY: read[-1][1]})


def iter_batches(path: str | os.PathLike[str], *, batch_rows: int = 65_536
                 ) -> Iterator[pa.RecordBatch]:
    """Yield a trace's rows lazily as batches with exactly SPAN_SCHEMA, each carrying its
    file's run metadata. Raises as :func:`read_parquet` does, on reaching the bad file or row."""
    for table, raw in _read_tables(path, batch_rows):
        yield from table.replace_schema_metadata({METADATA_KEY: raw}).to_batches()


def read_parquet_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The run metadata of a trace: the file's footer, or a directory's last part.

    Raises:
        TraceFileError: as :func:`read_parquet`, for the file whose footer is read.
    """
    source, raw = _open_checked(trace_files(path)[-1])
    source.close()
    metadata: dict[str, Any] = json.loads(raw)
    return metadata

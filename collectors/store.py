"""Trace files: a crash-safe Parquet span writer and a reader that checks what it reads.

A trace is one zstd Parquet file with ``SPAN_SCHEMA``, or a directory ``<path>.parts`` of
such files (one per flush); every file carries the run metadata as a JSON object under the
key-value metadata key ``METADATA_KEY`` (DESIGN.md, "The span record").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ttft.collectors._spans import Fail, conform, location, to_span_table
from ttft.tracer.schema import COLUMNS, METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA

__all__ = [
    "PARTS_SUFFIX", "TraceFileError", "TraceWriter", "iter_batches", "parts_dir",
    "read_metadata", "read_trace", "to_span_table", "trace_files", "write_trace",
]

logger = logging.getLogger(__name__)

PARTS_SUFFIX = ".parts"
"""A writer's part files live in ``<path>.parts/`` until they are merged into ``<path>``."""

_WRITE_OPTIONS: dict = {
    # Measured by benchmarks/storage.py (about 24 B/span on synthetic traces, from 31 with
    # zstd alone; rows grouped by trace, `_by_trace`): dictionaries for the columns that
    # repeat (parents have several children), random span ids as length-prefixed runs zstd
    # packs to their 8 bytes of entropy, times as deltas (rows of a trace are close in time).
    "compression": "zstd",
    "dictionary_pagesize_limit": 64 << 20,  # past 1 MiB (20k traces) pyarrow drops to plain
    "use_dictionary": ["trace_id", "parent_id", "request_id", "name", "stage", "clock", "service"],
    "column_encoding": {
        "span_id": "DELTA_LENGTH_BYTE_ARRAY",
        "start_ns": "DELTA_BINARY_PACKED",
        "end_ns": "DELTA_BINARY_PACKED",
        "attributes": "DELTA_BYTE_ARRAY",
    },
}
_PART_RE = re.compile(r"^part-(\d+)\.parquet$")


class TraceFileError(ValueError):
    """A file that cannot be read as a ttft trace. The message names the file.

    Attributes:
        path: the offending file or directory.
        reason: what is wrong, without the location.
        row: 0-based row within ``path`` at fault, or ``None``.
        field: the column at fault, or ``None``.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str, *, row: int | None = None,
                 field: str | None = None) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        self.row = row
        self.field = field
        super().__init__(f"{self.path}{location(row, field)}: {reason}")


def parts_dir(path: str | os.PathLike[str]) -> Path:
    """The directory where a writer of ``path`` keeps its part files."""
    return Path(os.fspath(path) + PARTS_SUFFIX)


def _part_key(name: str) -> tuple[int, int, str]:
    match = _PART_RE.match(name)
    return (0, int(match.group(1)), name) if match else (1, 0, name)


def _part_files(directory: Path) -> list[Path]:
    """Visible ``*.parquet`` files of ``directory`` in part order; temp dot-files excluded."""
    if not directory.is_dir():
        return []
    names = [
        entry.name for entry in os.scandir(directory)
        if entry.is_file() and entry.name.endswith(".parquet")
        and not entry.name.startswith((".", "_"))
    ]
    return [directory / name for name in sorted(names, key=_part_key)]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(tmp: Path) -> None:
    """Remove a temporary file after a failed write. A failure here (e.g. its directory is
    gone) is ignored, so it never hides why the write failed; readers skip dot-files."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def _by_trace(table: pa.Table) -> pa.Table:
    """The rows of each trace together, traces in order of their first row, rows of a trace
    in their order: a trace's id then repeats in runs and its times are close, which is
    what makes a file small (readers never depend on row order)."""
    if table.num_rows < 2:
        return table
    codes = pc.dictionary_encode(table.column("trace_id")).combine_chunks().indices
    codes = codes.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")  # codes number traces by first appearance
    if (order[1:] > order[:-1]).all():
        return table
    return table.take(order)


def _write_atomic(dest: Path, table: pa.Table, metadata_json: bytes) -> None:
    """Write ``table`` to ``dest`` via a temporary dot-name, so ``dest`` is always whole."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        table = _by_trace(table).replace_schema_metadata({METADATA_KEY: metadata_json})
        pq.write_table(table, tmp, **_WRITE_OPTIONS)
        _fsync(tmp)
        os.replace(tmp, dest)
    except BaseException:
        _discard(tmp)
        raise


def write_trace(
    path: str | os.PathLike[str], table: pa.Table, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write a whole span table as one trace file at once (atomically, via a temporary
    name), with ``metadata`` plus ``schema_version`` as its run metadata.

    Raises:
        ValueError: the table does not fit the span schema (names the row and field).
        TypeError: the metadata cannot be written as JSON.
    """
    dest = Path(path)
    table = to_span_table(table)
    try:
        metadata_json = json.dumps(
            {**(metadata or {}), "schema_version": SCHEMA_VERSION}, sort_keys=True
        ).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata: {exc}") from exc
    _write_atomic(dest, table, metadata_json)
    return dest


class TraceWriter:
    """Buffers spans and writes them as crash-safe zstd Parquet part files.

    Buffered rows become one part ``<path>.parts/part-NNNNN.parquet`` when ``flush_spans``
    rows are buffered or the oldest is ``flush_interval_s`` old (checked on :meth:`append` and
    by a daemon timer thread), and on :meth:`flush` and :meth:`close`. A part is written under
    a temporary dot-name, fsynced and renamed, so a crash loses at most the rows appended
    since the last flush. :meth:`close` merges the parts into ``path`` (replacing any file
    there) unless ``merge_on_close`` is false. Every file carries the run metadata.

    Threading: all methods may be called from any thread. :meth:`append` holds a lock only
    briefly, but writes the part on the calling thread when a flush is due.

    Failure: a failed flush raises to its caller (the timer thread logs instead); the rows
    it held are lost and counted in ``dropped_rows``. Parts already written stay on disk.

    Attributes:
        path: the merged trace file written by :meth:`close`.
        parts_dir: the directory of part files.
        rows_written: rows written to part files so far.
        dropped_rows: rows lost to failed flushes.
    """

    def __init__(self, path: str | os.PathLike[str], *, metadata: Mapping[str, Any] | None = None,
                 flush_spans: int = 50_000, flush_interval_s: float | None = 5.0,
                 merge_on_close: bool = True) -> None:
        """Create the parts directory and start the timer thread.

        Args:
            path: the trace file to produce.
            metadata: run metadata (JSON-serializable values); ``schema_version`` is added.
            flush_spans: flush when this many rows are buffered.
            flush_interval_s: flush when the oldest buffered row is this old; ``None``
                disables time-based flushing (and the timer thread).
            merge_on_close: merge the parts into ``path`` on close; else keep the directory.

        Raises:
            ValueError: a non-positive ``flush_spans`` or ``flush_interval_s``.
            TypeError: a metadata value that is not JSON-serializable.
            FileExistsError: ``<path>.parts`` already holds parts (e.g. of a crashed run).
            OSError: the parts directory cannot be created.
        """
        if flush_spans < 1:
            raise ValueError(f"flush_spans must be >= 1, got {flush_spans}")
        if flush_interval_s is not None and not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0 or None, got {flush_interval_s}")
        self.path = Path(path)
        self.parts_dir = parts_dir(self.path)
        self.merge_on_close = merge_on_close
        self._flush_spans = flush_spans
        self._flush_interval_ns = None if flush_interval_s is None else int(flush_interval_s * 1e9)
        self._metadata: dict[str, Any] = {}
        self._update_metadata(dict(metadata or {}))
        if _part_files(self.parts_dir):
            raise FileExistsError(f"{self.parts_dir}: holds parts of another run; read or "
                                  "remove them first")
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards the buffer, counters and metadata
        self._io_lock = threading.Lock()  # serializes part writes and the merge
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._oldest_ns: int | None = None  # monotonic time of the oldest buffered append
        self._next_part = 0
        self._closed = False
        self.rows_written = 0
        self.dropped_rows = 0
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if self._flush_interval_ns is not None:
            self._timer = threading.Thread(target=self._run_timer, daemon=True,
                                           name=f"ttft-writer:{self.path.name}")
            self._timer.start()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _update_metadata(self, metadata: dict[str, Any]) -> None:
        for key, value in metadata.items():  # fail here, not at the next flush
            try:
                json.dumps({key: value})
            except (TypeError, ValueError) as exc:
                raise TypeError(f"metadata {key!r}: {exc}") from exc
        self._metadata.update(metadata)

    def _metadata_json(self) -> bytes:
        return json.dumps({**self._metadata, "schema_version": SCHEMA_VERSION},
                          sort_keys=True).encode()

    def set_metadata(self, **metadata: Any) -> None:
        """Add or replace run metadata; later parts and the merged file carry it.

        Raises:
            ValueError: the writer is closed.
            TypeError: a value that is not JSON-serializable.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: writer is closed")
            self._update_metadata(metadata)

    def append(self, data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]]) -> None:
        """Buffer spans (see :func:`to_span_table`); flush on this thread if one is due.

        Raises:
            ValueError: the writer is closed, or the data does not fit the span schema.
            OSError: a due flush failed.
        """
        table = to_span_table(data)
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: writer is closed")
            if table.num_rows == 0:
                return
            now_ns = time.monotonic_ns()
            self._buffer.append(table)
            self._buffered_rows += table.num_rows
            if self._oldest_ns is None:
                self._oldest_ns = now_ns
            due = self._buffered_rows >= self._flush_spans or (
                self._flush_interval_ns is not None
                and now_ns - self._oldest_ns >= self._flush_interval_ns
            )
        if due:
            self.flush()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write the buffered rows as one part file now (nothing if none are buffered).

        Args:
            timeout_s: give up if another flush holds the writer longer than this.

        Returns:
            False if the timeout expired before the flush could start, else True.
        """
        if not self._io_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        try:
            self._flush_locked()
        finally:
            self._io_lock.release()
        return True

    def _flush_locked(self) -> None:
        with self._lock:
            if not self._buffer:
                return
            tables, self._buffer = self._buffer, []
            rows, self._buffered_rows, self._oldest_ns = self._buffered_rows, 0, None
            index, self._next_part = self._next_part, self._next_part + 1
            metadata_json = self._metadata_json()
        try:
            table = pa.concat_tables(tables)
            _write_atomic(self.parts_dir / f"part-{index:05d}.parquet", table, metadata_json)
        except BaseException:
            with self._lock:
                self.dropped_rows += rows
            raise
        with self._lock:
            self.rows_written += rows

    def _run_timer(self) -> None:
        interval_ns = self._flush_interval_ns
        assert interval_ns is not None
        while not self._stop.is_set():
            with self._lock:
                oldest_ns = self._oldest_ns
            now_ns = time.monotonic_ns()
            if oldest_ns is not None and now_ns - oldest_ns >= interval_ns:
                try:
                    self.flush()
                except Exception:
                    logger.exception("%s: timed flush failed", self.path)
                continue
            wait_ns = interval_ns if oldest_ns is None else oldest_ns + interval_ns - now_ns
            self._stop.wait(wait_ns / 1e9)

    def close(self) -> None:
        """Flush, stop the timer and, if ``merge_on_close``, merge the parts into ``path``.

        Idempotent. A writer that never got a row still leaves a valid, empty trace. The
        merge streams the parts row group by row group into a temporary file that is then
        renamed to ``path``; the parts directory is removed only after that succeeded.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join()
        with self._io_lock:
            self._flush_locked()
            if not _part_files(self.parts_dir):
                part = self.parts_dir / f"part-{self._next_part:05d}.parquet"
                _write_atomic(part, SPAN_SCHEMA.empty_table(), self._metadata_json())
            if self.merge_on_close:
                self._merge_locked()

    def _merge_locked(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        schema = SPAN_SCHEMA.with_metadata({METADATA_KEY: self._metadata_json()})
        try:
            with pq.ParquetWriter(tmp, schema, **_WRITE_OPTIONS) as sink:
                for part in _part_files(self.parts_dir):
                    with pq.ParquetFile(part) as source:
                        for group in range(source.num_row_groups):
                            table = source.read_row_group(group)
                            sink.write_table(table.replace_schema_metadata(None))
            _fsync(tmp)
            os.replace(tmp, self.path)
        except BaseException:
            _discard(tmp)
            raise
        shutil.rmtree(self.parts_dir)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
    files = _part_files(target)
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


def _read_tables(path: str | os.PathLike[str], batch_rows: int
                 ) -> Iterator[tuple[pa.Table, bytes]]:
    """Checked tables of a trace, each with its file's raw run metadata (an empty table for
    a file without rows). A bad row is reported by its number within its file."""
    for file in trace_files(path):
        source, raw = _open_checked(file)
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
                table = pa.Table.from_batches([batch])
                yield conform(table, _file_fail(file, offset), extra_ok=True, check_rows=False), raw
                offset += batch.num_rows


def read_trace(path: str | os.PathLike[str]) -> pa.Table:
    """Read a whole trace (a file or a directory of parts) into one table.

    Returns:
        A table with exactly SPAN_SCHEMA whose schema metadata holds the run metadata under
        METADATA_KEY (for a directory, that of its last part, the most recent).

    Raises:
        TraceFileError: the path is missing, a file is not Parquet or is corrupt, lacks the
            ttft metadata or a column, has a newer schema_version, or holds a bad row.
    """
    read = list(_read_tables(path, batch_rows=1 << 20))
    table = pa.concat_tables([table for table, _ in read])
    return table.replace_schema_metadata({METADATA_KEY: read[-1][1]})


def iter_batches(path: str | os.PathLike[str], *, batch_rows: int = 65_536
                 ) -> Iterator[pa.RecordBatch]:
    """Yield a trace's rows lazily as batches with exactly SPAN_SCHEMA, each carrying its
    file's run metadata. Raises as :func:`read_trace` does, on reaching the bad file or row."""
    for table, raw in _read_tables(path, batch_rows):
        yield from table.replace_schema_metadata({METADATA_KEY: raw}).to_batches()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The run metadata of a trace: the file's footer, or a directory's last part.

    Raises:
        TraceFileError: as :func:`read_trace`, for the file whose footer is read.
    """
    source, raw = _open_checked(trace_files(path)[-1])
    source.close()
    metadata: dict[str, Any] = json.loads(raw)
    return metadata

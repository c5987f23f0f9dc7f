"""Writing traces: a whole table at once, or a crash-safe writer that flushes Parquet part
files as spans arrive (docs/design.md, "The span record")."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ttft.collectors._log import (
    GroupCommit,
    LogSegment,
    encode_batch,
    encode_metadata,
    read_log,
)
from ttft.collectors._spans import to_span_table
from ttft.collectors.layout import (
    discard,
    fsync,
    joined_layout,
    log_files,
    log_name,
    part_files,
    parts_dir,
    replace_bytes,
    uncovered_logs,
    write_atomic,
    write_options,
)
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION, SPAN_SCHEMA
from ttft.tracer.span_ids import is_v2, to_v1, to_v2

__all__ = ["TraceWriter", "replace_bytes", "write_trace"]  # replace_bytes: for small files

logger = logging.getLogger(__name__)


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
    write_atomic(dest, table, metadata_json)
    return dest


class TraceWriter:
    """Buffers spans and writes them as crash-safe zstd Parquet part files.

    Buffered rows become one part ``<path>.parts/part-NNNNN.parquet`` when ``flush_spans``
    rows are buffered or the oldest is ``flush_interval_s`` old (checked on :meth:`append` and
    by a daemon timer thread), and on :meth:`flush` and :meth:`close`. A part is written under
    a temporary dot-name, fsynced and renamed, so a crash loses at most the rows appended
    since the last flush. :meth:`close` merges the parts into ``path`` (replacing any file
    there) unless ``merge_on_close`` is false. Every file carries the run metadata.

    With ``log`` (a span log, :mod:`ttft.collectors._log`), each append is first written to
    the log segment ``log-NNNNN.spans`` of the part its rows will go to, so a killed process
    loses nothing appended (the page cache outlives it), and ``append(..., durable=True)``
    returns only once the segment is fsynced: concurrent durable appends share one fsync
    (group commit). A segment is removed once its part is written; readers read a segment
    whose part is missing (:func:`ttft.collectors.read_spans`). Without a log, a durable
    append writes a part itself before it returns.

    Threading: all methods may be called from any thread. :meth:`append` holds a lock only
    briefly, but writes the part on the calling thread when a flush is due.

    Failure: a failed flush raises to its caller (the timer thread logs instead). Without a
    log, the rows it held are lost and counted in ``dropped_rows``; with one they stay in
    their segment, which readers and the merge on :meth:`close` read. Parts already written
    stay on disk. An append whose log write or fsync fails raises: its rows were not taken.

    Attributes:
        path: the merged trace file written by :meth:`close`.
        parts_dir: the directory of part files.
        rows_written: rows written to part files so far.
        dropped_rows: rows lost to failed flushes (always 0 with a log).
    """

    def __init__(self, path: str | os.PathLike[str], *, metadata: Mapping[str, Any] | None = None,
                 flush_spans: int = 50_000, flush_interval_s: float | None = 5.0,
                 merge_on_close: bool = True, initial_part: bool = False,
                 log: bool = False) -> None:
        """Create the parts directory (and the first log segment) and start the timer thread.

        Args:
            path: the trace file to produce.
            metadata: run metadata (JSON-serializable values); ``schema_version`` is added.
            flush_spans: flush when this many rows are buffered.
            flush_interval_s: flush when the oldest buffered row is this old; ``None``
                disables time-based flushing (and the timer thread).
            merge_on_close: merge the parts into ``path`` on close; else keep the directory.
            initial_part: write an empty part with the run metadata at once, so a process
                killed before its first flush still leaves a readable (empty) trace.
            log: keep a span log (see the class), which durable appends fsync.

        Raises:
            ValueError: a non-positive ``flush_spans`` or ``flush_interval_s``.
            TypeError: a metadata value that is not JSON-serializable.
            FileExistsError: ``<path>.parts`` already holds parts or logs (e.g. of a crashed
                run).
            OSError: the parts directory or the log cannot be created.
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
        if part_files(self.parts_dir) or log_files(self.parts_dir):
            raise FileExistsError(f"{self.parts_dir}: holds parts of another run; read or "
                                  "remove them first")
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        if initial_part:
            write_atomic(self.parts_dir / "part-00000.parquet", SPAN_SCHEMA.empty_table(),
                         self._metadata_json())
        self._lock = threading.Lock()  # guards the buffer, counters, metadata and segment
        self._io_lock = threading.Lock()  # serializes part writes and the merge
        self._commit = GroupCommit()  # one fsync at a time; segment rotation under it
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._oldest_ns: int | None = None  # monotonic time of the oldest buffered append
        self._next_part = 1 if initial_part else 0
        self._closed = False
        self._appended = 0  # appends written to the log so far
        self._synced = 0  # every append up to this one is fsynced
        self._sync_failed: OSError | None = None  # a rotated segment whose fsync failed
        self._segment = (LogSegment(self.parts_dir / log_name(self._next_part),
                                    self._metadata_json()) if log else None)
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
        """Add or replace run metadata; later parts, the log and the merged file carry it.

        Raises:
            ValueError: the writer is closed.
            TypeError: a value that is not JSON-serializable.
            OSError: the log cannot be written.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: writer is closed")
            self._update_metadata(metadata)
            if self._segment is not None:
                self._segment.write(encode_metadata(self._metadata_json()))

    def append(self, data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]], *,
               durable: bool = False) -> None:
        """Buffer spans (see :func:`to_span_table`), writing them to the log if there is one;
        flush on this thread if one is due.

        Args:
            data: the spans.
            durable: return only once they are on disk: the log fsynced (shared with the
                appends that arrived meanwhile), or, without a log, their part written.

        Raises:
            ValueError: the writer is closed, or the data does not fit the span schema.
            OSError: the log write or fsync failed (the rows were not taken), or a due
                flush failed.
        """
        table = to_v1(to_span_table(data))  # buffered and logged as text; parts as bytes
        record = encode_batch(table) if self._segment is not None and table.num_rows else b""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: writer is closed")
            if table.num_rows == 0:
                return
            if self._segment is not None:
                self._segment.write(record)
            self._appended += 1
            sequence = self._appended
            now_ns = time.monotonic_ns()
            self._buffer.append(table)
            self._buffered_rows += table.num_rows
            if self._oldest_ns is None:
                self._oldest_ns = now_ns
            due = self._buffered_rows >= self._flush_spans or (
                self._flush_interval_ns is not None
                and now_ns - self._oldest_ns >= self._flush_interval_ns
            )
            logged = self._segment is not None
        if due or (durable and not logged):
            self.flush()
        if durable and logged:
            self._sync(sequence)

    def sync(self) -> None:
        """Make every append so far durable (nothing to do without a log).

        Raises:
            OSError: the fsync failed.
        """
        with self._lock:
            sequence = self._appended
        self._sync(sequence)

    def _sync(self, sequence: int) -> None:
        self._commit.sync(lambda: self._covered(sequence), self._fsync_log)

    def _covered(self, sequence: int) -> bool:
        if self._sync_failed is not None:
            raise OSError(self._sync_failed.errno, f"{self.path}: the span log could not "
                          f"be made durable ({self._sync_failed})")
        return self._synced >= sequence  # an fsync that started after the append covered it

    def _fsync_log(self) -> None:
        with self._lock:
            segment, target = self._segment, self._appended
        if segment is not None:
            segment.sync()
        self._synced = target

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

    def _rotate(self, last: bool) -> tuple[list[pa.Table], int, int, bytes, LogSegment | None]:
        """Take the buffer and, with a log, start the next part's segment (none if ``last``);
        the segment that held the buffer is fsynced and closed. Holds the sync lock."""
        with self._commit.holding(), self._lock:
            index = self._next_part
            old = self._segment
            if not self._buffer:
                if not last or old is None:
                    return [], 0, index, b"", None
                self._segment = None  # closing with nothing buffered: the segment is empty
                old.close()
                old.path.unlink(missing_ok=True)
                return [], 0, index, b"", None
            metadata_json = self._metadata_json()
            if old is not None and not last:  # may raise: then nothing has changed
                self._segment = LogSegment(self.parts_dir / log_name(index + 1), metadata_json)
            elif old is not None:
                self._segment = None
            tables, self._buffer = self._buffer, []
            rows, self._buffered_rows, self._oldest_ns = self._buffered_rows, 0, None
            self._next_part = index + 1
            rotated_at = self._appended
            if old is not None:
                try:
                    old.sync()
                except OSError as exc:
                    self._sync_failed = exc
                    raise
                finally:
                    old.close()
                self._synced = max(self._synced, rotated_at)
        return tables, rows, index, metadata_json, old

    def _flush_locked(self, last: bool = False) -> None:
        tables, rows, index, metadata_json, segment = self._rotate(last)
        if not tables:
            return
        try:
            table = pa.concat_tables(tables)
            write_atomic(self.parts_dir / f"part-{index:05d}.parquet", table, metadata_json)
        except BaseException:
            if segment is None:  # with a log the rows stay in their segment, still read
                with self._lock:
                    self.dropped_rows += rows
            raise
        with self._lock:
            self.rows_written += rows
        if segment is not None:
            try:
                segment.path.unlink()
            except OSError:  # readers skip a segment whose part exists
                logger.warning("%s: could not remove %s", self.path, segment.path)

    def _run_timer(self) -> None:
        interval_ns = self._flush_interval_ns
        assert interval_ns is not None
        failing = False  # a failure is logged once, and its end once, not every interval
        while not self._stop.is_set():
            with self._lock:
                oldest_ns = self._oldest_ns
            now_ns = time.monotonic_ns()
            if oldest_ns is not None and now_ns - oldest_ns >= interval_ns:
                try:
                    self.flush()
                except Exception as exc:
                    if not failing:
                        logger.warning("%s: timed flush failed (%s); retrying every %.3g s, "
                                       "the rows stay in the span log", self.path, exc,
                                       interval_ns / 1e9)
                    failing = True
                    self._stop.wait(interval_ns / 1e9)  # not at once: no spin while it fails
                    continue
                if failing:
                    logger.warning("%s: timed flushes succeed again", self.path)
                failing = False
                continue
            wait_ns = interval_ns if oldest_ns is None else oldest_ns + interval_ns - now_ns
            self._stop.wait(wait_ns / 1e9)

    def close(self) -> None:
        """Flush, stop the timer and, if ``merge_on_close``, merge the parts into ``path``.

        Idempotent. A writer that never got a row still leaves a valid, empty trace. The
        merge streams the parts (and any log segment whose part could not be written) row
        group by row group into a temporary file that is then renamed to ``path``; the parts
        directory is removed only after that succeeded.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join()
        with self._io_lock:
            self._flush_locked(last=True)
            if not part_files(self.parts_dir) and not log_files(self.parts_dir):
                part = self.parts_dir / f"part-{self._next_part:05d}.parquet"
                write_atomic(part, SPAN_SCHEMA.empty_table(), self._metadata_json())
            if self.merge_on_close:
                self._merge_locked()

    def _merge_locked(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        parts = part_files(self.parts_dir)
        logged = [to_span_table(read_log(segment).table)  # parts that failed: few rows
                  for _, segment in uncovered_logs(self.parts_dir)]
        stored = [to_v2(rows) for rows in logged]  # None: a row whose ids need text
        schema, layout = joined_layout(parts, all(rows is not None for rows in stored))
        as_bytes = is_v2(schema)
        schema = schema.with_metadata({METADATA_KEY: self._metadata_json()})
        try:
            with pq.ParquetWriter(tmp, schema, **write_options(schema)) as sink:
                for part in parts:
                    with pq.ParquetFile(part) as source:
                        for group in range(source.num_row_groups):
                            table = layout(source.read_row_group(group))
                            sink.write_table(table.replace_schema_metadata(None))
                for rows in (stored if as_bytes else logged):
                    sink.write_table(rows.replace_schema_metadata(None))
            fsync(tmp)
            os.replace(tmp, self.path)
        except BaseException:
            discard(tmp)
            raise
        shutil.rmtree(self.parts_dir)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

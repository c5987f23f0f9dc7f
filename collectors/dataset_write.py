"""Writing partitioned trace datasets (the layout: ``collectors/dataset.py``): a dataset
written a batch at a time with bounded buffers (`DatasetWriter`), or from one table with
its rows' partitions (`write_dataset`, one whole partition at a time through the writer).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ttft.collectors.dataset import (
    BORROWED_FILE,
    DATASET_FILE,
    FORMAT,
    PARTITION_KEY,
    SPANS_FILE,
    VERSION,
    _filesystem,
    _partition_name,
    is_url,
)
from ttft.collectors.layout import (
    as_stored,
    by_trace,
    discard,
    fsync,
    joined_layout,
    replace_bytes,
    write_options,
)
from ttft.tracer.schema import (
    COUNTED,
    METADATA_KEY,
    SCHEMA_VERSION,
    SPAN_SCHEMA,
    run_metadata,
)
from ttft.tracer.span_ids import is_v2, same_layout

__all__ = ["DatasetWriter", "write_dataset"]


def _checked_rows(table: pa.Table, owner: np.ndarray, copy_rows: np.ndarray,
                  copy_partitions: np.ndarray, partitions: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    owner = np.asarray(owner, dtype=np.int64)
    copy_rows = np.asarray(copy_rows, dtype=np.int64)
    copy_partitions = np.asarray(copy_partitions, dtype=np.int64)
    if owner.shape != (table.num_rows,):
        raise ValueError(f"owner has {owner.size} entries for {table.num_rows} rows")
    if copy_rows.shape != copy_partitions.shape or copy_rows.ndim != 1:
        raise ValueError("copy_rows and copy_partitions differ in length")
    for name, values, bound in (("owner", owner, partitions),
                                ("copy_partitions", copy_partitions, partitions),
                                ("copy_rows", copy_rows, table.num_rows)):
        if values.size and (values.min() < 0 or values.max() >= bound):
            raise ValueError(f"{name} holds a value outside 0..{bound - 1}")
    return owner, copy_rows, copy_partitions


def _groups(keys: np.ndarray, values: np.ndarray, partitions: int) -> list[np.ndarray]:
    """``values`` split by ``keys`` (0..partitions-1), each group in its original order."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(partitions + 1))
    ordered = values[order]
    return [ordered[bounds[k]:bounds[k + 1]] for k in range(partitions)]


def _json_bytes(value: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(value, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata: {exc}") from exc


_FLUSH_ROWS = 1 << 20
"""Rows a partition's file gets at once (a Parquet row group's worth)."""
_BUFFER_BYTES = 64 << 20
"""Rows buffered for all partitions together before the largest buffer is written."""
_MAX_OPEN = 64
"""Partition files open for writing at once; past it the least recently written one is
closed as a finished piece, and a later write starts another (pieces are joined at
`DatasetWriter.close`), so a dataset of any partition count stays within the process's
open-file limit."""


class _PartFile:
    """One partition file being written: rows buffered, then written in row groups to
    dot-named temporary pieces that `close` joins (when there are several) and renames
    into place."""

    def __init__(self, path: Path, metadata: dict[bytes, bytes]) -> None:
        self.path, self.metadata = path, metadata
        self.buffered: list[pa.Table] = []
        self.rows = self.nbytes = self.written = 0
        self.pieces: list[Path] = []
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None  # the open piece's

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self.buffered.append(table)
            self.rows += table.num_rows
            self.nbytes += table.nbytes

    def _open(self, schema: pa.Schema) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        piece = self.path.with_name(f".{self.path.name}.tmp.{len(self.pieces)}")
        self.pieces.append(piece)
        self.writer = pq.ParquetWriter(piece, schema, **write_options(schema))
        self.schema = schema

    def flush(self) -> bool:
        """Write the buffered rows; True when that opened a writer. Each piece holds one
        layout (`layout.as_stored`: ids as bytes where they are W3C hex): rows of the
        other start a piece of their own, and `close` joins pieces of both as text."""
        if not self.buffered:
            return False
        table = pa.concat_tables(same_layout(self.buffered)) if len(self.buffered) > 1 \
            else self.buffered[0]
        self.buffered, self.rows, self.nbytes = [], 0, 0
        table = as_stored(by_trace(table))[0].replace_schema_metadata(self.metadata)
        if self.writer is not None and is_v2(self.schema) != is_v2(table.schema):
            self.suspend()
        opened = self.writer is None
        if opened:
            self._open(table.schema)
        assert self.writer is not None
        self.writer.write_table(table)
        self.written += table.num_rows
        return opened

    def suspend(self) -> None:
        """Close the open piece (a later flush starts another)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self, empty_ok: bool) -> bool:
        """Write what is left, join the pieces and rename the file into place; False
        (nothing written) when it holds no row and ``empty_ok`` is false."""
        self.flush()
        if not self.pieces:
            if not empty_ok:
                return False
            self._open(SPAN_SCHEMA.with_metadata(self.metadata))
        self.suspend()
        whole = self.pieces[0]
        if len(self.pieces) > 1:  # joined a row group at a time: memory stays bounded
            whole = self.path.with_name(f".{self.path.name}.tmp")
            schema, layout = joined_layout(self.pieces)
            with pq.ParquetWriter(whole, schema.with_metadata(self.metadata),
                                  **write_options(schema)) as joined:
                for piece in self.pieces:
                    source = pq.ParquetFile(piece)
                    for group in range(source.metadata.num_row_groups):
                        joined.write_table(layout(source.read_row_group(group))
                                           .replace_schema_metadata(self.metadata))
                    source.close()
                    piece.unlink()
        fsync(whole)
        os.replace(whole, self.path)
        self.pieces = []
        return True

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.suspend()
        for piece in self.pieces:
            discard(piece)
        discard(self.path.with_name(f".{self.path.name}.tmp"))


def _refuse_nonempty_local(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; the dataset is "
                         "written to a new or empty directory")


class DatasetWriter:
    """A partitioned dataset written a batch at a time (the layout above): each partition's
    own and borrowed rows are appended as they come (`add`), buffered up to
    `_BUFFER_BYTES` in all, and the dataset file is written last (`close`), so memory is
    bounded whatever the dataset's size. A URL is written to a local scratch directory
    and uploaded partition by partition at `close`.

    Args:
        out: a new or empty local directory, or a URL.
        partitions: the partition count N.
        key: the partition rule in words, kept in ``_ttft_dataset.json``.
        metadata: the run metadata; ``schema_version`` is set to this ttft's.

    Raises:
        ValueError: ``out`` exists and is not an empty directory, or ``partitions`` < 1.
        TypeError: the metadata cannot be written as JSON.
        TraceFileError: a URL whose filesystem package (or fsspec) is not installed.
    """

    def __init__(self, out: str | os.PathLike[str], partitions: int, key: str,
                 metadata: Mapping[str, Any]) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        self.out, self.partitions, self.key = out, partitions, key
        self.run = {**metadata, "schema_version": SCHEMA_VERSION}
        first = _json_bytes(self.run)
        others = _json_bytes({k: v for k, v in self.run.items() if k not in COUNTED})
        self.id = uuid.uuid4().hex
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        if is_url(out):
            fs, root_path = _filesystem(os.fspath(out))
            if fs.exists(root_path) and (not fs.isdir(root_path) or fs.ls(root_path)):
                raise ValueError(f"{out}: exists and is not an empty directory; the dataset "
                                 "is written to a new or empty directory")
            self._scratch = tempfile.TemporaryDirectory(prefix="ttft-dataset-")
            self.root = Path(self._scratch.name)
        else:
            self.root = Path(out)
            _refuse_nonempty_local(self.root)
            self.root.mkdir(parents=True, exist_ok=True)

        def part(k: int, name: str) -> _PartFile:
            identity = {"dataset": self.id, "partition": k, "partitions": partitions,
                        "file": name}
            return _PartFile(self.root / _partition_name(k) / name,
                             {METADATA_KEY: first if k == 0 else others,
                              PARTITION_KEY: _json_bytes(identity)})

        self._own = [part(k, SPANS_FILE) for k in range(partitions)]
        self._borrowed = [part(k, BORROWED_FILE) for k in range(partitions)]
        self._open: dict[int, _PartFile] = {}  # by id, least recently written first
        self.spans = self.copies = 0

    def _flush(self, f: _PartFile) -> None:
        if f.writer is not None:
            self._open.pop(id(f), None)
        elif f.buffered and len(self._open) >= _MAX_OPEN:
            self._open.pop(next(iter(self._open))).suspend()
        f.flush()
        if f.writer is not None:
            self._open[id(f)] = f

    def put(self, k: int, own: pa.Table, borrowed: pa.Table | None = None) -> None:
        """Append rows partition ``k`` owns and rows copied into it."""
        self._own[k].add(own)
        self.spans += own.num_rows
        if borrowed is not None:
            self._borrowed[k].add(borrowed)
            self.copies += borrowed.num_rows
        for f in (self._own[k], self._borrowed[k]):
            if f.rows >= _FLUSH_ROWS:
                self._flush(f)
        files = (*self._own, *self._borrowed)
        while sum(f.nbytes for f in files) > _BUFFER_BYTES:
            self._flush(max(files, key=lambda f: f.nbytes))

    def add(self, table: pa.Table, owner: np.ndarray, copy_rows: np.ndarray,
            copy_partitions: np.ndarray) -> None:
        """Append a batch of rows routed by ``owner`` (per row) and the copies
        ``copy_rows`` → ``copy_partitions`` (`write_dataset`'s arguments, for this batch).

        Raises:
            ValueError: the routing does not fit the batch or the partition count.
        """
        self._add(table, *_checked_rows(table, owner, copy_rows, copy_partitions,
                                        self.partitions))

    def _add(self, table: pa.Table, owner: np.ndarray, copy_rows: np.ndarray,
             copy_partitions: np.ndarray) -> None:
        """`add` of routing already checked (`_checked_rows`): partition by partition, so
        the rows buffered stay within `_BUFFER_BYTES` and the one partition taken."""
        owned = _groups(owner, np.arange(table.num_rows, dtype=np.int64), self.partitions)
        copied = _groups(copy_partitions, copy_rows, self.partitions)
        for k in range(self.partitions):
            if owned[k].size or copied[k].size:
                self.put(k, table.take(pa.array(owned[k], pa.int64())),
                         table.take(pa.array(copied[k], pa.int64())))

    def close(self) -> Path | str:
        """Write every partition's files and, last, the dataset file.

        Returns:
            ``out`` (a Path for a local directory, the URL as given otherwise).

        Raises:
            OSError: a file cannot be written.
        """
        try:
            for own, borrowed in zip(self._own, self._borrowed, strict=True):
                for f, empty_ok in ((own, True), (borrowed, False)):
                    self._open.pop(id(f), None)
                    f.close(empty_ok)
                fsync(own.path.parent)  # the renames are durable before the dataset names them
            info = _json_bytes({"format": FORMAT, "version": VERSION,
                                "partitions": self.partitions, "key": self.key,
                                "schema_version": SCHEMA_VERSION, "id": self.id,
                                "spans": self.spans, "copies": self.copies,
                                "metadata": self.run})
            if self._scratch is None:
                replace_bytes(self.root / DATASET_FILE, info)
                return Path(self.out)
            _upload(os.fspath(self.out), self.root, self.partitions, info)
            return self.out
        except BaseException:
            self.abort()
            raise
        finally:
            if self._scratch is not None:
                self._scratch.cleanup()

    def abort(self) -> None:
        """Remove the temporaries of files not yet in place (after a failure), and a URL's
        local scratch directory."""
        for f in (*self._own, *self._borrowed):
            f.discard()
        if self._scratch is not None:
            self._scratch.cleanup()


def write_dataset(
    out: str | os.PathLike[str],
    table: pa.Table,
    owner: np.ndarray,
    copy_rows: np.ndarray,
    copy_partitions: np.ndarray,
    partitions: int,
    key: str,
    metadata: Mapping[str, Any] | None = None,
) -> Path | str:
    """Write ``table`` as a partitioned dataset at ``out`` (the layout above), one
    partition at a time (`DatasetWriter`).

    Args:
        out: a new or empty local directory, or a URL (written through fsspec).
        table: the rows, with ``SPAN_SCHEMA``.
        owner: per row of ``table``, the partition (0..partitions-1) that owns it.
        copy_rows: row indices also copied into another partition, as borrowed rows.
        copy_partitions: per entry of ``copy_rows``, the partition it is copied into.
        partitions: the partition count N; every ``part=K`` directory is written.
        key: the partition rule in words, kept in ``_ttft_dataset.json``.
        metadata: the run metadata (None: the table's own, under ``METADATA_KEY``);
            ``schema_version`` is set to this ttft's.

    Returns:
        ``out`` (a Path for a local directory, the URL as given otherwise).

    Raises:
        ValueError: ``out`` exists and is not an empty directory; or ``owner``,
            ``copy_rows``, ``copy_partitions`` do not fit the table and ``partitions``.
        TypeError: the metadata cannot be written as JSON.
        TraceFileError: a URL whose filesystem package (or fsspec) is not installed.
        OSError: a file cannot be written.
    """
    routing = _checked_rows(table, owner, copy_rows, copy_partitions, partitions)
    writer = DatasetWriter(out, partitions, key,  # checked first: nothing made for bad rows
                           run_metadata(table) if metadata is None else metadata)
    try:
        writer._add(table, *routing)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def _upload(url: str, root: Path, partitions: int, info: bytes) -> None:
    """Upload the dataset written under local ``root`` to ``url``, partition by partition,
    then its dataset file (written under a temporary name and moved), last."""
    fs, root_path = _filesystem(url)
    for k in range(partitions):
        remote = f"{root_path}/{_partition_name(k)}"
        fs.makedirs(remote, exist_ok=True)
        for file in sorted((root / _partition_name(k)).iterdir()):
            fs.put_file(str(file), f"{remote}/{file.name}")
    tmp = f"{root_path}/.{DATASET_FILE}.tmp"
    fs.pipe_file(tmp, info)
    fs.mv(tmp, f"{root_path}/{DATASET_FILE}")

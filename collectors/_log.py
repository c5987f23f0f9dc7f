"""A trace writer's span log: the rows appended since its last part, on disk before they are
acknowledged (docs/design.md, "The span record"; README, "Reliability and security").

A log segment ``log-NNNNN.spans`` lives in a writer's parts directory and holds exactly the
rows that part ``part-NNNNN.parquet`` will hold once written; a segment whose part exists is
therefore already read through the part, and readers skip it. A segment is a header and a
sequence of records, each framed so that a torn tail (the process was killed mid-write) is
recognised and left out rather than misread::

    header:  b"TTFTLOG1" · u32 length · u32 crc32 · JSON {"schema_version", "metadata"}
    record:  u32 length · u32 crc32 · u8 kind · payload     (crc32 over kind and payload)
             kind 0: an Arrow IPC record batch of the span columns, dictionaries as strings
             kind 1: the run metadata as JSON (replaces the header's)

Integers are little-endian. A record is appended with one ``write``; a record is durable
once the segment is fsynced (:meth:`LogSegment.sync`).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.collectors.layout import fsync
from ttft.tracer.schema import SPAN_SCHEMA

MAGIC = b"TTFTLOG1"
_HEADER = struct.Struct("<II")  # length, crc32
_RECORD = struct.Struct("<IIB")  # length of payload, crc32 of kind + payload, kind
_BATCH, _METADATA = 0, 1

LOG_SCHEMA = pa.schema([
    pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type, f.nullable)
    for f in SPAN_SCHEMA
])
"""The span schema with its dictionary columns as plain strings: a record batch then
serializes on its own, without the dictionary batches an IPC stream would need."""


def _crc(*chunks: bytes) -> int:
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def encode_batch(table: pa.Table) -> bytes:
    """One record of a span table (already of ``SPAN_SCHEMA``), ready to append."""
    plain = table.cast(LOG_SCHEMA).combine_chunks().replace_schema_metadata(None)
    batches = plain.to_batches()
    batch = batches[0] if len(batches) == 1 else pa.RecordBatch.from_pylist([], LOG_SCHEMA)
    payload = batch.serialize().to_pybytes()
    kind = bytes([_BATCH])
    return _RECORD.pack(len(payload), _crc(kind, payload), _BATCH) + payload


def encode_metadata(metadata_json: bytes) -> bytes:
    kind = bytes([_METADATA])
    return _RECORD.pack(len(metadata_json), _crc(kind, metadata_json), _METADATA) + metadata_json


class LogSegment:
    """One segment open for appending. Not thread-safe: the writer serializes calls."""

    def __init__(self, path: Path, metadata_json: bytes) -> None:
        """Create the segment with its header, and make its directory entry durable.

        Raises:
            OSError: it cannot be created (e.g. it exists: another writer's).
        """
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        try:
            header = json.dumps({"metadata": json.loads(metadata_json)}).encode()
            self.write(MAGIC + _HEADER.pack(len(header), _crc(header)) + header)
            os.fsync(self._fd)
            fsync(path.parent)
        except BaseException:
            os.close(self._fd)
            # It holds nothing acknowledged: gone, so the next try (a full disk that has
            # space again) can create it, and no reader meets a headless segment.
            path.unlink(missing_ok=True)
            raise

    def write(self, data: bytes) -> None:
        """Append ``data`` whole or not at all (in the page cache: it survives a killed
        process, not a power cut until :meth:`sync`).

        Raises:
            OSError: the write failed (a full disk): the segment is cut back to where it
                was, so a torn record never hides the records appended after it.
        """
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def sync(self) -> None:
        """Make everything written so far durable."""
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class GroupCommit:
    """One fsync at a time, shared by every append it covers (group commit).

    An append waiting to be made durable either runs the fsync itself, when none is
    running, or waits for the running one to end and then looks again: the fsync that
    started after its write covers it. Waiters wait on the end of an fsync, not on its lock,
    so the thread that ran one cannot take the lock back first (Python's locks are not
    fair) and leave the appends it covered queued behind its next fsync.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition()
        self._round = 0  # how many times the lock was released

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the lock (no fsync of this commit runs meanwhile)."""
        self._lock.acquire()
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self._lock.release()
        with self._ended:
            self._round += 1
            self._ended.notify_all()

    def sync(self, covered: Callable[[], bool], fsync: Callable[[], None]) -> None:
        """Return once ``covered()`` (which may raise); until then, run ``fsync()`` under
        the lock when it is free, else wait for the fsync running to end."""
        while not covered():
            with self._ended:
                seen = self._round
            if self._lock.acquire(blocking=False):
                try:
                    if not covered():
                        fsync()
                finally:
                    self._release()
                continue
            with self._ended:  # the timeout bounds only a wait that no release would end
                self._ended.wait_for(lambda seen=seen: self._round != seen, 1.0)


@dataclass
class LogContents:
    """What a segment held: its rows (``SPAN_SCHEMA``), the run metadata last written, the
    records read and the bytes after the last whole record (a tail torn by a kill, or one
    being written right now)."""

    table: pa.Table
    metadata: dict[str, Any]
    records: int
    torn_bytes: int


def _nothing(torn_bytes: int) -> LogContents:
    """A segment whose header was cut (a full disk, a kill while it was created): it holds
    no record, so nothing in it was ever acknowledged."""
    return LogContents(LOG_SCHEMA.empty_table(), {}, 0, torn_bytes)


class LogError(ValueError):
    """A segment that is not one (bad magic or header): the message says why."""


def read_log(path: Path) -> LogContents:
    """Read every whole record of a segment, stopping at the first that is incomplete or
    fails its checksum (nothing after a torn record is trusted).

    Raises:
        LogError: the file is not a span log, or its header is torn or corrupt.
        FileNotFoundError: it vanished (its part was just written and it was removed).
    """
    data = path.read_bytes()
    at = len(MAGIC)
    if len(data) < at + _HEADER.size and MAGIC.startswith(data[:at]):
        return _nothing(len(data))  # created, its header never whole: nothing was in it
    if not data.startswith(MAGIC):
        raise LogError("not a ttft span log (bad magic)")
    length, crc = _HEADER.unpack_from(data, at)
    at += _HEADER.size
    header = data[at:at + length]
    if len(header) != length:
        return _nothing(len(data))
    if _crc(header) != crc:
        raise LogError("span log header is corrupt")
    try:
        metadata = json.loads(header)["metadata"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LogError(f"span log header is not valid JSON ({exc})") from exc
    at += length
    batches: list[pa.RecordBatch] = []
    records = 0
    view = memoryview(data)
    while at + _RECORD.size <= len(data):
        length, crc, kind = _RECORD.unpack_from(data, at)
        start = at + _RECORD.size
        payload = view[start:start + length]
        if len(payload) != length or _crc(bytes([kind]), payload) != crc:
            break
        if kind == _BATCH:
            batches.append(pa.ipc.read_record_batch(pa.py_buffer(payload), LOG_SCHEMA))
        elif kind == _METADATA:
            metadata = json.loads(bytes(payload))
        else:
            break  # a kind this version does not know: written by a newer ttft
        records += 1
        at = start + length
    table = pa.Table.from_batches(batches, LOG_SCHEMA) if batches else LOG_SCHEMA.empty_table()
    return LogContents(table, metadata, records, len(data) - at)

"""What every importer shares: the interface and rows → span table."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import stat
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ttft.collectors._spans import to_span_table
from ttft.collectors.errors import MAX_DECOMPRESSED_BYTES, TraceFileError
from ttft.tracer.schema import METADATA_KEY, SCHEMA_VERSION


@runtime_checkable
class Importer(Protocol):
    """One trace format (xarray's ``BackendEntrypoint`` shape).

    ``guess_can_open`` looks at the file cheaply (its first bytes, never the whole file) and
    must not raise; ``read`` returns a table with exactly ``SPAN_SCHEMA`` whose schema
    metadata holds the run metadata under ``METADATA_KEY`` (at least ``schema_version``,
    ``source_format`` and ``source``), or raises `TraceFileError`.
    """

    name: str
    description: str

    def guess_can_open(self, path: Path) -> bool: ...

    def read(self, path: Path) -> pa.Table: ...


INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_GZIP_MAGIC = b"\x1f\x8b"


def head(path: Path, size: int = 4096) -> bytes:
    """The first ``size`` bytes of ``path`` (empty when it cannot be read or is not a
    regular file: a folder, or a FIFO, which is never opened here so guessing cannot block
    on it or consume it)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def decoded_head(path: Path, size: int) -> tuple[bytes, int | None]:
    """The first bytes of ``path`` (decompressed when gzip), and the file's whole length
    when it is known without reading it (None for gzip). Never raises."""
    data = head(path, size)
    if data[:2] != _GZIP_MAGIC:
        try:
            return data, os.path.getsize(path)
        except OSError:
            return data, None
    try:
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(data, 4 * size), None
    except zlib.error:
        return b"", None


def fits_int64(value_ns: int) -> bool:
    """Whether a time in ns can be stored in the span table's int64 columns."""
    return INT64_MIN <= value_ns <= INT64_MAX


class _TooLarge(Exception):
    """The decompressed data passed `MAX_DECOMPRESSED_BYTES` (turned into a
    `TraceFileError` naming the file)."""


class _Limited(io.RawIOBase):
    """A decompressing stream that raises `_TooLarge` past ``limit`` bytes."""

    def __init__(self, stream: io.BufferedIOBase, limit: int) -> None:
        self._stream = stream
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._stream.readinto(buffer)
        self._left -= count
        if self._left < 0:
            raise _TooLarge
        return count


@contextmanager
def opened(path: Path) -> Iterator[io.BufferedIOBase]:
    """``path`` as a binary stream, gzip decompressed on the fly up to
    `MAX_DECOMPRESSED_BYTES`; read errors inside the block (I/O, gzip, the size limit)
    become `TraceFileError`."""
    try:
        with open(path, "rb") as raw:
            if raw.peek(2)[:2] == _GZIP_MAGIC:
                with gzip.GzipFile(fileobj=raw) as unzipped:
                    yield io.BufferedReader(_Limited(unzipped, MAX_DECOMPRESSED_BYTES))
            else:
                yield raw
    except _TooLarge:
        raise TraceFileError(path, f"decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes "
                                   "(the limit MAX_DECOMPRESSED_BYTES)") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceFileError(path, f"not valid gzip: {exc}") from None
    except OSError as exc:
        raise TraceFileError(path, exc.strerror or str(exc)) from None


def read_bytes(path: Path) -> bytes:
    """The whole of ``path``, decompressed as `opened` does (bounded, errors as
    `TraceFileError`)."""
    with opened(path) as stream:
        return stream.read()


def load_json(data: bytes | str, path: Path, **options: Any) -> Any:
    """``json.loads(data, **options)``; invalid JSON and nesting too deep for the parser
    (a `RecursionError`) raise `TraceFileError` naming ``path``."""
    try:
        return json.loads(data, **options)
    except RecursionError:
        raise TraceFileError(path, "not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise TraceFileError(path, f"not valid JSON ({exc})") from None


_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by ``"NaN"``/``"Infinity"``/
    ``"-Infinity"`` (the strings proto3 JSON writes for such doubles)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else _NON_FINITE[value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def valid_json_attributes(text: Any) -> Any:
    """An ``attributes`` text that is valid JSON: ``NaN``/``Infinity`` tokens (which
    Python's json writes but JSON does not allow) become the strings ``"NaN"``,
    ``"Infinity"`` and ``"-Infinity"``. Other values are returned as they are."""
    if not isinstance(text, str) or ("NaN" not in text and "Infinity" not in text):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return json.dumps(_finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


def _valid_attributes(row: Mapping[str, Any]) -> Mapping[str, Any]:
    text = row.get("attributes")
    fixed = valid_json_attributes(text)
    return row if fixed is text else {**row, "attributes": fixed}


def rows_to_table(
    rows: Iterable[Mapping[str, Any]], path: Path, source_format: str, **metadata: Any
) -> pa.Table:
    """Row dicts (span-record columns) → a span table with the import's metadata.

    Attribute texts holding ``NaN`` or infinities are rewritten as valid JSON
    (`valid_json_attributes`).

    Raises:
        TraceFileError: a row does not fit the schema (the message names the row).
    """
    try:
        table = to_span_table([_valid_attributes(row) for row in rows])
    except (ValueError, OverflowError) as exc:  # OverflowError: a number beyond int64
        raise TraceFileError(path, str(exc)) from None
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source_format": source_format,
        "source": str(path),
        **metadata,
    }
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})

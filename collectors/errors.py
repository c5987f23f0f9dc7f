"""The one error for input ttft cannot read as a trace."""

from __future__ import annotations

import os

__all__ = ["MAX_DECOMPRESSED_BYTES", "MAX_PARQUET_RATIO", "TraceFileError"]

MAX_DECOMPRESSED_BYTES = 256 << 20
"""Most bytes a compressed trace may decompress to (256 MiB): a gzip file, a stream read
from standard input or a FIFO, or Parquet data decoded at more than `MAX_PARQUET_RATIO`
times its size on disk. Beyond it the input is refused with a `TraceFileError` naming
the limit, so a small compression bomb never fills memory."""

MAX_PARQUET_RATIO = 100
"""Parquet decoded beyond `MAX_DECOMPRESSED_BYTES` is refused only when it is also more than
this many times its size on disk (real traces decode at about 5-20 times)."""


def location(row: int | None, field: str | None) -> str:
    """``", row R, field 'F'"`` for the parts that are known (empty when neither is)."""
    return (f", row {row}" if row is not None else "") + (
        f", field {field!r}" if field is not None else ""
    )


class TraceFileError(ValueError):
    """A file that cannot be read as a trace, in any format: missing, unrecognised, torn,
    of a newer schema, or with a row that breaks its format. The message names the file
    (and the row and field, or the line or frame, where known).

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

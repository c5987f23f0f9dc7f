"""The one error for input ttft cannot read as a trace."""

from __future__ import annotations

import os

__all__ = ["TraceFileError"]


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

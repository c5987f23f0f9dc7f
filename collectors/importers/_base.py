"""What every importer shares: the interface and rows → span table."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ttft.collectors._spans import to_span_table
from ttft.collectors.errors import TraceFileError
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


def head(path: Path, size: int = 4096) -> bytes:
    """The first ``size`` bytes of ``path`` (empty when it cannot be read or is a folder)."""
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def rows_to_table(
    rows: Iterable[Mapping[str, Any]], path: Path, source_format: str, **metadata: Any
) -> pa.Table:
    """Row dicts (span-record columns) → a span table with the import's metadata.

    Raises:
        TraceFileError: a row does not fit the schema (the message names the row).
    """
    try:
        table = to_span_table(list(rows))
    except ValueError as exc:
        raise TraceFileError(path, str(exc)) from None
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source_format": source_format,
        "source": str(path),
        **metadata,
    }
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})

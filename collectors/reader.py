"""The one way to read a trace: any format ttft imports, stages mapped once, here.

Every command and library function reads through :func:`read_spans`, so two commands never
give two answers for one file: ttft's own Parquet (a file or a directory of parts) and the
other systems' formats (`ttft.collectors.importers.IMPORTERS`) all come back with exactly
``SPAN_SCHEMA`` and with serving stacks' span names mapped onto ttft's stages
(`ttft.collectors.importers.mapping`). A trace written by ``ttft collect`` or ``ttft trace``
may hold a vLLM server's spans: the mapping applies to ttft's format too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.collectors._files import parts_dir
from ttft.collectors.errors import TraceFileError
from ttft.collectors.importers import IMPORTERS
from ttft.collectors.importers.mapping import StageMapping, default_mapping, load_mapping
from ttft.tracer.schema import METADATA_KEY

__all__ = ["guess_format", "read_spans", "run_metadata"]


def _exists(path: Path) -> bool:
    """``path`` exists, or is a ttft trace a crashed writer left as ``path.parts/``."""
    return path.exists() or parts_dir(path).is_dir()


def guess_format(path: str | os.PathLike[str]) -> str:
    """The name of the first importer that can open ``path``.

    Raises:
        TraceFileError: the path does not exist, or no importer recognises it.
    """
    path = Path(path)
    if not _exists(path):
        raise TraceFileError(path, "does not exist")
    for name, importer in IMPORTERS.items():
        if importer.guess_can_open(path):
            return name
    expected = "; ".join(f"{i.description} (--format {n})" for n, i in IMPORTERS.items())
    raise TraceFileError(path, f"not a trace format ttft reads; expected one of: {expected}")


def _mapping(mapping: StageMapping | str | os.PathLike[str] | None) -> StageMapping:
    """The rules to apply: the built-in table, ``mapping`` itself, or the built-in table
    extended by the TOML file at ``mapping``."""
    if mapping is None:
        return default_mapping()
    if isinstance(mapping, StageMapping):
        return mapping
    return load_mapping(mapping)


def read_spans(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    mapping: StageMapping | str | os.PathLike[str] | None = None,
) -> pa.Table:
    """Read a trace in any format, with stages mapped.

    Args:
        path: a trace file, or a directory of ttft part files (also the ``<path>.parts``
            directory a writer that did not close left behind).
        format: an `IMPORTERS` name (``ttft``, ``otlp-json``, ``otlp-proto``, ``jaeger``,
            ``chrome``); None to guess from the file's first bytes.
        mapping: the stage rules: None for the built-in ones (vLLM, SGLang, TGI); the path
            of a TOML rules file, whose rules are tried before the built-in ones; or a
            `StageMapping`, applied as it is (e.g. ``default_mapping().extended(mine)``).

    Returns:
        A table with exactly ``SPAN_SCHEMA`` whose schema metadata holds the run metadata
        under ``METADATA_KEY`` (see :func:`run_metadata`).

    Raises:
        TraceFileError: the path is missing or unrecognised, the format name unknown, the
            file breaks its format (named by file and row, line or frame).
        ValueError: the mapping file cannot be read or holds a bad rule (the message names
            the file, the rule and the field).
    """
    path = Path(path)
    rules = _mapping(mapping)
    if format is None:
        format = guess_format(path)
    elif format not in IMPORTERS:
        raise TraceFileError(path, f"unknown format {format!r}; known: {', '.join(IMPORTERS)}")
    elif not _exists(path):
        raise TraceFileError(path, "does not exist")
    return rules.apply(IMPORTERS[format].read(path))


def run_metadata(table: pa.Table) -> dict[str, Any]:
    """The run metadata a table from :func:`read_spans` carries (empty when it has none)."""
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else {}

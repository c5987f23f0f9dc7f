"""Importers: trace files of other systems → ttft's span table.

Each format is one module with one small class (``name``, ``guess_can_open(path)``,
``read(path) -> pyarrow.Table``), registered in `IMPORTERS`. `read_any` picks the format
(or takes the one named), reads, and maps serving stacks' span names onto ttft's stages
(`ttft.collectors.importers.mapping`), so ``ttft analyze``, ``report`` and ``export``
attribute any of them with the same rules.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from ttft.collectors.importers._base import Importer, TraceImportError, rows_to_table
from ttft.collectors.importers.chrome import ChromeTrace
from ttft.collectors.importers.jaeger import JaegerJSON
from ttft.collectors.importers.otlp import OTLPJsonLines, OTLPProto
from ttft.collectors.importers.ttft_parquet import TTFTParquet

IMPORTERS: dict[str, Importer] = {i.name: i for i in (
    TTFTParquet(), JaegerJSON(), ChromeTrace(), OTLPJsonLines(), OTLPProto())}
"""Every importer by name, in the order `guess_format` tries them."""

__all__ = [
    "IMPORTERS",
    "Importer",
    "TraceImportError",
    "guess_format",
    "read_any",
    "rows_to_table",
]


def _exists(path: Path) -> bool:
    """``path`` exists, or is a ttft trace a crashed writer left as ``path.parts/``."""
    from ttft.collectors.store import parts_dir

    return path.exists() or parts_dir(path).is_dir()


def guess_format(path: str | os.PathLike[str]) -> str:
    """The name of the first importer that can open ``path``.

    Raises:
        TraceImportError: the path does not exist, or no importer recognises it.
    """
    path = Path(path)
    if not _exists(path):
        raise TraceImportError(path, "does not exist")
    for name, importer in IMPORTERS.items():
        if importer.guess_can_open(path):
            return name
    expected = "; ".join(f"{i.description} (--format {n})" for n, i in IMPORTERS.items())
    raise TraceImportError(path, f"not a trace format ttft reads; expected one of: {expected}")


def read_any(
    path: str | os.PathLike[str], *, format: str | None = None, mapping=None
) -> pa.Table:
    """Read ``path`` in its format (guessed, or ``format``) and map stages.

    Args:
        path: a trace file (or a directory of ttft part files).
        format: an `IMPORTERS` name; None to guess.
        mapping: a `ttft.collectors.importers.mapping.StageMapping` (default: the
            built-in table for vLLM, SGLang and TGI).

    Raises:
        TraceImportError: unknown format name, unrecognised or unreadable file.
    """
    path = Path(path)
    if format is None:
        format = guess_format(path)
    elif format not in IMPORTERS:
        raise TraceImportError(path, f"unknown format {format!r}; known: {', '.join(IMPORTERS)}")
    elif not _exists(path):
        raise TraceImportError(path, "does not exist")
    table = IMPORTERS[format].read(path)
    # ttft's own traces too: one written by ``ttft collect`` may hold a serving stack's spans.
    from ttft.collectors.importers.mapping import default_mapping

    return (mapping or default_mapping()).apply(table)

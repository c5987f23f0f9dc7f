"""Reading a trace for a command: one error line (exit code 2) naming the file on failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from ttft.reports._app import fail, progress
from ttft.tracer.schema import METADATA_KEY


def load_trace(path: Path) -> tuple[pa.Table, dict[str, Any]]:
    """The span table of ``path`` (a file or a directory of parts) and its run metadata.

    Raises:
        typer.Exit: code 2 after printing what was wrong with the file.
    """
    from ttft.collectors.store import TraceFileError, read_trace

    try:
        with progress(f"reading {path}"):
            table = read_trace(path)
    except TraceFileError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}") from None
    metadata = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    return table, metadata

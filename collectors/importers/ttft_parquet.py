"""ttft's own Parquet traces (a file or a directory of part files)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ttft.collectors.importers._base import TraceImportError, head


class TTFTParquet:
    name = "ttft"
    description = "ttft Parquet trace (a file, or a directory of part files)"

    def guess_can_open(self, path: Path) -> bool:
        from ttft.collectors.store import parts_dir

        if not path.exists() and parts_dir(path).is_dir():
            return True  # the parts a crashed writer left; read_trace reads them
        if path.is_dir():
            return any(path.glob("*.parquet"))
        return head(path, 4) == b"PAR1"

    def read(self, path: Path) -> pa.Table:
        from ttft.collectors.store import TraceFileError, read_trace

        try:
            return read_trace(path)
        except TraceFileError as exc:
            raise TraceImportError(path, str(exc).removeprefix(f"{path}: ")) from None

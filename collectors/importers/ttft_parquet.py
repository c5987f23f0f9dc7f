"""ttft's own Parquet traces (a file, a directory of part files, or a partitioned dataset)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ttft.collectors.dataset import looks_like_dataset, read_dataset
from ttft.collectors.importers._base import head
from ttft.collectors.layout import parts_dir
from ttft.collectors.parquet import read_parquet


class TTFTParquet:
    name = "ttft"
    description = "ttft Parquet trace (a file, or a directory of part files)"

    def guess_can_open(self, path: Path) -> bool:
        if not path.exists() and parts_dir(path).is_dir():
            return True  # the parts a crashed writer left; read_parquet reads them
        if path.is_dir():
            return True  # only ttft reads directories; read_parquet names what is missing
        return head(path, 4) == b"PAR1"

    def read(self, path: Path) -> pa.Table:
        if looks_like_dataset(path):  # before part=K/ directories read as a plain directory
            return read_dataset(path, native=True)  # read_spans gives the ids as asked
        return read_parquet(path)

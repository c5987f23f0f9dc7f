"""What every benchmark hands ``benchmarks/run.py``: its figures, written as JSON with
``--json PATH`` beside the table the benchmark prints itself."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Figure:
    """One measured figure, with the goal it is held to (``goal`` "-" and ``met`` None when
    it is context, such as the machine's own matmul rate)."""

    benchmark: str
    name: str
    value: float
    unit: str
    goal: str = "-"
    met: bool | None = None


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")


def write(path: Path | None, figures: list[Figure]) -> None:
    """Write ``figures`` to ``path`` as a JSON list (nothing when ``path`` is None)."""
    if path is not None:
        path.write_text(json.dumps([asdict(f) for f in figures], indent=1))

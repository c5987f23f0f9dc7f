"""``run_validate`` for tests: a run that misses is run once more before it counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ttft.reports.runs.validate import run_validate


def validated(tmp_path: Path, **kwargs: Any):
    """``run_validate(tmp_path / "first", **kwargs)``, and when it misses, the same again.

    A loaded 2-core machine overslept sleeps of the injected delays: once 5 ms by 1.06 ms
    in the median of 8 requests, once a 15 ms transfer delay by 1.8 ms (tolerance 1 ms). A
    second run tells that noise from a systematic miss, which fails both."""
    result = run_validate(tmp_path / "first", **kwargs)
    return result if result.ok else run_validate(tmp_path / "again", **kwargs)

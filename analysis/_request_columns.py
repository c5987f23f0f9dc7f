"""The columns that name a request (``trace_id``, ``request_id``, ``condition``), taken from
``Assembly.requests`` for the frames of blame, prefill scaling and regime, so every
analysis names a request as attribution does."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from ttft.analysis.assemble import Assembly


def request_columns(asm: Assembly, req: np.ndarray, *columns: str) -> dict[str, pd.Series]:
    """``{column: asm.requests[column] of each request index in req}``, None for -1 (a row
    of no request) and for a missing value, as object columns (pandas would infer strings
    with NaN)."""
    out = {}
    for column in columns:
        known = asm.requests[column].to_numpy(dtype=object, na_value=None)
        values = np.append(known, None)
        out[column] = pd.Series(values[req], dtype=object)
    return out

"""The condition rule (``cold`` / ``prefix_hit``) that ``analysis.assemble`` labels each
request by, and the largest ``cached_tokens`` per group that prefill scaling reports too."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ttft.analysis import _column_arrays as col
from ttft.tracer.schema import ATTR_CACHED_TOKENS

_NAMES = np.array([None, "cold", "prefix_hit"], dtype=object)


def max_cached(
    attrs: pa.ChunkedArray | pa.Array, rows: np.ndarray, group: np.ndarray, n_groups: int
) -> np.ndarray:
    """The largest ``cached_tokens`` attribute on ``rows`` per group code (``group`` is
    per row); -1 where a group has none."""
    best = np.full(n_groups, -1, np.int64)
    if len(rows):
        np.maximum.at(best, group[rows], col.int_attribute(attrs, rows, ATTR_CACHED_TOKENS))
    return best


def conditions(server_cached: np.ndarray, prefill_cached: np.ndarray) -> np.ndarray:
    """``prefix_hit`` / ``cold`` / None per group: the ``cached_tokens`` of its ``server``
    span, else the largest of its ``prefill`` and ``prefill.chunk`` spans (both from
    `max_cached`); more than 0 is a prefix hit, 0 is cold, none is unknown."""
    best = np.where(server_cached >= 0, server_cached, prefill_cached)
    return _NAMES[np.where(best > 0, 2, np.where(best == 0, 1, 0))]

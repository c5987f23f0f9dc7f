"""The per-request values every summary is made of, beside the attribution.

A summary needs, besides each request's parts (``Attribution``), three tables of values per
request: what happened after its first token (``analysis.after_first_token``), its load
figures (``analysis.load``) and its K/V transfer (``analysis.transfer``). They are taken
from one assembly (`request_values`) and read part by part (``order_stats.PartSet``), so a
summary never reads an assembly: it is built from the values alone, whether they came from
one table or from a dataset's partitions (docs/architecture.md, "One program").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ttft.analysis.after_first_token import after_first_token_values
from ttft.analysis.assemble import Assembly
from ttft.analysis.attribution import Attribution
from ttft.analysis.load import load_values
from ttft.analysis.transfer import transfers

__all__ = ["RequestValues", "request_values", "stack_frames"]


@dataclass
class RequestValues:
    """The values of an attribution's requests: ``after_first_token``
    (`after_first_token_values` of its ok requests), ``load`` (``load_values`` of every
    request) and ``transfers`` (``transfers`` of its ok requests)."""

    after_first_token: dict[str, np.ndarray]
    load: dict[str, np.ndarray]
    transfers: pd.DataFrame


def request_values(asm: Assembly, attr: Attribution) -> RequestValues:
    """The `RequestValues` of ``attr``, attributed from ``asm``."""
    ok = attr.requests["request"].to_numpy()
    after = after_first_token_values(asm, ok)
    return RequestValues(after, load_values(asm, attr, after), transfers(asm, ok))


def stack_frames(frames: Sequence[pd.DataFrame], counts: Sequence[int] | None = None
                 ) -> pd.DataFrame:
    """Frames concatenated in order; with ``counts`` (requests of each part), each part's
    ``request`` column moved past the parts before it."""
    frames = list(frames)
    if counts is not None:
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        frames = [f.assign(request=f["request"].to_numpy(np.int64) + first)
                  for f, first in zip(frames, firsts, strict=True)]
    kept = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(kept, ignore_index=True)

"""Which stages stand between the requests and a TTFT SLO, from per-request parts: pure
functions (no I/O).

For the requests that miss the SLO (TTFT above it), each stage's **rescue share** is the
share of them that would meet it had that one stage taken its median time for the
request's condition (``cold``, ``prefix_hit``, or none), every other part unchanged: TTFT
``- attributed[stage] + median``, exact from the attributed parts (which sum to TTFT). The
**smallest set** is the fewest stages whose time, cut to that median wherever it was above
it (``min(attributed, median)``), would bring TTFT's p99 to the SLO or under: every set of
one stage, then of two, and so on, the lowest p99 winning among sets of one size; past
`MAX_EXHAUSTIVE` evaluations of a size, stages are added greedily (each step the one that
lowers p99 most) and the result says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis.attribution import Attribution
from ttft.analysis.load import goodput

__all__ = ["MAX_EXHAUSTIVE", "goodput_summary", "slo_attribution"]

MAX_EXHAUSTIVE = 50_000_000
"""Largest (sets × requests) one size of the exhaustive search may evaluate."""
_NS_PER_MS = 1e6


def _medians(att: np.ndarray, conditions: np.ndarray) -> np.ndarray:
    """Per request and stage, the median attributed ns among the requests of its
    condition."""
    out = np.zeros(att.shape, np.float64)
    keys = np.where(pd.isna(conditions), "", conditions).astype(str)
    for key in np.unique(keys):
        mine = keys == key
        out[mine] = np.median(att[mine], axis=0)
    return out


def _p99(ttft_ns: np.ndarray) -> float:
    return float(np.percentile(ttft_ns, 99))


def slo_attribution(attr: Attribution, slo_ms: float) -> dict[str, Any] | None:
    """The rescue share of every stage with time and the smallest set of stages for a TTFT
    SLO of ``slo_ms`` (module docstring), or None when no request has a TTFT.

    Returns:
        ``slo_ms``; ``requests`` (with a TTFT) and ``missing`` (above the SLO);
        ``stages``: per stage with any time, ``{"rescued": n, "share": n / missing}``
        (share 0 when none misses), largest share first; ``p99_ms`` now; ``smallest_set``
        (stage names, [] when p99 already meets the SLO, None when even every stage at its
        median does not) with ``p99_after_ms`` and ``search`` (``exhaustive`` or
        ``greedy``).
    """
    ttft = attr.requests["ttft_ns"].to_numpy(np.int64)
    if len(ttft) == 0:
        return None
    slo_ns = slo_ms * _NS_PER_MS
    att_all = attr.attributed.to_numpy(np.int64)
    used = (att_all > 0).any(axis=0)
    names = list(np.asarray(attr.attributed.columns)[used])
    att = att_all[:, used]
    median = _medians(att, attr.requests["condition"].to_numpy(dtype=object))
    miss = ttft > slo_ns
    missing = int(miss.sum())
    rescued = ((ttft[miss, None] - att[miss] + median[miss]) <= slo_ns).sum(axis=0)
    stages = {
        name: {"rescued": int(n), "share": float(n / missing) if missing else 0.0}
        for name, n in zip(names, rescued, strict=True)
    }
    stages = dict(sorted(stages.items(), key=lambda kv: (-kv[1]["rescued"], kv[0])))
    cut = np.maximum(att - median, 0)  # what cutting each stage to its median saves
    chosen, after, search = _smallest_set(ttft, cut, slo_ns)
    return {
        "slo_ms": slo_ms,
        "requests": int(len(ttft)),
        "missing": missing,
        "stages": stages,
        "p99_ms": float(np.percentile(ttft / _NS_PER_MS, 99)),  # as the summary's
        "smallest_set": None if chosen is None else [names[i] for i in chosen],
        "p99_after_ms": after / _NS_PER_MS,
        "search": search,
    }


def _smallest_set(ttft: np.ndarray, cut: np.ndarray, slo_ns: float
                  ) -> tuple[list[int] | None, float, str]:
    """The fewest columns of ``cut`` whose savings bring p99 under ``slo_ns``."""
    now = _p99(ttft)
    if now <= slo_ns:
        return [], now, "exhaustive"
    n_stages = cut.shape[1]
    best_all = _p99(ttft - cut.sum(axis=1))
    if best_all > slo_ns:
        return None, best_all, "exhaustive"
    for size in range(1, n_stages + 1):
        sets = list(combinations(range(n_stages), size))
        if len(sets) * len(ttft) > MAX_EXHAUSTIVE:
            return _greedy(ttft, cut, slo_ns)
        scored = [(_p99(ttft - cut[:, list(s)].sum(axis=1)), s) for s in sets]
        p99, best = min(scored)
        if p99 <= slo_ns:
            return list(best), p99, "exhaustive"
    return None, best_all, "exhaustive"  # not reached: the full set meets it


def _greedy(ttft: np.ndarray, cut: np.ndarray, slo_ns: float
            ) -> tuple[list[int] | None, float, str]:
    chosen: list[int] = []
    current = ttft.astype(np.int64)
    p99 = _p99(current)
    while p99 > slo_ns:
        left = [i for i in range(cut.shape[1]) if i not in chosen]
        p99, pick = min((_p99(current - cut[:, i]), i) for i in left)
        chosen.append(pick)
        current = current - cut[:, pick]
    return chosen, p99, "greedy"


def goodput_summary(attr: Attribution, loads: Mapping[str, np.ndarray],
             slo: Mapping[str, float] | None) -> dict[str, Any] | None:
    """``Summary.goodput`` (``analysis.load.goodput``); with a TTFT SLO also
    ``ttft_stages``: which stages stand between the requests that miss it and the SLO
    (`slo_attribution`). None without SLOs."""
    if not slo:
        return None
    out = dict(goodput(loads, len(attr.failed), slo))
    if "ttft" in slo:
        out["ttft_stages"] = slo_attribution(attr, slo["ttft"])
    return out

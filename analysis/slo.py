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

from ttft.analysis.attribution import Attribution
from ttft.analysis.load import check_slo, goodput_figures, meeting_slo
from ttft.analysis.order_stats import PartSet, medians, percentiles
from ttft.analysis.part_figures import EachPart, PartRows, one_part, stage_matrix, stages

__all__ = ["MAX_EXHAUSTIVE", "goodput_summary", "slo_attribution", "slo_figures"]

MAX_EXHAUSTIVE = 50_000_000
"""Largest (sets × requests) one size of the exhaustive search may evaluate."""
_NS_PER_MS = 1e6


def _p99s(parts: PartSet, columns: list) -> list[float]:
    return [float(found[0]) for found in percentiles(parts, columns, [99])]


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
    return slo_figures(one_part(attr), slo_ms)


def slo_figures(parts: PartSet, slo_ms: float) -> dict[str, Any] | None:
    """`slo_attribution` of the requests of a `PartSet` of ``PartRows``."""
    n = sum(parts.map(lambda p: len(p.ttft)))
    if n == 0:
        return None
    slo_ns = slo_ms * _NS_PER_MS
    used = np.flatnonzero(np.any(parts.map(lambda p: (p.att > 0).any(axis=0)), axis=0))
    names = list(stages(parts)[used])
    keys = sorted(set().union(*parts.map(lambda p: set(p.condition_keys))))
    matrices = EachPart(lambda p: {key: stage_matrix(p.att, p.condition_keys == key, used)
                                   for key in keys})
    found = medians(parts, [(lambda p, key=key, i=i: matrices(p)[key][i])
                            for key in keys for i in range(len(used))])
    table = np.asarray([np.nan if m is None else m for m in found],
                       np.float64).reshape(len(keys), len(used))

    def median(p: PartRows) -> np.ndarray:
        """Per request and stage, the median attributed ns of its condition."""
        if "median" not in p.cache:
            out = np.zeros((len(p.ttft), len(used)), np.float64)
            mine = p.condition_keys
            for k, key in enumerate(keys):
                out[mine == key] = table[k]
            p.cache["median"] = out
        return p.cache["median"]

    def rescued(p: PartRows) -> tuple[int, np.ndarray]:
        miss = p.ttft > slo_ns
        att = p.att[:, used]
        return int(miss.sum()), ((p.ttft[miss, None] - att[miss] + median(p)[miss])
                                 <= slo_ns).sum(axis=0)

    counts = parts.map(rescued)
    missing = sum(c[0] for c in counts)
    saved = np.sum([c[1] for c in counts], axis=0)
    stage_shares = {
        name: {"rescued": int(k), "share": float(k / missing) if missing else 0.0}
        for name, k in zip(names, saved, strict=True)
    }
    stage_shares = dict(sorted(stage_shares.items(), key=lambda kv: (-kv[1]["rescued"], kv[0])))

    def cut(p: PartRows) -> np.ndarray:
        """What cutting each stage to its median saves, per request."""
        if "cut" not in p.cache:
            p.cache["cut"] = np.maximum(p.att[:, used] - median(p), 0)
        return p.cache["cut"]

    chosen, after, search = _smallest_set(parts, n, cut, len(used), slo_ns)
    (p99_ms,) = percentiles(parts, [lambda p: p.ttft / _NS_PER_MS], [99])
    return {
        "slo_ms": slo_ms,
        "requests": int(n),
        "missing": missing,
        "stages": stage_shares,
        "p99_ms": float(p99_ms[0]),  # as the summary's
        "smallest_set": None if chosen is None else [names[i] for i in chosen],
        "p99_after_ms": after / _NS_PER_MS,
        "search": search,
    }


def _smallest_set(parts: PartSet, n: int, cut: Any, n_stages: int, slo_ns: float
                  ) -> tuple[list[int] | None, float, str]:
    """The fewest columns of ``cut`` whose savings bring p99 under ``slo_ns``."""
    (now,) = _p99s(parts, [lambda p: p.ttft])
    if now <= slo_ns:
        return [], now, "exhaustive"
    (best_all,) = _p99s(parts, [lambda p: p.ttft - cut(p).sum(axis=1)])
    if best_all > slo_ns:
        return None, best_all, "exhaustive"
    for size in range(1, n_stages + 1):
        sets = list(combinations(range(n_stages), size))
        if len(sets) * n > MAX_EXHAUSTIVE:
            return _greedy(parts, cut, n_stages, slo_ns)
        found = _p99s(parts, [(lambda p, s=s: p.ttft - cut(p)[:, list(s)].sum(axis=1))
                              for s in sets])
        p99, best = min(zip(found, sets, strict=True))
        if p99 <= slo_ns:
            return list(best), p99, "exhaustive"
    return None, best_all, "exhaustive"  # not reached: the full set meets it


def _greedy(parts: PartSet, cut: Any, n_stages: int, slo_ns: float
            ) -> tuple[list[int] | None, float, str]:
    chosen: list[int] = []

    def current(p: PartRows) -> np.ndarray:
        out = p.ttft.astype(np.int64)
        for i in chosen:
            out = out - cut(p)[:, i]
        return out

    (p99,) = _p99s(parts, [current])
    while p99 > slo_ns:
        left = [i for i in range(n_stages) if i not in chosen]
        found = _p99s(parts, [(lambda p, i=i: current(p) - cut(p)[:, i]) for i in left])
        p99, pick = min(zip(found, left, strict=True))
        chosen.append(pick)
    return chosen, p99, "greedy"


def goodput_summary(parts: PartSet, slo: Mapping[str, float] | None,
                    duration_ns: int | None) -> dict[str, Any] | None:
    """``Summary.goodput`` of a `PartSet` of ``PartRows`` (``analysis.load.goodput``,
    ``per_s`` over the run's ``duration_ns``, None without one); with a TTFT SLO also
    ``ttft_stages``: which stages stand between the requests that miss it and the SLO
    (`slo_figures`). None without SLOs.

    Raises:
        ValueError: an unknown metric, or a limit that is not a positive number.
    """
    if not slo:
        return None
    check_slo(slo)
    meeting = sum(parts.map(lambda p: meeting_slo(p.values.load, slo)))
    total = sum(parts.map(lambda p: len(p.ttft) + len(p.attribution.failed)))
    out: dict[str, Any] = goodput_figures(slo, meeting, total, duration_ns)
    if "ttft" in slo:
        out["ttft_stages"] = slo_figures(parts, slo["ttft"])
    return out

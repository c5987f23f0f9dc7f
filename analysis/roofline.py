"""The roofline rule (`roofline_place`) and the figures of prefill chunks' regime rows
(``analysis.regime.regime``'s frame, one row per chunk).

`regime_figures` gives, over the chunk rows of every part of a trace (an
``order_stats.PartSet``: one frame in memory, or a dataset's partitions, spilled by a Dask
driver that holds none of them), the summary per condition and chunk bucket and how far
the chunks went past the peaks (`RooflineExcess`). Both are reductions: counts, integer
sums, exactly rounded float sums (``order_stats.exact_sum``), exact medians
(``order_stats.medians``) and maxima, so the figures never depend on how the chunks were
split among parts or in what order they came. `regime_summary` and `roofline_excess` are
those figures of one frame. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ttft.analysis._model_device import Peaks
from ttft.analysis.order_stats import InMemory, PartSet, exact_sum, medians

__all__ = ["SUMMARY_COLUMNS", "RooflineExcess", "chunk_bucket", "regime_figures",
           "regime_summary", "roofline_excess", "roofline_place"]


def roofline_place(
    peaks: Peaks | None, intensity: Any, achieved_flops_per_s: Any
) -> dict[str, Any]:
    """Where work of ``intensity`` FLOP/B that ran at ``achieved_flops_per_s`` sits on the
    roofline of ``peaks`` (arrays or scalars, element by element): ``bound`` (``compute``
    at or above the ridge, else ``memory``; None without peaks), ``attainable_flops_per_s``
    ``min(peak, intensity·bandwidth)``, ``above_roofline`` (achieved > attainable) and
    ``roofline_fraction`` achieved/attainable, NaN where above the roofline, where achieved
    is NaN or without peaks. The one rule of ``analysis.regime.regime``,
    `regime_summary` and ``ttft profile-prefill``.
    """
    intensity = np.asarray(intensity, dtype=np.float64)
    achieved = np.asarray(achieved_flops_per_s, dtype=np.float64)
    if peaks is None:
        nan = np.full(np.broadcast(intensity, achieved).shape, np.nan)
        out = {"bound": np.full(nan.shape, None, dtype=object), "attainable_flops_per_s": nan,
               "roofline_fraction": nan, "above_roofline": np.zeros(nan.shape, bool)}  # fmt: skip
    else:
        attainable = np.minimum(peaks.flops_per_s, intensity * peaks.bytes_per_s)
        above = achieved > attainable  # NaN compares False
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.where(above, np.nan, achieved / attainable)
        bound = np.where(intensity >= peaks.ridge, "compute", "memory").astype(object)
        out = {"bound": bound, "attainable_flops_per_s": attainable,
               "roofline_fraction": fraction, "above_roofline": above}  # fmt: skip
    if intensity.ndim == 0 and achieved.ndim == 0:
        return {k: v.item() for k, v in out.items()}
    return out


@dataclass(frozen=True)
class RooflineExcess:
    """How far a trace's chunks went past the roofline of ``peaks`` (`roofline_excess`).

    ``chunks`` of ``of_chunks`` ran above their attainable FLOP/s; the best achieved
    FLOP/s and bytes/s (bytes by the cost model) over all chunks; ``flops`` and ``bytes``
    whether those best rates exceed the peak FLOP/s and the peak bandwidth themselves. The
    device can do at least the best rates, whatever the peaks say.
    """

    chunks: int
    of_chunks: int
    best_flops_per_s: float
    best_bytes_per_s: float
    flops: bool
    bytes: bool


SUMMARY_COLUMNS = (
    "condition", "chunk_bucket", "chunks", "tokens", "median_intensity", "ridge", "bound",
    "compute_bound_share", "achieved_flops_per_s", "attainable_flops_per_s",
    "roofline_fraction", "above_roofline",
)  # fmt: skip
_CONDITIONS = ("cold", "prefix_hit")
"""The conditions with rows of their own; every other (or none) is only in ``all``."""


def chunk_bucket(chunk_tokens: int) -> str:
    """Power-of-two bucket of a chunk size: ``"1"``, ``"2-3"``, …, ``"256-511"``."""
    return _bucket_name(_bucket_low(chunk_tokens))


def _bucket_low(chunk_tokens: int) -> int:
    return 1 if chunk_tokens <= 1 else 1 << (int(chunk_tokens).bit_length() - 1)


def _bucket_name(low: int) -> str:
    return "1" if low == 1 else f"{low}-{2 * low - 1}"


def _bucket_lows(tokens: np.ndarray) -> np.ndarray:
    """`chunk_bucket`'s lower bound of each chunk size (1: the bucket ``"1"``)."""
    sizes, inverse = np.unique(np.asarray(tokens, np.int64), return_inverse=True)
    return np.asarray([_bucket_low(int(t)) for t in sizes], np.int64)[inverse]


def _condition_keys(frame: pd.DataFrame) -> np.ndarray:
    """Each chunk's `_CONDITIONS` index; ``len(_CONDITIONS)`` for any other or none."""
    cond = frame["condition"].to_numpy(object)
    key = np.full(len(frame), len(_CONDITIONS), np.int64)
    for k, name in enumerate(_CONDITIONS):
        key[cond == name] = k
    return key


@dataclass
class _PartSums:
    """One part's chunks reduced: per (condition key, bucket low) ``[chunks, tokens,
    flops, bytes, positive duration ns, compute-bound chunks]`` (exact sums), its
    non-null conditions and whether one was null; and for the excess, the chunks above
    their roofline, all chunks and the best achieved FLOP/s and bytes/s (NaN: none)."""

    groups: dict[tuple[int, int], list[Any]]
    conditions: set[str]
    null_condition: bool
    above: int
    chunks: int
    best_flops: float
    best_bytes: float


def _best(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.max()) if len(finite) else math.nan


def _sums(frame: pd.DataFrame | None, peaks: Peaks | None, summary: bool) -> _PartSums | None:
    if frame is None or frame.empty:
        return None
    groups: dict[tuple[int, int], list[Any]] = {}
    conditions: set[str] = set()
    null = False
    if summary:
        key, low = _condition_keys(frame), _bucket_lows(frame["chunk_tokens"])
        tokens = frame["chunk_tokens"].to_numpy(np.int64)
        flops, nbytes = (frame[c].to_numpy(np.float64) for c in ("flops", "bytes"))
        dur = np.clip(frame["dur_ns"].to_numpy(np.int64), 0, None)
        compute = (frame["bound"] == "compute").to_numpy(bool)
        for k, lo in sorted(set(zip(key.tolist(), low.tolist(), strict=True))):
            m = (key == k) & (low == lo)
            groups[(k, lo)] = [int(m.sum()), int(tokens[m].sum()), exact_sum(flops[m]),
                               exact_sum(nbytes[m]), int(dur[m].sum()), int(compute[m].sum())]
        cond = frame["condition"]
        null = bool(cond.isna().any())
        conditions = set(cond.dropna().unique().tolist())
    above = 0
    best_flops = best_bytes = math.nan
    if peaks is not None:
        achieved = frame["achieved_flops_per_s"].to_numpy(np.float64)
        above = int(roofline_place(peaks, frame["intensity"].to_numpy(np.float64),
                                   achieved)["above_roofline"].sum())
        seconds = frame["dur_ns"].to_numpy(np.float64) / 1e9
        with np.errstate(divide="ignore", invalid="ignore"):
            moved = np.where(seconds > 0, frame["bytes"].to_numpy(np.float64) / seconds,
                             np.nan)
        best_flops, best_bytes = _best(achieved), _best(moved)
    return _PartSums(groups, conditions, null, above, len(frame), best_flops, best_bytes)


def regime_figures(parts: PartSet, peaks: Peaks | None,
                   chunks_of: Callable[[Any], pd.DataFrame | None] = lambda p: p, *,
                   summary: bool = True) -> tuple[pd.DataFrame | None, RooflineExcess | None]:
    """The summary (`regime_summary`'s rows; None without ``summary``) and the excess
    (`roofline_excess`) of the chunks of every part (``chunks_of(part)``, a `regime`
    frame or None), against ``peaks``."""
    found = [s for s in parts.map(lambda p: _sums(chunks_of(p), peaks, summary))
             if s is not None]
    return (_summary(parts, found, peaks, chunks_of) if summary else None,
            _excess(found, peaks))


def _excess(found: list[_PartSums], peaks: Peaks | None) -> RooflineExcess | None:
    above = sum(s.above for s in found)
    if peaks is None or not above:
        return None
    best_flops = _best(np.asarray([s.best_flops for s in found]))
    best_bytes = _best(np.asarray([s.best_bytes for s in found]))
    return RooflineExcess(chunks=above, of_chunks=sum(s.chunks for s in found),
                          best_flops_per_s=best_flops, best_bytes_per_s=best_bytes,
                          flops=best_flops > peaks.flops_per_s,
                          bytes=best_bytes > peaks.bytes_per_s)


def _summary(parts: PartSet, found: list[_PartSums], peaks: Peaks | None,
             chunks_of: Callable[[Any], pd.DataFrame | None]) -> pd.DataFrame:
    totals: dict[tuple[int, int], list[Any]] = {}
    for s in found:
        for group, sums in s.groups.items():
            if group in totals:
                totals[group] = [a + b for a, b in zip(totals[group], sums, strict=True)]
            else:
                totals[group] = list(sums)
    if not totals:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in SUMMARY_COLUMNS})
    conditions = set().union(*(s.conditions for s in found))
    one = (next(iter(conditions)) if len(conditions) == 1
           and not any(s.null_condition for s in found) else None)
    lows = sorted({lo for _, lo in totals})
    groups: list[tuple[str, str, set[int], set[int]]] = []
    for k, name in enumerate([*_CONDITIONS, "all"]):
        keys = {k} if name != "all" else set(range(len(_CONDITIONS) + 1))
        if not any(c in keys for c, _ in totals) or (name == "all" and one in _CONDITIONS):
            continue
        for lo in [*lows, None]:
            buckets = {lo} if lo is not None else set(lows)
            if any(c in keys and b in buckets for c, b in totals):
                groups.append((name, "all" if lo is None else _bucket_name(lo), keys, buckets))

    def intensities(keys: set[int], buckets: set[int]) -> Callable[[Any], np.ndarray]:
        def of(part: Any) -> np.ndarray:
            frame = chunks_of(part)
            if frame is None or frame.empty:
                return np.empty(0, np.float64)
            mine = (np.isin(_condition_keys(frame), list(keys))
                    & np.isin(_bucket_lows(frame["chunk_tokens"]), list(buckets)))
            values = frame["intensity"].to_numpy(np.float64)[mine]
            return values[~np.isnan(values)]  # as pandas' median skips NaN
        return of

    middles = medians(parts, [intensities(keys, buckets) for _, _, keys, buckets in groups])
    ridge = peaks.ridge if peaks is not None else math.nan
    out = []
    for (name, bucket, keys, buckets), middle in zip(groups, middles, strict=True):
        mine = [sums for (c, b), sums in totals.items() if c in keys and b in buckets]
        chunks, tokens, flops, nbytes, dur, compute = (sum(s[i] for s in mine)
                                                       for i in range(6))
        flops, nbytes, seconds = float(flops), float(nbytes), float(dur) / 1e9
        achieved = flops / seconds if seconds > 0 else math.nan
        placed = roofline_place(peaks, flops / nbytes, achieved)
        out.append({
            "condition": name, "chunk_bucket": bucket, "chunks": chunks, "tokens": tokens,
            "median_intensity": math.nan if middle is None else float(middle),
            "ridge": ridge, "bound": placed["bound"], "compute_bound_share": compute / chunks,
            "achieved_flops_per_s": achieved,
            "attainable_flops_per_s": placed["attainable_flops_per_s"],
            "roofline_fraction": placed["roofline_fraction"],
            "above_roofline": bool(placed["above_roofline"]),
        })
    return pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))


def regime_summary(frame: pd.DataFrame, peaks: Peaks | None = None) -> pd.DataFrame:
    """Per condition (``cold``, ``prefix_hit``, then ``all``, which mixes both and chunks
    of unknown condition, left out when every chunk is of one of the two) and chunk
    bucket (`chunk_bucket`, ascending, then ``all``): chunks, tokens, the median chunk
    intensity, the ridge, ``bound`` and the achieved, attainable and fraction figures of
    the group as a whole (its FLOPs over its bytes and over its summed duration, placed by
    `roofline_place`: no fraction and ``above_roofline`` True where the group beat its
    roofline), and ``compute_bound_share`` (of its chunks). ``peaks`` defaults to those
    `regime` used (``frame.attrs["peaks"]``); without any, the roofline columns are NaN
    and ``bound`` None.
    """
    peaks = peaks if peaks is not None else frame.attrs.get("peaks")
    found, _ = regime_figures(InMemory([frame]), peaks)
    assert found is not None
    return found


def roofline_excess(frame: pd.DataFrame, peaks: Peaks | None = None) -> RooflineExcess | None:
    """What `regime`'s ``frame`` achieved beyond ``peaks`` (default: those it used,
    ``frame.attrs["peaks"]``): None without peaks or when every chunk is on or under its
    roofline."""
    peaks = peaks if peaks is not None else frame.attrs.get("peaks")
    return regime_figures(InMemory([frame]), peaks, summary=False)[1]

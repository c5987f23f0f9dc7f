"""Exact percentiles over values spread across parts, without holding them together.

A `PartSet` is a trace's parts where a summary reads them (``analysis.part_sets``): in this
process's memory (`InMemory`: one table analysed whole), or spilled to disk as each part
arrives and read back one at a time (`Spilled`: a dataset's partitions, so the process
merging them holds no request; docs/architecture.md, "One program"). ``map(fn)`` is ``fn``
of every part, in order: every figure of a summary is a reduction of such results.

`percentiles` is numpy's linear percentile (``np.percentile``, bit for bit) of a column of
values each part gives, found by histogram refinement: one pass counts the values and
their bounds; while the values between the bounds around a wanted rank are more than a
part set may fetch (`PartSet.fetch_limit`), a pass counts them in at most `BINS` bins of
the values' order-preserving integer keys (bins of a power of two keys each, found by a
shift) and keeps the bin holding the rank; then one pass fetches the values left around
each rank, which give the order statistics, and numpy's interpolation between them is the
figure. Each pass reads every part once, for `BATCH` columns at once; a wanted value is
found within a few passes (the bounds shrink `BINS` times a pass), whatever the
distribution. Parts held whole (no fetch limit) give every value with the bounds: one pass.
Memory is O(`BATCH` × (`BINS` + fetch limit)), whatever the number of parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ttft.analysis.part_sets import (
    FETCH_LIMIT,
    KEEP_BYTES,
    InMemory,
    Keyed,
    PartSet,
    Spilled,
    keyed_bytes,
    load_keyed,
    save_keyed,
)

__all__ = ["BATCH", "BINS", "FETCH_LIMIT", "HELD_BATCH", "KEEP_BYTES", "InMemory", "Keyed",
           "Named", "PartSet", "Spilled", "exact_sum", "keyed_bytes", "load_keyed", "medians",
           "order_statistics", "percentiles", "remembered", "save_keyed"]

BINS = 1 << 12
"""Bins of one refinement pass."""
BATCH = 64
"""Columns refined together over parts read back pass by pass: each holds `BINS` counts
and at most `FETCH_LIMIT` fetched keys a rank (64 columns: about 20 MB), and every
column more in a batch is a pass fewer (a summary's 25 stages are one batch)."""
HELD_BATCH = 16
"""Columns taken together over parts held whole (no fetch limit): each holds every one of
its values' keys while its batch is selected."""
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)

Column = Callable[[Any], np.ndarray]
"""A part's values of one column (1-D, integer, boolean or float)."""


def _keys(values: np.ndarray) -> np.ndarray:
    """Order-preserving int64 keys of values (floats by their bits, negatives flipped;
    -0.0 taken as 0.0, which numpy's partition does not tell apart either)."""
    if values.dtype.kind == "f":
        bits = np.ascontiguousarray(values + 0.0, np.float64).view(np.int64)
        return np.where(bits < 0, bits ^ _FLIP, bits)
    return np.asarray(values, np.int64)


def _ranks(n: int, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's linear method: the ranks either side of each percentile and the weight."""
    virtual = (n - 1) * np.true_divide(np.asarray(qs, np.float64), 100)
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1
    previous[above] = following[above] = n - 1
    below = virtual < 0
    previous[below] = following[below] = 0
    gamma = virtual - np.where(above, -1, previous)  # as numpy takes it: -1 above the top
    return previous.astype(np.intp), following.astype(np.intp), gamma


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's interpolation between neighbouring order statistics."""
    diff = b - a
    out = np.add(a, diff * t)
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5, casting="unsafe")
    return out


class Named:
    """A column under a name that says what it holds (``("stage", "cold", 3)``): its
    percentiles found by `remembered` are kept by the part set under the name and the
    percentiles asked, so a later `percentiles` of the same name takes no pass."""

    def __init__(self, name: tuple[Any, ...], column: Column) -> None:
        self.name, self.column = name, column

    def __call__(self, part: Any) -> np.ndarray:
        return self.column(part)


def _wanted_ranks(qs: np.ndarray) -> Callable[[int], np.ndarray]:
    return lambda n: np.unique(np.r_[_ranks(n, qs)[:2]])


def _interpolated(found: Any, qs: np.ndarray) -> np.ndarray | None:
    """numpy's percentiles ``qs`` of a column from its order statistics (`_order_statistics`)."""
    if found is None or isinstance(found, float):
        return None if found is None else np.full(len(qs), np.nan)
    n, values = found
    previous, following, gamma = _ranks(n, qs)
    return _lerp(np.asarray([values[int(r)] for r in previous]),
                 np.asarray([values[int(r)] for r in following]), gamma)


def _memo(parts: PartSet) -> dict[tuple[Any, ...], np.ndarray | None]:
    return parts.__dict__.setdefault("_remembered", {})


def percentiles(parts: PartSet, columns: Sequence[Column], qs: Sequence[float]
                ) -> list[np.ndarray | None]:
    """``np.percentile(values, qs)`` of each column's values over every part (concatenated
    in part order), bit for bit; None for a column without values. NaN among a column's
    values makes every figure of it NaN, as numpy's. A `Named` column `remembered` for
    these ``qs`` is not read again."""
    qs = np.asarray(qs, np.float64)
    memo, asked = _memo(parts), tuple(qs.tolist())
    out: list[Any] = [memo.get((c.name, asked), KeyError) if isinstance(c, Named) else KeyError
                      for c in columns]
    todo = [i for i, found in enumerate(out) if found is KeyError]
    stats = _order_statistics(parts, [columns[i] for i in todo], _wanted_ranks(qs))
    for i, found in zip(todo, stats, strict=True):
        out[i] = _interpolated(found, qs)
    return out


@contextmanager
def remembered(parts: PartSet, asks: Sequence[tuple[Named, Sequence[float]]]
               ) -> Iterator[None]:
    """Within the context, `percentiles` of each ``(column, qs)`` of ``asks`` comes from
    one set of passes made now for all of them together (a summary's dozens of columns
    read each part a few times, not a few times each); forgotten on leaving."""
    memo = _memo(parts)
    found = _order_statistics(parts, [column for column, _ in asks],
                              [_wanted_ranks(np.asarray(qs, np.float64)) for _, qs in asks])
    for (column, qs), stats in zip(asks, found, strict=True):
        qs = np.asarray(qs, np.float64)
        memo[(column.name, tuple(qs.tolist()))] = _interpolated(stats, qs)
    try:
        yield
    finally:
        memo.clear()


def medians(parts: PartSet, columns: Sequence[Column]) -> list[float | None]:
    """``np.median`` of each column's values over every part, bit for bit (None: none)."""
    def middle(n: int) -> np.ndarray:
        return np.unique([(n - 1) // 2, n // 2])

    out: list[float | None] = []
    for found in _order_statistics(parts, columns, middle):
        if found is None or isinstance(found, float):
            out.append(found)
            continue
        n, values = found
        out.append(float(np.median(np.asarray([values[int(r)] for r in middle(n)]))))
    return out


def order_statistics(parts: PartSet, columns: Sequence[Column],
                     ranks: Callable[[int], Sequence[int]]) -> list[dict[int, Any] | None]:
    """Per column, the values at the ranks ``ranks(n)`` names (0-based, of its ``n``
    values over every part, sorted): ``np.partition(values, r)[r]`` for each, as
    ``{rank: value}``; None for a column without values. A column with NaN has no order:
    refused."""
    out: list[dict[int, Any] | None] = []
    for found in _order_statistics(parts, columns,
                                   lambda n: np.unique(np.asarray(ranks(n), np.intp))):
        if isinstance(found, float):
            raise ValueError("order statistics of a column holding NaN")
        out.append(None if found is None else found[1])
    return out


def exact_sum(values: np.ndarray) -> Any:
    """The exact sum of float64 values as a ``fractions.Fraction`` (sums of parts add up
    exactly; ``float`` of the total is ``math.fsum`` of every value)."""
    from fractions import Fraction

    values = np.asarray(values, np.float64)
    if not np.isfinite(values).all():
        raise ValueError("an exact sum of values that are not all finite")
    mantissa, exponent = np.frexp(values)
    whole = np.ldexp(mantissa, 53).astype(np.int64)  # exact: 53-bit integer mantissas
    total = Fraction(0)
    for e in np.unique(exponent):
        mine = whole[exponent == e]
        high, low = mine >> 26, mine & ((1 << 26) - 1)  # each sum fits an int64
        total += Fraction((int(high.sum()) << 26) + int(low.sum())) * Fraction(2) ** int(e - 53)
    return total


def _column_bounds(values: np.ndarray, keys: np.ndarray) -> tuple[int, int, int, int, Any]:
    """A part's count, NaN count, least and greatest key and dtype of a column."""
    nan = int(np.isnan(values).sum()) if values.dtype.kind == "f" else 0
    return (len(values), nan, int(keys.min()) if len(keys) else 0,
            int(keys.max()) if len(keys) else 0, values.dtype)


def _column_start(found: Sequence[tuple[int, int, int, int, Any]]
                  ) -> tuple[Any, np.dtype | None, int, int]:
    """A column's result so far from its parts' `_column_bounds`: None (no values), NaN
    (one is NaN) or ``(n, {})``; its dtype, least and greatest key."""
    mine = [f for f in found if f[0]]
    n = sum(f[0] for f in mine)
    if n == 0:
        return None, None, 0, 0
    if any(f[1] for f in mine):
        return float("nan"), None, 0, 0
    if len({np.dtype(f[4]).kind == "f" for f in mine}) > 1:
        raise ValueError("a column's values are floats in some parts and integers "
                         "in others: cast them to one dtype")
    return ((n, {}), np.result_type(*(f[4] for f in mine)), min(f[2] for f in mine),
            max(f[3] for f in mine))


def _first_windows(parts: PartSet, columns: Sequence[Column],
                   wanted: Sequence[Callable[[int], np.ndarray]]
                   ) -> tuple[list[Any], dict[tuple[int, int, int], list[Any]], dict[int, Any]]:
    """The first pass: per column its result so far (`_column_start`), its window
    (``(column, lo, hi) -> [below, count, ranks]``: every value, the ranks
    ``wanted[column](n)``)
    and its values' dtype."""
    def bounds(part: Any) -> list[tuple[int, int, int, int, Any]]:
        out = []
        for column in columns:
            values = np.asarray(column(part))
            out.append(_column_bounds(values, _keys(values)))
        return out

    seen = parts.map(bounds)
    result: list[Any] = []
    windows: dict[tuple[int, int, int], list[Any]] = {}
    dtypes: dict[int, Any] = {}
    for c in range(len(columns)):
        start, dtype, lo, hi = _column_start([found[c] for found in seen])
        result.append(start)
        if dtype is not None:
            dtypes[c] = dtype
            windows[(c, lo, hi)] = [0, start[0], [int(r) for r in wanted[c](start[0])]]
    return result, windows, dtypes


def _held_statistics(parts: PartSet, columns: Sequence[Column],
                     wanted: Sequence[Callable[[int], np.ndarray]]
                     ) -> list[tuple[int, dict[int, Any]] | float | None]:
    """`_batch_statistics` of parts held in memory (no fetch limit) in one pass: every
    key fetched with the bounds (what the fetch pass would fetch, as the first window is
    every value), then selected as that pass selects them."""
    def keys(part: Any) -> list[tuple[tuple[int, int, int, int, Any], np.ndarray]]:
        out = []
        for column in columns:
            values = np.asarray(column(part))
            k = _keys(values)
            out.append((_column_bounds(values, k), k))
        return out

    seen = parts.map(keys)
    result: list[Any] = []
    for c in range(len(columns)):
        start, dtype, lo, hi = _column_start([found[c][0] for found in seen])
        result.append(start)
        if dtype is None:
            continue
        ranks = [int(r) for r in wanted[c](start[0])]
        if lo == hi:
            start[1].update((r, _value(lo, dtype)) for r in ranks)
            continue
        every = np.concatenate([found[c][1] for found in seen])
        kth = np.asarray(ranks)
        every = np.partition(every, kth) if len(kth) < len(every) else np.sort(every)
        start[1].update((r, _value(int(every[r]), dtype)) for r in ranks)
    return result


def _order_statistics(parts: PartSet, columns: Sequence[Column],
                      wanted: Callable[[int], np.ndarray]
                      | Sequence[Callable[[int], np.ndarray]]
                      ) -> list[tuple[int, dict[int, Any]] | float | None]:
    """Per column: None (no values), NaN (a value is NaN), else ``(n, {rank: value})``
    for the ranks ``wanted(n)`` names (one function for every column, or one a column),
    values in the column's dtype; `BATCH` columns at a time (a stage search asks for
    hundreds: their fetched values and bins are held only a batch at a time)."""
    wants = [wanted] * len(columns) if callable(wanted) else list(wanted)
    out: list[Any] = []
    held = parts.fetch_limit is None
    batch = HELD_BATCH if held else BATCH
    for first in range(0, len(columns), batch):
        mine, theirs = columns[first:first + batch], wants[first:first + batch]
        out += (_held_statistics(parts, mine, theirs) if held
                else _batch_statistics(parts, mine, theirs))
    return out


def _batch_statistics(parts: PartSet, columns: Sequence[Column],
                      wanted: Sequence[Callable[[int], np.ndarray]]
                      ) -> list[tuple[int, dict[int, Any]] | float | None]:
    limit = parts.fetch_limit
    result, windows, dtypes = _first_windows(parts, columns, wanted)
    while windows:
        fetch = {key: w for key, w in windows.items()
                 if key[1] == key[2] or limit is None or w[1] <= limit}
        split = {key: w for key, w in windows.items() if key not in fetch}
        for (c, lo, _), (_, _, ranks) in [(k, w) for k, w in fetch.items() if k[1] == k[2]]:
            for r in ranks:
                result[c][1][r] = _value(lo, dtypes[c])
        fetch = {key: w for key, w in fetch.items() if key[1] != key[2]}
        inner = {key: _bin_shift(key[1], key[2]) for key in split}
        fetched: list[list[np.ndarray]] = [[] for _ in fetch]
        counted = [np.zeros(BINS, np.int64) for _ in split]

        def visit(part: Any, fetch: dict = fetch, inner: dict = inner,
                  fetched: list = fetched, counted: list = counted) -> None:
            """One part's answer, added to the others' as it comes (memory: the
            windows' bins and fetched values, whatever the number of parts)."""
            keys, counts = _pass(part, columns, fetch, inner)
            for found, k in zip(fetched, keys, strict=True):
                found.append(k)
            for total, c in zip(counted, counts, strict=True):
                total += c

        parts.map(visit)
        for i, ((c, _, _), (below, _, ranks)) in enumerate(fetch.items()):
            keys = np.concatenate(fetched[i])
            kth = np.asarray(ranks) - below
            keys = np.partition(keys, kth) if len(kth) < len(keys) else np.sort(keys)
            for r, k in zip(ranks, kth, strict=True):
                result[c][1][r] = _value(int(keys[k]), dtypes[c])
        windows = {}
        for i, (key, (below, _, ranks)) in enumerate(split.items()):
            counts = counted[i]
            firsts = below + np.concatenate([[0], np.cumsum(counts)[:-1]])
            lo, shift = key[1], inner[key]
            for r in ranks:
                b = int(np.searchsorted(firsts, r, side="right")) - 1
                bin_lo = lo + (b << shift)
                bin_hi = min(key[2], bin_lo + (1 << shift) - 1)
                window = windows.setdefault((key[0], bin_lo, bin_hi),
                                            [int(firsts[b]), int(counts[b]), []])
                window[2].append(r)
    return result


def _bin_shift(lo: int, hi: int) -> int:
    """How far keys ``lo..hi`` shift (``(key - lo) >> shift``) into at most `BINS` bins,
    bin b holding ``lo + (b << shift)`` to the next bin's first key - 1 (and ``hi``):
    found by a subtraction and a shift, not a search among edges."""
    return max(0, (hi - lo).bit_length() - (BINS.bit_length() - 1))


def _bins(keys: np.ndarray, lo: int, shift: int) -> np.ndarray:
    """Each key's bin (`_bin_shift`) of keys at least ``lo``; exact over the whole int64
    range (the difference taken as unsigned, modulo 2^64)."""
    offset = keys.view(np.uint64) - np.uint64(lo % (1 << 64))
    return (offset >> np.uint64(shift)).astype(np.intp)


def _pass(part: Any, columns: Sequence[Column], fetch: dict, inner: dict
          ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One part's answer to a refinement pass: the keys in each window to fetch, and the
    counts per bin of each window to split."""
    keys_of: dict[int, np.ndarray] = {}

    def keys(c: int) -> np.ndarray:
        if c not in keys_of:
            keys_of[c] = _keys(np.asarray(columns[c](part)))
        return keys_of[c]

    fetched = []
    for c, lo, hi in fetch:
        k = keys(c)
        fetched.append(k[(k >= lo) & (k <= hi)])
    counts = []
    for (c, lo, hi), shift in inner.items():
        k = keys(c)
        k = k[(k >= lo) & (k <= hi)]
        counts.append(np.bincount(_bins(k, lo, shift), minlength=BINS))
    return fetched, counts


def _value(key: int, dtype: Any) -> Any:
    """The value of an order-preserving key (`_keys`) in ``dtype``."""
    if np.dtype(dtype).kind == "f":
        bits = np.int64(key)
        return np.asarray(bits ^ _FLIP if bits < 0 else bits).view(np.float64)[()]
    return np.asarray(key).astype(dtype)[()]

"""Exact percentiles over values spread across parts, without holding them together.

A `PartSet` is a trace's parts where a summary reads them: in this process's memory
(`InMemory`: one table analysed whole), or spilled to disk as each part arrives and read
back one at a time (`Spilled`: a dataset's partitions, so the process merging them holds
no request; docs/architecture.md, "One program"). ``map(fn)`` is ``fn`` of every part, in
order: every figure of a summary is a reduction of such results.

`percentiles` is numpy's linear percentile (``np.percentile``, bit for bit) of a column of
values each part gives, found by histogram refinement: one pass counts the values and
their bounds; while the values between the bounds around a wanted rank are more than a
part set may fetch (`PartSet.fetch_limit`), a pass counts them in `BINS` bins of the
values' order-preserving integer keys and keeps the bin holding the rank; then one pass
fetches the values left around each rank, which give the order statistics, and numpy's
interpolation between them is the figure. Each pass reads every part once, for `BATCH`
columns at once; a wanted value is found within a few passes (the bounds shrink `BINS`
times a pass), whatever the distribution. Memory is O(`BATCH` × (`BINS` + fetch limit)),
whatever the number of parts.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BATCH", "BINS", "FETCH_LIMIT", "KEEP_BYTES", "InMemory", "Keyed", "PartSet",
           "Spilled", "exact_sum", "keyed_bytes", "load_keyed", "medians", "order_statistics",
           "percentiles", "save_keyed"]

BINS = 1 << 12
"""Bins of one refinement pass."""
FETCH_LIMIT = 1 << 15
"""The most values a spilled part set fetches around one rank in one pass."""
BATCH = 16
"""Columns refined together."""
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)

KEEP_BYTES = 1 << 29
"""What a spilled part set keeps in memory: the parts put while their sizes (its ``size``)
fit, else those first read back, by the bytes of their files (a part in memory takes about
as much, up to twice with its strings)."""

Column = Callable[[Any], np.ndarray]
"""A part's values of one column (1-D, integer, boolean or float)."""


class PartSet(abc.ABC):
    """A trace's parts, read where they are kept (see the module docstring)."""

    fetch_limit: int | None = None
    """The most values fetched around one rank per pass (None: any number)."""

    @abc.abstractmethod
    def map(self, fn: Callable[[Any], Any]) -> list[Any]:
        """``fn`` of every part, in order."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """How many parts."""


class InMemory(PartSet):
    """Parts held in this process (fetching their values costs nothing more)."""

    def __init__(self, parts: Iterable[Any]) -> None:
        self.parts = list(parts)

    def map(self, fn: Callable[[Any], Any]) -> list[Any]:
        return [fn(part) for part in self.parts]

    def __len__(self) -> int:
        return len(self.parts)


def _files_bytes(directory: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file())


def _save_array(part: np.ndarray, directory: str) -> None:
    np.save(os.path.join(directory, "values.npy"), part, allow_pickle=False)


def _load_array(directory: str) -> np.ndarray:
    return np.load(os.path.join(directory, "values.npy"), allow_pickle=False)


Keyed = Mapping[str | tuple[str, ...], Sequence[np.ndarray]]
"""Arrays under keys (strings, or tuples of strings), a few to a key: such as a part's clock
bounds (``analysis.clocks.Bounds``)."""


def save_keyed(part: Keyed, directory: str) -> None:
    """A `Spilled` ``save`` of `Keyed` arrays: their keys in ``keys.json``, their arrays in
    ``arrays.npz`` (no pickle: the arrays are numbers)."""
    keys = list(part)
    with open(os.path.join(directory, "keys.json"), "w") as f:
        json.dump([[k] if isinstance(k, str) else list(k) for k in keys], f)
    np.savez(os.path.join(directory, "arrays.npz"),
             **{f"{i}_{j}": a for i, k in enumerate(keys) for j, a in enumerate(part[k])})


def keyed_bytes(part: Keyed) -> int:
    """What `Keyed` arrays take in memory (a `Spilled` ``size``)."""
    return sum(np.asarray(a).nbytes for arrays in part.values() for a in arrays)


def load_keyed(directory: str) -> dict[str | tuple[str, ...], tuple[np.ndarray, ...]]:
    """What `save_keyed` wrote."""
    with open(os.path.join(directory, "keys.json")) as f:
        keys = [k[0] if len(k) == 1 else tuple(k) for k in json.load(f)]
    with np.load(os.path.join(directory, "arrays.npz"), allow_pickle=False) as found:
        names = sorted(found.files, key=lambda n: tuple(int(x) for x in n.split("_")))
        arrays: dict[int, list[np.ndarray]] = {}
        for name in names:
            arrays.setdefault(int(name.split("_")[0]), []).append(found[name])
    return {k: tuple(arrays.get(i, ())) for i, k in enumerate(keys)}


class Spilled(PartSet):
    """Parts written to a temporary directory as they come (`put`, in any order; each in
    a directory of its own, by ``save(part, directory)``, read back by ``load(directory)``:
    default, a numpy array), read back by `map`, in part order. Parts are kept in memory
    while they total at most ``keep_bytes`` (default `KEEP_BYTES`; 0: none): with
    ``size`` (a part's bytes in memory), as they are put, never written; else the first
    read back, by the bytes of their files. So a summary's many passes read each of
    those once at most; every other part is read alone at each pass, so memory stays
    within the budget and one part, whatever the number of parts. The files go with
    ``close``, the context, or this object."""

    _limit: int | None = FETCH_LIMIT

    @property  # type: ignore[override]
    def fetch_limit(self) -> int | None:
        """`FETCH_LIMIT`, or None (any number, one fetch pass) once every part is kept in
        memory: their values are held anyway."""
        everything = bool(self._kept) and all(k in self._kept for k in self._paths)
        return None if everything else self._limit

    @fetch_limit.setter
    def fetch_limit(self, limit: int | None) -> None:
        self._limit = limit

    def __init__(self, directory: str | None = None, *,
                 save: Callable[[Any, str], None] = _save_array,
                 load: Callable[[str], Any] = _load_array,
                 keep_bytes: int | None = None,
                 size: Callable[[Any], int] | None = None) -> None:
        self.directory = tempfile.mkdtemp(prefix="ttft-parts-", dir=directory)
        self._save, self._load, self._size = save, load, size
        self._paths: dict[int, str] = {}
        self.keep_bytes = KEEP_BYTES if keep_bytes is None else keep_bytes
        self._kept: dict[int, Any] = {}
        self._kept_bytes: dict[int, int] = {}
        self._removal = weakref.finalize(self, shutil.rmtree, self.directory, True)

    def _keeps(self, k: int, part: Any, size: int) -> bool:
        """Keep ``part`` as part ``k`` if the budget holds it."""
        if sum(self._kept_bytes.values()) + size > self.keep_bytes:
            return False
        self._kept[k], self._kept_bytes[k] = part, size
        return True

    def put(self, k: int, part: Any) -> None:
        """Part ``k`` (it replaces one put before)."""
        self._kept.pop(k, None)
        self._kept_bytes.pop(k, None)
        path = os.path.join(self.directory, f"{k:06d}")
        shutil.rmtree(path, ignore_errors=True)
        self._paths.pop(k, None)
        if self._size is not None and self._keeps(k, part, self._size(part)):
            return
        scratch = path + ".tmp"
        shutil.rmtree(scratch, ignore_errors=True)
        os.mkdir(scratch)
        self._save(part, scratch)
        os.replace(scratch, path)
        self._paths[k] = path

    def add(self, part: Any) -> None:
        """The next part."""
        self.put(len(self), part)

    def map(self, fn: Callable[[Any], Any]) -> list[Any]:
        out = []
        for k in sorted(self._paths.keys() | self._kept.keys()):
            part = self._kept.get(k)
            if part is None:
                part = self._load(self._paths[k])
                self._keeps(k, part, _files_bytes(self._paths[k]))
            out.append(fn(part))
            del part
        return out

    def __len__(self) -> int:
        return len(self._paths.keys() | self._kept.keys())

    def close(self) -> None:
        self._kept.clear()
        self._kept_bytes.clear()
        self._removal()

    def __enter__(self) -> Spilled:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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


def percentiles(parts: PartSet, columns: Sequence[Column], qs: Sequence[float]
                ) -> list[np.ndarray | None]:
    """``np.percentile(values, qs)`` of each column's values over every part (concatenated
    in part order), bit for bit; None for a column without values. NaN among a column's
    values makes every figure of it NaN, as numpy's."""
    qs = np.asarray(qs, np.float64)
    stats = _order_statistics(parts, columns, lambda n: np.unique(np.r_[_ranks(n, qs)[:2]]))
    out: list[np.ndarray | None] = []
    for found in stats:
        if found is None or isinstance(found, float):
            out.append(None if found is None else np.full(len(qs), np.nan))
            continue
        n, values = found
        previous, following, gamma = _ranks(n, qs)
        out.append(_lerp(np.asarray([values[int(r)] for r in previous]),
                         np.asarray([values[int(r)] for r in following]), gamma))
    return out


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
                   wanted: Callable[[int], np.ndarray]
                   ) -> tuple[list[Any], dict[tuple[int, int, int], list[Any]], dict[int, Any]]:
    """The first pass: per column its result so far (`_column_start`), its window
    (``(column, lo, hi) -> [below, count, ranks]``: every value, the ranks ``wanted(n)``)
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
            windows[(c, lo, hi)] = [0, start[0], [int(r) for r in wanted(start[0])]]
    return result, windows, dtypes


def _held_statistics(parts: PartSet, columns: Sequence[Column],
                     wanted: Callable[[int], np.ndarray]
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
        ranks = [int(r) for r in wanted(start[0])]
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
                      ) -> list[tuple[int, dict[int, Any]] | float | None]:
    """Per column: None (no values), NaN (a value is NaN), else ``(n, {rank: value})``
    for the ranks ``wanted(n)`` names, values in the column's dtype; `BATCH` columns at a
    time (a stage search asks for hundreds: their fetched values and bins are held only a
    batch at a time)."""
    out: list[Any] = []
    for first in range(0, len(columns), BATCH):
        out += _batch_statistics(parts, columns[first:first + BATCH], wanted)
    return out


def _batch_statistics(parts: PartSet, columns: Sequence[Column],
                      wanted: Callable[[int], np.ndarray]
                      ) -> list[tuple[int, dict[int, Any]] | float | None]:
    limit = parts.fetch_limit
    if limit is None:
        return _held_statistics(parts, columns, wanted)
    result, windows, dtypes = _first_windows(parts, columns, wanted)
    while windows:
        fetch = {key: w for key, w in windows.items()
                 if key[1] == key[2] or limit is None or w[1] <= limit}
        split = {key: w for key, w in windows.items() if key not in fetch}
        for (c, lo, _), (_, _, ranks) in [(k, w) for k, w in fetch.items() if k[1] == k[2]]:
            for r in ranks:
                result[c][1][r] = _value(lo, dtypes[c])
        fetch = {key: w for key, w in fetch.items() if key[1] != key[2]}
        inner = {key: _inner_edges(key[1], key[2]) for key in split}
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
            edges = [key[1], *inner[key].tolist(), key[2] + 1]
            for r in ranks:
                b = int(np.searchsorted(firsts, r, side="right")) - 1
                window = windows.setdefault((key[0], edges[b], edges[b + 1] - 1),
                                            [int(firsts[b]), int(counts[b]), []])
                window[2].append(r)
    return result


def _inner_edges(lo: int, hi: int) -> np.ndarray:
    """The `BINS` - 1 inner edges of integer keys ``lo..hi`` (bin b: ``edges[b]`` to
    ``edges[b+1] - 1``; empty bins where the keys are fewer than the bins)."""
    span = hi - lo + 1
    return np.asarray([lo + span * b // BINS for b in range(1, BINS)], np.int64)


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
    for (c, lo, hi), edges in inner.items():
        k = keys(c)
        k = k[(k >= lo) & (k <= hi)]
        counts.append(np.bincount(np.searchsorted(edges, k, side="right"), minlength=BINS))
    return fetched, counts


def _value(key: int, dtype: Any) -> Any:
    """The value of an order-preserving key (`_keys`) in ``dtype``."""
    if np.dtype(dtype).kind == "f":
        bits = np.int64(key)
        return np.asarray(bits ^ _FLIP if bits < 0 else bits).view(np.float64)[()]
    return np.asarray(key).astype(dtype)[()]

"""The summary's figures as reductions over a `PartSet` of `PartRows` (``order_stats``):
each part gives counts, exact sums and the values of a column, and exact percentiles
come from ``order_stats.percentiles``, so one table (one part in memory) and a dataset's
partitions (spilled, read one at a time) give one summary bit for bit, and whoever merges
the partitions holds none of their requests (docs/architecture.md, "One program").

Definitions are ``analysis.summary``'s (docs/design.md): percentiles are numpy's linear
ones over every request, means exact from integer sums (``math.fsum`` for float values).
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from pyarrow import feather

from ttft.analysis.after_first_token import KEYS
from ttft.analysis.attribution import FRAMES, Attribution
from ttft.analysis.order_stats import InMemory, PartSet, exact_sum, percentiles
from ttft.analysis.quality import EXAMPLES_KEPT, Quality
from ttft.analysis.request_values import RequestValues
from ttft.tracer.schema import OUTCOMES

__all__ = ["EachPart", "PartRows", "after_first_token", "failed_first_token", "failure_counts",
           "failure_examples", "kv_transfer", "load_figures", "ms_figures", "one_part",
           "stage_matrix", "stage_rows", "stages", "tail_rows"]

_NS_PER_MS = 1e6
PERCENTILES = (50, 90, 99)
_MATRICES = ("att", "raw", "ttft")
"""`PartRows`' int64 arrays that a summary's passes read, saved as ``.npy`` beside the
frames and memory-mapped when read back: a pass then costs the arithmetic, not decoding
the frames again."""
_AS_MATRIX = {"attributed": "att", "raw": "raw"}
"""Frames saved as their `_MATRICES` file alone (with their column names) where they are
plain int64 rows 0..n-1: rebuilt from it when read, not written twice."""
Select = Callable[["PartRows"], np.ndarray] | None
"""A boolean mask over a part's ok requests (``Attribution.requests``); None: all."""


class PartRows:
    """One part's attribution and request values, their arrays decoded once, and its
    chunks' regime rows (``analysis.regime.regime``; None where the regime was not asked
    for or its model is not known); `save` and `load` write and read them as files
    (``part_sets.Spilled``): the frames as Arrow IPC, the arrays as ``.npz``, the matrices
    every pass reads as ``.npy`` (`_MATRICES`). What is read back has no defects (a part's
    defects go with its ``analysis.part.PartHeader``)."""

    def __init__(self, attribution: Attribution, values: RequestValues,
                 chunks: pd.DataFrame | None = None) -> None:
        self.attribution = attribution
        self.values = values
        self.chunks = chunks

    @staticmethod
    def save(rows: PartRows, directory: str) -> None:
        attr, values = rows.attribution, rows.values
        frames = {name: getattr(attr, name) for name in FRAMES}
        frames["transfers"] = values.transfers
        if rows.chunks is not None:  # its attrs (the peaks it was costed with) stay here
            frames["chunks"] = pd.DataFrame(rows.chunks, copy=False)
            frames["chunks"].attrs = {}
        for name in _MATRICES:  # what every pass reads, mapped back (`_SavedRows`)
            np.save(os.path.join(directory, f"{name}.npy"), getattr(rows, name))
        matrices = {}  # frames that are a matrix saved above: not written twice
        for name, matrix in _AS_MATRIX.items():
            frame = frames[name]
            if (frame.index.equals(pd.RangeIndex(len(frame)))
                    and all(dtype == np.int64 for dtype in frame.dtypes)):
                matrices[name] = [matrix, frame.columns.name, frame.columns.tolist()]
                del frames[name]
        for name, frame in frames.items():
            feather.write_feather(frame, os.path.join(directory, f"{name}.arrow"),
                                  compression="uncompressed")
        for kind in ("after_first_token", "load"):
            np.savez(os.path.join(directory, f"{kind}.npz"), **getattr(values, kind))
        with open(os.path.join(directory, "attribution.json"), "w") as f:
            json.dump({"boundary": attr.boundary, "policy": attr.policy,
                       "matrices": matrices}, f)

    @staticmethod
    def nbytes(rows: PartRows) -> int:
        """What the part takes in memory: its frames (strings counted deep) and arrays."""
        frames = [getattr(rows.attribution, name) for name in FRAMES]
        frames += [rows.values.transfers] + ([] if rows.chunks is None else [rows.chunks])
        arrays = [*rows.values.after_first_token.values(), *rows.values.load.values()]
        return (sum(int(f.memory_usage(index=True, deep=True).sum()) for f in frames)
                + sum(np.asarray(a).nbytes for a in arrays))

    @staticmethod
    def load(directory: str) -> PartRows:
        """The part `save` wrote in ``directory``, each of its frames and sets of arrays
        read when first used: a pass of a summary reads only what its figures need (the
        TTFT of each request, not its 25 stages three ways)."""
        with open(os.path.join(directory, "attribution.json")) as f:
            said = json.load(f)
        return _SavedRows(directory, _SavedAttribution(directory, said["boundary"],
                                                       said["policy"], said["matrices"]),
                          _SavedValues(directory))

    @cached_property
    def att(self) -> np.ndarray:
        return self.attribution.attributed.to_numpy(np.int64)

    @cached_property
    def raw(self) -> np.ndarray:
        return self.attribution.raw.to_numpy(np.int64)

    @cached_property
    def ttft(self) -> np.ndarray:
        return self.attribution.requests["ttft_ns"].to_numpy(np.int64)

    @cached_property
    def conditions(self) -> np.ndarray:
        return self.attribution.requests["condition"].to_numpy(dtype=object)

    @cached_property
    def cache(self) -> dict[Any, Any]:
        return {}

    def rows(self, select: Select) -> np.ndarray | slice:
        return slice(None) if select is None else select(self)

    def of_condition(self, condition: str) -> np.ndarray:
        """Which ok requests are of ``condition`` (found once a part: every pass of a
        summary asks again for each of its columns), compared as the column's own dtype
        does (an Arrow string column in C, not string by string)."""
        key = ("condition", condition)
        if key not in self.cache:
            same = self.attribution.requests["condition"] == condition
            self.cache[key] = same.fillna(False).to_numpy(bool)
        return self.cache[key]

    @cached_property
    def condition_keys(self) -> np.ndarray:
        """Each ok request's condition as a string ("" for none)."""
        conditions = self.conditions
        return np.where(pd.isna(conditions), "", conditions).astype(str)


class EachPart:
    """``make(part)`` of the part last asked about, kept until another part is asked
    about. ``percentiles`` reads a part's columns one after another in each pass, so
    columns cut from one matrix (``EachPart(matrix)(part)[j]``) make it once a part and
    pass, where cutting each column from the part's rows (a strided gather) cost
    most of a summary's merge."""

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make, self.part, self.value = make, None, None

    def __call__(self, part: Any) -> Any:
        if self.part is not part:
            self.part, self.value = None, None  # the last one's value goes first
            self.value, self.part = self.make(part), part
        return self.value


def stage_matrix(att: np.ndarray, rows: np.ndarray | slice, used: np.ndarray,
                 scale: float = 1.0) -> np.ndarray:
    """``att[rows][:, used] / scale`` transposed, C-contiguous: row ``i`` is stage
    ``used[i]``'s values, each as ``att[rows, used[i]] / scale`` gives it (int64 kept for
    a scale of 1)."""
    picked = att[rows][:, used]
    return np.ascontiguousarray((picked if scale == 1.0 else picked / scale).T)


def _frame(directory: str, name: str) -> pd.DataFrame:
    return feather.read_feather(os.path.join(directory, f"{name}.arrow"), memory_map=False)


class _Saved(abc.ABC):
    """What was saved in a directory (``_directory``), each of `_NAMES` read by `_read`
    when first used and kept."""

    _NAMES: tuple[str, ...] = ()
    _directory: str

    def __getattr__(self, name: str) -> Any:
        if name not in self._NAMES or "_directory" not in self.__dict__:
            raise AttributeError(name)
        value = self.__dict__[name] = self._read(name)
        return value

    @abc.abstractmethod
    def _read(self, name: str) -> Any:
        """The saved ``name``."""


class _SavedAttribution(_Saved, Attribution):
    _NAMES = FRAMES

    def __init__(self, directory: str, boundary: str, policy: str,
                 matrices: Mapping[str, list[Any]]) -> None:
        self._directory, self.boundary, self.policy = directory, boundary, policy
        self._matrices = matrices
        self.quality = Quality()

    def _read(self, name: str) -> pd.DataFrame:
        if name in self._matrices:  # saved as its matrix (`PartRows.save`)
            matrix, columns_name, columns = self._matrices[name]
            values = np.load(os.path.join(self._directory, f"{matrix}.npy"), allow_pickle=False)
            return pd.DataFrame(values, columns=pd.Index(columns, name=columns_name))
        frame = _frame(self._directory, name)
        if name == "failed" and "status_code" in frame and frame["status_code"].dtype.kind == "f":
            # Arrow gives ints with nulls back as floats; the frame holds ints and None
            frame["status_code"] = pd.Series(
                [None if pd.isna(v) else int(v) for v in frame["status_code"]],
                index=frame.index, dtype=object)
        return frame


class _SavedValues(_Saved, RequestValues):
    _NAMES = ("after_first_token", "load", "transfers")

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def _read(self, name: str) -> Any:
        if name == "transfers":
            return _frame(self._directory, name)
        with np.load(os.path.join(self._directory, f"{name}.npz"),
                     allow_pickle=False) as found:
            return {key: found[key] for key in found.files}


class _SavedRows(_Saved, PartRows):
    _NAMES = ("chunks",)

    def __init__(self, directory: str, attribution: Attribution, values: RequestValues
                 ) -> None:
        self._directory, self.attribution, self.values = directory, attribution, values

    def _read(self, name: str) -> pd.DataFrame | None:
        there = os.path.exists(os.path.join(self._directory, "chunks.arrow"))
        return _frame(self._directory, "chunks") if there else None

    def _matrix(self, name: str) -> np.ndarray:
        """One of `_MATRICES`, mapped from its file (pages read as a pass touches them,
        let go with this part), as a plain array."""
        return np.asarray(np.load(os.path.join(self._directory, f"{name}.npy"),
                                  mmap_mode="r", allow_pickle=False))

    @cached_property
    def att(self) -> np.ndarray:
        return self._matrix("att")

    @cached_property
    def raw(self) -> np.ndarray:
        return self._matrix("raw")

    @cached_property
    def ttft(self) -> np.ndarray:
        return self._matrix("ttft")


def one_part(attr: Attribution, values: RequestValues | None = None) -> InMemory:
    """One attribution (and its values, else none) as the one part of a `PartSet`."""
    return InMemory([PartRows(attr, values or RequestValues({}, {}, pd.DataFrame()))])


def stages(parts: PartSet) -> np.ndarray:
    """The stage names (every part's attribution has the same columns)."""
    names = parts.map(lambda p: tuple(p.attribution.attributed.columns))
    if len(set(names)) > 1:
        raise ValueError("parts were attributed with different stages")
    return np.asarray(names[0] if names else ())


def ms_figures(parts: PartSet, column: Callable[[PartRows], np.ndarray]
               ) -> dict[str, float] | None:
    """p50/p90/p99/mean in ms of an int64 ns column (mean from the integer sum; None for
    no values)."""
    (found,) = percentiles(parts, [lambda p: column(p).astype(np.float64) / _NS_PER_MS],
                           PERCENTILES)
    if found is None:
        return None
    def sums(p: PartRows) -> tuple[int, int]:
        values = column(p)
        return len(values), int(values.sum())

    n, total = np.sum(parts.map(sums), axis=0)
    out = {f"p{q}": float(v) for q, v in zip(PERCENTILES, found, strict=True)}
    out["mean"] = float(np.int64(total) / int(n) / _NS_PER_MS)
    return out


def stage_rows(parts: PartSet, select: Select = None) -> pd.DataFrame:
    """``summary.stage_table`` over the parts' requests ``select`` keeps."""
    names = stages(parts)

    def sums(p: PartRows) -> tuple[Any, ...]:
        rows = p.rows(select)
        att, raw, ttft = p.att[rows], p.raw[rows], p.ttft[rows]
        return (len(ttft), int(ttft.sum()), att.sum(axis=0), raw.sum(axis=0),
                (att > 0).any(axis=0) | (raw > 0).any(axis=0))

    found = parts.map(sums)
    columns = ["p50", "p90", "p99", "mean", "share", "raw_mean", "overlap_mean"]
    n = sum(f[0] for f in found)
    if n == 0:
        return pd.DataFrame(columns=columns, dtype=float)
    used = np.flatnonzero(np.any([f[4] for f in found], axis=0))
    att = np.sum([f[2] for f in found], axis=0).astype(np.int64)[used]
    raw = np.sum([f[3] for f in found], axis=0).astype(np.int64)[used]
    total = float(np.int64(sum(f[1] for f in found)))
    matrix = EachPart(lambda p: stage_matrix(p.att, p.rows(select), used, _NS_PER_MS))
    figures = percentiles(parts, [(lambda p, i=i: matrix(p)[i]) for i in range(len(used))],
                          PERCENTILES)
    table = pd.DataFrame(np.asarray(figures).reshape(len(used), 3), index=names[used],
                         columns=["p50", "p90", "p99"])
    table["mean"] = att / n / _NS_PER_MS
    table["share"] = att / total if total > 0 else 0.0
    table["raw_mean"] = raw / n / _NS_PER_MS
    table["overlap_mean"] = (raw - att) / n / _NS_PER_MS
    table.index.name = "stage"
    return table[columns]


def _band_sums(parts: PartSet, used: np.ndarray, keep: Callable[[np.ndarray], np.ndarray]
               ) -> tuple[int, np.ndarray]:
    """How many requests ``keep`` (of their TTFTs) keeps, and their attributed sums."""
    found = parts.map(lambda p: (int(keep(p.ttft).sum()),
                                 p.att[keep(p.ttft)][:, used].sum(axis=0)))
    return sum(f[0] for f in found), np.sum([f[1] for f in found], axis=0).astype(np.int64)


def tail_rows(parts: PartSet) -> pd.DataFrame:
    """``summary.tail_mix`` over the parts."""
    (found,) = percentiles(parts, [lambda p: p.ttft], [40, 50, 60, 99])
    if found is None:
        return pd.DataFrame(columns=["tail_mean", "median_mean"], dtype=float)
    p40, p50, p60, p99 = found
    used = np.flatnonzero(np.any(parts.map(lambda p: (p.att > 0).any(axis=0)), axis=0))
    n, tail = _band_sums(parts, used, lambda t: t >= p99)
    n_band, middle = _band_sums(parts, used, lambda t: (t >= p40) & (t <= p60))
    if n_band == 0:
        nearest = min(parts.map(lambda p: float(np.abs(p.ttft - p50).min()) if len(p.ttft)
                                else np.inf))
        n_band, middle = _band_sums(parts, used, lambda t: np.abs(t - p50) == nearest)
    return pd.DataFrame({"tail_mean": tail / n / _NS_PER_MS,
                         "median_mean": middle / n_band / _NS_PER_MS},
                        index=stages(parts)[used])


def failure_counts(parts: PartSet, condition: str | None = None) -> dict[str, int]:
    """Failed requests by outcome, in ``OUTCOMES`` order (of one condition)."""
    def counts(p: PartRows) -> pd.Series:
        failed = p.attribution.failed
        if condition is not None:
            failed = failed[failed["condition"] == condition]
        return failed["outcome"].value_counts()

    found = [c for c in parts.map(counts) if len(c)]
    total = pd.concat(found).groupby(level=0).sum() if found else pd.Series(dtype=int)
    return {kind: int(total[kind]) for kind in OUTCOMES if kind in total.index}


def failure_examples(parts: PartSet, counts: Mapping[str, int]
                     ) -> dict[str, list[dict[str, Any]]]:
    """Up to `EXAMPLES_KEPT` failed requests per outcome, the smallest trace ids (parts'
    candidates in part order, sorted stably: the whole's order)."""
    def smallest(p: PartRows) -> pd.DataFrame:
        failed = p.attribution.failed
        return pd.concat([failed[failed["outcome"] == kind].sort_values("trace_id", kind="stable")
                          .head(EXAMPLES_KEPT) for kind in counts] or [failed.head(0)])

    found = parts.map(smallest)
    failed = pd.concat([f for f in found if len(f)] or found[:1], ignore_index=True)
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in counts:
        rows = (failed[failed["outcome"] == kind].sort_values("trace_id", kind="stable")
                .head(EXAMPLES_KEPT))
        out[kind] = [
            {"trace_id": str(r.trace_id),
             "status_code": None if pd.isna(r.status_code) else int(r.status_code),
             "error": None if not isinstance(r.error, str) else r.error}
            for r in rows.itertuples(index=False)
        ]
    return out


def failed_first_token(parts: PartSet) -> dict[str, Any] | None:
    """The failed requests that saw a first token: how many, and their TTFT."""
    def seen(p: PartRows) -> np.ndarray:
        ttft = p.attribution.failed["ttft_ns"].to_numpy(dtype=np.int64)
        return ttft[ttft >= 0]

    found = ms_figures(parts, seen)
    return None if found is None else {
        "requests": int(sum(parts.map(lambda p: len(seen(p))))), "ttft_ms": found}


def after_first_token(parts: PartSet) -> dict[str, dict | None]:
    """``after_first_token.summarize_values`` over the parts."""
    columns = [(lambda p, k=k: np.asarray(p.values.after_first_token[k], np.float64)
                / _NS_PER_MS) for k in KEYS]
    found = percentiles(parts, columns, PERCENTILES)
    sums = parts.map(lambda p: [(len(c(p)), exact_sum(c(p))) for c in columns])
    out: dict[str, dict | None] = {}
    for i, (key, figures) in enumerate(zip(KEYS, found, strict=True)):
        if figures is None:
            out[key] = None
            continue
        n = sum(s[i][0] for s in sums)
        figure = {f"p{q}": float(v) for q, v in zip(PERCENTILES, figures, strict=True)}
        figure["mean"] = float(sum((s[i][1] for s in sums), Fraction(0))) / n
        figure["requests"] = int(n)
        out[key] = figure
    return out


def load_figures(parts: PartSet) -> dict[str, Any] | None:
    """``analysis.load.load``'s figures over the parts: ``duration_ns``, ``requests``
    completed, ``output_tokens``, ``content_filter``, and ``e2e``: p50/p90/p99/mean of the
    completed requests' end-to-end ns (None without one); None without a client span."""
    def sums(p: PartRows) -> tuple[Any, ...] | None:
        v = p.values.load
        if len(v["start_ns"]) == 0:
            return None
        done = v["completed"]
        return (int(v["start_ns"].min()), int(v["end_ns"].max()), int(done.sum()),
                int(v["output_tokens"][done].sum()), int((done & v["content_filter"]).sum()))

    found = [f for f in parts.map(sums) if f is not None]
    if not found:
        return None

    def e2e(p: PartRows) -> np.ndarray:
        v = p.values.load
        return (v["end_ns"] - v["start_ns"])[v["completed"]]

    return {"duration_ns": max(f[1] for f in found) - min(f[0] for f in found),
            "requests": sum(f[2] for f in found),
            "output_tokens": sum(f[3] for f in found),
            "content_filter": sum(f[4] for f in found),
            "e2e": ms_figures(parts, e2e)}


def _bounds(values: np.ndarray) -> tuple[float, float] | None:
    return (float(values.min()), float(values.max())) if len(values) else None


def kv_transfer(parts: PartSet) -> dict[str, Any] | None:
    """``analysis.transfer.transfer_summary`` over the parts."""
    def measured(p: PartRows) -> pd.DataFrame:
        frame = p.values.transfers
        return frame[~frame["estimated"].to_numpy(bool) & frame["bytes_per_s"].notna()]

    def sums(p: PartRows) -> tuple[Any, ...]:
        frame, kept = p.values.transfers, measured(p)
        return (len(frame), int(frame["estimated"].sum()),
                int(frame["blocks"][frame["blocks"] >= 0].sum()),
                int(frame["bytes"][frame["bytes"] >= 0].sum()),
                int(kept["dur_ns"].sum()), int(kept["bytes"].sum()),
                frame["first_token"].dropna().value_counts(),
                float((frame["dur_ns"].to_numpy(np.int64) / _NS_PER_MS).max(initial=-np.inf)),
                _bounds(kept["bytes_per_s"].to_numpy(np.float64)))

    found = parts.map(sums)
    if sum(f[0] for f in found) == 0:
        return None
    duration, bandwidth = percentiles(parts, [
        lambda p: p.values.transfers["dur_ns"].to_numpy(np.int64) / _NS_PER_MS,
        lambda p: measured(p)["bytes_per_s"].to_numpy(np.float64)], [50, 90])
    bounds = [f[8] for f in found if f[8] is not None]
    counts = [f[6] for f in found if len(f[6])]
    first = pd.concat(counts).groupby(level=0).sum() if counts else pd.Series(dtype=int)
    out: dict[str, Any] = {
        "requests": int(sum(f[0] for f in found)),
        "estimated": int(sum(f[1] for f in found)),
        "blocks": int(sum(f[2] for f in found)),
        "bytes": int(sum(f[3] for f in found)),
        "duration_ms": {"p50": float(duration[0]), "p90": float(duration[1]),
                        "max": max(f[7] for f in found)},
        "bytes_per_s": None,
        "aggregate_bytes_per_s": None,
        "first_token": {str(k): int(n) for k, n in sorted(first.items())},
    }
    if bandwidth is not None:
        requests = int(sum(parts.map(lambda p: len(measured(p)))))
        out["bytes_per_s"] = {"p50": float(bandwidth[0]), "p90": float(bandwidth[1]),
                              "min": min(b[0] for b in bounds),
                              "max": max(b[1] for b in bounds),
                              "requests": requests}
        out["aggregate_bytes_per_s"] = (sum(f[5] for f in found) * 1e9
                                        / sum(f[4] for f in found))
    return out



"""One part's rows as a summary reads them (`PartRows`: a part's attribution, request
values and chunk rows, their arrays decoded once), and how a driver spills them to disk
and reads them back (`PartRows.save`, `PartRows.load`; ``analysis.part_sets.Spilled``);
`EachPart` and `stage_matrix` cut a pass's columns from one matrix a part.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from pyarrow import feather

from ttft.analysis.attribution import FRAMES, Attribution
from ttft.analysis.quality import Quality
from ttft.analysis.request_values import RequestValues

__all__ = ["EachPart", "PartRows", "Select", "stage_matrix"]

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
        if attr.covered is attr.raw and "raw" in matrices:  # one frame (``Attribution``)
            matrices["covered"] = matrices["raw"]
            del frames["covered"]
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
        """What the part takes in memory: its frames (strings counted deep; a frame that
        is two of them, ``covered`` as ``raw``, once) and arrays."""
        frames = list({id(f): f for f in (getattr(rows.attribution, name)
                                          for name in FRAMES)}.values())
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
        if name == "covered" and "raw" in self._matrices \
                and self._matrices.get(name) == self._matrices["raw"]:
            return self.raw  # saved as one frame, read as one
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

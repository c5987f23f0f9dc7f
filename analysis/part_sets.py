"""Where a trace's parts lie while a summary reads them (``analysis.order_stats``): a
`PartSet` is in this process's memory (`InMemory`) or spilled to disk as each part arrives
and read back a part at a time (`Spilled`), kept in memory within a budget
(`KEEP_BYTES`); ``map(fn)`` is ``fn`` of every part, in order (docs/architecture.md, "One
program"). `save_keyed` and `load_keyed` spill arrays under keys (clock bounds).
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

__all__ = ["FETCH_LIMIT", "KEEP_BYTES", "InMemory", "Keyed", "PartSet", "Spilled",
           "keyed_bytes", "load_keyed", "save_keyed"]

FETCH_LIMIT = 1 << 15
"""The most values a spilled part set fetches around one rank in one pass."""

KEEP_BYTES = 1 << 29
"""What a spilled part set keeps in memory: the parts put while their sizes (its ``size``)
fit, else those first read back, by the bytes of their files (a part in memory takes about
as much, up to twice with its strings)."""


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

"""Fast conversions of span-table columns into numpy arrays (private helpers)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:  # O(n + groups) counting sort; ten times faster than a comparison sort here.
    from pandas._libs.algos import groupsort_indexer as _groupsort_indexer
except ImportError:  # pragma: no cover - depends on the pandas build
    _groupsort_indexer = None


def _array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def int64(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    """An int64 column as a numpy array, nulls replaced by ``fill``."""
    arr = _array(col)
    if arr.null_count:
        arr = pc.fill_null(arr, fill)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


def codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Integer codes (int32, -1 for null) and the distinct values of a string column.

    Dictionary columns keep their dictionary (unified across chunks); plain strings are
    hash-encoded.
    """
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col], type=col.type)
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.unify_dictionaries()
    if col.num_chunks == 0:
        return np.empty(0, np.int32), []
    values = col.chunk(0).dictionary.to_pylist()
    idx = pa.chunked_array([c.indices for c in col.chunks]).combine_chunks()
    out = np.asarray(pc.fill_null(idx, -1).to_numpy(zero_copy_only=False), dtype=np.int32)
    return out, values


def id_values(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Span ids as two uint64 words ``(high, low)`` that compare like the id strings, and
    a non-null mask.

    16-character ids (the W3C hex form every OpenTelemetry source writes) are read
    straight from the Arrow buffer as two big-endian words, so numeric order is byte order
    of the strings; any other form falls back to ranks of the sorted distinct strings.
    """
    arr = _array(col)
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(pa.string())
    if pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    n = len(arr)
    present = (
        np.ones(n, bool)
        if arr.null_count == 0
        else np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
    )
    high = np.zeros(n, np.uint64)
    low = np.zeros(n, np.uint64)
    if n == 0 or not present.any():
        return high, low, present
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    lengths = np.diff(offsets)
    if np.all(lengths[present] == 16) and not lengths[~present].any():
        first = int(offsets[0])
        raw = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[first : int(offsets[-1])]
        words = raw.view(">u8").reshape(-1, 2).astype(np.uint64)
        high[present], low[present] = words[:, 0], words[:, 1]
        return high, low, present
    enc = pc.dictionary_encode(arr)
    rank = np.empty(len(enc.dictionary), dtype=np.uint64)
    rank[np.asarray(pc.sort_indices(enc.dictionary))] = np.arange(len(enc.dictionary))
    idx = np.asarray(pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False))
    high[:] = np.where(present, rank[idx], 0)
    return high, low, present


def int_attribute(attributes: pa.ChunkedArray | pa.Array, rows: np.ndarray, key: str) -> np.ndarray:
    """Integer value of ``key`` in the JSON attributes of ``rows``; -1 where absent.

    A regular expression on the JSON text (no JSON parse per row) reads the first
    ``"key": 123`` pair; a key nested in an inner object would match too, which no ttft
    writer or importer produces (a key inside a string value is escaped and never matches).
    """
    out = np.full(len(rows), -1, dtype=np.int64)
    if len(rows) == 0:
        return out
    sub = _array(attributes).take(pa.array(rows, type=pa.int64()))
    if pa.types.is_dictionary(sub.type):
        sub = sub.cast(pa.string())
    sub = pc.fill_null(sub, "")
    hit = np.asarray(pc.match_substring(sub, f'"{key}"').to_numpy(zero_copy_only=False))
    if not hit.any():
        return out
    where = np.flatnonzero(hit)
    found = pc.extract_regex(
        sub.take(pa.array(where)), rf'"{key}"\s*:\s*(?P<v>-?\d{{1,18}})'
    )
    values = pc.cast(pc.fill_null(found.field("v"), "-1"), pa.int64())
    out[where] = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    return out


def group_order(labels: np.ndarray, groups: int) -> np.ndarray:
    """Stable permutation that sorts integer labels in ``[0, groups)``."""
    if len(labels) == 0:
        return np.empty(0, dtype=np.intp)
    if np.all(labels[1:] >= labels[:-1]):
        return np.arange(len(labels))
    if _groupsort_indexer is not None:
        return _groupsort_indexer(labels.astype(np.intp, copy=False), groups)[0]
    return np.argsort(labels, kind="stable")  # pragma: no cover

"""Ids held as bytes (schema version 2, ``tracer.span_ids``) as the analysis reads them
(private to ``analysis``): trace codes, and ids as text, exactly as their hex text would
give them, so a table gives one answer in either layout (docs/design.md, "Schema
versions")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.tracer.span_ids import hex_texts

FOLD = tuple(np.uint64(m) for m in (
    0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
))
"""Odd multipliers folding fixed-width ids' 8-byte words into one (wrapping)."""


def id_texts(ids: pa.Array) -> list[str | None]:
    """Ids as Python text: as they are, or the lowercase hex of ids held as bytes."""
    if pa.types.is_fixed_size_binary(ids.type):
        return _texts(ids)
    return ids.to_pylist()


def _texts(ids: pa.Array) -> list[str | None]:
    return pa.chunked_array(hex_texts(pa.chunked_array([ids])), pa.string()).to_pylist()


def binary_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """``_column_arrays.codes`` of fixed-width binary ids, values as their lowercase hex
    text, in order of first appearance (as hashing their text gives): runs of equal ids
    found by comparing
    each row's bytes with the row before, the run heads' words folded into one integer and
    factorized, then every head checked against its code's first (a shared fold never
    merges two ids); a null id, or a fold two ids share, leaves it to Arrow's hashing."""
    n, width = len(column), column.type.byte_width
    if n == 0:
        return np.empty(0, np.int32), []
    if column.null_count or width % 8:
        return _hashed_binary(column)
    heads, words, last = [], [], None
    at = 0
    for chunk in column.chunks:
        m = len(chunk)
        if m == 0:
            continue
        raw = np.frombuffer(chunk.buffers()[1], np.uint64)[
            chunk.offset * width // 8 : (chunk.offset + m) * width // 8].reshape(m, width // 8)
        head = np.ones(m, bool)
        head[1:] = (raw[1:] != raw[:-1]).any(axis=1)
        if last is not None:
            head[0] = bool((raw[0] != last).any())
        last = raw[-1]
        rows = np.flatnonzero(head)
        heads.append(rows + at)
        words.append(raw[rows])
        at += m
    starts = np.concatenate(heads)
    run_words = np.concatenate(words)
    folded = np.zeros(len(run_words), np.uint64)
    with np.errstate(over="ignore"):
        for j in range(run_words.shape[1]):
            folded ^= run_words[:, j] * FOLD[j % len(FOLD)]
    found, distinct = pd.factorize(folded)
    first = np.empty(len(distinct), np.int64)
    first[found[::-1]] = np.arange(len(found) - 1, -1, -1)  # each code's first run
    if not np.array_equal(run_words, run_words[first[found]]):
        return _hashed_binary(column)
    ids = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(first), [None, pa.py_buffer(run_words[first].tobytes())])
    codes_ = np.repeat(found.astype(np.int32), np.diff(np.append(starts, n)))
    return codes_, _texts(ids)


def _hashed_binary(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """`binary_codes` by Arrow's hash table over every row (-1 for a null id)."""
    enc = pc.dictionary_encode(column.combine_chunks())
    codes_ = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False),
                        dtype=np.int32)
    return codes_, _texts(enc.dictionary)

"""Span ids as pairs of uint64 words that compare like the id strings (private to
``analysis``): read straight from Arrow buffers where every id is a 16-character string,
else ranked among all the picked strings together."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis._column_arrays import by_chunk, compiled, one_array
from ttft.tracer.span_ids import SPAN_BYTES, hex_texts, hex_words, validity


def id_values(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Span ids as two uint64 words ``(high, low)`` that compare like the id strings, and
    a non-null mask (`id_words` of every row of one column)."""
    return id_words((col, None))[0]


Words = tuple[np.ndarray, np.ndarray, np.ndarray]


def id_words(*picks: tuple[pa.ChunkedArray | pa.Array, np.ndarray | None]) -> list[Words]:
    """Span ids at chosen rows of one or more id columns (``(column, rows)``; rows in any
    order, None for all) as ``(high, low, present)``: two uint64 words that compare like
    the id strings, equal words for equal ids across all the picks, and a non-null mask.

    Where every column holds only 16-character ids (the W3C hex form every OpenTelemetry
    source writes) and nulls, the words are read straight from each chunk's Arrow buffer
    at the chosen rows, big-endian, so numeric order is byte order of the strings (no
    copy of the column). Otherwise the chosen strings are ranked among all the picks'
    distinct strings together: ranks taken per column would make a parent id equal to
    another span's id.
    """
    chunked = [col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col])
               for col, _ in picks]
    binary = [pa.types.is_fixed_size_binary(col.type) for col in chunked]
    if all(binary):  # ids as bytes (schema version 2): the words of their hex text
        return [_binary_words(col, rows) for col, (_, rows) in zip(chunked, picks, strict=True)]
    if any(binary):  # one table holds one layout; mixed picks are read as text
        chunked = [pa.chunked_array(hex_texts(col), pa.string()) if b
                   else col for col, b in zip(chunked, binary, strict=True)]
    fixed: dict[int, list | None] = {}
    for col in chunked:
        if id(col) not in fixed:
            found = [_fixed_ids(_id_array(c)) for c in col.chunks]
            fixed[id(col)] = None if any(f is None for f in found) else found
    if all(fixed[id(col)] is not None for col in chunked):
        return [_lower_hex_words(*_gather_words(fixed[id(col)], [len(c) for c in col.chunks],
                                                rows))
                for col, (_, rows) in zip(chunked, picks, strict=True)]
    arrays = [_id_array(one_array(col)) for col in chunked]
    chosen = [arr if rows is None else arr.take(pa.array(rows, type=pa.int64()))
              for arr, (_, rows) in zip(arrays, picks, strict=True)]
    joined = pa.concat_arrays(chosen) if chosen else pa.array([], pa.string())
    enc = pc.dictionary_encode(joined)
    # Hex ids compare without case (OTLP's JSON form allows either): the distinct values
    # that are hex are lowered, and those that then agree get one rank.
    values = enc.dictionary
    is_hex = pc.fill_null(pc.match_substring_regex(values, "^[0-9A-Fa-f]+$"), False)
    folded = pc.dictionary_encode(pc.if_else(is_hex, pc.utf8_lower(values), values))
    rank = np.empty(len(folded.dictionary), dtype=np.uint64)
    rank[np.asarray(pc.sort_indices(folded.dictionary))] = np.arange(len(folded.dictionary))
    rank = rank[np.asarray(folded.indices, dtype=np.int64)] if len(rank) else rank
    idx = np.asarray(pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False))
    # An empty string names no span, as a null does.
    valid = np.asarray(pc.fill_null(pc.greater(pc.binary_length(joined), 0), False)
                       .to_numpy(zero_copy_only=False), dtype=bool)
    high = np.where(valid, rank[idx] if len(rank) else 0, 0).astype(np.uint64)
    cuts = np.cumsum([0] + [len(c) for c in chosen])
    return [(high[a:b], np.zeros(b - a, np.uint64), valid[a:b])
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


_HEX_CASE = np.uint64(0x2020202020202020)  # the bit that sets a letter lower, per byte


def _lower_hex_words(high: np.ndarray, low: np.ndarray, present: np.ndarray) -> Words:
    """16-character ids (as words) that are hex, lowered: OTLP's JSON form allows either
    case, and one id written both ways is one span. Lowercase hex bytes (``0-9a-f``) all
    hold bit 0x20, so one AND over the words says whether any id needs a look (none, in
    what OpenTelemetry writes); ids of other forms keep their case."""
    ones = np.uint64(2**64 - 1)
    every = (np.bitwise_and.reduce(high, where=present, initial=ones)
             & np.bitwise_and.reduce(low, where=present, initial=ones))
    if every & _HEX_CASE == _HEX_CASE:
        return high, low, present
    both = high & low  # a byte of either lacks 0x20 where this byte does
    look = np.flatnonzero(present & ((both & _HEX_CASE) != _HEX_CASE))
    raw = np.stack([high[look], low[look]], axis=1).astype(">u8").view(np.uint8).reshape(-1, 16)
    hexed = (((raw >= 0x30) & (raw <= 0x39)) | ((raw | 0x20) >= 0x61) & ((raw | 0x20) <= 0x66))
    fold = look[hexed.all(axis=1)]
    high, low = high.copy(), low.copy()
    high[fold] |= _HEX_CASE
    low[fold] |= _HEX_CASE
    return high, low, present


def _id_array(arr: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    return arr


def _fixed_ids(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The ``(k, 2)`` big-endian words of the k non-null values of one chunk, in row order,
    and each row's index among them (-1 for a null or an empty string, which names no span;
    None without either); None unless every other value has 16 bytes."""
    n = len(arr)
    if n == 0:
        return np.zeros((0, 2), ">u8"), None
    if not pa.types.is_string(arr.type):
        return None
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    nulls = arr.null_count
    lengths = np.diff(offsets)
    place = None
    if not nulls and int(offsets[-1] - offsets[0]) == 16 * n:
        if not np.all(lengths == 16):
            return None
    else:
        present = lengths == 16
        if nulls:
            present &= validity(arr)
        # The other rows hold no bytes: nulls, and empty strings, which name no span.
        if not np.array_equal(lengths, present.astype(np.int32) << 4):
            return None
        place = np.cumsum(present, dtype=np.int32) - 1  # chunks hold < 2**31 rows
        place[~present] = -1
    data = arr.buffers()[2]
    if data is None:  # every value null (or empty)
        return np.zeros((0, 2), ">u8"), place
    raw = np.frombuffer(data, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]
    return raw.view(">u8").reshape(-1, 2), place


def _binary_words(col: pa.ChunkedArray, rows: np.ndarray | None) -> Words:
    """`id_words` of 8-byte ids at ``rows``: the words of their lowercase hex text
    (``tracer.span_ids.hex_words``), the words a version-1 column of the same ids gives,
    so both layouts give one answer. A null names no span. From the kernels' threshold
    (``_column_arrays.compiled``) one compiled pass reads them (``_kernels.hex_id_words``);
    below it, each chunk's bytes are gathered at its rows and looked up."""
    if col.type.byte_width != SPAN_BYTES:  # not span ids: ranked as their text is
        return id_words((pa.chunked_array(hex_texts(col), pa.string()),
                         rows))[0]

    kernel = compiled(len(col) if rows is None else len(rows))
    if kernel:
        from ttft.analysis._kernels import hex_id_words  # numba: only analysis needs it

    def fill(i: int, local: np.ndarray, high: np.ndarray, low: np.ndarray,
             ok: np.ndarray) -> None:
        chunk = col.chunks[i]
        raw, valid = _chunk_bytes(chunk), validity(chunk)
        if kernel:  # one compiled pass, in place: no gathers of bytes or digits
            hex_id_words(raw, valid, local, high, low, ok)
            return
        ok[:] = valid[local]
        if ok.any():
            words = hex_words(raw[local[ok]])
            high[ok], low[ok] = words[:, 0], words[:, 1]

    return _chunk_words([len(c) for c in col.chunks], rows, fill)


def _chunk_bytes(chunk: pa.Array) -> np.ndarray:
    """One chunk of 8-byte ids as its ``(n, 8)`` bytes (a view; zeros where it holds none)."""
    data = chunk.buffers()[1]
    if data is None:  # every id null
        return np.zeros((len(chunk), SPAN_BYTES), np.uint8)
    return np.frombuffer(data, np.uint8)[
        chunk.offset * SPAN_BYTES : (chunk.offset + len(chunk)) * SPAN_BYTES
    ].reshape(-1, SPAN_BYTES)


def _gather_words(fixed: list[tuple[np.ndarray, np.ndarray | None]], lengths: list[int],
                  rows: np.ndarray | None) -> Words:
    """`id_words` of one column from its chunks' `_fixed_ids`, chunk by chunk."""

    def fill(i: int, local: np.ndarray, high: np.ndarray, low: np.ndarray,
             ok: np.ndarray) -> None:
        words, place = fixed[i]
        if place is None:
            picked = words[local]
            high[:], low[:], ok[:] = picked[:, 0], picked[:, 1], True
            return
        at = place[local]
        ok[:] = at >= 0
        if len(words):
            picked = words[at]
            high[:], low[:] = np.where(ok, picked[:, 0], 0), np.where(ok, picked[:, 1], 0)

    return _chunk_words(lengths, rows, fill)


def _chunk_words(lengths: list[int], rows: np.ndarray | None,
                 fill: Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
                 ) -> Words:
    """Words at ``rows`` (in any order; None for all) of a column whose chunks have
    ``lengths``: the rows sorted once (when they are not), split at the chunk bounds, each
    chunk's share written by ``fill(chunk index, rows within it, high, low, present)``
    into the result's slices (zeros and False until then), then put back in order."""
    if rows is None:
        rows = np.arange(sum(lengths))
    rows = np.asarray(rows, dtype=np.int64)
    perm = None
    if len(rows) > 1 and not np.all(rows[1:] >= rows[:-1]):
        perm = np.argsort(rows, kind="stable")
        rows = rows[perm]
    high = np.zeros(len(rows), np.uint64)
    low = np.zeros(len(rows), np.uint64)
    present = np.zeros(len(rows), bool)
    for i, a, b, local in by_chunk(lengths, rows):
        fill(i, local, high[a:b], low[a:b], present[a:b])
    if perm is None:
        return high, low, present
    back = np.empty_like(perm)
    back[perm] = np.arange(len(perm))
    return high[back], low[back], present[back]


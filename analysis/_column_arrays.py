"""Fast conversions of span-table columns into numpy arrays (private helpers)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ttft.analysis._binary_ids import FOLD, binary_codes

try:  # O(n + groups) counting sort; ten times faster than a comparison sort here.
    from pandas._libs.algos import groupsort_indexer as _groupsort_indexer
except ImportError:  # pragma: no cover - depends on the pandas build
    _groupsort_indexer = None


def one_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one Arrow array (its chunks combined only when there are several)."""
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def take(col: pa.ChunkedArray | pa.Array, rows: np.ndarray) -> pa.Array:
    """``col[rows]`` for ascending ``rows``, chunk by chunk (Arrow's take on a chunked
    string column would first concatenate all of it)."""
    if isinstance(col, pa.Array):
        return col.take(pa.array(rows, type=pa.int64()))
    pieces = [col.chunks[i].take(pa.array(local, type=pa.int64()))
              for i, _, _, local in by_chunk([len(c) for c in col.chunks], rows)]
    if not pieces:
        return pa.array([], type=col.type)
    return pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]


def by_chunk(lengths: Sequence[int], rows: np.ndarray
             ) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """Ascending ``rows`` of a column whose chunks have ``lengths``, split at the chunk
    bounds: per chunk holding some, ``(chunk, a, b, local)``, ``rows[a:b]`` being in it at
    ``local``."""
    bounds = np.cumsum([0, *lengths])
    cuts = np.searchsorted(rows, bounds)
    for i in range(len(lengths)):
        a, b = int(cuts[i]), int(cuts[i + 1])
        if b > a:
            yield i, a, b, rows[a:b] - bounds[i]


def among(codes: np.ndarray, wanted, size: int) -> np.ndarray:
    """``codes`` (integers in ``[-1, size)``, -1 for none) that are one of ``wanted``, by a
    lookup table: several times faster than ``np.isin`` over a column."""
    table = np.zeros(size + 1, bool)  # the last entry answers for -1
    table[list(wanted)] = True
    return table[codes]


def int64(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    """An int64 column as a numpy array, nulls replaced by ``fill``: a view of Arrow's
    buffer where the column is one chunk (read-only), else one copy numpy owns (writable,
    so a caller may move it in place: ``assemble._moved``), filled chunk by chunk."""
    if isinstance(col, pa.ChunkedArray) and col.num_chunks > 1:
        out = np.empty(len(col), np.int64)
        at = 0
        for chunk in col.chunks:
            if chunk.null_count:
                chunk = pc.fill_null(chunk, fill)
            out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
            at += len(chunk)
        return out
    arr = one_array(col)
    if arr.null_count:
        arr = pc.fill_null(arr, fill)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


def codes(col: pa.ChunkedArray | pa.Array, *, runs: bool = False
          ) -> tuple[np.ndarray, list[str]]:
    """Integer codes (int32, -1 for null) and the distinct values of a string column.

    Dictionary columns keep their dictionary (unified across chunks); plain strings are
    hash-encoded, with ``runs`` by runs of equal values where they hold few enough
    (`_run_codes`: trace ids, whose rows files keep together).
    """
    found, values, _ = _codes_from(col, runs)
    return found, values


def _codes_from(col: pa.ChunkedArray | pa.Array, runs: bool
                ) -> tuple[np.ndarray, list[str], pa.Array | None]:
    """`codes`, and an Arrow array holding every value (None without values)."""
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col], type=col.type)
    if not pa.types.is_dictionary(col.type):
        found = _run_codes(col) if runs else None
        if found is not None:
            return found
        # One hash table over the whole column: encoding chunk by chunk and unifying the
        # dictionaries afterwards is several times slower for high-cardinality ids.
        col = pa.chunked_array([pc.dictionary_encode(one_array(col))])
    col = col.unify_dictionaries()
    if col.num_chunks == 0:
        return np.empty(0, np.int32), [], None
    source = col.chunk(0).dictionary
    values = source.to_pylist()
    if len(set(values)) < len(values):  # a dictionary that holds a value twice: one code
        first: dict = {}
        merged = np.array([first.setdefault(v, len(first)) for v in values], np.int32)
        found = _indices(col)
        found = np.where(found >= 0, merged[np.maximum(found, 0)], np.int32(-1))
        return found, list(first), pa.array(list(first), source.type)
    return _indices(col), values, source


def _indices(col: pa.ChunkedArray) -> np.ndarray:
    """The indices of a dictionary column with unified dictionaries as one int32 array (-1
    for null): copied once, chunk by chunk, straight from each chunk's buffer where it
    holds no null (combining the chunks, filling nulls and converting were three copies)."""
    out = np.empty(len(col), np.int32)
    at = 0
    for chunk in col.chunks:
        idx, n = chunk.indices, len(chunk)
        if n and not idx.null_count and idx.type == pa.int32():
            out[at:at + n] = np.frombuffer(idx.buffers()[1], np.int32, n, idx.offset * 4)
        elif n:
            out[at:at + n] = pc.fill_null(idx, -1).to_numpy(zero_copy_only=False)
        at += n
    return out


def blank_as_null(found: tuple[np.ndarray, list[str]]) -> tuple[np.ndarray, list[str]]:
    """`codes` with the empty string's code, if any, turned into -1: an empty id names
    nothing, as a null does (the value stays in the list, unused)."""
    codes_, values = found
    if "" in values:
        codes_ = np.where(codes_ == values.index(""), np.int32(-1), codes_)
    return codes_, values


def trace_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """`codes` of a ``trace_id`` column as every step groups it: by runs, an empty id as
    null (`blank_as_null`), hex ids without case (`fold_hex_case`). Ids as bytes (schema
    version 2) give the codes and values (lowercase hex text) their text would
    (``_binary_ids.binary_codes``)."""
    if pa.types.is_fixed_size_binary(column.type):
        return binary_codes(column if isinstance(column, pa.ChunkedArray)
                            else pa.chunked_array([column]))
    found, values, source = _codes_from(column, True)
    return fold_hex_case(blank_as_null((found, values)), source)


def fold_hex_case(found: tuple[np.ndarray, list[str]], source: pa.Array | None = None
                  ) -> tuple[np.ndarray, list[str]]:
    """`codes` with hex values that differ only in case made one (the lowercase value, in
    order of first appearance): OTLP's JSON form allows either case. Lowercase hex bytes
    all hold bit 0x20, so one AND over the bytes of the values (or of ``source``, an Arrow
    string array holding every value) clears the usual case."""
    codes_, values = found
    if not values:
        return found
    if source is not None and pa.types.is_string(source.type) and source.buffers()[2]:
        offsets = np.frombuffer(source.buffers()[1], np.int32)[
            source.offset : source.offset + len(source) + 1]
        data = np.frombuffer(source.buffers()[2], np.uint8)[int(offsets[0]) : int(offsets[-1])]
    else:
        data = np.frombuffer("".join(values).encode(), np.uint8)
    cut = len(data) // 8 * 8
    every = np.bitwise_and.reduce(data[:cut].view(np.uint64), initial=np.uint64(2**64 - 1))
    every = int(every) & 0x2020202020202020
    if every == 0x2020202020202020 and np.bitwise_and.reduce(data[cut:], initial=255) & 0x20:
        return found
    arr = pa.array(values, pa.string())
    is_hex = pc.fill_null(pc.match_substring_regex(arr, "^[0-9A-Fa-f]+$"), False)
    lowered = pc.if_else(is_hex, pc.utf8_lower(arr), arr)
    if lowered.equals(arr):
        return found
    merged, uniques = pd.factorize(np.asarray(lowered.to_pylist(), dtype=object))
    merged = merged.astype(np.int32)
    return np.where(codes_ >= 0, merged[np.maximum(codes_, 0)], np.int32(-1)), list(uniques)


def _run_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str], pa.Array] | None:
    """`codes` of a string column whose equal values mostly sit in runs (a trace's rows are
    written together): equal neighbours are found by Arrow's string comparison, and only
    the first value of each run is hashed. Codes and values are those of hashing every
    row (values in order of first appearance), with the run heads (an Arrow array holding
    every value). Neighbouring nulls are one run (request ids: a trace's client rows have
    none). None when runs are not a quarter of the rows or fewer: hashing everything is
    then cheaper."""
    n = len(col)
    if n < 2:
        return None
    after, before = col.slice(1), col.slice(0, n - 1)
    same = pc.equal(after, before)
    if col.null_count:
        same = pc.or_kleene(same, pc.and_(pc.is_null(after), pc.is_null(before)))
    same = pc.fill_null(same, False)
    head = np.ones(n, bool)
    head[1:] = ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    heads = np.flatnonzero(head)
    if len(heads) * 4 > n:
        return None
    firsts = take(col, heads)
    found = _fixed_width_codes(firsts)
    if found is None:
        enc = pc.dictionary_encode(firsts)
        per_run = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False),
                             dtype=np.int32)
        values = enc.dictionary.to_pylist()
    else:
        per_run, values = found
    return np.repeat(per_run, np.diff(np.append(heads, n))), values, firsts





def _fixed_width_codes(texts: pa.Array) -> tuple[np.ndarray, list[str]] | None:
    """`codes` of a string array whose values all have one width, a multiple of 8 bytes
    up to 32 (hex trace ids: 32), no null: each value's words folded into one integer and
    those factorized (pandas' integer hash table, several times faster than hashing the
    strings), then every value checked against its code's first value, so a fold shared by
    two values never merges them (None then, as for any other array)."""
    n = len(texts)
    if n == 0 or texts.null_count or not pa.types.is_string(texts.type):
        return None
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset : texts.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width % 8 or not 8 <= width <= 32 or int(offsets[-1] - offsets[0]) != width * n:
        return None
    if not np.all(np.diff(offsets) == width):
        return None
    raw = np.frombuffer(texts.buffers()[2], np.uint8)[int(offsets[0]) : int(offsets[-1])]
    words = raw.view(np.uint64).reshape(n, width // 8)
    folded = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            folded ^= words[:, j] * FOLD[j]
    found, distinct = pd.factorize(folded)
    first = np.empty(len(distinct), np.int64)
    first[found[::-1]] = np.arange(n - 1, -1, -1)  # the first row of each code
    if not np.array_equal(words, words[first[found]]):
        return None
    return found.astype(np.int32), texts.take(pa.array(first)).to_pylist()


def narrow(codes: np.ndarray, n_values: int) -> np.ndarray:
    """Codes (-1 for null) into ``n_values`` values as int16 where they fit: for codes held
    to the end of an analysis (``Rows.service``, ``Rows.clock``), 2 B a row less each."""
    return codes.astype(np.int16) if n_values < 2**15 else codes


def release_arrow_pool() -> None:
    """Hand what Arrow's memory pool holds free (mimalloc keeps it for Arrow alone) back
    to the system, where numpy's next arrays find it (docs/architecture.md, "Memory is
    time": with the other steps there, the peak above the input at 23.8M spans fell from
    154-155 to 127 B a span). Cheap: a few ms."""
    pa.default_memory_pool().release_unused()


KERNEL_ROWS = 262_144
"""Rows from which a compiled kernel (``analysis._kernels``) does the work of a vectorized
step: below it, importing numba and loading the kernel (about 0.45 s) costs more than the
kernel saves, so small traces never import it."""

LOADED_KERNEL_ROWS = 4_096
"""Rows from which a compiled kernel does the work once numba is loaded in this process
(the warm-up, ``analysis.kernel_warmup``, or an earlier kernel paid its start-up): each
loads from its cache in milliseconds, and runs faster than the vectorized step from a few
thousand rows on (at 2.4M spans, whose prefill chunks and engine spans are under
`KERNEL_ROWS`, the analysis took 1.06-1.14 s against 1.16-1.28)."""


def compiled(rows: int) -> bool:
    """Whether a compiled kernel does a step of ``rows`` rows: from `KERNEL_ROWS` on, and
    from `LOADED_KERNEL_ROWS` on where numba is loaded already. Both ways give the same
    answer (each kernel's tests compare them); only the time differs."""
    return rows >= KERNEL_ROWS or (rows >= LOADED_KERNEL_ROWS and "numba" in sys.modules)


_BLANK = "[ \\t\\n\\r]*"  # JSON whitespace


def int_attribute(attributes: pa.ChunkedArray | pa.Array, rows: np.ndarray, key: str) -> np.ndarray:
    """Integer value of the top-level ``key`` in the JSON attributes of ``rows``
    (ascending); -1 where absent or not an integer.

    By Arrow's RE2, no JSON parse per row: ``"key"``, optional whitespace, ``:``, optional
    whitespace, an optional ``-`` and 1 to 18 digits, then an optional ``.`` and zeros (an
    integer sent as a double), that no digit, ``.``, ``e`` or ``E`` follows. The first
    match is the top-level key in an object holding no other object and no backslash
    (`json_shapes`: in what every ttft writer produces, all of them); in an object holding
    another, a nested one may come first, and the expression must see nothing but ``{``
    and text without another ``{`` before the key. A text with a backslash (an escaped
    quote or ``\\u`` escape may hide or fake the key) or one that names the key where no
    expression read it is parsed as JSON: few in any real trace. (A substring search for
    the key and a numpy parse of the bytes after it measured slower: RE2 takes
    about 0.35 µs a row, the search alone 0.15.) From `KERNEL_ROWS` rows on, a compiled
    scan of the same rule reads them (`_scanned`).
    """
    if len(rows) == 0:
        return np.full(0, -1, dtype=np.int64)
    if compiled(len(rows)):
        return _scanned(attributes, rows, key)
    sub = take(attributes, rows)
    if pa.types.is_dictionary(sub.type) or pa.types.is_large_string(sub.type):
        sub = sub.cast(pa.string())
    number = "(?P<v>-?[0-9]{1,18})(?:\\.0*)?(?:[^.0-9eE]|$)"  # 3.0: OTLP's doubleValue
    name = json.dumps(key)
    tail = f"{re.escape(name)}{_BLANK}:{_BLANK}{number}"
    out = _extracted(sub, tail)
    flat, escaped = json_shapes(sub)
    out[~flat] = -1
    nested = np.flatnonzero(~flat & ~escaped)
    if len(nested):
        out[nested] = _extracted(sub.take(pa.array(nested)), f"^{_BLANK}\\{{[^{{]*?{tail}")
    parse = escaped.copy()
    unread = np.flatnonzero((out < 0) & ~escaped)
    if len(unread):
        named = pc.fill_null(pc.match_substring(sub.take(pa.array(unread)), name), False)
        parse[unread[np.asarray(named.to_numpy(zero_copy_only=False), bool)]] = True
    at = np.flatnonzero(parse)
    if len(at):
        out[at] = [_parsed_int(t, key) for t in sub.take(pa.array(at)).to_pylist()]
    return out


def _scanned(attributes: pa.ChunkedArray | pa.Array, rows: np.ndarray, key: str) -> np.ndarray:
    """`int_attribute` by a compiled scan of each chunk's bytes (`_kernels.int_scan`, the
    same rule as the expressions, about four times faster); only the texts it cannot
    answer (a backslash, a negative value, the key named where the scan read none) are
    parsed as JSON."""
    from ttft.analysis._kernels import PARSE, int_scan  # numba: only analysis needs it

    out = np.full(len(rows), -1, dtype=np.int64)
    column = attributes if isinstance(attributes, pa.ChunkedArray) else pa.chunked_array(
        [attributes])
    rows = np.asarray(rows, dtype=np.int64)
    name = np.frombuffer(json.dumps(key).encode(), np.uint8)
    for i, a, b, local in by_chunk([len(c) for c in column.chunks], rows):
        chunk = column.chunks[i]
        if pa.types.is_dictionary(chunk.type) or pa.types.is_large_string(chunk.type):
            chunk = chunk.cast(pa.string())
        n = len(chunk)
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)[chunk.offset : chunk.offset + n + 1]
        data = chunk.buffers()[2]
        data = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
        valid = (np.ones(n, bool) if not chunk.null_count else
                 np.asarray(pc.is_valid(chunk).to_numpy(zero_copy_only=False), bool))
        int_scan(offsets, data, valid, local, name, out[a:b])
    at = np.flatnonzero(out == PARSE)
    if len(at):
        texts = take(column, rows[at]).to_pylist()
        out[at] = [_parsed_int(t, key) for t in texts]
    return out


def _extracted(texts: pa.Array, pattern: str) -> np.ndarray:
    """The group ``v`` of ``pattern`` in each of ``texts`` as int64 (-1: no match), writable."""
    found = pc.extract_regex(texts, pattern)
    values = pc.fill_null(pc.cast(pc.struct_field(found, [0]), pa.int64()), -1)
    return np.array(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def json_shapes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per text (a string array): ``flat``, it begins with ``{`` and holds no other ``{`` and
    no backslash; ``escaped``, it holds a backslash. One count of ``{`` and one test for
    ``\\`` over the whole buffer answer for every row in the usual case (as many ``{`` as
    rows that begin with one, no backslash); else the rows are searched one by one."""
    n = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset : texts.offset + n + 1]
    data = texts.buffers()[2]
    lengths = np.diff(offsets)
    opens = np.zeros(n, bool)
    escaped = np.zeros(n, bool)
    if data is None or not (lengths > 0).any():
        return opens, escaped
    raw = np.frombuffer(data, np.uint8)
    some = lengths > 0
    opens[some] = raw[offsets[:-1][some]] == 0x7B
    if texts.null_count:
        opens &= np.asarray(pc.is_valid(texts).to_numpy(zero_copy_only=False), bool)
    body = raw[int(offsets[0]) : int(offsets[-1])]
    if (body == 0x5C).any():
        found = pc.fill_null(pc.match_substring(texts, "\\"), False)
        escaped = np.asarray(found.to_numpy(zero_copy_only=False), bool)
    if np.count_nonzero(body == 0x7B) == np.count_nonzero(opens):
        return opens & ~escaped, escaped
    ones = pc.fill_null(pc.equal(pc.count_substring(texts, "{"), 1), False)
    return opens & ~escaped & np.asarray(ones.to_numpy(zero_copy_only=False), bool), escaped


def _parsed_int(text: str, key: str) -> int:
    """`int_attribute` of one JSON text by a full parse (-1 where malformed)."""
    try:
        value = json_int(json.loads(text).get(key))
    except (ValueError, AttributeError):
        return -1
    return -1 if value is None else value


def json_int(value: object) -> int | None:
    """A parsed JSON value as an integer attribute: an int, or a float with no fraction
    (OTLP sends some integers as ``doubleValue``), below 10^18 in magnitude; else None
    (a bool is no integer)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**18:
        return value
    return None


def smallest_by_value(
    group: np.ndarray, codes: np.ndarray, values: list[str], n_groups: int
) -> np.ndarray:
    """Per group in ``[0, n_groups)``, the code (into ``values``) of the smallest value
    among the ``codes`` of its members; -1 for a group without members.

    The choice depends on the values alone, never on the members' order. O(members): only
    the groups holding two distinct codes compare strings.
    """
    out = np.full(n_groups, -1, np.int64)
    out[group] = codes  # some member's code; right unless the group holds two codes
    differs = codes != out[group]
    if differs.any():
        mixed = np.zeros(n_groups, bool)
        mixed[group[differs]] = True
        mine = mixed[group]
        used = np.unique(codes[mine])
        by_value = used[np.argsort(np.asarray([values[c] for c in used], dtype=object))]
        rank = np.full(len(values), -1, np.int64)
        rank[by_value] = np.arange(len(by_value))
        best = np.full(n_groups, len(by_value), np.int64)
        np.minimum.at(best, group[mine], rank[codes[mine]])
        out[mixed] = by_value[best[mixed]]
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

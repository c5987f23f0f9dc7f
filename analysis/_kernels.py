"""Compiled loops (numba) for what numpy can only do in many passes over a column (private
to ``analysis``). Each kernel has one job, is exact (the numpy or regex rule it replaces
is in its docstring and its tests compare the two), and is compiled once per machine
(``cache=True``: later processes load it from ``__pycache__``)."""

from __future__ import annotations

import numpy as np
from numba import njit

PARSE = -2
"""`int_scan`'s answer for a text that needs a full JSON parse."""


@njit(cache=True, nogil=True)
def _is_ws(c: int) -> bool:
    return c == 0x20 or c == 0x09 or c == 0x0A or c == 0x0D


@njit(cache=True, nogil=True)
def _number_at(data: np.ndarray, q: int, end: int) -> int:
    """The value of ``-?[0-9]{1,18}(?:\\.0*)?(?:[^.0-9eE]|$)`` matched at ``q``: -1 for no
    match, `PARSE` for a negative one (the regex rule parses those, to tell a malformed
    text's -1), else the value (``-0`` is 0).

    Deterministic as the regex is: a run of more than 18 digits never matches (every
    shorter prefix is followed by a digit), and a ``.`` matches only with zeros after it
    and then the end or a character outside ``.0-9eE``."""
    neg = False
    if q < end and data[q] == 0x2D:  # '-'
        neg = True
        q += 1
    value = 0
    digits = 0
    while q < end and 0x30 <= data[q] <= 0x39:
        value = value * 10 + (data[q] - 0x30)
        digits += 1
        q += 1
        if digits > 18:
            return -1
    if digits == 0:
        return -1
    if q < end and data[q] == 0x2E:  # '.': only zeros may follow
        q += 1
        while q < end and data[q] == 0x30:
            q += 1
    if q < end:
        c = data[q]
        if c == 0x2E or c == 0x65 or c == 0x45 or 0x30 <= c <= 0x39:
            return -1
    return PARSE if neg and value else value


@njit(cache=True, nogil=True)
def int_scan(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray, rows: np.ndarray,
             name: np.ndarray, out: np.ndarray) -> None:
    """``_column_arrays.int_attribute`` of the texts at ``rows`` of one Arrow string chunk
    (``offsets``/``data`` its buffers, ``valid`` its validity per row), into ``out``:
    the integer after the top-level key ``name`` (the key's JSON string, as bytes), -1
    where none, `PARSE` where only a JSON parse can tell.

    The rule is the expressions' it stands in for: a text with a backslash is parsed (an
    escape may hide or fake the key); else, where the text is whitespace, ``{`` and more,
    the first ``name``, whitespace, ``:``, whitespace and number (`_number_at`) that starts
    before any second ``{`` (a nested object may hold the key) gives the value; a text
    with no such match that still names the key anywhere is parsed; else -1."""
    for i in range(len(rows)):
        r = rows[i]
        out[i] = -1
        if valid[r]:
            out[i] = _text_int(data, offsets[r], offsets[r + 1], name)


@njit(cache=True, nogil=True)
def _text_int(data: np.ndarray, a: int, b: int, name: np.ndarray) -> int:
    """`int_scan` of the one text ``data[a:b]``."""
    for p in range(a, b):
        if data[p] == 0x5C:  # a backslash
            return PARSE
    s = a
    while s < b and _is_ws(data[s]):
        s += 1
    stop = a  # matches may start before `stop` only (none unless the text opens with {)
    if s < b and data[s] == 0x7B:
        stop = s + 1
        while stop < b and data[stop] != 0x7B:
            stop += 1
    named = False
    for p in range(a, b - len(name) + 1):
        if not _named_at(data, p, name):
            continue
        if p >= stop:
            return PARSE
        named = True
        value = _value_after(data, p + len(name), b)
        if value != -1:
            return value
    return PARSE if named else -1


@njit(cache=True, nogil=True)
def _named_at(data: np.ndarray, p: int, name: np.ndarray) -> bool:
    for j in range(len(name)):
        if data[p + j] != name[j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _value_after(data: np.ndarray, q: int, b: int) -> int:
    """Whitespace, ``:``, whitespace and `_number_at` from ``q``; -1 where they do not
    match."""
    while q < b and _is_ws(data[q]):
        q += 1
    if q >= b or data[q] != 0x3A:  # ':'
        return -1
    q += 1
    while q < b and _is_ws(data[q]):
        q += 1
    return _number_at(data, q, b)


MAX_SWEEP = 63
"""Most spans a request may have for `exclusive_sweep` (more: the vectorized blocks)."""
_REL_MAX = (1 << 53) - 1


@njit(cache=True, nogil=True)
def exclusive_sweep(counts, offsets, has, a, b, root, has_cut, cut_lo, cut_hi,
                    stage, client, start, end, keep, depth, sid_hi, sid_lo,
                    tables, codes, att, cov, raw, slow) -> None:
    """``attribution`` of every request with ``has`` under the ``exclusive`` policy, one
    request at a time: ``att``, ``cov`` and ``raw`` rows (ns per stage code) as the
    vectorized blocks (``attribution._Block``) give them, with the same clipping, order key
    and elementary segments. ``tables`` rows are the stage codes' eligibility at this
    boundary, priority and name rank; ``codes`` the root-only stage, ``unattributed`` and
    1 at the client boundary (client spans eligible). A request of more than `MAX_SWEEP`
    spans, or whose order the span ids and stage names leave tied (the blocks then compare
    trace ids), is marked in ``slow`` and left to the blocks."""
    lo = np.empty(MAX_SWEEP, np.int64)
    hi = np.empty(MAX_SWEEP, np.int64)
    key = np.empty(MAX_SWEEP, np.int64)
    inc = np.empty(MAX_SWEEP, np.bool_)
    order = np.empty(MAX_SWEEP, np.int64)
    pts = np.empty(2 * MAX_SWEEP + 2, np.int64)
    for r in range(len(counts)):
        k = counts[r]
        if k == 0 or not has[r]:
            continue
        if k > MAX_SWEEP:
            slow[r] = True
            continue
        o = offsets[r]
        _clip(r, k, o, a, b, root, has_cut, cut_lo, cut_hi, stage, client, start, end, keep,
              depth, tables, codes, lo, hi, key, inc)
        if not _rank(k, o, key, sid_hi, sid_lo, stage, tables[2], order):
            slow[r] = True
            continue
        m = 2
        pts[0], pts[1] = a[r], b[r]
        for j in range(k):
            s = stage[o + j]
            raw[r, s] += hi[j] - lo[j]
            if inc[j] and hi[j] > lo[j]:
                pts[m], pts[m + 1] = lo[j], hi[j]
                m += 2
        seg = pts[:m]
        seg.sort()
        for i in range(m - 1):
            t0, t1 = seg[i], seg[i + 1]
            if t1 == t0:
                continue
            owner = -1
            for q in range(k - 1, -1, -1):  # the largest key active on [t0, t1)
                c = order[q]
                if inc[c] and lo[c] <= t0 and hi[c] >= t1:
                    owner = c
                    break
            if owner < 0:
                att[r, codes[1]] += t1 - t0
            elif owner == root[r]:
                att[r, codes[0]] += t1 - t0
            else:
                att[r, stage[o + owner]] += t1 - t0
        _covered(r, k, o, stage, inc, lo, hi, raw, cov, order)


@njit(cache=True, nogil=True)
def _clip(r, k, o, a, b, root, has_cut, cut_lo, cut_hi, stage, client, start, end,
          keep, depth, tables, codes, lo, hi, key, inc) -> None:
    """A request's spans clipped to its window (and, on the server's side at the client
    boundary, to the server's window), the root's made the whole window, and each one's
    exclusive key ``(priority + 1, depth capped at 31, start after the request's first)``
    packed as ``_Block`` packs it (``-1`` priority for a span that takes no time)."""
    ar, br = a[r], b[r]
    smin = start[o]
    for j in range(1, k):
        smin = min(smin, start[o + j])
    for j in range(k):
        s = o + j
        st = stage[s]
        cl = client[s]
        ok = keep[s] and tables[0, st] == 1 and (codes[2] == 1 or not cl)
        low = max(start[s], ar)
        high = min(end[s], br)
        if has_cut[r] and not cl:
            low = max(low, cut_lo[r])
            high = min(high, cut_hi[r])
        is_root = j == root[r]
        ok = (ok and high > low) or is_root
        if is_root:
            low, high = ar, br
        if not ok:
            low, high = ar, ar
        prio = -1 if not ok else (0 if is_root else tables[1, st])
        rel = start[s] - smin  # wraps as numpy's does, for clocks 2^63 ns apart
        rel = _REL_MAX if rel < 0 or rel > _REL_MAX else rel
        key[j] = ((prio + 1) << 58) | (min(np.int64(depth[s]), 31) << 53) | rel
        lo[j], hi[j], inc[j] = low, high, ok


@njit(cache=True, nogil=True)
def _rank(k, o, key, sid_hi, sid_lo, stage, name_rank, order) -> bool:
    """``order[:k]``: the columns by ascending ``(key, span id, stage name)``; False where
    two columns tie in all of them."""
    for j in range(k):
        order[j] = j
        q = j
        while q > 0 and _before(order[q], order[q - 1], o, key, sid_hi, sid_lo, stage,
                                name_rank) > 0:
            order[q], order[q - 1] = order[q - 1], order[q]
            q -= 1
    for q in range(1, k):
        if _before(order[q - 1], order[q], o, key, sid_hi, sid_lo, stage, name_rank) == 0:
            return False
    return True


@njit(cache=True, nogil=True)
def _before(x, y, o, key, sid_hi, sid_lo, stage, name_rank) -> int:
    """1 when column ``x`` sorts before ``y``, -1 after, 0 tied (`_rank`'s keys)."""
    if key[x] != key[y]:
        return 1 if key[x] < key[y] else -1
    if sid_hi[o + x] != sid_hi[o + y]:
        return 1 if sid_hi[o + x] < sid_hi[o + y] else -1
    if sid_lo[o + x] != sid_lo[o + y]:
        return 1 if sid_lo[o + x] < sid_lo[o + y] else -1
    nx, ny = name_rank[stage[o + x]], name_rank[stage[o + y]]
    if nx != ny:
        return 1 if nx < ny else -1
    return 0


@njit(cache=True, nogil=True)
def _covered(r, k, o, stage, inc, lo, hi, raw, cov, scratch) -> None:
    """``cov[r]``: per stage, the union of its included spans' clipped intervals (its raw
    sum where it has one); ``scratch`` is overwritten. ``done`` marks the stages summed
    (stage codes are < 63), so a stage whose union is 0 ns is summed once too."""
    done = 0
    for j in range(k):
        s = stage[o + j]
        if not inc[j] or (done >> s) & 1:
            continue
        done |= 1 << s
        n = 0
        for q in range(j, k):  # this stage's included columns, by ascending start
            if inc[q] and stage[o + q] == s:
                scratch[n] = q
                p = n
                n += 1
                while p > 0 and lo[scratch[p]] < lo[scratch[p - 1]]:
                    scratch[p], scratch[p - 1] = scratch[p - 1], scratch[p]
                    p -= 1
        if n == 1:
            cov[r, s] = raw[r, s]
            continue
        total, far = 0, lo[scratch[0]]
        for p in range(n):
            c = scratch[p]
            if hi[c] > far:
                total += hi[c] - max(lo[c], far)
                far = hi[c]
        cov[r, s] = total


_MIX_A = np.uint64(0x9E3779B97F4A7C15)
_MIX_B = np.uint64(0xBF58476D1CE4E5B9)


@njit(cache=True, nogil=True)
def _slot(t: np.uint64, hi: np.uint64, lo: np.uint64, mask: np.uint64) -> np.int64:
    """A hash of the key ``(t, hi, lo)`` as a slot of a table of ``mask + 1`` slots."""
    x = (t * _MIX_A) ^ hi
    x = (x ^ (x >> np.uint64(29))) * _MIX_B ^ lo
    x = (x ^ (x >> np.uint64(32))) * _MIX_A
    return np.int64((x ^ (x >> np.uint64(29))) & mask)


@njit(cache=True, nogil=True)
def first_of_keys(kt, kh, kl, qt, qh, ql, out) -> None:
    """For each query ``(qt[i], qh[i], ql[i])``, the first index ``j`` whose key
    ``(kt[j], kh[j], kl[j])`` equals it, into ``out[i]``; -1 where no key does (all uint64).

    What ``pandas`` answers as ``query.merge(keys.drop_duplicates(), on=key)`` (the first
    row of each distinct key kept) by one open-addressing hash table over the keys, linear
    in both, where the merge hashes and sorts every column several times."""
    size = 1
    while size < 2 * len(kt) + 1:
        size *= 2
    mask = np.uint64(size - 1)
    table = np.full(size, -1, np.int64)
    for j in range(len(kt)):
        s = _slot(kt[j], kh[j], kl[j], mask)
        while True:
            at = table[s]
            if at < 0:
                table[s] = j
                break
            if kt[at] == kt[j] and kh[at] == kh[j] and kl[at] == kl[j]:
                break  # the first of the key stays
            s = (s + 1) & (size - 1)
    for i in range(len(qt)):
        out[i] = -1
        s = _slot(qt[i], qh[i], ql[i], mask)
        while True:
            at = table[s]
            if at < 0:
                break
            if kt[at] == qt[i] and kh[at] == qh[i] and kl[at] == ql[i]:
                out[i] = at
                break
            s = (s + 1) & (size - 1)


@njit(cache=True, nogil=True)
def _hex_digit(nibble: np.uint64) -> np.uint64:
    """The lowercase hex digit of ``nibble`` as its ASCII code."""
    return nibble + np.uint64(48) if nibble < np.uint64(10) else nibble + np.uint64(87)


@njit(cache=True, nogil=True)
def _hex_word(raw: np.ndarray, r: int, first: int) -> np.uint64:
    """The big-endian uint64 of the 8 lowercase hex digits of bytes ``first .. first+3`` of
    row ``r`` of ``raw``."""
    word = np.uint64(0)
    eight, four, low = np.uint64(8), np.uint64(4), np.uint64(15)
    for j in range(first, first + 4):
        b = np.uint64(raw[r, j])
        word = (word << eight) | _hex_digit(b >> four)
        word = (word << eight) | _hex_digit(b & low)
    return word


@njit(cache=True, nogil=True)
def hex_id_words(raw, valid, rows, high, low, ok) -> None:
    """``tracer.span_ids.hex_words`` of the 8-byte ids at ``rows`` (in any order) of one
    chunk (``raw`` its ``(n, 8)`` bytes, ``valid`` its rows' validity) into ``high``,
    ``low`` and ``ok``: the two big-endian words of each id's 16-digit lowercase hex text;
    0, 0 and False for a null."""
    for i in range(len(rows)):
        r = rows[i]
        if valid[r]:
            high[i] = _hex_word(raw, r, 0)
            low[i] = _hex_word(raw, r, 4)
            ok[i] = True
        else:
            high[i] = np.uint64(0)
            low[i] = np.uint64(0)
            ok[i] = False

"""The compiled cutting of span columns out of a scanned OTLP body (numba; private to
``collectors``): strings gathered into Arrow buffers, ids as lowercase hex, event span ids,
and the ``attributes`` column's JSON written as ``rows.attributes_json`` writes it
(``json.dumps(..., sort_keys=True, separators=(",", ":"))``: ``ensure_ascii``, so every
character outside ``' '..'~'`` is escaped, ``\\uXXXX`` in lowercase hex, as a surrogate
pair past U+FFFF). The tables come from :mod:`ttft.collectors._otlp_scan`."""

from __future__ import annotations

import numpy as np
from numba import njit

from ttft.collectors._otlp_scan import (
    K_A,
    K_B,
    K_KEY,
    K_KEY_LEN,
    K_KIND,
    KIND_BOOL,
    KIND_INT,
    KIND_RAW,
    KIND_STR,
)
from ttft.collectors._otlp_wire import compare

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_SHORT = np.zeros(128, np.uint8)  # the one-letter escapes json writes
for _char, _letter in zip(b'"\\\n\r\t\b\f', b'"\\nrtbf', strict=True):
    _SHORT[_char] = _letter
_TRUE = np.frombuffer(b"true", np.uint8)
_FALSE = np.frombuffer(b"false", np.uint8)
_NULL = np.frombuffer(b"null", np.uint8)
_INT64_MIN = -(1 << 63)
_INT64_MIN_DIGITS = np.frombuffer(b"9223372036854775808", np.uint8)

# ``lit``: offsets and lengths in ``data`` of the status keys and values
L_CODE_KEY, L_CODE_KEY_LEN, L_MSG_KEY, L_MSG_KEY_LEN, L_OK, L_OK_LEN, L_ERROR, L_ERROR_LEN = \
    range(8)


@njit(cache=True, nogil=True)
def _u16(out: np.ndarray, o: int, unit: int) -> int:
    out[o], out[o + 1] = 0x5C, 0x75  # \u
    for i in range(4):
        out[o + 2 + i] = _HEX[(unit >> (12 - 4 * i)) & 0xF]
    return o + 6


@njit(cache=True, nogil=True)
def _string(data: np.ndarray, p: int, n: int, out: np.ndarray, o: int) -> int:
    """``data[p:p+n]`` (valid UTF-8) as a JSON string at ``out[o]``; the end."""
    out[o] = 0x22
    o += 1
    end = p + n
    while p < end:
        c = np.int64(data[p])
        if 0x20 <= c <= 0x7E:
            if c == 0x22 or c == 0x5C:
                out[o] = 0x5C
                o += 1
            out[o] = c
            o += 1
            p += 1
            continue
        if c < 0x80:
            if _SHORT[c]:
                out[o], out[o + 1] = 0x5C, _SHORT[c]
                o += 2
            else:
                o = _u16(out, o, c)
            p += 1
            continue
        if c < 0xE0:
            cp, n_more = c & 0x1F, 1
        elif c < 0xF0:
            cp, n_more = c & 0x0F, 2
        else:
            cp, n_more = c & 0x07, 3
        for i in range(1, n_more + 1):
            cp = (cp << 6) | (np.int64(data[p + i]) & 0x3F)
        p += n_more + 1
        if cp < 0x10000:
            o = _u16(out, o, cp)
        else:
            cp -= 0x10000
            o = _u16(out, o, 0xD800 | (cp >> 10))
            o = _u16(out, o, 0xDC00 | (cp & 0x3FF))
    out[o] = 0x22
    return o + 1


@njit(cache=True, nogil=True)
def _copy(source: np.ndarray, p: int, n: int, out: np.ndarray, o: int) -> int:
    for i in range(n):
        out[o + i] = source[p + i]
    return o + n


@njit(cache=True, nogil=True)
def _int(value: int, out: np.ndarray, o: int) -> int:
    if value < 0:
        out[o] = 0x2D  # -
        o += 1
        if value == _INT64_MIN:
            return _copy(_INT64_MIN_DIGITS, 0, _INT64_MIN_DIGITS.size, out, o)
        value = -value
    n = 1
    while value >= 10 ** n and n < 19:
        n += 1
    for i in range(n - 1, -1, -1):
        out[o + i] = 0x30 + value % 10
        value //= 10
    return o + n


@njit(cache=True, nogil=True)
def _value(data: np.ndarray, kvs: np.ndarray, k: int, out: np.ndarray, o: int) -> int:
    kind = kvs[k, K_KIND]
    if kind == KIND_STR:
        return _string(data, kvs[k, K_A], kvs[k, K_B], out, o)
    if kind == KIND_INT:
        return _int(kvs[k, K_A], out, o)
    if kind == KIND_BOOL:
        return _copy(_TRUE, 0, 4, out, o) if kvs[k, K_A] else _copy(_FALSE, 0, 5, out, o)
    if kind == KIND_RAW:
        return _copy(data, kvs[k, K_A], kvs[k, K_B], out, o)
    return _copy(_NULL, 0, 4, out, o)  # KIND_NULL (scan leaves no other kind here)


@njit(cache=True, nogil=True)
def attributes_json(data: np.ndarray, kvs: np.ndarray, order: np.ndarray, kv0: np.ndarray,
                    kv1: np.ndarray, skip: np.ndarray, code: np.ndarray, message: np.ndarray,
                    message_len: np.ndarray, lit: np.ndarray, offsets: np.ndarray,
                    out: np.ndarray) -> int:
    """Row r's JSON: the key-values ``order[kv0[r]:kv1[r]]`` (sorted by key) but those in
    ``skip[r]`` (-1: none), with ``otel.status_code`` (``code[r]`` 1 ``OK``, 2 ``ERROR``)
    and, with a code and a non-empty message, ``otel.status_description`` merged in key
    order. Fills ``offsets`` (Arrow's, ``len(kv0) + 1``); returns the bytes written."""
    o = 0
    offsets[0] = 0
    for r in range(kv0.size):
        out[o] = 0x7B  # {
        o += 1
        first = True
        synthetic = 0 if code[r] == 0 else (2 if message_len[r] else 1)
        done = 0
        i = kv0[r]
        while i < kv1[r] or done < synthetic:
            k = -1
            if i < kv1[r]:
                k = order[i]
                if k == skip[r, 0] or k == skip[r, 1] or k == skip[r, 2] or k == skip[r, 3]:
                    i += 1
                    continue
            use_synthetic = False
            if done < synthetic:
                key = lit[L_CODE_KEY] if done == 0 else lit[L_MSG_KEY]
                key_len = lit[L_CODE_KEY_LEN] if done == 0 else lit[L_MSG_KEY_LEN]
                use_synthetic = k < 0 or compare(data, key, key_len, kvs[k, K_KEY],
                                                 kvs[k, K_KEY_LEN]) < 0
            if not first:
                out[o] = 0x2C  # ,
                o += 1
            first = False
            if use_synthetic:
                o = _string(data, key, key_len, out, o)
                out[o] = 0x3A  # :
                o += 1
                if done == 0:
                    at = L_OK if code[r] == 1 else L_ERROR
                    o = _string(data, lit[at], lit[at + 1], out, o)
                else:
                    o = _string(data, message[r], message_len[r], out, o)
                done += 1
            else:
                o = _string(data, kvs[k, K_KEY], kvs[k, K_KEY_LEN], out, o)
                out[o] = 0x3A
                o += 1
                o = _value(data, kvs, k, out, o)
                i += 1
        out[o] = 0x7D  # }
        o += 1
        offsets[r + 1] = o
    return o


@njit(cache=True, nogil=True)
def gather(data: np.ndarray, at: np.ndarray, length: np.ndarray, offsets: np.ndarray,
           out: np.ndarray) -> None:
    """The strings ``data[at[r]:at[r]+length[r]]`` as Arrow buffers (``at[r] < 0``: null,
    empty)."""
    o = 0
    offsets[0] = 0
    for r in range(at.size):
        if at[r] >= 0:
            o = _copy(data, at[r], length[r], out, o)
        offsets[r + 1] = o


@njit(cache=True, nogil=True)
def _mix64(x: np.uint64) -> np.uint64:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def hex_ids(data: np.ndarray, at: np.ndarray, n_bytes: int, event: np.ndarray,
            offsets: np.ndarray, out: np.ndarray) -> None:
    """Lowercase hex of the ``n_bytes`` ids at ``at[r]`` (< 0: null) as Arrow buffers; a
    row with ``event[r] >= 0`` gets instead the id of that event of the 8-byte span id at
    ``at[r]`` (``rows.event_span_id``: SplitMix64 of the id xor SplitMix64 of the index xor
    a constant, never zero)."""
    o = 0
    offsets[0] = 0
    for r in range(at.size):
        p = at[r]
        if p >= 0 and event[r] < 0:
            for i in range(n_bytes):
                byte = data[p + i]
                out[o], out[o + 1] = _HEX[byte >> 4], _HEX[byte & 0xF]
                o += 2
        elif p >= 0:
            parent = np.uint64(0)
            for i in range(8):
                parent = (parent << np.uint64(8)) | np.uint64(data[p + i])
            z = _mix64(parent ^ _mix64(np.uint64(event[r]) ^ np.uint64(0x6A09E667F3BCC909)))
            if z == 0:
                z = np.uint64(1)
            for i in range(16):
                out[o + i] = _HEX[np.int64((z >> np.uint64(60 - 4 * i)) & np.uint64(0xF))]
            o += 16
        offsets[r + 1] = o


@njit(cache=True, nogil=True)
def find(data: np.ndarray, at: np.ndarray, length: np.ndarray, names: np.ndarray,
         name_offsets: np.ndarray) -> np.ndarray:
    """For each string ``data[at[r]:at[r]+length[r]]``, the index of the equal one among
    ``names`` (Arrow buffers), or -1."""
    found = np.full(at.size, -1, np.int32)
    for r in range(at.size):
        for j in range(name_offsets.size - 1):
            a, b = name_offsets[j], name_offsets[j + 1]
            if at[r] >= 0 and b - a == length[r]:
                same = True
                for i in range(length[r]):
                    if data[at[r] + i] != names[a + i]:
                        same = False
                        break
                if same:
                    found[r] = j
                    break
    return found
